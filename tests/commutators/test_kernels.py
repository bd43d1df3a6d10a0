"""Tests for the ReLU commutator kernels (specalign.commutators, paper Secs. 3-5, 9, 10).

Reduced (co-activation) forms are compared with literal per-sample loops, the exact
identities are checked on random and trained networks, every normalisation is
checked on a hand-worked 2x2 case, and the Sec. 9 closed forms are compared with
Monte Carlo estimates that run through the production kernels.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from specalign.commutators.measure import analytic
from specalign.commutators.measure.defects import (
    G_D,
    G_Q,
    G_S,
    Qbar,
    Sbar,
    coactivation,
    commutator,
    frob2,
    gate_energy,
    gate_energy_pointwise,
    residual,
    safe_divide,
)
from specalign.commutators.measure.diagnostics import (
    LAYER_KEYS,
    LOCAL_KEYS,
    VARIABLE_INFO,
    VARIABLES,
    evaluate,
)
from specalign.commutators.measure.localize import (
    localized_energy,
    localized_energy_gate,
    localized_energy_rank_one,
    relative_gaps,
    reliable_boundaries,
    spectral_decomposition,
)
from specalign.commutators.measure.network import forward
from specalign.commutators.measure.recursion import four_sources, source_geometry

KBETA = ((1, 0), (2, 1))
NORMALISED = (
    "G_D", "G_Q", "G_S", "G_D_train", "G_Q_train", "G_S_train",
    "e_tr", "e_imb", "e_fluc", "e_gate", "rho_tr_imb",
    "I_tr_imb", "I_tr_fluc", "I_tr_gate", "I_imb_fluc", "I_imb_gate", "I_fluc_gate",
    "chi", "q_D", "q_Q_av", "q_Q_pt", "q_S_av", "q_S_pt",
)  # fmt: skip


def random_net(widths, rng, batch=()):
    return [
        rng.standard_normal((*batch, widths[i + 1], widths[i])) * np.sqrt(2.0 / widths[i])
        for i in range(len(widths) - 1)
    ]


def evaluate_quiet(*args, **kwargs):
    """``evaluate`` with every numpy warning turned into an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(all="raise"):
            return evaluate(*args, **kwargs)


# --------------------------------------------------------------------------------------
# Brute force: literal per-sample matrices, no co-activation shortcuts.
# --------------------------------------------------------------------------------------


def brute_pass(Ws, X):
    """Per-sample gate matrices D_l(x), sensitivities g_l(x) (Jacobian products), outputs."""
    L = len(Ws)
    D = [[] for _ in range(L - 1)]
    g = [[] for _ in range(L)]
    F = []
    for x in X:
        a = x
        Dx = []
        for l in range(L - 1):
            z = Ws[l] @ a
            Dl = np.diag((z > 0).astype(float))
            Dx.append(Dl)
            a = Dl @ z
        F.append((Ws[-1] @ a)[0])
        for l in range(L - 1):
            D[l].append(Dx[l])
        # g_l^T = W_{L-1} D_{L-2} W_{L-2} ... D_l W_l
        J = Ws[-1].copy()
        g[L - 1].append(J[0].copy())
        for l in range(L - 2, -1, -1):
            J = J @ Dx[l] @ Ws[l]
            g[l].append(J[0].copy())
    return [np.array(v) for v in D], [np.array(v) for v in g], np.array(F)


