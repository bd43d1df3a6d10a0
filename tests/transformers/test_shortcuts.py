"""The shortcuts that make the paper's largest models affordable give the direct results.

Propagation and steering read every block's directions from ``spectra.nc`` instead of
decomposing each F again; a simplified run and its prolonged continuation share one pass;
steering reruns only the changed last layer, in the simplified model and, through replayed
earlier layers, in the causal LM. Each shortcut is checked here against the computation it
replaces, on tiny models.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import xarray as xr
from tiny_models import TINY_CONFIGS

from specalign.io import DiskStack
from specalign.transformers.load.families import adapter_class
from specalign.transformers.measure import directions, linalg, metrics, spectra, steer
from specalign.transformers.measure import propagate as prop
from specalign.transformers.weights import BlockWeights, ModelWeights

D, ETA = 12, 0.5


def _weights(n_layers: int, shared: bool, causal: bool, seed: int, D: int = D) -> ModelWeights:
    rng = np.random.default_rng(seed)

    def block() -> BlockWeights:
        W_Q, W_K, W_V, W_O = rng.standard_normal((4, D, D)) / np.sqrt(D)
        z = np.zeros(D)
        return BlockWeights(
            W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, b_Q=z, b_K=z, b_V=z, b_O=z,
            ln_weight=1.0 + 0.1 * rng.standard_normal(D), ln_bias=0.1 * rng.standard_normal(D),
        )  # fmt: skip

    blocks = [block() for _ in range(1 if shared else n_layers)]
    return ModelWeights(
        family="albert" if shared else "bert", d_model=D, n_heads=3, n_layers=n_layers,
        blocks=blocks, layer_block=np.zeros(n_layers, int) if shared else np.arange(n_layers),
        ln_position="post" if shared else "pre", causal=causal, attn_scale=0.5,
        layer_attention=["global"] * n_layers,
    )  # fmt: skip


MODELS = {
    # the family decides only whether a causal LM is loaded: "bert" keeps steering in
    # the simplified model; the causal mask is on all the same
    "distinct_causal": lambda: _weights(4, shared=False, causal=True, seed=1),
    "shared": lambda: _weights(3, shared=True, causal=False, seed=2),
}


@pytest.mark.parametrize("name", MODELS)
def test_directions_from_spectra_equal_a_fresh_decomposition(name):
    mw = MODELS[name]()
    stored = spectra.block_directions(spectra.spectra_dataset(mw, eta=ETA))
    for blk, got in zip(mw.blocks, stored, strict=True):
        fresh = directions.principal_directions(blk.F)
        assert set(got) == set(fresh)
        for key, want in fresh.items():
            np.testing.assert_array_equal(got[key], want, err_msg=key)


def test_block_directions_names_an_old_spectra_file():
    ds = spectra.spectra_dataset(MODELS["shared"](), eta=ETA).drop_vars("direction_v_neg")
    with pytest.raises(Exception, match="old/spectra.nc: missing direction_v_neg.*rerun"):
        spectra.block_directions(ds, "old/spectra.nc")


@pytest.mark.parametrize("name", MODELS)
def test_propagation_with_stored_directions_and_one_pass_is_the_direct_result(name):
    mw = MODELS[name]()
    rng = np.random.default_rng(3)
    hidden = rng.standard_normal((mw.n_layers + 1, 2, 5, D))
    cfg = {"prolonged_layers": mw.n_layers + 3, "corr": "cosine", "null_draws": 2}
    states = prop.propagation_states(mw, hidden, ETA, cfg)
    for attention in ("real", "full"):
        full = prop.simplified_forward(mw, hidden[0], ETA, attention)
        np.testing.assert_array_equal(states[f"simplified_{attention}"], full)
        longer = prop.simplified_forward(mw, hidden[0], ETA, attention, cfg["prolonged_layers"])
        np.testing.assert_array_equal(states[f"prolonged_{attention}"], longer)
    stored = spectra.block_directions(spectra.spectra_dataset(mw, eta=ETA))
    fast = prop.propagation_dataset(mw, states, cfg, seed=0, directions=stored)
    direct = prop.propagation_dataset(mw, states, cfg, seed=0)
    xr.testing.assert_identical(fast, direct)


@pytest.mark.parametrize("corr", ["cosine", "pearson"])
@pytest.mark.parametrize("name", MODELS)
def test_streamed_propagation_is_the_result_of_the_whole_runs(name, corr):
    """The rule's pass (each state reduced as it is computed) against the states of
    every mode computed first and measured together, and its alignment metrics against
    ``metrics.alignment`` of each whole run (a product per layer)."""
    mw = MODELS[name]()
    hidden = np.random.default_rng(5).standard_normal((mw.n_layers + 1, 3, 4, D))
    # 9 draws: more than the 8 below which numpy sums a mean one value after the other
    cfg = {"prolonged_layers": mw.n_layers + 4, "corr": corr, "null_draws": 9}
    run = prop.propagation_run(mw, hidden.astype(np.float32), ETA, cfg, seed=2)
    states = prop.propagation_states(mw, hidden.astype(np.float32), ETA, cfg)
    xr.testing.assert_identical(run.dataset, prop.propagation_dataset(mw, states, cfg, seed=2))
    # the two correlations side by side on two threads: the same bits
    two = prop.propagation_run(mw, hidden.astype(np.float32), ETA, cfg, seed=2, threads=2)
    xr.testing.assert_identical(two.dataset, run.dataset)
    # the real states read a state at a time from disk, as the rule gives them
    with DiskStack() as stack:
        for X in hidden.astype(np.float32):
            stack.append(X)
        on_disk = prop.propagation_run(mw, stack, ETA, cfg, seed=2)
    xr.testing.assert_identical(on_disk.dataset, run.dataset)
    assert run.layers == {m: s.shape[0] - 1 for m, s in states.items()}
    assert list(run.dataset.mode.values) == list(states)
    assert run.first_nonfinite == {}
    v1 = directions.layer_directions(mw, cfg["prolonged_layers"])["v1"]
    for mode, S in states.items():
        whole = metrics.alignment(S, v1[: S.shape[0] - 1], corr)
        got = run.dataset.sel(mode=mode).isel(layer=slice(0, S.shape[0] - 1))
        # the stream's one product for all directions and the run's product per layer
        # sum in other orders: equal to round-off, and rho (a count above round-off)
        # exactly
        for k in ("gamma", "psi", "rho", "gamma_mean", "psi_mean", "rho_mean"):
            np.testing.assert_allclose(
                got[k].values, whole[k], rtol=1e-12, atol=1e-15, err_msg=f"{mode} {k}"
            )
        for k in ("rho", "rho_mean"):
            np.testing.assert_array_equal(got[k].values, whole[k], err_msg=f"{mode} {k}")
        # the random-direction nulls: the mean over the draws of each whole run's values
        rng = np.random.default_rng(2)
        rand = linalg.unit(rng.standard_normal((9, cfg["prolonged_layers"], D)))
        draws = [metrics.alignment(S, r[: S.shape[0] - 1], corr) for r in rand]
        for k in ("gamma", "rho", "rho_mean", "psi_mean"):
            want = np.mean([dr[k] for dr in draws], axis=0)
            np.testing.assert_allclose(
                got[f"{k}_null"].values, want, rtol=1e-12, atol=1e-15, err_msg=f"{mode} {k}"
            )


def test_streamed_propagation_never_holds_a_run():
    """Peak traced memory of the rule's pass, its outputs included, stays below one
    simplified run's states (T + 1 of every token in float64): a whole-run pass holds
    two runs and their unit rows. At a width where the states dominate, as in the
    models the bound is for."""
    import tracemalloc

    d, P, N, T = 480, 4, 8, 100
    mw = _weights(2, shared=True, causal=False, seed=8, D=d)
    hidden = np.random.default_rng(6).standard_normal((mw.n_layers + 1, P, N, d))
    cfg = {"prolonged_layers": T, "corr": "cosine", "null_draws": 2}
    one_run = (T + 1) * P * N * d * 8
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        ds = prop.propagation_run(mw, hidden, ETA, cfg, seed=0).dataset
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert ds.sizes["layer"] == T
    assert peak < one_run, (peak, one_run)


def test_streamed_propagation_names_the_first_state_that_is_not_finite():
    mw = MODELS["distinct_causal"]()
    hidden = np.random.default_rng(7).standard_normal((mw.n_layers + 1, 2, 3, D))
    hidden[2, 1, 0, 4] = np.nan
    cfg = {"prolonged_layers": mw.n_layers, "corr": "cosine", "null_draws": 1}
    run = prop.propagation_run(mw, hidden, ETA, cfg, seed=0)
    assert run.first_nonfinite == {"real_model": 2}
    hidden[0, 0, 0, 0] = np.inf  # the embedding output: every simplified run starts there
    run = prop.propagation_run(mw, hidden, ETA, cfg, seed=0)
    assert run.first_nonfinite == dict.fromkeys(run.layers, 0)


def test_simplified_forward_continues_a_run_exactly():
    mw = MODELS["distinct_causal"]()
    X0 = np.random.default_rng(4).standard_normal((2, 5, D))
    run = prop.simplified_forward(mw, X0, ETA, "real")
    tail = prop.simplified_forward(mw, run[2], ETA, "real", start=2)
    np.testing.assert_array_equal(tail, run[2:])


@pytest.mark.parametrize("name", MODELS)
def test_steering_dataset_equals_every_steered_model_run_in_full(name, monkeypatch):
    """gamma_u, the per-layer gamma and rho and the scalars, against a full simplified
    run and ``propagation_metrics`` of each steered model (the computation before the
    last-layer shortcut)."""
    mw = MODELS[name]()
    rng = np.random.default_rng(5)
    X0, e = rng.standard_normal((3, 4, D)), rng.standard_normal(D)
    monkeypatch.setattr(steer, "steering_target", lambda *a, **k: steer.SteeringTarget(7, (), ""))
    monkeypatch.setattr(steer, "model_inputs", lambda *a, **k: (X0, e))
    cfg = {"target_text": "x", "c": [0.5, 2.0], "methods": ["min_norm", "lstsq"]}
    ds = steer.steering_dataset(mw, "unused", np.zeros((3, 4), int), ETA, cfg, 0, 3)
    # the variants side by side, one BLAS thread each: the same bits
    two = steer.steering_dataset(mw, "unused", np.zeros((3, 4), int), ETA, cfg, 0, 3, threads=2)
    xr.testing.assert_identical(ds, two)
    u = e / np.linalg.norm(e)
    for method in cfg["methods"]:
        for c in cfg["c"]:
            steered, res = steer.steer_model_weights(mw, u, c, method=method)
            states = prop.simplified_forward(steered, X0, ETA, "real")
            got_m = metrics.propagation_metrics(steered, {"s": states}, n_null_draws=1)
            got = ds.sel(c=c).isel(method=cfg["methods"].index(method))
            np.testing.assert_allclose(
                got["gamma_layers"], got_m["gamma"].sel(mode="s"), rtol=1e-12, atol=1e-15
            )
            np.testing.assert_array_equal(got["rho_layers"], got_m["rho"].sel(mode="s"))
            want_u = np.abs(metrics.correlation(states[-1], u)).reshape(-1)
            np.testing.assert_allclose(
                got["gamma_u"].sel(variant="steered"), want_u, rtol=1e-12, atol=1e-15
            )
            # the null: the mean over the 3 random directions, one correlation each
            R = steer._random_units(D, 3, 0)
            want_null = np.mean(
                [np.abs(metrics.correlation(states[-1], r)).reshape(-1) for r in R], axis=0
            )
            np.testing.assert_allclose(
                got["gamma_u_null"].sel(variant="steered"), want_null, rtol=1e-12, atol=1e-15
            )
            assert float(got["residual"]) == pytest.approx(res.residual, abs=1e-12)
            assert float(got["relative_change"]) == pytest.approx(res.relative_change, rel=1e-12)
            assert bool(got["u_is_leading"]) == res.u_is_leading
    # the original model's layers are untouched by steered_weights' shallow copy
    fresh = MODELS[name]()
    for a, b in zip(mw.blocks, fresh.blocks, strict=True):
        np.testing.assert_array_equal(a.W_O, b.W_O)


CAUSAL = [t for t in TINY_CONFIGS if adapter_class(t).causal_lm]


@pytest.mark.parametrize("model_type", CAUSAL)
def test_next_token_replay_equals_the_full_forward(model_type):
    """p_after with the earlier layers replayed equals a full forward of the LM with the
    changed W_O, for every causal family; the model is left unchanged."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    # a deep copy: transformers edits nested entries in place
    config = AutoConfig.for_model(model_type, **copy.deepcopy(TINY_CONFIGS[model_type]))
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    module, transposed = steer._out_projection(lm, -1)
    W = module.weight.detach().double().numpy()
    W = W.T if transposed else W
    rng = np.random.default_rng(6)
    variants = [W + 0.3 * rng.standard_normal(W.shape) for _ in range(2)]
    ids = rng.integers(0, 50, size=(3, 6))
    before, after = steer.next_token_probs(lm, ids, 5, variants)
    np.testing.assert_array_equal(module.weight.detach().double().numpy(), W.T if transposed else W)
    t_ids = torch.as_tensor(ids)

    def full(weight: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            module.weight.copy_(torch.as_tensor(weight.T if transposed else weight))
            logits = lm(input_ids=t_ids, attention_mask=torch.ones_like(t_ids)).logits
        return torch.softmax(logits[:, -1].double(), dim=-1)[:, 5].numpy()

    original = W.copy()
    np.testing.assert_allclose(before, full(original), rtol=1e-6)
    for W_new, p in zip(variants, after, strict=True):
        np.testing.assert_allclose(p, full(W_new), rtol=1e-6)
        assert not np.allclose(p, before, rtol=1e-3)  # the change is visible
    full(original)


def test_spectra_do_not_depend_on_the_thread_count():
    """Blocks decomposed side by side, each on one BLAS thread: the same bits as one at a
    time, in block order."""
    mw = _weights(5, shared=False, causal=False, seed=7)
    one = spectra.spectra_dataset(mw, eta=ETA, threads=1)
    two = spectra.spectra_dataset(mw, eta=ETA, threads=2)
    xr.testing.assert_identical(one, two)
    order = spectra.map_blocks(lambda x: x * x, list(range(7)), threads=3)
    assert order == [x * x for x in range(7)]


@pytest.mark.parametrize("threads", [1, 2])
def test_one_gemm_over_the_token_rows_is_the_stacked_product(threads):
    """``rows_matmul`` multiplies all prompts' rows in one GEMM: the stacked product to
    round-off for any shape, non-contiguous rows and more than one leading axis included,
    and below the small-product bound the stacked product itself. At the default config's
    shapes (100 prompts of 10 tokens, d 384) and one BLAS thread, OpenBLAS gives the
    stacked product's bits, on which the bit-identity check of the default run at
    ``--cores 1`` rests; with widths that are not multiples of 8, or one token per
    prompt, it does not (measured; the sums are ordered otherwise). At two threads it
    depends on the kernel: bit for bit with OpenBLAS's SkylakeX kernels, not with its
    Haswell kernels (an AMD EPYC, 2026-12-02: 18 % of the elements differ in the last
    bits), so two threads are held to round-off only."""
    from threadpoolctl import threadpool_info, threadpool_limits

    rng = np.random.default_rng(5)
    openblas = any(i["internal_api"] == "openblas" for i in threadpool_info())
    cases = [((100, 10, 384), 384, True), ((7, 10, 256), 1152, True), ((4, 2, 6, 130), 1301, False),
             ((3, 1, 1024), 1472, False), ((5, 4, 12), 16, False)]  # fmt: skip
    with threadpool_limits(threads, user_api="blas"):
        for shape, m, same_bits in cases:
            X = np.moveaxis(rng.standard_normal(shape[:-2] + shape[-1:] + shape[-2:-1]), -1, -2)
            B = rng.standard_normal((m, shape[-1])).T  # a transposed weight, as the kernels
            got, stacked = linalg.rows_matmul(X, B), X @ B
            assert got.shape == stacked.shape
            np.testing.assert_allclose(got, stacked, rtol=1e-12, atol=1e-12)
            if shape[-2] * shape[-1] * m <= linalg.SMALL_PRODUCT:
                np.testing.assert_array_equal(got, stacked)
            if same_bits and openblas and threads == 1:
                np.testing.assert_array_equal(got, stacked)


@pytest.mark.parametrize("corr", ["cosine", "pearson"])
@pytest.mark.parametrize("name", MODELS)
def test_metrics_as_products_equal_the_previous_reductions(name, corr):
    """Issue 33: the per-state metrics as matrix products against the previous method
    (a reduction per direction, tests/transformers/einsum_metrics.py), every variable,
    every mode: float64 values to 1e-12 relative; rho equal to the previous method's
    count of the rises above round-off, and to its own count where no psi is that
    close to 0."""
    from einsum_metrics import layer_metrics

    mw = MODELS[name]()
    hidden = np.random.default_rng(11).standard_normal((mw.n_layers + 1, 3, 4, D))
    cfg = {"prolonged_layers": mw.n_layers + 4, "corr": corr, "null_draws": 5}
    states = prop.propagation_states(mw, hidden, ETA, cfg)
    ds = prop.propagation_dataset(mw, states, cfg, seed=4)
    tol = metrics.psi_round_off(D)
    n_checked = 0
    for mode, S in states.items():
        T = S.shape[0] - 1
        ref = layer_metrics(mw, S, cfg["prolonged_layers"], corr, 5, seed=4)
        got = ds.sel(mode=mode).isel(layer=slice(0, T))
        for k, want in ref.items():
            want = np.asarray(want)
            if k.startswith("rho"):
                continue
            np.testing.assert_allclose(got[k].values, want, rtol=1e-12, atol=1e-15, err_msg=k)
            n_checked += 1
        psi = np.asarray(ref["psi"])
        np.testing.assert_array_equal(got["rho"].values, (psi > tol).mean(axis=1))
        # where no psi is within round-off of 0, the previous rho itself
        clear = (np.abs(psi) > tol).all(axis=1)
        np.testing.assert_array_equal(got["rho"].values[clear], np.asarray(ref["rho"])[clear])
    assert n_checked == len(states) * (len(ref) - 6)  # all but the six rho counts


def test_rho_does_not_count_round_off_as_a_rise():
    """A layer that only rescales its tokens leaves every angle where it was: psi is 0
    in exact arithmetic and rho must be 0, whatever order a kernel sums in. Computed,
    psi is a few eps either side of 0 (checked here, so the test can fail), and the
    previous rho (psi > 0) counted about half of them."""
    rng = np.random.default_rng(0)
    d, P, N = 64, 4, 16
    X = rng.standard_normal((P, N, d))
    S = np.stack([X * s for s in (1.0, 3.0, 7.0 / 3.0, 1e3 / 7.0)])
    dirs = linalg.unit(rng.standard_normal((3, d)))
    for corr in ("cosine", "pearson"):
        got = metrics.alignment(S, dirs, corr)
        assert (got["psi"] != 0).any() and (got["psi"] > 0).any()
        assert np.abs(got["psi"]).max() <= metrics.psi_round_off(d)
        np.testing.assert_array_equal(got["rho"], 0.0)
        np.testing.assert_array_equal(got["rho_mean"], 0.0)


@pytest.mark.parametrize("corr", ["cosine", "pearson"])
def test_correlations_of_many_directions_are_each_directions_correlation(corr):
    """metrics.correlations (one product for k directions) against metrics.correlation
    of each direction, signed, zero rows NaN."""
    rng = np.random.default_rng(9)
    X = rng.standard_normal((3, 4, D))
    X[1, 2] = 0.0
    V = rng.standard_normal((5, D))
    got = metrics.correlations(X, V, corr)
    assert got.shape == (5, 3, 4)
    want = np.stack([metrics.correlation(X, v, corr) for v in V])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    assert np.isnan(got[:, 1, 2]).all() and (got < 0).any()
