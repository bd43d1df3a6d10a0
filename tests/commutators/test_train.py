"""Batched ensemble trainer (specalign.commutators.train) against the autograd baseline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specalign.commutators.data.synthetic import sample
from specalign.commutators.train import (
    DIVERGENCE_FACTOR,
    checkpoint_label,
    he_init,
    predict,
    reference_train_loop,
    rescale,
    train_ensemble,
)

torch.set_num_threads(1)

LR = 1e-2


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray]:
    return sample(48, seed=11)


@pytest.fixture(scope="module")
def small() -> list[np.ndarray]:
    return he_init([2, 8, 8, 1], seeds=[0, 1, 2])


def test_matches_autograd_reference(data, small):
    X, y = data
    res = train_ensemble(small, X, y, lr=LR, n_iter=200, risk_levels=())
    ref_risk, ref_final = reference_train_loop(small, X, y, lr=LR, n_iter=200)
    assert res.risk.shape == ref_risk.shape == (3, 201)
    np.testing.assert_allclose(res.risk, ref_risk, rtol=1e-12, atol=0)
    assert res.risk[:, -1].max() < res.risk[:, 0].min()  # it actually trained
    for W, W_ref in zip(res.final_weights, ref_final, strict=True):
        np.testing.assert_allclose(W, W_ref, rtol=1e-12, atol=1e-13)
    assert not res.diverged.any()
    np.testing.assert_array_equal(res.diverged_at, -1)


def test_dead_unit_convention_sigma_prime_zero(data, small):
    """A zero row of W_0 gives z = 0 exactly for every input: with sigma'(0) = 0 its
    gradient is zero, the row stays zero, and autograd agrees."""
    X, y = data
    Ws = [W.copy() for W in small]
    Ws[0][:, 3, :] = 0.0
    res = train_ensemble(Ws, X, y, lr=LR, n_iter=50, risk_levels=())
    assert np.all(res.final_weights[0][:, 3, :] == 0.0)
    # the outgoing column of the dead unit gets no gradient either (a_3 = 0)
    np.testing.assert_array_equal(res.final_weights[1][:, :, 3], Ws[1][:, :, 3])
    ref_risk, ref_final = reference_train_loop(Ws, X, y, lr=LR, n_iter=50)
    np.testing.assert_allclose(res.risk, ref_risk, rtol=1e-12, atol=0)
    assert np.all(ref_final[0][:, 3, :] == 0.0)


def test_risk_checkpoints_at_first_crossing(data, small):
    X, y = data
    levels = (0.5, 0.25, 0.05)
    res = train_ensemble(small, X, y, lr=LR, n_iter=400, risk_levels=levels)
    assert res.checkpoint_labels == ("r<=5e-1", "r<=2.5e-1", "r<=5e-2")
    rel = res.risk / res.risk[:, :1]
    np.testing.assert_array_equal(rel, res.relative_risk)
    for s in range(3):
        for c, level in enumerate(levels):
            below = np.flatnonzero(res.risk[s] <= level * res.risk[s, 0])
            expected = int(below[0]) if below.size else -1
            assert res.checkpoint_iteration[s, c] == expected
    reached = res.checkpoint_iteration >= 0
    assert reached[:, :2].all(), "test setting should reach the two upper levels"
    # the stored weights are W_i at the crossing: replay to that iteration and compare
    s, c = 1, 1
    k = int(res.checkpoint_iteration[s, c])
    replay = train_ensemble(small, X, y, lr=LR, n_iter=k, risk_levels=())
    for l in range(3):
        np.testing.assert_array_equal(res.checkpoint_weights[l][s, c], replay.final_weights[l][s])
        nan_where_unreached = np.isnan(res.checkpoint_weights[l][~reached])
        assert nan_where_unreached.all()
    np.testing.assert_allclose(res.checkpoint_time[reached], res.checkpoint_iteration[reached] * LR)


def test_time_checkpoints(data, small):
    X, y = data
    res = train_ensemble(small, X, y, lr=LR, n_iter=300, risk_levels=(1e-1,), times=(0, 1.5, 3))
    assert res.checkpoint_labels == ("r<=1e-1", "t=0", "t=1.5", "t=3")
    np.testing.assert_array_equal(res.checkpoint_iteration[:, 1:], [[0, 150, 300]] * 3)
    for l in range(3):
        np.testing.assert_array_equal(res.checkpoint_weights[l][:, 1], small[l])
        np.testing.assert_array_equal(res.checkpoint_weights[l][:, 3], res.final_weights[l])
    mid = train_ensemble(small, X, y, lr=LR, n_iter=150, risk_levels=())
    for l in range(3):
        np.testing.assert_array_equal(res.checkpoint_weights[l][:, 2], mid.final_weights[l])
    with pytest.raises(ValueError, match="n_iter"):
        train_ensemble(small, X, y, lr=LR, n_iter=300, times=(3.5,))
    with pytest.raises(ValueError, match="duplicate"):
        train_ensemble(small, X, y, lr=LR, n_iter=300, times=(1, 1))


def test_checkpoint_labels():
    assert checkpoint_label("risk", 1e-3) == "r<=1e-3"
    assert checkpoint_label("risk", 2.5e-2) == "r<=2.5e-2"
    assert checkpoint_label("time", 100.0) == "t=100"
    assert checkpoint_label("time", 0) == "t=0"


def test_divergence_is_isolated():
    """At lr = 10 some seeds blow up (past DIVERGENCE_FACTOR * R(0), or to inf/NaN); the
    others (here killed to a constant function in one step, without a blow-up) must be
    exactly what they are when run alone."""
    X, y = sample(160, seed=1)
    seeds = list(range(6))
    Ws = he_init([2, 32, 32, 1], seeds)
    res = train_ensemble(Ws, X, y, lr=10.0, n_iter=60, risk_levels=(1e-1,), times=(0, 300, 600))
    div = res.diverged
    assert div.any() and (~div).any(), "setting should split the ensemble"
    for s in np.flatnonzero(div):
        k = res.diverged_at[s]
        assert 0 < k <= 60
        limit = DIVERGENCE_FACTOR * res.risk[s, 0]
        assert np.isfinite(res.risk[s, :k]).all() and (res.risk[s, :k] <= limit).all()
        assert not res.risk[s, k] <= limit  # above the limit, inf or NaN
        assert np.isnan(res.risk[s, k + 1 :]).all()
        # the time checkpoints after divergence are unreached, t=0 was taken
        assert res.checkpoint_iteration[s, 1] == 0
        np.testing.assert_array_equal(res.checkpoint_iteration[s, 2:], -1)
        assert np.isnan(res.checkpoint_weights[1][s, 2:]).all()
        solo = train_ensemble([W[[s]] for W in Ws], X, y, lr=10.0, n_iter=60, risk_levels=())
        np.testing.assert_allclose(res.risk[s, :k], solo.risk[0, :k], rtol=1e-13)
        assert solo.diverged_at[0] == k
    ok = np.flatnonzero(~div)
    np.testing.assert_array_equal(res.diverged_at[ok], -1)
    alone = train_ensemble([W[ok] for W in Ws], X, y, lr=10.0, n_iter=60, risk_levels=(1e-1,))
    assert not alone.diverged.any()
    np.testing.assert_allclose(res.risk[ok], alone.risk, rtol=1e-13)
    for l in range(3):
        np.testing.assert_allclose(res.final_weights[l][ok], alone.final_weights[l], rtol=1e-13)


def test_blow_up_then_collapse_is_diverged():
    """Issue 10, item 4: a seed whose risk explodes and then falls to a constant (every
    ReLU off: a dead network) must count as diverged, not as converged.

    The textbook loop (no divergence handling) shows what happens to seeds 1 and 2 at
    lr = 10: the risk passes 1e225 R(0), then stays at a constant 0.27 R(0) / 0.64 R(0),
    finite all along. The trainer must stop them at the first iteration above
    DIVERGENCE_FACTOR * R(0) and leave them out of every checkpoint after it.
    """
    X, y = sample(40, seed=0)
    Ws = he_init([2, 32, 32, 32, 1], [1, 2])
    risk, _ = reference_train_loop(Ws, X, y, lr=10.0, n_iter=50)
    assert np.isfinite(risk).all()
    assert (risk.max(axis=1) > 1e200 * risk[:, 0]).all()
    np.testing.assert_array_equal(risk[:, -1], risk[:, -10])  # collapsed: constant
    assert (risk[:, -1] < risk[:, 0]).all()  # and below R(0): it would pass a risk level
    res = train_ensemble(Ws, X, y, lr=10.0, n_iter=50, risk_levels=(0.9,), times=(0, 20))
    assert res.diverged.all()
    for s, k in enumerate(res.diverged_at):
        first = int(np.argmax(risk[s] > DIVERGENCE_FACTOR * risk[s, 0]))
        assert k == first
        np.testing.assert_allclose(res.risk[s, : k + 1], risk[s, : k + 1], rtol=1e-10)
        assert np.isnan(res.risk[s, k + 1 :]).all()
    # the risk level 0.9 R(0) that the collapsed network reaches is never recorded
    np.testing.assert_array_equal(res.checkpoint_iteration[:, 0], -1)
    np.testing.assert_array_equal(res.checkpoint_iteration[:, 2], -1)  # t = 20 (step 2) is after it


def test_deterministic_bit_identical(data, small):
    X, y = data
    kw = dict(lr=LR, n_iter=120, risk_levels=(0.5, 0.1), times=(0, 1))
    a = train_ensemble(small, X, y, **kw)
    b = train_ensemble(small, X, y, **kw)
    np.testing.assert_array_equal(a.risk, b.risk)
    np.testing.assert_array_equal(a.checkpoint_iteration, b.checkpoint_iteration)
    for l in range(3):
        np.testing.assert_array_equal(a.final_weights[l], b.final_weights[l])
        np.testing.assert_array_equal(a.checkpoint_weights[l], b.checkpoint_weights[l])


def test_inputs_not_modified(data, small):
    X, y = data
    before = [W.copy() for W in small]
    train_ensemble(small, X, y, lr=LR, n_iter=5)
    for W, W0 in zip(small, before, strict=True):
        np.testing.assert_array_equal(W, W0)


def test_iterations_allocate_no_arrays_of_the_batch_size(data):
    """The activations, residual, deltas and gradients are allocated once per run, not
    once per iteration: fresh arrays of a few MB each iteration cost page faults that
    made a benchmark ensemble's step 1.8x slower. Counted with torch's profiler: the
    allocations at least as large as one layer's activations do not grow with n_iter."""
    from torch.profiler import ProfilerActivity, profile

    X = np.repeat(data[0], 8, axis=0)  # N = 384: an activation is 3 x 8 x 384 doubles
    y = np.repeat(data[1], 8)
    Ws = he_init([2, 8, 8, 1], seeds=[0, 1, 2])
    activation_bytes = 3 * 8 * X.shape[0] * 8

    def large_allocations(n_iter: int) -> int:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            train_ensemble(Ws, X, y, lr=LR, n_iter=n_iter, risk_levels=(0.5,))
        return sum(e.cpu_memory_usage >= activation_bytes for e in prof.events())

    few, many = large_allocations(10), large_allocations(40)
    assert few > 0  # the workspace itself is seen
    assert many == few, (few, many)