def brute_layers(Ws, X, kbeta=KBETA):
    """All layer quantities from literal per-sample loops (Secs. 3-5)."""
    D, g, _ = brute_pass(Ws, X)
    H = len(Ws) - 1
    res = {}
    C_next = np.zeros((1, 1))
    for l in range(H - 1, -1, -1):
        W, Wn = Ws[l], Ws[l + 1]
        P = W @ W.T
        NFM = W.T @ W
        Dl = D[l]
        S_next = np.array([np.outer(v, v) for v in g[l + 1]])
        S_l = np.array([np.outer(v, v) for v in g[l]])
        Q = np.array([Dx @ Sx @ Dx for Dx, Sx in zip(Dl, S_next, strict=True)])
        Qb, Sb_next, Sb = Q.mean(0), S_next.mean(0), S_l.mean(0)
        Delta = P - Wn.T @ Wn
        C_int = commutator(Qb, P)
        T_tr = np.mean([Dx @ Wn.T @ C_next @ Wn @ Dx for Dx in Dl], axis=0)
        T_imb = np.mean([Dx @ commutator(Sb_next, Delta) @ Dx for Dx in Dl], axis=0)
        T_fluc = commutator(
            np.mean([Dx @ (Sx - Sb_next) @ Dx for Dx, Sx in zip(Dl, S_next, strict=True)], 0),
            P,
        )
        T_gate = np.mean(
            [Dx @ Sb_next @ commutator(Dx, P) + commutator(Dx, P) @ Sb_next @ Dx for Dx in Dl],
            axis=0,
        )
        gate_E = np.mean([frob2(commutator(Dx, P)) for Dx in Dl])
        lamP, UP = np.linalg.eigh(P)
        UP = UP[:, ::-1]
        lamN, UN = np.linalg.eigh(NFM)
        UN = UN[:, ::-1]
        loc = {key: [] for key in ("q_D", "q_Q_av", "q_Q_pt", "q_S_av", "q_S_pt")}
        for k, beta in kbeta:
            Pi = UP[:, :k] @ UP[:, :k].T
            Pp = UP[:, k + beta :] @ UP[:, k + beta :].T
            Ni = UN[:, :k] @ UN[:, :k].T
            Np = UN[:, k + beta :] @ UN[:, k + beta :].T
            loc["q_D"].append(np.mean([frob2(Pi @ Dx @ Pp) for Dx in Dl]))
            loc["q_Q_av"].append(frob2(Pi @ Qb @ Pp))
            loc["q_Q_pt"].append(np.mean([frob2(Pi @ Qx @ Pp) for Qx in Q]))
            # An empty perp block has no localised energy (NaN, not 0).
            s_ok = 1.0 if k + beta < NFM.shape[0] else np.nan
            loc["q_S_av"].append(s_ok * frob2(Ni @ Sb @ Np))
            loc["q_S_pt"].append(s_ok * np.mean([frob2(Ni @ Sx @ Np) for Sx in S_l]))
        res[l] = dict(
            P=P, NFM=NFM, Qbar=Qb, Sbar=Sb, Sbar_next=Sb_next, C_int=C_int,
            T_tr=T_tr, T_imb=T_imb, T_fluc=T_fluc, T_gate=T_gate, gate_energy=gate_E,
            C_feat=commutator(Sb, NFM), **loc,
        )  # fmt: skip
        C_next = C_int
    return res


# --------------------------------------------------------------------------------------
# Forward pass and reduced forms against brute force
# --------------------------------------------------------------------------------------


def test_forward_matches_brute_force_and_finite_differences():
    rng = np.random.default_rng(0)
    Ws = random_net([3, 5, 4, 6, 1], rng)
    X = rng.standard_normal((9, 3))
    fw = forward(Ws, X)
    D, g, F = brute_pass(Ws, X)
    np.testing.assert_allclose(fw.F, F, rtol=1e-13, atol=1e-14)
    for l in range(3):
        np.testing.assert_array_equal(fw.d[l], np.array([np.diag(Dx) for Dx in D[l]]))
    for l in range(4):
        np.testing.assert_allclose(fw.g[l], g[l], rtol=1e-13, atol=1e-14)
        assert fw.a[l].shape == (9, [3, 5, 4, 6][l])
    # g_0 = dF/dx; ReLU nets are piecewise linear, so a small central difference is exact
    # up to round-off unless a kink lies within h.
    h = 1e-6
    for i in range(3):
        e = np.zeros(3)
        e[i] = h
        fd = (forward(Ws, X + e).F - forward(Ws, X - e).F) / (2 * h)
        np.testing.assert_allclose(fd, fw.g[0][:, i], atol=1e-7)


def test_gate_uses_strict_inequality():
    # sigma'(0) = 0: a preactivation exactly at 0 closes the gate.
    Ws = [np.array([[1.0, -1.0], [1.0, 0.0]]), np.array([[1.0, 1.0]])]
    fw = forward(Ws, np.array([[1.0, 1.0]]))
    np.testing.assert_array_equal(fw.d[0], [[0.0, 1.0]])


