"""Layerwise commutator diagnostics of a ReLU network: the workflow's single entry point.

:func:`evaluate` computes, for each hidden layer ``l = 0..H-1`` of each network in a
batch, the global defect profiles (Sec. 10.1), the four-source geometry of the
internal commutator (Secs. 4, 10.3), the buffered localised energies with their
spectral reliability test (Secs. 5.1, 10.4) and the residuals of the two exact
identities (Sec. 10.7). Global profiles use the evaluation sample; sources and
localisation use the training sample, as in the paper.

Undefined values are NaN and are never replaced by 0 (Sec. 10.1):

* a ratio whose denominator vanishes is NaN;
* a layer whose gates are all closed on a sample ("dead layer") has NaN gate
  defects ``G_D``/``q_D`` on that sample, and, through ``Qbar_l = 0``, NaN internal,
  feature and source ratios; so have all layers upstream of it, whose sensitivity
  vanishes identically (their ``G_D`` stays defined);
* a localised energy of an identically vanishing operator, or at a boundary that
  fails the reliability test, is NaN;
* a network whose weights contain a non-finite entry (an unreached checkpoint) is
  NaN everywhere, with ``reliable`` False.

Raw energies (``E_*``, ``C_int_norm``) and residuals stay numeric when finite: an
identically zero source has energy exactly 0.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import xarray as xr

from specalign.commutators.measure.defects import (
    G_D,
    G_Q,
    G_S,
    Qbar,
    Sbar,
    coactivation,
    commutator,
    frob2,
    gram_P,
    nfm,
    residual,
    transpose,
)
from specalign.commutators.measure.localize import (
    localized_energy,
    localized_energy_gate,
    localized_energy_rank_one,
    relative_gaps,
    reliable_boundaries,
    spectral_decomposition,
)
from specalign.commutators.measure.network import Forward, check_weights, forward
from specalign.commutators.measure.recursion import Sources, four_sources, source_geometry

__all__ = ["Variable", "VARIABLE_INFO", "VARIABLES", "LAYER_KEYS", "LOCAL_KEYS", "evaluate"]

#: A RuntimeWarning is raised when an exact identity misses by more than this fraction
#: of its natural operator scale; float64 gives ~1e-16.
IDENTITY_WARN_TOL = 1e-8

#: Default memory budget per chunk of networks (bytes of per-sample arrays).
CHUNK_BYTES = 64 * 2**20


class Variable(NamedTuple):
    """Description of one output of :func:`evaluate`, for netCDF attributes."""

    name: str
    description: str
    reference: str
    dims: tuple[str, ...]


_L = ("layer",)
_LK = ("layer", "kbeta")

VARIABLE_INFO: tuple[Variable, ...] = (
    Variable(
        "G_D",
        "normalised gate defect mean||[D_l,P_l]||_F^2/||P_l||_F^2, eval sample",
        "Secs. 4, 10.1",
        _L,
    ),
    Variable(
        "G_Q",
        "normalised internal defect ||[Qbar_l,P_l]||_F^2/(||Qbar_l||_op^2"
        " ||P_l||_F^2), eval sample",
        "Sec. 10.1",
        _L,
    ),
    Variable(
        "G_S",
        "normalised feature defect ||[Sbar_l,NFM_l]||_F^2/(||Sbar_l||_op^2"
        " ||NFM_l||_F^2), eval sample",
        "Sec. 10.1",
        _L,
    ),
    Variable("G_D_train", "normalised gate defect G_D on the training sample", "Sec. 10.1", _L),
    Variable("G_Q_train", "normalised internal defect G_Q on the training sample", "Sec. 10.1", _L),
    Variable("G_S_train", "normalised feature defect G_S on the training sample", "Sec. 10.1", _L),
    Variable("E_tr", "transport source energy ||T_tr||_F^2, training sample", "Sec. 4", _L),
    Variable("E_imb", "imbalance source energy ||T_imb||_F^2, training sample", "Sec. 4", _L),
    Variable("E_fluc", "fluctuation source energy ||T_fluc||_F^2, training sample", "Sec. 4", _L),
    Variable("E_gate", "gate source energy ||T_gate||_F^2, training sample", "Sec. 4", _L),
    Variable("e_tr", "transport energy fraction E_tr/sum E", "Secs. 4, 10.3", _L),
    Variable("e_imb", "imbalance energy fraction E_imb/sum E", "Secs. 4, 10.3", _L),
    Variable("e_fluc", "fluctuation energy fraction E_fluc/sum E", "Secs. 4, 10.3", _L),
    Variable("e_gate", "gate energy fraction E_gate/sum E", "Secs. 4, 10.3", _L),
    Variable("rho_tr_imb", "Frobenius cosine <T_tr,T_imb>/(||T_tr|| ||T_imb||)", "Sec. 10.3", _L),
    Variable("I_tr_imb", "interaction 2<T_tr,T_imb>_F/sum E", "Sec. 4; Sec. 10.6", _L),
    Variable("I_tr_fluc", "interaction 2<T_tr,T_fluc>_F/sum E", "Sec. 4; Sec. 10.6", _L),
    Variable("I_tr_gate", "interaction 2<T_tr,T_gate>_F/sum E", "Sec. 4; Sec. 10.6", _L),
    Variable("I_imb_fluc", "interaction 2<T_imb,T_fluc>_F/sum E", "Sec. 4; Sec. 10.6", _L),
    Variable("I_imb_gate", "interaction 2<T_imb,T_gate>_F/sum E", "Sec. 4; Sec. 10.6", _L),
    Variable("I_fluc_gate", "interaction 2<T_fluc,T_gate>_F/sum E", "Sec. 4; Sec. 10.6", _L),
    Variable("chi", "cancellation ratio ||C_int||_F/sum_nu ||T_nu||_F", "Secs. 4, 10.3", _L),
    Variable(
        "C_int_norm", "internal commutator norm ||[Qbar_l,P_l]||_F, training sample", "Sec. 4", _L
    ),
    Variable(
        "res_recursion",
        "residual Res(C_int_l, T_tr+T_imb+T_fluc+T_gate), training sample",
        "Secs. 4, 10.7",
        _L,
    ),
    Variable(
        "res_transport",
        "residual Res([Sbar_l,NFM_l], W_l^T[Qbar_l,P_l]W_l), max over eval and training samples",
        "Secs. 4, 10.7",
        _L,
    ),
    Variable(
        "q_D",
        "buffered gate energy mean||Pi^(k) D_l Pi^(k+beta)perp||_F^2 (P_l basis)",
        "Secs. 5.1, 10.4",
        _LK,
    ),
    Variable(
        "q_Q_av",
        "buffered energy ||Pi^(k) Qbar_l Pi^(k+beta)perp||_F^2 (P_l basis)",
        "Secs. 5.1, 10.4",
        _LK,
    ),
    Variable(
        "q_Q_pt",
        "buffered energy mean||Pi^(k) Q_l(x) Pi^(k+beta)perp||_F^2 (P_l basis)",
        "Secs. 5.1, 10.6",
        _LK,
    ),
    Variable(
        "q_S_av",
        "buffered energy ||Pi^(k) Sbar_l Pi^(k+beta)perp||_F^2 (NFM_l basis)",
        "Secs. 5.1, 5.3",
        _LK,
    ),
    Variable(
        "q_S_pt",
        "buffered energy mean||Pi^(k) S_l(x) Pi^(k+beta)perp||_F^2 (NFM_l basis)",
        "Secs. 5.1, 5.3",
        _LK,
    ),
    Variable("gap_k", "relative gap (lambda_k-lambda_{k+1})/lambda_1 of P_l", "Sec. 10.1", _LK),
    Variable(
        "gap_kb", "relative gap (lambda_{k+b}-lambda_{k+b+1})/lambda_1 of P_l", "Sec. 10.1", _LK
    ),
    Variable(
        "reliable",
        "both P_l boundary gaps exceed the threshold (spectral reliability)",
        "Sec. 10.1",
        _LK,
    ),
)

#: ``(name, "description (paper reference)")`` pairs; ``dict(VARIABLES)`` maps each
#: output key to a one-line netCDF description.
VARIABLES: tuple[tuple[str, str], ...] = tuple(
    (v.name, f"{v.description} (paper {v.reference})") for v in VARIABLE_INFO
)
#: The descriptions of the coordinates and per-checkpoint variables of ``diagnostics.nc``.
BOOKKEEPING: dict[str, str] = {
    "seed": "training seed of the ensemble member",
    "checkpoint": "checkpoint label: a risk level reached (risk_rel) or a training time t",
    "layer": (
        "layer l = 0..L-2 as Nystrom counts them (0-based): the hidden layer fed by W_l, "
        "whose commutators with W_{l+1} are measured"
    ),
    "kb": "localisation setting (k, beta) of the buffered energies (Sec. 5.1)",
    "k": "k of the localisation setting: the top-k eigenvectors",
    "beta": "beta of the localisation setting: the buffer width",
    "iteration": "gradient-descent iteration of the checkpoint (-1 when not reached)",
    "time": "training time t = iteration * lr (NaN when not reached)",
    "reached": "whether this seed reached the checkpoint",
    "risk_train": "training risk (half mean squared error) at the checkpoint",
    "risk_rel": "training risk relative to the seed's initial risk",
    "risk_eval": "risk (half mean squared error) on the evaluation sample",
    "diverged": "whether the seed's training diverged (its diagnostics are NaN)",
}
LAYER_KEYS: tuple[str, ...] = tuple(v.name for v in VARIABLE_INFO if v.dims == _L)
LOCAL_KEYS: tuple[str, ...] = tuple(v.name for v in VARIABLE_INFO if v.dims == _LK)

_GEOMETRY_KEYS = (
    "e_tr", "e_imb", "e_fluc", "e_gate", "rho_tr_imb", "I_tr_imb", "I_tr_fluc", "I_tr_gate",
    "I_imb_fluc", "I_imb_gate", "I_fluc_gate", "chi",
)  # fmt: skip


def _norm(A: np.ndarray) -> np.ndarray:
    return np.sqrt(frob2(A))


def _identity(
    A: np.ndarray, B: np.ndarray, scale: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """Paper residual ``Res(A, B)`` and a flag for a genuine violation of ``A = B``.

    ``Res`` is relative to ``||A|| + ||B||``, so it reads ~1 whenever both sides vanish
    mathematically (e.g. ``P_l`` proportional to the identity) and only round-off is
    left. The flag instead compares the mismatch with the natural scale of the terms.
    """
    return residual(A, B, eps), _norm(A - B) > IDENTITY_WARN_TOL * scale


def _transport_identity(
    W: np.ndarray, NFM: np.ndarray, Sb: np.ndarray, C_int: np.ndarray, eps: float
) -> tuple[np.ndarray, np.ndarray]:
    """``Res([Sbar_l, NFM_l], W_l^T [Qbar_l, P_l] W_l)`` (Sec. 4, transport identity)."""
    scale = _norm(Sb) * _norm(NFM) + frob2(W) * _norm(C_int)
    return _identity(commutator(Sb, NFM), transpose(W) @ C_int @ W, scale, eps)


def _all_zero(A: np.ndarray) -> np.ndarray:
    return np.all(A == 0, axis=(-2, -1))


def _empty_outputs(b: int, H: int, K: int) -> dict[str, np.ndarray]:
    out = {key: np.full((b, H), np.nan) for key in LAYER_KEYS}
    out |= {key: np.full((b, H, K), np.nan) for key in LOCAL_KEYS}
    out["reliable"] = np.zeros((b, H, K), dtype=bool)
    out["_violated"] = np.zeros((b, H), dtype=bool)
    return out


def _finite_nets(Ws: list[np.ndarray], *passes: Forward) -> np.ndarray:
    """Networks whose operators and per-sample quantities are all finite (no overflow)."""
    ok = np.ones(Ws[0].shape[0], dtype=bool)
    for W in Ws:
        ok &= np.isfinite(frob2(W))  # then every P_l and NFM_l is finite too
    for fw in passes:
        ok &= np.isfinite(fw.F).all(axis=-1)
        for g in fw.g:
            ok &= np.isfinite(g).all(axis=(-2, -1))
    return ok


def _evaluate_chunk(
    Ws: list[np.ndarray],
    X_train: np.ndarray,
    X_eval: np.ndarray,
    kbeta: Sequence[tuple[int, int]],
    gap_threshold: float,
    eps: float,
) -> dict[str, np.ndarray]:
    """All diagnostics for a chunk of ``b`` networks with weights of shape ``(b, ., .)``."""
    b = Ws[0].shape[0]
    H = len(Ws) - 1
    out = _empty_outputs(b, H, len(kbeta))

    fw_tr = forward(Ws, X_train)
    fw_ev = forward(Ws, X_eval)
    ok_net = _finite_nets(Ws, fw_tr, fw_ev)
    if not ok_net.all():
        # Finite but exploding weights (a diverging run) overflow somewhere; treat them
        # like unreached checkpoints and evaluate the rest.
        if ok_net.any():

            def sub(X: np.ndarray) -> np.ndarray:
                return X[ok_net] if X.ndim == 3 else X

            res = _evaluate_chunk(
                [W[ok_net] for W in Ws], sub(X_train), sub(X_eval), kbeta, gap_threshold, eps
            )
            for key, value in res.items():
                out[key][ok_net] = value
        return out

    C_next = None  # C_int_{L-1} = [1, P_{L-1}] = 0
    for l in range(H - 1, -1, -1):
        C_next = _evaluate_layer(out, l, Ws, fw_tr, fw_ev, C_next, kbeta, gap_threshold, eps)
    return out


def _evaluate_layer(
    out: dict[str, np.ndarray],
    l: int,
    Ws: list[np.ndarray],
    fw_tr: Forward,
    fw_ev: Forward,
    C_next: np.ndarray | None,
    kbeta: Sequence[tuple[int, int]],
    gap_threshold: float,
    eps: float,
) -> np.ndarray:
    """Every diagnostic of hidden layer ``l`` into ``out``; returns C_int_l, which the
    recursion of layer l - 1 needs (layers run from the top down)."""
    W, W_next = Ws[l], Ws[l + 1]
    NFM = nfm(W)

    # Global profiles on the evaluation sample.
    d_ev = fw_ev.d[l]
    Qb_ev = Qbar(d_ev, fw_ev.g[l + 1])
    Sb_ev = Sbar(fw_ev.g[l])
    P = gram_P(W)
    dead_ev = _all_zero(d_ev)
    out["G_D"][:, l] = np.where(dead_ev, np.nan, G_D(P, coactivation(d_ev)))
    out["G_Q"][:, l] = G_Q(Qb_ev, P)
    out["G_S"][:, l] = G_S(Sb_ev, NFM)
    res_tr_ev, bad_ev = _transport_identity(W, NFM, Sb_ev, commutator(Qb_ev, P), eps)

    # Sources, training-sample profiles and localisation on the training sample.
    d_tr = fw_tr.d[l]
    src = four_sources(W, W_next, d_tr, fw_tr.g[l + 1], C_next)
    Sb_tr = Sbar(fw_tr.g[l])
    dead_tr = _all_zero(d_tr)
    out["G_D_train"][:, l] = np.where(dead_tr, np.nan, G_D(src.P, src.p))
    out["G_Q_train"][:, l] = G_Q(src.Qbar, src.P)
    out["G_S_train"][:, l] = G_S(Sb_tr, NFM)
    res_tr_tr, bad_tr = _transport_identity(W, NFM, Sb_tr, src.C_int, eps)
    out["res_transport"][:, l] = np.maximum(res_tr_ev, res_tr_tr)
    T = src.as_dict()
    scale = _norm(src.Qbar) * _norm(src.P) + sum(_norm(t) for t in T.values())
    out["res_recursion"][:, l], bad_rec = _identity(src.C_int, src.total(), scale, eps)
    out["_violated"][:, l] = bad_ev | bad_tr | bad_rec

    geo = source_geometry(T, src.C_int)
    for nu in ("tr", "imb", "fluc", "gate"):
        out[f"E_{nu}"][:, l] = geo[f"E_{nu}"]
    out["C_int_norm"][:, l] = geo["C_int_norm"]
    undefined = dead_tr | _all_zero(src.Qbar)
    for key in _GEOMETRY_KEYS:
        # Zero sources already give NaN; the mask states the dead-layer rule
        # explicitly instead of relying on exact zeros.
        out[key][:, l] = np.where(undefined, np.nan, geo[key])

    _localized_energies(out, l, src, NFM, Sb_tr, fw_tr, dead_tr, kbeta, gap_threshold)
    return src.C_int


def _localized_energies(
    out: dict[str, np.ndarray],
    l: int,
    src: Sources,
    NFM: np.ndarray,
    Sb_tr: np.ndarray,
    fw_tr: Forward,
    dead_tr: np.ndarray,
    kbeta: Sequence[tuple[int, int]],
    gap_threshold: float,
) -> None:
    """Buffered localised energies of layer ``l`` for every configured (k, beta), relative
    to the eigenvectors of P_l (gate and Q side) and of NFM_l (feature side), Sec. 5.1."""
    null_Q = _all_zero(src.Qbar)
    null_S = _all_zero(Sb_tr)
    lam_P, U_P = spectral_decomposition(src.P)
    lam_N, U_N = spectral_decomposition(NFM)
    q_rows = fw_tr.d[l] * fw_tr.g[l + 1]
    s_rows = fw_tr.g[l]
    for j, (k, beta) in enumerate(kbeta):
        gk, gkb = relative_gaps(lam_P, k, beta)
        ok_P = reliable_boundaries(lam_P, k, beta, gap_threshold)
        ok_N = reliable_boundaries(lam_N, k, beta, gap_threshold)
        out["gap_k"][:, l, j] = gk
        out["gap_kb"][:, l, j] = gkb
        out["reliable"][:, l, j] = ok_P
        # Each energy is NaN unless its basis passes the reliability test (which
        # also rejects an empty perp block) and its operator is not identically 0.
        ok = ok_P & ~dead_tr
        out["q_D"][:, l, j] = np.where(ok, localized_energy_gate(src.p, U_P, k, beta), np.nan)
        ok = ok_P & ~null_Q
        out["q_Q_av"][:, l, j] = np.where(ok, localized_energy(src.Qbar, U_P, k, beta), np.nan)
        out["q_Q_pt"][:, l, j] = np.where(
            ok, localized_energy_rank_one(q_rows, U_P, k, beta), np.nan
        )
        ok = ok_N & ~null_S
        out["q_S_av"][:, l, j] = np.where(ok, localized_energy(Sb_tr, U_N, k, beta), np.nan)
        out["q_S_pt"][:, l, j] = np.where(
            ok, localized_energy_rank_one(s_rows, U_N, k, beta), np.nan
        )


def _chunk_size(Ws: list[np.ndarray], n_samples: int) -> int:
    widths = [W.shape[-1] for W in Ws]
    # Activations, gates, sensitivities and temporaries per sample and layer, plus
    # the m x m operators and eigenvector sets per layer.
    per_net = 8 * (6 * n_samples * sum(widths) + 24 * sum(m * m for m in widths))
    return max(1, CHUNK_BYTES // per_net)


def evaluate(
    Ws: Sequence[np.ndarray],
    X_train: np.ndarray,
    X_eval: np.ndarray,
    kbeta: Sequence[tuple[int, int]] = ((1, 0),),
    gap_threshold: float = 1e-3,
    eps: float = 1e-30,
    *,
    chunk_size: int | None = None,
) -> dict[str, np.ndarray]:
    """Layerwise commutator diagnostics of one network or a batch of networks.

    Parameters
    ----------
    Ws:
        Weights ``W_0..W_{L-1}`` (``L >= 2``), ``W_l`` of shape ``(*B, m_{l+1}, m_l)``
        with ``m_L = 1``; the leading batch shape ``B`` (possibly empty) must be the
        same for every layer, one network per batch entry.
    X_train, X_eval:
        Samples of shape ``(N, m_0)`` shared by the batch, or ``(*B, N, m_0)``.
        Sources, training-sample defects and localisation use ``X_train``; the
        global profiles ``G_D, G_Q, G_S`` use ``X_eval``.
    kbeta:
        Boundary pairs ``(k, beta)`` with ``k >= 1``, ``beta >= 0`` for the buffered
        energies (Sec. 5.1). Pairs with ``k + beta >= m_{l+1}`` give NaN at layer ``l``.
    gap_threshold:
        Minimum relative gap at both boundaries for a reliable projector (Sec. 10.1).
    eps:
        Regulariser of the residual denominators (Sec. 10.7).
    chunk_size:
        Networks processed together; default from a fixed memory budget.

    Returns
    -------
    dict[str, numpy.ndarray]
        Exactly the keys of :data:`VARIABLES`, in that order; arrays of shape
        ``(*B, H)`` for layer quantities and ``(*B, H, K)`` for the localised ones
        (``K = len(kbeta)``).
        ``reliable`` is boolean, every other array float64.
    """
    Ws = check_weights(Ws)
    if len(Ws) < 2:
        raise ValueError("need at least one hidden layer (L >= 2)")
    batch = Ws[0].shape[:-2]
    if any(W.shape[:-2] != batch for W in Ws):
        raise ValueError("all weight matrices must share the same leading batch shape")
    kbeta = [(int(k), int(beta)) for k, beta in kbeta]
    for k, beta in kbeta:
        if k < 1 or beta < 0:
            raise ValueError(f"need k >= 1 and beta >= 0, got (k, beta) = ({k}, {beta})")

    n_net = int(np.prod(batch, dtype=np.int64))
    Wf = [W.reshape(n_net, *W.shape[-2:]) for W in Ws]

    def flat_x(X: np.ndarray, name: str) -> tuple[np.ndarray, bool]:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim == 2:
            return X, False
        if X.shape[:-2] != batch:
            raise ValueError(f"{name} batch shape {X.shape[:-2]} differs from weights' {batch}")
        return X.reshape(n_net, *X.shape[-2:]), True

    Xtr, tr_batched = flat_x(X_train, "X_train")
    Xev, ev_batched = flat_x(X_eval, "X_eval")

    out = _empty_outputs(n_net, len(Ws) - 1, len(kbeta))

    finite = np.ones(n_net, dtype=bool)
    for W in Wf:
        finite &= np.all(np.isfinite(W), axis=(-2, -1))
    idx = np.flatnonzero(finite)
    size = chunk_size or _chunk_size(Ws, Xtr.shape[-2] + Xev.shape[-2])
    for start in range(0, idx.size, size):
        sel = idx[start : start + size]
        res = _evaluate_chunk(
            [W[sel] for W in Wf],
            Xtr[sel] if tr_batched else Xtr,
            Xev[sel] if ev_batched else Xev,
            kbeta,
            gap_threshold,
            eps,
        )
        for key, value in res.items():
            out[key][sel] = value

    if out["_violated"].any():
        worst = max(np.nanmax(out[key]) for key in ("res_recursion", "res_transport"))
        warnings.warn(
            f"an exact identity (transport or four-source recursion) is violated beyond"
            f" {IDENTITY_WARN_TOL:g} of its operator scale; max residual {worst:.3g}",
            RuntimeWarning,
            stacklevel=2,
        )
    return {v.name: out[v.name].reshape(*batch, *out[v.name].shape[1:]) for v in VARIABLE_INFO}


# --- the diagnostics.nc contract ----------------------------------------------------


def _half_mse(F: np.ndarray, y: np.ndarray) -> np.ndarray:
    return 0.5 * np.mean((F - y) ** 2, axis=-1)


def diagnostics_dataset(
    traj: Mapping[str, Any],
    settings: Mapping[str, Any],
    progress: Callable[..., None] | None = None,
) -> Any:
    """Evaluate every (seed, checkpoint) network of a trajectory into an xarray Dataset.

    Global defects G_* use the evaluation sample (diagnostic for synthetic experiments,
    test for benchmarks); the source decomposition and localised energies use the
    training sample (Section 10.1). Unreached checkpoints and diverged seeds are NaN.
    """
    weights = traj["weights"]
    S, C = traj["iteration"].shape
    H = len(weights) - 1
    kbeta = [tuple(int(v) for v in kb) for kb in settings["localize"]]
    flat = [W.reshape(S * C, *W.shape[2:]) for W in weights]
    if progress:
        progress(f"evaluating {S} seeds x {C} checkpoints x {H} layers")
    out = evaluate(
        flat,
        traj["X_train"],
        traj["X_eval"],
        kbeta=kbeta,
        gap_threshold=float(settings["gap_threshold"]),
        eps=float(settings["eps"]),
    )

    risk_train = _half_mse(forward(flat, traj["X_train"]).F, traj["y_train"]).reshape(S, C)
    risk0 = traj["risk"][:, 0]
    coords = {
        "seed": np.asarray(traj["seeds"], dtype=np.int64),
        "checkpoint": np.asarray(traj["labels"], dtype=object).astype(str),
        "layer": np.arange(H),
        "kb": [f"k{k}b{b}" for k, b in kbeta],
    }
    data_vars: dict[str, Any] = {}
    for name, arr in out.items():
        arr = np.asarray(arr)
        if arr.ndim == 2:
            data_vars[name] = (("seed", "checkpoint", "layer"), arr.reshape(S, C, H))
        elif arr.ndim == 3:
            data_vars[name] = (
                ("seed", "checkpoint", "layer", "kb"),
                arr.reshape(S, C, H, len(kbeta)),
            )
        else:  # pragma: no cover - the kernel's contract
            raise ValueError(f"diagnostic {name} has unexpected shape {arr.shape}")
    iteration = np.asarray(traj["iteration"], dtype=np.int64)
    reached = iteration >= 0
    data_vars["iteration"] = (("seed", "checkpoint"), iteration)
    data_vars["time"] = (("seed", "checkpoint"), np.where(reached, iteration * traj["lr"], np.nan))
    data_vars["reached"] = (("seed", "checkpoint"), reached)
    data_vars["risk_train"] = (("seed", "checkpoint"), risk_train)
    data_vars["risk_rel"] = (("seed", "checkpoint"), risk_train / risk0[:, None])
    if traj["y_eval"] is not None:
        risk_eval = _half_mse(forward(flat, traj["X_eval"]).F, traj["y_eval"]).reshape(S, C)
        data_vars["risk_eval"] = (("seed", "checkpoint"), risk_eval)
    data_vars["diverged"] = (("seed",), np.asarray(traj["diverged"], dtype=bool))
    ds = xr.Dataset(data_vars, coords=coords)
    ds = ds.assign_coords(k=("kb", [k for k, _ in kbeta]), beta=("kb", [b for _, b in kbeta]))
    descriptions = {**dict(VARIABLES), **BOOKKEEPING}
    for name, text in descriptions.items():
        if name in ds:
            ds[name].attrs["description"] = text if isinstance(text, str) else str(text)
    exp = traj["config"]
    ds.attrs.update(
        experiment=exp.get("name", ""),
        kind=exp["kind"],
        hidden=int(exp["hidden"]),
        width=int(exp["width"]),
        seeds=int(exp["seeds"]),
        dataset=exp.get("dataset", "synthetic"),
        data_source=exp.get("source", "synthetic"),
        rescale_c=float(exp.get("rescale", {}).get("c", 1.0)),
        eval_sample=traj["eval_name"],
        config=json.dumps(exp, sort_keys=True),
        diagnostics=json.dumps(dict(settings), sort_keys=True),
    )
    return ds