def test_progress_callable_and_tqdm_like(data, small):
    X, y = data
    calls: list[tuple[int, int]] = []
    train_ensemble(small, X, y, lr=LR, n_iter=250, progress=lambda i, n: calls.append((i, n)))
    its = [i for i, _ in calls]
    assert its == sorted(its) and its[-1] == 250 and all(n == 250 for _, n in calls)
    assert 50 <= len(calls) <= 130

    class Bar:
        n = 0

        def update(self, k: int) -> None:
            self.n += k

    bar = Bar()
    train_ensemble(small, X, y, lr=LR, n_iter=37, progress=bar)
    assert bar.n == 37


def test_shape_validation(data, small):
    X, y = data
    with pytest.raises(ValueError, match="X must have shape"):
        train_ensemble(small, X[:, :1], y, lr=LR, n_iter=1)
    with pytest.raises(ValueError, match="y must have shape"):
        train_ensemble(small, X, y[:-1], lr=LR, n_iter=1)
    with pytest.raises(ValueError, match="seeds"):
        train_ensemble([small[0], small[1][:2], small[2]], X, y, lr=LR, n_iter=1)
    with pytest.raises(ValueError, match="lr"):
        train_ensemble(small, X, y, lr=0.0, n_iter=1)


@pytest.mark.parametrize("c", [0.5, 2.0, 3.0])
def test_rescaling_preserves_function(data, c):
    X, _ = data
    Ws = he_init([2, 16, 16, 16, 1], seeds=range(4))
    Wc = rescale(Ws, 1, c)
    np.testing.assert_array_equal(Wc[0], Ws[0])
    np.testing.assert_array_equal(Wc[3], Ws[3])
    np.testing.assert_allclose(Wc[1], c * Ws[1], rtol=1e-15)
    F, Fc = predict(Ws, X), predict(Wc, X)
    if c in (0.5, 2.0):  # multiplying by a power of two is exact in binary floating point
        np.testing.assert_array_equal(Fc, F)
    else:
        np.testing.assert_allclose(Fc, F, rtol=1e-13, atol=1e-15)
    # same function, different parametrisation: the trajectories separate
    y = F[0]
    r1 = train_ensemble(Ws, X, y + 1.0, lr=LR, n_iter=20, risk_levels=())
    rc = train_ensemble(Wc, X, y + 1.0, lr=LR, n_iter=20, risk_levels=())
    np.testing.assert_allclose(rc.risk[:, 0], r1.risk[:, 0], rtol=1e-13)
    assert not np.allclose(rc.risk[:, -1], r1.risk[:, -1], rtol=1e-6)


