"""Power-method dynamics of transformer layers (Li & Altafini, arXiv:2605.25619).

Sphere dynamics and Jacobians at consensus (supplement), and the simplified and real
token propagation with their metrics and null levels. Weights are built by hand or read
straight off tiny random ``transformers`` modules (hand_weights.py), independent of the
checkpoint extraction code. Last-layer steering: test_steering.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hand_weights import bert_weights, gpt2_weights, model_from_F, sym

from specalign.transformers.load import hf
from specalign.transformers.measure import directions, metrics
from specalign.transformers.measure import propagate as prop
from specalign.transformers.measure import sphere as S

torch.set_num_threads(1)


# --------------------------------------------------------------------------- sphere


def test_full_attention_update_matches_hand_computation():
    # F = diag(2, 1), x_1 = e1, x_2 = e2, eta = 1/2, A = 1/2 everywhere:
    # mean = (1/2, 1/2), F mean = (1, 1/2),
    # xt_1 = (1, 0) + (1/2)(1, 1/2) = (3/2, 1/4), xt_2 = (0, 1) + (1/2, 1/4) = (1/2, 5/4).
    F = np.diag([2.0, 1.0])
    X = np.eye(2)
    expect = np.array([[1.5, 0.25], [0.5, 1.25]])
    expect /= np.linalg.norm(expect, axis=1, keepdims=True)
    assert np.allclose(S.step(X, F, 0.5, attention="full"), expect, atol=1e-15)
    # two heads with F^1 + F^2 = F give the same update under full attention
    heads = np.stack([np.array([[1.5, 0.3], [0.0, 0.2]]), np.array([[0.5, -0.3], [0.0, 0.8]])])
    assert np.allclose(S.step(X, heads, 0.5, attention="full"), expect, atol=1e-15)

    # the same through simplified_forward (one head, non-causal)
    mw = model_from_F([F])
    out = prop.simplified_forward(mw, X[None], 0.5, attention="full")
    assert out.shape == (2, 1, 2, 2)
    assert np.allclose(out[1, 0], expect, atol=1e-14)
    # causal: A = [[1, 0], [1/2, 1/2]], so xt_1 = e1 + (1/2) F e1 = (2, 0) -> e1 and
    # xt_2 as above
    mw_c = model_from_F([F], causal=True)
    out_c = prop.simplified_forward(mw_c, X[None], 0.5, attention="full")
    assert np.allclose(out_c[1, 0], [[1.0, 0.0], expect[1]], atol=1e-14)


def test_softmax_step_multihead_and_trajectory():
    rng = np.random.default_rng(3)
    n, d, H = 6, 4, 3
    X = rng.standard_normal((n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Fh = rng.standard_normal((H, d, d))
    WQ, WK = rng.standard_normal((2, H, 2, d))
    # reference: explicit loops over heads and tokens
    ref = np.empty_like(X)
    for i in range(n):
        acc = X[i].copy()
        for h in range(H):
            s = np.array([0.7 * (WQ[h] @ X[i]) @ (WK[h] @ X[j]) for j in range(n)])
            a = np.exp(s - s.max())
            a /= a.sum()
            acc += 0.3 * sum(a[j] * Fh[h] @ X[j] for j in range(n))
        ref[i] = acc / np.linalg.norm(acc)
    assert np.allclose(S.step(X, Fh, 0.3, "softmax", W_QK=(WQ, WK), beta=0.7), ref, atol=1e-13)
    traj = S.simulate(X, Fh, 0.3, 5, "softmax", W_QK=(WQ, WK), beta=0.7)
    assert traj.shape == (6, n, d)
    assert np.allclose(traj[1], ref, atol=1e-13)
    assert np.allclose(np.linalg.norm(traj, axis=-1), 1.0)
    A = S.attention_matrices(X, H, "softmax", (WQ, WK), 0.7)
    assert A.shape == (H, n, n) and np.allclose(A.sum(-1), 1.0)


@pytest.mark.parametrize("k", [0, 2])
def test_tangent_jacobian_matches_closed_form(k):
    n, eta = 5, 0.4
    F = sym([1.0, 0.5, -0.2, -1.5], seed=1)
    lam, V = S.consensus_points(F)
    X = S.consensus_state(V[:, k], n)
    JT = S.tangent_jacobian(X, F, eta)
    d = F.shape[0]
    assert JT.shape == (n * d - n, n * d - n)
    num = np.sort_complex(np.linalg.eigvals(JT))
    closed = np.sort_complex(S.consensus_jacobian_eigenvalues(F, eta, k, n).astype(complex))
    assert np.allclose(num, closed, atol=1e-12)

    # The ambient derivative has the tangent eigenvalues plus n zeros (radial
    # directions), NOT the supplement's (1 - a + a^2)/(1 + a), a = eta lambda_k.
    ext = np.sort_complex(np.linalg.eigvals(S.extrinsic_jacobian(X, F, eta)))
    assert np.allclose(ext, np.sort_complex(np.concatenate([np.zeros(n), closed])), atol=1e-12)
    supp = S.supplement_consensus_eigenvalues(F, eta, k, n)
    a = eta * lam[k]
    assert np.isclose(supp[0], (1 - a + a * a) / (1 + a))
    assert not np.any(np.isclose(ext, supp[0], atol=1e-6))


def test_tangent_jacobian_nonsymmetric_real_spectrum():
    rng = np.random.default_rng(4)
    P = rng.standard_normal((4, 4))
    F = P @ np.diag([2.0, 1.0, 0.5, -0.3]) @ np.linalg.inv(P)
    n, eta = 3, 0.3
    _, V = S.consensus_points(F)
    for k in range(4):
        JT = S.tangent_jacobian(S.consensus_state(V[:, k], n), F, eta)
        num = np.sort_complex(np.linalg.eigvals(JT))
        closed = np.sort_complex(S.consensus_jacobian_eigenvalues(F, eta, k, n).astype(complex))
        assert np.allclose(num, closed, atol=1e-11)


def test_stability_under_step_size_condition():
    lam = [1.0, 0.5, -0.2, -3.0]  # -lambda_d > lambda_1: the bound 2/|l1 + ld| = 1 applies
    F = sym(lam, seed=2)
    assert S.stepsize_bound(F) == pytest.approx(1.0)
    _, V = S.consensus_points(F)
    n = 5

    def radius(k, eta):
        return S.spectral_radius(S.tangent_jacobian(S.consensus_state(V[:, k], n), F, eta))

    for eta in (0.3, 0.9):  # inside the bound: v1 stable, every other consensus unstable
        assert radius(0, eta) < 1
        assert all(radius(k, eta) > 1 for k in (1, 2, 3))
    assert radius(0, 1.1) > 1  # past the bound v1 loses stability (to v_d's 2-cycle)

    # and the dynamics agree: a perturbed principal consensus returns to it
    rng = np.random.default_rng(0)
    X = S.consensus_state(V[:, 0], n) + 0.05 * rng.standard_normal((n, 4))
    traj = S.simulate(X, F, 0.9, 300, "full")
    assert np.allclose(np.abs(traj[-1] @ V[:, 0]), 1.0, atol=1e-10)


def test_supplement_radial_eigenvalue_would_misjudge_stability():
    # eta lambda_1 = 3 > 2: the supplement's (1 - a + a^2)/(1 + a) = 7/4 > 1 would call
    # v1 unstable, but on the sphere every tangent eigenvalue is < 1 and v1 attracts.
    F = sym([3.0, 1.0, -0.5], seed=5)
    n, eta = 4, 1.0
    _, V = S.consensus_points(F)
    assert S.supplement_consensus_eigenvalues(F, eta, 0, n)[0] == pytest.approx(7 / 4)
    X = S.consensus_state(V[:, 0], n)
    assert S.spectral_radius(S.tangent_jacobian(X, F, eta)) < 1
    rng = np.random.default_rng(1)
    traj = S.simulate(X + 0.05 * rng.standard_normal(X.shape), F, eta, 100, "full")
    assert np.allclose(np.abs(traj[-1] @ V[:, 0]), 1.0, atol=1e-12)


def test_bipartite_consensus_small_perturbation_returns_large_escapes():
    """Figure 14: d = 3, n = 10, softmax attention, bipartite consensus along v1."""
    F = sym([1.0, 0.6, 0.3], seed=1)
    _, V = S.consensus_points(F)
    eta, beta, n1 = 0.5, 1.0, 6
    X = S.bipartite_state(V[:, 0], n1, 10 - n1)
    assert np.allclose(S.step(X, F, eta, "softmax", beta=beta), X, atol=1e-14)
    assert S.spectral_radius(S.tangent_jacobian(X, F, eta, "softmax", beta=beta)) < 1
    D = np.random.default_rng(5).standard_normal(X.shape)
    small = S.simulate(X + 0.01 * D, F, eta, 400, "softmax", beta=beta)
    assert np.allclose(small[-1], X, atol=1e-7)
    large = S.simulate(X + 1.0 * D, F, eta, 400, "softmax", beta=beta)
    c = large[-1] @ V[:, 0]
    assert np.allclose(np.abs(c), 1.0, atol=1e-7)
    assert np.all(np.sign(c) == np.sign(c[0]))  # consensus at one of +-v1, no longer bipartite


def test_shared_layer_gamma_rate_matches_power_method():
    lam = [1.0, 0.7, 0.4, 0.2, -0.1, -0.3]
    F = sym(lam, seed=6)
    eta = 0.5
    mw = model_from_F([F], n_heads=2, layer_block=np.zeros(12, dtype=int))
    assert mw.shared
    rng = np.random.default_rng(7)
    X0 = rng.standard_normal((3, 5, 6))
    T = 60  # prolonged: 12 real layers repeated
    states = prop.simplified_forward(mw, X0, eta, attention="full", n_layers=T)
    assert states.shape == (T + 1, 3, 5, 6)
    ds = metrics.propagation_metrics(mw, {"simplified_full": states}, n_null_draws=2)
    gamma = ds["gamma"].sel(mode="simplified_full").values  # (layer, token)
    measured = S.measured_convergence_rate(gamma, tail=0.5)
    predicted = S.convergence_rate_prediction(F, eta)
    assert predicted == pytest.approx(1.35 / 1.5)
    assert S.asymptotic_rate(F, eta, n=5) == pytest.approx(predicted)
    assert measured == pytest.approx(predicted, abs=5e-3)
    assert gamma[-1].min() > 0.99


# --------------------------------------------------------------------------- real models


def test_bert_attention_sublayer_matches_hook(tiny_bert):
    mw = bert_weights(tiny_bert)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    captured = {}
    hooks = [
        layer.attention.output.dense.register_forward_hook(
            lambda m, i, o, ell=ell: captured.__setitem__(ell, o.detach().numpy().copy())
        )
        for ell, layer in enumerate(tiny_bert.encoder.layer)
    ]
    with torch.no_grad():
        out = tiny_bert(input_ids=ids, output_hidden_states=True)
    for h in hooks:
        h.remove()
    for ell in range(mw.n_layers):
        X = out.hidden_states[ell].numpy()
        rec = prop.attention_sublayer(mw, ell, X)
        assert np.abs(rec - captured[ell]).max() < 1e-10
        assert np.abs(captured[ell]).max() > 0.1  # not a vacuous comparison


def test_gpt2_attention_sublayer_matches_hook(tiny_gpt2):
    model = tiny_gpt2.transformer
    mw = gpt2_weights(model)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    captured, inputs = {}, {}
    hooks = []
    for ell, blk in enumerate(model.h):
        hooks.append(
            blk.attn.register_forward_hook(
                lambda m, i, o, ell=ell: captured.__setitem__(ell, o[0].detach().numpy().copy())
            )
        )
        hooks.append(
            blk.register_forward_pre_hook(
                lambda m, args, kwargs, ell=ell: inputs.__setitem__(
                    ell, (args[0] if args else kwargs["hidden_states"]).detach().numpy().copy()
                ),
                with_kwargs=True,
            )
        )
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    for ell in range(mw.n_layers):
        rec = prop.attention_sublayer(mw, ell, inputs[ell])
        assert np.abs(rec - captured[ell]).max() < 1e-10
        A = prop.attention_weights(mw, ell, inputs[ell])
        assert np.allclose(np.triu(A, 1), 0.0) and np.allclose(A.sum(-1), 1.0)
        assert A.max() > 0.5  # far from uniform: the test exercises the softmax


def test_real_forward_hidden_states(tiny_gpt2, gpt2_dir):
    ids = np.random.default_rng(0).integers(0, 64, (2, 5))
    hs = hf.real_forward_hidden_states(gpt2_dir, ids, dtype=torch.float64)
    assert hs.shape == (3, 2, 5, 32) and hs.dtype == np.float64
    last = {}
    h = tiny_gpt2.transformer.h[-1].register_forward_hook(
        lambda m, i, o: last.__setitem__("x", (o[0] if isinstance(o, tuple) else o).numpy())
    )
    with torch.no_grad():
        tiny_gpt2.transformer(input_ids=torch.as_tensor(ids))
    h.remove()
    # float32 checkpoint on disk: agreement to float32 precision; residual stream, no ln_f
    assert np.allclose(hs[-1], last["x"], atol=1e-5)
    normed = hf.real_forward_hidden_states(gpt2_dir, ids, dtype=torch.float64, final_norm=True)
    assert not np.allclose(normed[-1], hs[-1], atol=1e-3)
    assert np.allclose(normed[:-1], hs[:-1])


# --------------------------------------------------------------------------- metrics


def test_metrics_hand_made_example():
    d = 4
    F = np.diag([2.0, 1.0, 0.5, -3.0])
    mw = model_from_F([F, F], layer_block=[0, 1])
    e = np.eye(d)
    # tokens exactly at v1 = e1 in every state: gamma = 1, psi = 0, rho = 0, distance 0
    at_v1 = np.broadcast_to(e[0], (3, 2, 3, d)).copy()
    # second run: the tokens start on e2 and jump to e1 at layer 1, so psi_1 = 1, rho_1 = 1
    jump = at_v1.copy()
    jump[0] = e[1]
    ds = metrics.propagation_metrics(mw, {"a": at_v1, "b": jump}, n_null_draws=4)
    assert ds.sizes == {"mode": 2, "layer": 2, "token": 6, "prompt": 2, "state": 3}
    assert np.allclose(ds["gamma"].sel(mode="a"), 1.0)
    assert np.allclose(ds["psi"].sel(mode="a"), 0.0)
    assert np.allclose(ds["rho"].sel(mode="a"), 0.0)
    assert np.allclose(ds["token_distance"].sel(mode="a"), 0.0)
    assert np.allclose(ds["psi"].sel(mode="b", layer=1), 1.0)
    assert ds["rho"].sel(mode="b", layer=1) == 1.0 and ds["rho_mean"].sel(mode="b", layer=1) == 1
    assert np.allclose(ds["gamma_v2"].sel(mode="a"), 0.0)  # v2 = e2 is orthogonal
    assert np.allclose(ds["gamma_neg_null"].sel(mode="a"), 0.0)  # v_neg = e4
    assert np.allclose(ds["lambda_v1"], 2.0) and np.allclose(ds["lambda_neg"], -3.0)
    assert list(ds["token_prompt"].values) == [0, 0, 0, 1, 1, 1]
    assert list(ds["token_position"].values) == [0, 1, 2, 0, 1, 2]
    nulls = [v for v in ds.data_vars if v.endswith("_null")]
    assert {"gamma_null", "psi_null", "rho_null", "gamma_neg_null", "psi_neg_null",
            "rho_neg_null", "gamma_mean_null", "rho_mean_neg_null"} <= set(nulls)  # fmt: skip
    assert ds["gamma_null"].dims == ("mode", "layer", "token")
    assert ds["rho_null"].dims == ("mode", "layer")

    # random states: rho in [0, 1], pearson and cosine both available and different
    rng = np.random.default_rng(0)
    R = rng.standard_normal((3, 4, 5, d)) + 0.7  # a common offset separates the two
    cos = metrics.propagation_metrics(mw, {"r": R}, corr="cosine", n_null_draws=3)
    pea = metrics.propagation_metrics(mw, {"r": R}, corr="pearson", n_null_draws=3)
    for ds_ in (cos, pea):
        for v in ("rho", "rho_mean", "rho_null", "rho_neg_null"):
            assert ((ds_[v] >= 0) & (ds_[v] <= 1)).all()
        assert ((ds_["gamma"] >= 0) & (ds_["gamma"] <= 1)).all()
    assert cos.attrs["corr"] == "cosine" and pea.attrs["corr"] == "pearson"
    assert not np.allclose(cos["gamma"], pea["gamma"])
    Xc = R[1] - R[1].mean(-1, keepdims=True)
    v1c = e[0] - 0.25
    ref = np.abs(Xc @ v1c) / (np.linalg.norm(Xc, axis=-1) * np.linalg.norm(v1c))
    assert np.allclose(pea["gamma"].sel(layer=1, mode="r"), ref.reshape(-1))
    # corr_proj: span(v1) alone reproduces gamma under cosine; span(v1, v2) gives >= gamma
    one = metrics.propagation_metrics(mw, {"r": R}, proj="v1", n_null_draws=1)
    assert np.allclose(one["corr_proj"], one["gamma"])
    assert (cos["corr_proj"] >= cos["gamma"] - 1e-12).all()
    # Figure 4 distance: e1, e2, -e1 (any scale) -> mean of sqrt2, 2, sqrt2
    tri = np.array([[3.0, 0, 0, 0], [0, 0.5, 0, 0], [-1.0, 0, 0, 0]])
    assert metrics.token_distance(tri) == pytest.approx((2 * np.sqrt(2) + 2) / 3)


def test_principal_directions_complex_leading_pair():
    # leading pair 2 +- 1i in the (e1, e2) plane, then real 1.5 and -2
    F = np.zeros((4, 4))
    F[:2, :2] = [[2.0, -1.0], [1.0, 2.0]]
    F[2, 2], F[3, 3] = 1.5, -2.0
    pdir = directions.principal_directions(F)
    assert pdir["lambda1_is_complex"]
    assert np.allclose(np.abs(pdir["v1"]), [0, 0, 1, 0]) and pdir["lambda_v1"] == 1.5
    assert np.allclose(np.abs(pdir["v_neg"]), [0, 0, 0, 1]) and pdir["lambda_neg"] == -2.0
    # v2 is the second *real* eigenvector: here the only other real one, e4
    assert np.allclose(np.abs(pdir["v2"]), [0, 0, 0, 1]) and pdir["lambda_v2"] == -2.0
    B = pdir["top2_basis"]
    assert np.allclose(B @ B.T, np.diag([1.0, 1.0, 0.0, 0.0]), atol=1e-12)  # the rotation plane


def test_random_direction_null_level_high_dimension():
    d = 400
    F = np.diag(np.linspace(1.0, -1.0, d))
    mw = model_from_F([F])
    rng = np.random.default_rng(1)
    states = rng.standard_normal((2, 10, 20, d))
    ds = metrics.propagation_metrics(mw, {"random": states}, n_null_draws=8, seed=3)
    expect = np.sqrt(2 / (np.pi * d))
    assert float(ds["gamma_null"].mean()) == pytest.approx(expect, rel=0.1)
    assert float(ds["gamma"].mean()) == pytest.approx(expect, rel=0.25)  # v1 is random too
    assert np.isfinite(ds["gamma_neg_null"]).all()
    assert 0.3 < float(ds["rho_null"].mean()) < 0.7


def test_real_attention_reduces_to_full_with_zero_queries():
    # W_Q = W_K = 0: uniform softmax scores, so "real" must equal "full" (causal too),
    # and a GPT-Neo "local" window restricts the keys
    rng = np.random.default_rng(2)
    F = sym([1.0, 0.5, 0.1, -0.4], seed=3)
    X0 = rng.standard_normal((2, 5, 4))
    for causal in (False, True):
        mw = model_from_F([F, F], n_heads=2, causal=causal, layer_block=[0, 1])
        for blk in mw.blocks:
            blk.W_Q[:] = 0.0
            blk.W_K[:] = 0.0
        real = prop.simplified_forward(mw, X0, 0.3, attention="real")
        full = prop.simplified_forward(mw, X0, 0.3, attention="full")
        assert np.allclose(real, full, atol=1e-14)
    mw = model_from_F([F], causal=True, kinds=["local"], window=2, family="gpt_neo")
    A = prop.attention_weights(mw, 0, X0)
    i, j = np.indices((5, 5))
    assert np.all(A[..., (j > i) | (i - j >= 2)] == 0.0)
    assert np.allclose(A.sum(-1), 1.0)


def test_prompts():
    ids = hf.random_prompts(50, 4, 6, seed=1, special_ids_to_avoid=[0, 1, 2, 49])
    assert ids.shape == (4, 6) and ids.dtype == np.int64
    assert not np.isin(ids, [0, 1, 2, 49]).any() and ids.max() < 50
    assert np.array_equal(ids, hf.random_prompts(50, 4, 6, 1, [0, 1, 2, 49]))

    def tok(text, add_special_tokens=False):
        return {"input_ids": [len(w) for w in text.split()]}

    out = hf.text_prompts(tok, ["a bb ccc dddd", "short one", "", "x yy zzz w v"], 4)
    assert out.tolist() == [[1, 2, 3, 4], [1, 2, 3, 1]]
    with pytest.raises(ValueError):
        hf.text_prompts(tok, ["a b"], 3)


def test_prompt_lines_end_at_line_feeds_only(tmp_path: Path) -> None:
    """Issue 29: one prompt per line, whatever Unicode separators a line holds (U+2028
    and the others str.splitlines ends lines at split one prompt into two), and line
    ends as written on any system."""
    inside = ["\u2028", "\u2029", "\x85", "\x0c", "\x0b", "\x1c", "\x1d", "\x1e"]
    lines = [f"one {sep} prompt" for sep in inside] + ["last line"]
    for end in ("\n", "\r\n", "\r"):
        path = tmp_path / "prompts.txt"
        path.write_bytes(end.join(lines).encode("utf-8"))
        assert hf.prompt_lines(path) == lines, repr(end)
    path.write_bytes(b"a b c\n\nd e f\n")
    assert hf.prompt_lines(path) == ["a b c", "", "d e f", ""]


@pytest.mark.parametrize("corr", ["cosine", "pearson"])
def test_metrics_equal_direct_correlations(corr):
    """The metrics' fast path (norms computed once per mode) equals the plain definition
    |corr(x_i, v1_t)| and psi_t = gamma_t - |corr(x_i^{t-1}, v1_t)|, for tokens and nulls."""
    from specalign.transformers.measure.directions import layer_directions
    from specalign.transformers.measure.metrics import correlation, propagation_metrics
    from specalign.transformers.measure.propagate import simplified_forward

    rng = np.random.default_rng(3)
    mw = model_from_F([sym([2.0, 1.0, 0.5, -1.0]), sym([1.5, -0.5, 0.2, 0.1], seed=1)])
    X0 = rng.standard_normal((3, 4, 4))
    S = simplified_forward(mw, X0, 0.5, attention="full")
    ds = propagation_metrics(mw, {"m": S}, corr=corr, n_null_draws=2, seed=0)
    v1 = layer_directions(mw)["v1"]
    for t in range(2):
        after = np.abs(correlation(S[t + 1], v1[t], corr)).reshape(-1)
        before = np.abs(correlation(S[t], v1[t], corr)).reshape(-1)
        np.testing.assert_allclose(ds["gamma"].values[0, t], after, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(ds["psi"].values[0, t], after - before, rtol=1e-10, atol=1e-13)
        mean_tok = np.abs(correlation(S[t + 1].mean(axis=1), v1[t], corr))
        np.testing.assert_allclose(ds["gamma_mean"].values[0, t], mean_tok, rtol=1e-12)
