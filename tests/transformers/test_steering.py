"""Last-layer steering (Li & Altafini, arXiv:2605.25619, Section 3.3): the change of W_O that
makes a target direction u an eigenvector of F = W_O W_V at c times its spectral radius,
its minimum-norm and least-squares constructions, its effect on the tokens' alignment
gamma and on a real model's next-token probabilities. Weights from hand_weights.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hand_weights import gpt2_weights, model_from_F, sym

from specalign.transformers.measure import directions
from specalign.transformers.measure import steer as st

torch.set_num_threads(1)


# --------------------------------------------------------------------------- steering


def test_steering_makes_u_exact_eigenvector():
    rng = np.random.default_rng(8)
    d = 16
    W_V = rng.standard_normal((d, d))
    W_O = rng.standard_normal((d, d))
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    F = W_O @ W_V
    r = np.max(np.abs(np.linalg.eigvals(F)))
    both = st.compare_steering(W_O, W_V, u, c=1.5)
    for res in both.values():
        assert res.residual < 1e-12
        assert np.allclose(res.F @ u, 1.5 * r * u, atol=1e-10 * r)
        assert np.min(np.abs(np.linalg.eigvals(res.F) - 1.5 * r)) < 1e-8 * r
        assert np.allclose(res.W_O - W_O, res.delta)
        # issue 33: Delta is kept as its rank-one factors; W_O' is W_O + Delta exactly,
        # and the relative change from the factors is the Frobenius norms' ratio
        np.testing.assert_array_equal(res.W_O, W_O + res.delta)
        want = np.linalg.norm(res.delta) / np.linalg.norm(W_O)
        assert res.relative_change == pytest.approx(want, rel=1e-13)
        assert np.linalg.matrix_rank(res.delta) == 1
    mn, ls = both["min_norm"], both["lstsq"]
    assert mn.relative_change <= ls.relative_change + 1e-12

    # ill-conditioned W_V: the pseudo-inverse construction is far larger
    U_, _, Vt = np.linalg.svd(W_V)
    W_V_bad = U_ @ np.diag(np.logspace(0, -6, d)) @ Vt
    bad = st.compare_steering(W_O, W_V_bad, u, c=1.5)
    assert bad["min_norm"].residual < 1e-10
    assert bad["lstsq"].relative_change > 100 * bad["min_norm"].relative_change


def test_steering_to_zero_is_measured_against_the_spectral_radius():
    """Issue 29: c = 0 sends u into the null space of F'; its residual is relative to r
    (relative to |c r| = 0 it read 2e291, and the verdict 'u is not an eigenvector')."""
    from specalign.transformers.report.claims import steer_verdict

    rng = np.random.default_rng(9)
    d = 12
    W_V, W_O = rng.standard_normal((d, d)), rng.standard_normal((d, d))
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    r = np.max(np.abs(np.linalg.eigvals(W_O @ W_V)))
    for method, res in st.compare_steering(W_O, W_V, u, c=0.0).items():
        assert res.target_eigenvalue == 0.0 and res.residual < 1e-12, method
        assert res.residual == pytest.approx(np.linalg.norm(res.F @ u) / r, rel=1e-9, abs=1e-30)
        assert np.linalg.norm(res.F @ u) < 1e-10 * r
        row = {"residual": res.residual, "gamma_u_steered": 0.1, "gamma_u_original": 0.5,
               "gamma_u_null": 0.2, "u_is_leading": res.u_is_leading}  # fmt: skip
        assert "not an eigenvector" not in steer_verdict(row)
    # other c: relative to |c r| as before
    res = st.compare_steering(W_O, W_V, u, c=-0.5)["min_norm"]
    miss = res.F @ u - res.target_eigenvalue * u
    assert res.residual == pytest.approx(np.linalg.norm(miss) / (0.5 * r), rel=1e-12)


def test_steered_weights_and_gamma():
    F = sym([1.0, 0.8, 0.3, 0.1, -0.2, -0.5], seed=9)
    mw = model_from_F([F], n_heads=2, layer_block=np.zeros(4, dtype=int))  # shared (ALBERT)
    u = np.random.default_rng(2).standard_normal(6)
    new_mw, res = st.steer_model_weights(mw, u, c=3.0)
    assert res.u_is_leading
    assert len(new_mw.blocks) == 2 and list(new_mw.layer_block) == [0, 0, 0, 1]
    assert np.array_equal(new_mw.blocks[0].W_O, mw.blocks[0].W_O)
    v1_last = directions.layer_directions(new_mw)["v1"][-1]
    assert abs(v1_last @ u) / np.linalg.norm(u) == pytest.approx(1.0, abs=1e-10)
    X0 = np.random.default_rng(3).standard_normal((4, 6, 6))
    ds = st.steering_gamma(mw, X0, 0.5, u, res.W_O, attention="full")
    assert ds["gamma_u"].dims == ("variant", "token")
    g = ds["gamma_u_mean"]
    assert float(g.sel(variant="steered").mean()) > float(g.sel(variant="original").mean())


def test_next_token_prob_change_gpt2(tiny_gpt2, gpt2_dir):
    mw = gpt2_weights(tiny_gpt2.transformer)
    W_O = mw.blocks[-1].W_O
    ids = np.random.default_rng(4).integers(0, 64, (3, 6))
    # the unchanged W_O in the package (out, in) convention must leave the model intact:
    # this fails if the Conv1D (in, out) storage were not respected
    same = st.next_token_prob_change(gpt2_dir, ids, 5, W_O, dtype=torch.float64)
    assert np.allclose(same["delta"], 0.0, atol=1e-7)
    assert np.all(same["p_before"] > 0)
    wrong = st.next_token_prob_change(gpt2_dir, ids, 5, W_O.T, dtype=torch.float64)
    assert np.abs(wrong["delta"]).max() > 1e-5
    E = tiny_gpt2.transformer.wte.weight.detach().numpy()
    u = st.target_direction(E, 5)
    assert np.linalg.norm(u) == pytest.approx(1.0)
    res = st.steer(W_O, mw.blocks[-1].W_V, u, c=5.0)
    out = st.next_token_prob_change(gpt2_dir, ids, 5, res.W_O, dtype=torch.float64)
    assert out["p_after"].shape == (3,) and np.isfinite(out["p_after"]).all()
    with pytest.raises(ValueError):
        st.next_token_prob_change(gpt2_dir, ids, 5, np.zeros((32, 16)))