@pytest.mark.parametrize("seed", [1, 2])
def test_reduced_forms_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    Ws = random_net([3, 5, 4, 6, 1], rng)
    X = rng.standard_normal((11, 3))
    fw = forward(Ws, X)
    brute = brute_layers(Ws, X)
    C_next = None
    for l in range(2, -1, -1):
        b = brute[l]
        d, gn = fw.d[l], fw.g[l + 1]
        p = coactivation(d)
        A = rng.standard_normal(b["P"].shape)
        np.testing.assert_allclose(A * p, np.mean([np.diag(r) @ A @ np.diag(r) for r in d], 0))
        np.testing.assert_allclose(gate_energy(b["P"], p), b["gate_energy"], rtol=1e-12)
        np.testing.assert_allclose(
            gate_energy_pointwise(b["P"], d),
            [frob2(commutator(np.diag(r), b["P"])) for r in d],
            rtol=1e-12,
            atol=1e-13,
        )
        np.testing.assert_allclose(Qbar(d, gn), b["Qbar"], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(Sbar(fw.g[l]), b["Sbar"], rtol=1e-12, atol=1e-14)
        src = four_sources(Ws[l], Ws[l + 1], d, gn, C_next)
        for name in ("T_tr", "T_imb", "T_fluc", "T_gate", "C_int"):
            np.testing.assert_allclose(
                getattr(src, name), b[name], rtol=1e-11, atol=1e-13, err_msg=name
            )
        C_next = src.C_int

        lamP, UP = spectral_decomposition(b["P"])
        lamN, UN = spectral_decomposition(b["NFM"])
        for j, (k, beta) in enumerate(KBETA):
            got = {
                "q_D": localized_energy_gate(p, UP, k, beta),
                "q_Q_av": localized_energy(b["Qbar"], UP, k, beta),
                "q_Q_pt": localized_energy_rank_one(d * gn, UP, k, beta),
                "q_S_av": localized_energy(b["Sbar"], UN, k, beta),
                "q_S_pt": localized_energy_rank_one(fw.g[l], UN, k, beta),
            }
            for key, value in got.items():
                np.testing.assert_allclose(value, b[key][j], rtol=1e-11, atol=1e-14, err_msg=key)


def test_evaluate_matches_brute_force():
    rng = np.random.default_rng(3)
    Ws = random_net([3, 5, 4, 6, 1], rng)
    Xtr, Xev = rng.standard_normal((12, 3)), rng.standard_normal((10, 3))
    out = evaluate_quiet(Ws, Xtr, Xev, kbeta=KBETA, gap_threshold=0.0)
    btr, bev = brute_layers(Ws, Xtr), brute_layers(Ws, Xev)
    for l in range(3):
        for key, b in (("G_D", bev), ("G_D_train", btr)):
            np.testing.assert_allclose(out[key][l], b[l]["gate_energy"] / frob2(b[l]["P"]))
        for key, b in (("G_Q", bev), ("G_Q_train", btr)):
            ref = frob2(b[l]["C_int"]) / (np.linalg.norm(b[l]["Qbar"], 2) ** 2 * frob2(b[l]["P"]))
            np.testing.assert_allclose(out[key][l], ref, rtol=1e-12)
        for key, b in (("G_S", bev), ("G_S_train", btr)):
            ref = frob2(b[l]["C_feat"]) / (
                np.linalg.norm(b[l]["Sbar"], 2) ** 2 * frob2(b[l]["NFM"])
            )
            np.testing.assert_allclose(out[key][l], ref, rtol=1e-12)
        for nu in ("tr", "imb", "fluc", "gate"):
            np.testing.assert_allclose(
                out[f"E_{nu}"][l], frob2(btr[l][f"T_{nu}"]), rtol=1e-10, atol=1e-28
            )
        for key in ("q_D", "q_Q_av", "q_Q_pt", "q_S_av", "q_S_pt"):
            np.testing.assert_allclose(out[key][l], btr[l][key], rtol=1e-11, atol=1e-14)


# --------------------------------------------------------------------------------------
# Exact identities
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("widths", [[4, 8, 8, 1], [3, 6, 9, 5, 7, 1], [5, 3, 1]])
def test_identities_on_random_nets(widths):
    rng = np.random.default_rng(len(widths))
    Ws = random_net(widths, rng, batch=(4,))
    out = evaluate_quiet(
        Ws, rng.standard_normal((64, widths[0])), rng.standard_normal((32, widths[0]))
    )
    assert np.all(out["res_recursion"] < 1e-13)
    assert np.all(out["res_transport"] < 1e-13)


def test_recursion_check_can_fail():
    # Feeding a wrong downstream commutator must show up in the residual: the check
    # is not closed by construction.
    rng = np.random.default_rng(4)
    Ws = random_net([3, 6, 6, 1], rng)
    fw = forward(Ws, rng.standard_normal((40, 3)))
    top = four_sources(Ws[1], Ws[2], fw.d[1], fw.g[2], None)
    good = four_sources(Ws[0], Ws[1], fw.d[0], fw.g[1], top.C_int)
    bad = four_sources(Ws[0], Ws[1], fw.d[0], fw.g[1], 1.5 * top.C_int)
    assert good.recursion_residual() < 1e-14
    assert bad.recursion_residual() > 1e-3


def test_evaluate_warns_when_an_identity_breaks(monkeypatch):
    import dataclasses

    import specalign.commutators.measure.diagnostics as diagnostics

    def broken(*args):
        src = four_sources(*args)
        return dataclasses.replace(src, T_gate=1.01 * src.T_gate)

    monkeypatch.setattr(diagnostics, "four_sources", broken)
    rng = np.random.default_rng(15)
    X = rng.standard_normal((30, 3))
    with pytest.warns(RuntimeWarning, match="exact identity"):
        out = evaluate(random_net([3, 5, 5, 1], rng), X, X)
    assert np.all(out["res_recursion"] > 1e-6)


def train_relu_net(widths, X, y, steps, lr, rng):
    """Full-batch gradient descent on the half mean-squared error (tiny numpy loop)."""
    Ws = random_net(widths, rng)
    risks = []
    for _ in range(steps):
        fw = forward(Ws, X)
        r = fw.F - y
        risks.append(0.5 * np.mean(r**2))
        # dF/dW_l = (d_l * g_{l+1}) a_l^T per sample; dF/dW_{L-1} = a_{L-1}^T.
        grads = [
            ((r[:, None] * fw.d[l] * fw.g[l + 1]).T @ fw.a[l]) / len(y) for l in range(len(Ws) - 1)
        ]
        grads.append((r @ fw.a[-1])[None, :] / len(y))
        Ws = [W - lr * G for W, G in zip(Ws, grads, strict=True)]
    return Ws, np.array(risks)


def test_identities_on_trained_net():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((64, 2))
    # Target of paper eq. (10.1).
    x1, x2 = X[:, 0], X[:, 1]
    y = 0.8 * np.maximum(x1 + 0.6 * x2, 0) - 0.6 * np.maximum(-0.7 * x1 + x2, 0) + 0.25 * x1
    Ws, risks = train_relu_net([2, 10, 10, 10, 1], X, y, steps=400, lr=0.05, rng=rng)
    assert risks[-1] < 0.2 * risks[0]
    out = evaluate_quiet(Ws, X, rng.standard_normal((128, 2)), kbeta=KBETA)
    assert np.all(out["res_recursion"] < 1e-12)
    assert np.all(out["res_transport"] < 1e-12)
    for key in ("G_D", "G_Q", "G_S", "chi", "e_imb"):
        assert np.all(np.isfinite(out[key])), key
    np.testing.assert_allclose(
        out["e_tr"] + out["e_imb"] + out["e_fluc"] + out["e_gate"], 1.0, rtol=1e-12
    )
    # ||C_int||^2 = sum E + sum of interactions (Sec. 4 energy expansion).
    total = out["E_tr"] + out["E_imb"] + out["E_fluc"] + out["E_gate"]
    inter = sum(out[k] for k in LAYER_KEYS if k.startswith("I_"))
    np.testing.assert_allclose(out["C_int_norm"] ** 2, total * (1 + inter), rtol=1e-10)


# --------------------------------------------------------------------------------------
# Hand-worked 2x2 cases of every normalisation
# --------------------------------------------------------------------------------------


def test_hand_G_D_through_evaluate():
    # W_0 = [[1,1],[1,0]] gives P = [[2,1],[1,1]], ||P||_F^2 = 4+1+1+1 = 7.
    # x = (-1,2): z = (1,-1), D = diag(1,0): [D,P] = [[0,1],[-1,0]], ||.||^2 = 2.
    # x = (1,1):  z = (2, 1), D = I:        [D,P] = 0.
    # G_D = mean(2, 0) / 7 = 1/7.  Equivalently p = [[1,.5],[.5,.5]] and
    # sum_ij P_ij^2 (p_ii + p_jj - 2 p_ij) = 2 * 1 * (1 + .5 - 1) = 1.
    Ws = [np.array([[1.0, 1.0], [1.0, 0.0]]), np.array([[1.0, 1.0]])]
    X = np.array([[-1.0, 2.0], [1.0, 1.0]])
    out = evaluate_quiet(Ws, X, X)
    assert out["G_D"].shape == (1,)
    np.testing.assert_allclose(out["G_D"], [1 / 7], rtol=1e-15)
    np.testing.assert_allclose(out["G_D_train"], [1 / 7], rtol=1e-15)
    P = Ws[0] @ Ws[0].T
    p = np.array([[1.0, 0.5], [0.5, 0.5]])
    np.testing.assert_allclose(coactivation(forward(Ws, X).d[0]), p)
    np.testing.assert_allclose(G_D(P, p), 1 / 7, rtol=1e-15)


def test_hand_G_Q_and_G_S():
    # G_Q: Qbar = [[1,1],[1,1]], P = diag(1,0).  [Q,P] = QP - PQ = [[0,-1],[1,0]],
    # ||.||_F^2 = 2; ||Q||_op = 2 (eigenvalues 2, 0); ||P||_F^2 = 1  ->  2 / (4 * 1) = 1/2.
    np.testing.assert_allclose(G_Q(np.ones((2, 2)), np.diag([1.0, 0.0])), 0.5, rtol=1e-15)
    # G_S: Sbar = diag(2,1), NFM = [[1,1],[1,1]].  [S,N] = [[0,1],[-1,0]], ||.||^2 = 2;
    # ||S||_op^2 = 4, ||N||_F^2 = 4  ->  2 / 16 = 1/8.
    np.testing.assert_allclose(G_S(np.diag([2.0, 1.0]), np.ones((2, 2))), 0.125, rtol=1e-15)
    # Zero normalisers are NaN, never 0.
    assert np.isnan(G_Q(np.zeros((2, 2)), np.eye(2)))
    assert np.isnan(G_S(np.eye(2), np.zeros((2, 2))))
    assert np.isnan(G_D(np.zeros((2, 2)), np.eye(2)))


def test_hand_source_geometry():
    # T_tr = [[1,0],[0,0]], T_imb = [[-1,0],[0,1]], T_fluc = [[0,1],[1,0]], T_gate = diag(0,2).
    # E = (1, 2, 2, 4), sum E = 9  ->  e = (1/9, 2/9, 2/9, 4/9).
    # <tr,imb> = -1, <imb,gate> = 2, all other pairs 0:
    #   rho = -1 / (1 * sqrt 2);  I_tr_imb = -2/9;  I_imb_gate = 4/9.
    # C = sum = [[0,1],[1,3]], ||C|| = sqrt 11; sum ||T|| = 1 + sqrt2 + sqrt2 + 2
    #   -> chi = sqrt(11) / (3 + 2 sqrt 2).  Check: ||C||^2 = 9 + 9 * (-2/9 + 4/9) = 11.
    T = {
        "tr": np.array([[1.0, 0.0], [0.0, 0.0]]),
        "imb": np.array([[-1.0, 0.0], [0.0, 1.0]]),
        "fluc": np.array([[0.0, 1.0], [1.0, 0.0]]),
        "gate": np.array([[0.0, 0.0], [0.0, 2.0]]),
    }
    geo = source_geometry(T)
    expect = {
        "E_tr": 1, "E_imb": 2, "E_fluc": 2, "E_gate": 4,
        "e_tr": 1 / 9, "e_imb": 2 / 9, "e_fluc": 2 / 9, "e_gate": 4 / 9,
        "rho_tr_imb": -1 / np.sqrt(2),
        "I_tr_imb": -2 / 9, "I_tr_fluc": 0, "I_tr_gate": 0,
        "I_imb_fluc": 0, "I_imb_gate": 4 / 9, "I_fluc_gate": 0,
        "C_int_norm": np.sqrt(11), "chi": np.sqrt(11) / (3 + 2 * np.sqrt(2)),
    }  # fmt: skip
    assert set(geo) == set(expect)
    for key, value in expect.items():
        np.testing.assert_allclose(geo[key], value, rtol=1e-15, atol=1e-16, err_msg=key)
    # All-zero sources: every ratio NaN; zero transport alone: rho NaN.
    zero = source_geometry({k: np.zeros((2, 2)) for k in T})
    for key in ("e_tr", "e_imb", "e_fluc", "e_gate", "rho_tr_imb", "I_tr_imb", "chi"):
        assert np.isnan(zero[key]), key
    assert np.isnan(source_geometry({**T, "tr": np.zeros((2, 2))})["rho_tr_imb"])


def test_hand_localized_energies_and_gaps():
    # P = [[2,1],[1,2]]: lambda = (3, 1), u_1 = (1,1)/sqrt2, u_2 = (1,-1)/sqrt2.
    # Relative gap at j = 1: (3 - 1)/3 = 2/3 (both boundaries coincide for beta = 0).
    P = np.array([[2.0, 1.0], [1.0, 2.0]])
    lam, U = spectral_decomposition(P)
    np.testing.assert_allclose(lam, [3.0, 1.0])
    gk, gkb = relative_gaps(lam, 1, 0)
    np.testing.assert_allclose([gk, gkb], [2 / 3, 2 / 3])
    # Gates d = (1,0) and (1,1): u_1^T diag(1,0) u_2 = 1/2 -> energy 1/4; D = I gives 0.
    # q_D = (1/4 + 0)/2 = 1/8; via p = [[1,.5],[.5,.5]] and <p, Pi o Pi_perp>.
    p = np.array([[1.0, 0.5], [0.5, 0.5]])
    np.testing.assert_allclose(localized_energy_gate(p, U, 1, 0), 1 / 8, rtol=1e-14)
    # Rank one Q = q q^T with q = (1, 0): ||Pi q||^2 ||Pi_perp q||^2 = 1/2 * 1/2 = 1/4.
    np.testing.assert_allclose(
        localized_energy_rank_one(np.array([[1.0, 0.0]]), U, 1, 0), 0.25, rtol=1e-14
    )
    # Averaged operator A = diag(1, 0): (u_1^T A u_2)^2 = 1/4.
    np.testing.assert_allclose(localized_energy(np.diag([1.0, 0.0]), U, 1, 0), 0.25, rtol=1e-14)
    # 3x3 buffer: P = diag(4,2,1), (k,beta) = (1,1): Pi = e1 e1^T, Pi_perp = e3 e3^T,
    # energy = A_13^2; gaps (4-2)/4 = 1/2 and (2-1)/4 = 1/4.
    lam3, U3 = spectral_decomposition(np.diag([4.0, 2.0, 1.0]))
    A = np.arange(9.0).reshape(3, 3)
    np.testing.assert_allclose(localized_energy(A, U3, 1, 1), A[0, 2] ** 2, rtol=1e-14)
    np.testing.assert_allclose(relative_gaps(lam3, 1, 1), [0.5, 0.25])
    # No perp block (k + beta >= m) and a zero spectrum are unreliable.
    assert np.isnan(relative_gaps(lam3, 2, 1)[1])
    assert not reliable_boundaries(lam3, 2, 1)
    assert not reliable_boundaries(np.zeros(3), 1, 0)


def test_residual_and_safe_divide():
    A = np.array([[1.0, 2.0], [3.0, 4.0]])
    B = A + np.array([[0.0, 0.0], [0.0, 1e-3]])
    # ||A-B|| = 1e-3, ||A|| = sqrt 30, ||B|| = sqrt(1+4+9+4.001^2).
    expected = 1e-3 / (np.sqrt(30.0) + np.sqrt(14 + 4.001**2))
    np.testing.assert_allclose(residual(A, B), expected, rtol=1e-12)
    assert residual(np.zeros((2, 2)), np.zeros((2, 2))) == 0.0
    ratio = safe_divide(np.array([1.0, 0.0]), np.array([0.0, 2.0]))
    np.testing.assert_array_equal(ratio, [np.nan, 0.0])


# --------------------------------------------------------------------------------------
# Undefined values: dead layers, unreliable boundaries, unreached checkpoints
# --------------------------------------------------------------------------------------


def test_fully_dead_network_is_nan_never_zero():
    rng = np.random.default_rng(6)
    Ws = random_net([3, 4, 4, 1], rng)
    Ws[0] = -10.0 * np.abs(Ws[0])  # all z_0 < 0 on positive inputs; layer 1 then sees a = 0
    X = np.abs(rng.standard_normal((20, 3))) + 0.1
    out = evaluate_quiet(Ws, X, X, kbeta=KBETA)
    for key in NORMALISED:
        assert np.all(np.isnan(out[key])), key
    for key in ("E_tr", "E_imb", "E_fluc", "E_gate", "C_int_norm"):
        np.testing.assert_array_equal(out[key], 0.0)
    np.testing.assert_array_equal(out["res_recursion"], 0.0)
    np.testing.assert_array_equal(out["res_transport"], 0.0)


def test_interior_dead_layer():
    rng = np.random.default_rng(7)
    Ws = random_net([3, 4, 4, 1], rng)
    Ws[1] = -np.abs(Ws[1])  # a_1 >= 0 so z_1 <= 0: layer 1 dead, layer 0 loses sensitivity
    X = rng.standard_normal((30, 3))
    out = evaluate_quiet(Ws, X, X, kbeta=KBETA)
    for key in NORMALISED:
        assert np.isnan(out[key][1]).all(), key
    # Layer 0 gates are alive, so its gate defects stay defined...
    assert np.isfinite(out["G_D"][0]) and out["G_D"][0] > 0
    assert np.isfinite(out["q_D"][0]).all()
    # ...but Qbar_0 = 0 (g_1 = 0), so internal, feature and source ratios are undefined.
    for key in ("G_Q", "G_S", "e_imb", "rho_tr_imb", "chi", "I_imb_gate"):
        assert np.isnan(out[key][0]), key
    for key in ("q_Q_av", "q_Q_pt", "q_S_av", "q_S_pt"):
        assert np.isnan(out[key][0]).all(), key


def test_reliability_turns_degenerate_boundary_into_nan():
    rng = np.random.default_rng(8)
    X = rng.standard_normal((40, 3))
    W1 = rng.standard_normal((1, 3))
    kbeta = ((1, 0), (1, 1), (2, 1), (3, 0))
    # P = NFM = diag(9, 4, 1): relative gaps 5/9 and 3/9, all boundaries resolved.
    out = evaluate_quiet([np.diag([3.0, 2.0, 1.0]), W1], X, X, kbeta=kbeta)
    np.testing.assert_allclose(out["gap_k"][0, :3], [5 / 9, 5 / 9, 3 / 9])
    np.testing.assert_allclose(out["gap_kb"][0, :3], [5 / 9, 3 / 9, np.nan])
    np.testing.assert_array_equal(out["reliable"][0], [True, True, False, False])
    assert np.isfinite(out["q_D"][0, :2]).all() and np.isfinite(out["q_S_pt"][0, :2]).all()
    # k + beta >= m: no perp block -> NaN.
    assert np.isnan(out["q_D"][0, 2:]).all() and np.isnan(out["q_S_av"][0, 2:]).all()
    # Near-degenerate top pair: relative gap 1e-5 < 1e-3 -> NaN at k = 1, fine at (2, 0).
    W0 = np.diag(np.sqrt([1.0, 1.0 - 1e-5, 0.25]))
    out = evaluate_quiet([W0, W1], X, X, kbeta=((1, 0), (2, 0)))
    np.testing.assert_allclose(out["gap_k"][0, 0], 1e-5, rtol=1e-6)
    np.testing.assert_array_equal(out["reliable"][0], [False, True])
    for key in ("q_D", "q_Q_av", "q_Q_pt", "q_S_av", "q_S_pt"):
        assert np.isnan(out[key][0, 0]) and np.isfinite(out[key][0, 1]), key
    out = evaluate_quiet([W0, W1], X, X, kbeta=((1, 0),), gap_threshold=1e-6)
    assert out["reliable"][0, 0] and np.isfinite(out["q_Q_pt"][0, 0])
    # Exactly degenerate spectrum: projector undefined. P = 4I commutes with everything,
    # so C_int = 0 exactly (the paper's Res then compares round-off with round-off, which
    # is why evaluate's violation warning uses the operator scale instead).
    out = evaluate_quiet([2.0 * np.eye(3), W1], X, X)
    assert out["gap_k"][0, 0] == 0.0 and not out["reliable"][0, 0]
    assert np.isnan(out["q_D"][0, 0]) and np.isnan(out["q_S_pt"][0, 0])
    assert out["C_int_norm"][0] == 0.0
    # Wide layer: P is 2x2 (no perp block at k = 2) but NFM is 4x4 with a kernel; the
    # feature side uses its own spectrum, and Sbar = W^T Qbar W cannot reach ker W, so
    # the feature-side energy across that boundary vanishes (Sec. 5.3).
    W0 = np.array([[2.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    X4 = rng.standard_normal((40, 4))
    out = evaluate_quiet([W0, np.array([[1.0, -1.0]])], X4, X4, kbeta=((2, 0),))
    assert not out["reliable"][0, 0] and np.isnan(out["q_D"][0, 0])
    assert 0.0 <= out["q_S_av"][0, 0] < 1e-28 and 0.0 <= out["q_S_pt"][0, 0] < 1e-28


def test_batch_matches_one_at_a_time_and_nan_checkpoints():
    rng = np.random.default_rng(9)
    widths = [3, 5, 4, 1]
    Ws = random_net(widths, rng, batch=(2, 3))
    Ws[1][1, 2, 0, 0] = np.nan  # an unreached checkpoint
    Xtr, Xev = rng.standard_normal((25, 3)), rng.standard_normal((15, 3))
    out = evaluate_quiet(Ws, Xtr, Xev, kbeta=KBETA)
    out_small_chunks = evaluate_quiet(Ws, Xtr, Xev, kbeta=KBETA, chunk_size=2)
    assert [*out] == [v.name for v in VARIABLE_INFO]
    for key in LAYER_KEYS:
        assert out[key].shape == (2, 3, 2), key
    for key in LOCAL_KEYS:
        assert out[key].shape == (2, 3, 2, 2), key
    assert out["reliable"].dtype == bool
    for i in range(2):
        for j in range(3):
            single = evaluate_quiet([W[i, j] for W in Ws], Xtr, Xev, kbeta=KBETA)
            for key, value in single.items():
                for got in (out[key][i, j], out_small_chunks[key][i, j]):
                    np.testing.assert_allclose(got, value, rtol=1e-13, atol=1e-300, err_msg=key)
    for key in LAYER_KEYS + LOCAL_KEYS:
        if key != "reliable":
            assert np.isnan(out[key][1, 2]).all(), key
    assert not out["reliable"][1, 2].any()
    assert np.isfinite(out["G_D"][0]).all()


def test_overflowing_network_is_nan_not_a_crash():
    rng = np.random.default_rng(16)
    Ws = random_net([3, 4, 4, 1], rng, batch=(3,))
    Ws[0][1] *= 1e200  # finite weights whose Gram matrix overflows
    X = rng.standard_normal((10, 3))
    with np.errstate(over="ignore", invalid="ignore"):
        out = evaluate(Ws, X, X)
    assert np.isnan(out["G_D"][1]).all() and not out["reliable"][1].any()
    single = evaluate_quiet([W[2] for W in Ws], X, X)
    np.testing.assert_allclose(out["chi"][2], single["chi"], rtol=1e-13)


def test_batched_inputs_and_forward_batch():
    rng = np.random.default_rng(10)
    Ws = random_net([2, 4, 3, 1], rng, batch=(3,))
    X = rng.standard_normal((3, 12, 2))
    fw = forward(Ws, X)
    out = evaluate_quiet(Ws, X, X[:, :8])
    for b in range(3):
        single_fw = forward([W[b] for W in Ws], X[b])
        np.testing.assert_allclose(fw.F[b], single_fw.F, rtol=1e-14)
        for l in range(3):
            np.testing.assert_allclose(fw.g[l][b], single_fw.g[l], rtol=1e-14)
        single = evaluate_quiet([W[b] for W in Ws], X[b], X[b, :8])
        for key, value in single.items():
            np.testing.assert_allclose(out[key][b], value, rtol=1e-13, err_msg=key)


def test_variables_describe_every_key():
    rng = np.random.default_rng(11)
    X = rng.standard_normal((5, 2))
    out = evaluate_quiet(random_net([2, 3, 1], rng), X, X)
    names = dict(VARIABLES)
    assert list(names) == list(out)
    assert all(isinstance(text, str) and "Sec" in text for text in names.values())
    assert set(LAYER_KEYS) | set(LOCAL_KEYS) == set(out)


def test_invalid_inputs_raise():
    rng = np.random.default_rng(12)
    Ws = random_net([2, 3, 1], rng)
    with pytest.raises(ValueError):
        evaluate(Ws, np.ones((4, 2)), np.ones((4, 2)), kbeta=((0, 0),))
    with pytest.raises(ValueError):
        forward([np.ones((3, 2)), np.ones((2, 3))], np.ones((4, 2)))  # vector output
    with pytest.raises(ValueError):
        forward([np.ones((3, 2)), np.ones((1, 4))], np.ones((4, 2)))  # width mismatch


# --------------------------------------------------------------------------------------
# Section 9: closed forms vs Monte Carlo through the production kernels
# --------------------------------------------------------------------------------------

N_MC = 200_000


def test_two_neuron_closed_forms_special_values():
    w = np.array([1.0, 2.0, -1.0])
    # rho = 1: identical half-spaces, G_0 = 0; rho = -1: complementary gates,
    # G_0 = 2 ||w1||^2 ||w2||^2 (Sec. 9.1); rho = 0: no covariance coupling.
    assert analytic.gate_energy_two_neuron(w, 2 * w) == 0.0
    np.testing.assert_allclose(analytic.gate_energy_two_neuron(w, -w), 2 * 6.0 * 6.0)
    assert analytic.gate_energy_two_neuron(np.array([1.0, 0, 0]), np.array([0, 1.0, 0])) == 0
    np.testing.assert_allclose(
        [analytic.coactivation_two_neuron(r) for r in (-1, 0, 1)], [0.0, 0.25, 0.5]
    )
    theta = np.linspace(0.0, np.pi / 2, 7)
    h = 1e-6
    fd = analytic.gate_energy_transient(theta + h) - analytic.gate_energy_transient(theta - h)
    np.testing.assert_allclose(
        fd / (2 * h), analytic.gate_energy_transient_derivative(theta), atol=1e-7
    )
    # Transient growth: positive slope at 0, zero at the orthogonal configuration.
    assert analytic.gate_energy_transient_derivative(0.0) > 0
    assert abs(analytic.gate_energy_transient(np.pi / 4)) < 1e-16


def test_two_neuron_monte_carlo_matches_closed_form():
    rng = np.random.default_rng(13)
    w1, w2 = rng.standard_normal(3), rng.standard_normal(3)
    c = np.array([1.3, -0.7])
    mc = analytic.monte_carlo_two_neuron(w1, w2, c, N_MC, rng)
    rho = analytic.neuron_cosine(w1, w2)
    assert abs(mc.G0 - analytic.gate_energy_two_neuron(w1, w2)) < 4 * mc.G0_se
    assert abs(mc.pi12 - analytic.coactivation_two_neuron(rho)) < 4 * mc.pi12_se
    assert np.all(np.abs(mc.Qbar - analytic.Qbar_two_neuron(c, rho)) < 4 * mc.Qbar_se)


@pytest.mark.parametrize("theta", [0.0, 0.2, 0.5, np.pi / 4, 1.2])
def test_transient_growth_monte_carlo(theta):
    rng = np.random.default_rng(14)
    v, e = np.array([0.0, 1.0, 0.0]), np.array([0.6, 0.0, 0.8])
    est, se = analytic.monte_carlo_gate_energy_transient(theta, v, e, N_MC, rng)
    exact = analytic.gate_energy_transient(theta)
    assert abs(est - exact) <= 4 * se + 1e-12