def test_rescale_rejects_bad_arguments():
    Ws = he_init([2, 4, 4, 1], seeds=[0])
    for c in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="c must be"):
            rescale(Ws, 1, c)
    with pytest.raises(ValueError, match="layer"):
        rescale(Ws, 2, 2.0)


def test_predict_single_network_matches_ensemble(data):
    X, _ = data
    Ws = he_init([2, 8, 1], seeds=[3, 4])
    np.testing.assert_array_equal(predict([W[1] for W in Ws], X), predict(Ws, X)[1])


def test_he_init_statistics():
    widths = [8, 256, 256, 1]
    Ws = he_init(widths, seeds=range(20))
    assert [W.shape for W in Ws] == [(20, 256, 8), (20, 256, 256), (20, 1, 256)]
    assert all(W.dtype == np.float64 for W in Ws)
    for W, var in zip(Ws, [2 / 8, 2 / 256, 1 / 256], strict=True):
        n = W.size
        assert abs(W.mean()) < 4 * np.sqrt(var / n)
        # sample variance of a normal: relative sd sqrt(2/n)
        assert abs(W.var() / var - 1) < 5 * np.sqrt(2 / n)


def test_he_init_seed_independent_of_ensemble():
    widths = [2, 8, 8, 1]
    solo = he_init(widths, seeds=[7])
    for seeds, pos in (([3, 7], 1), ([7, 1, 2, 9], 0), ([5, 6, 7], 2)):
        ens = he_init(widths, seeds=seeds)
        for W, W_solo in zip(ens, solo, strict=True):
            np.testing.assert_array_equal(W[pos], W_solo[0])
    other = he_init(widths, seeds=[8])
    assert not np.array_equal(other[1], solo[1])
    with pytest.raises(ValueError, match="scalar output"):
        he_init([2, 8, 2], seeds=[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu(data, small):
    X, y = data
    cpu = train_ensemble(small, X, y, lr=LR, n_iter=100, times=(1,))
    gpu = train_ensemble(small, X, y, lr=LR, n_iter=100, times=(1,), device="cuda")
    np.testing.assert_allclose(gpu.risk, cpu.risk, rtol=1e-10)
    np.testing.assert_array_equal(gpu.checkpoint_iteration, cpu.checkpoint_iteration)
