"""Four-source recursion of the internal commutator and its source geometry (paper Sec. 4).

For ``l = 0..H-1`` the internal commutator ``C_int_l = [Qbar_l, P_l]`` splits exactly as

    C_int_l = T_tr + T_imb + T_fluc + T_gate,

    T_tr   = mean_x D_l W_{l+1}^T C_int_{l+1} W_{l+1} D_l       (transport)
    T_imb  = mean_x D_l [Sbar_{l+1}, Delta_l] D_l                (adjacent-layer imbalance)
    T_fluc = [mean_x D_l R_{l+1}(x) D_l, P_l]                    (sensitivity fluctuation)
    T_gate = mean_x D_l Sbar_{l+1} [D_l, P_l] + [D_l, P_l] Sbar_{l+1} D_l   (gate)

with ``C_int_{L-1} = [1, P_{L-1}] = 0``. With the co-activation matrix
``p = mean_x d d^T`` each gate average becomes a Hadamard product:
``T_tr = p * (W^T C W)``, ``T_imb = p * [Sbar, Delta]``,
``mean_x D R D = Qbar_l - p * Sbar_{l+1}`` and
``T_gate = (p*Sbar) P - p*(Sbar P) + p*(P Sbar) - P (p*Sbar)``.

Each source is computed from its own formula. ``Qbar_l`` enters both ``C_int_l`` and
``T_fluc`` and cancels, so the recursion residual tests the transport, imbalance and
gate algebra together with the consistency of ``Sbar_{l+1}`` and ``C_int_{l+1}``
(i.e. the backward pass); ``T_fluc`` itself is verified against a per-sample loop in
the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specalign.commutators.measure.defects import (
    Qbar,
    Sbar,
    coactivation,
    commutator,
    frob2,
    frob_inner,
    gram_P,
    imbalance,
    residual,
    safe_divide,
    transpose,
)

__all__ = ["SOURCE_NAMES", "Sources", "four_sources", "source_geometry"]

SOURCE_NAMES: tuple[str, ...] = ("tr", "imb", "fluc", "gate")


@dataclass(frozen=True)
class Sources:
    """The four sources of one layer and the operators they were built from.

    All matrices have shape ``(..., m_{l+1}, m_{l+1})``.
    """

    T_tr: np.ndarray
    T_imb: np.ndarray
    T_fluc: np.ndarray
    T_gate: np.ndarray
    C_int: np.ndarray
    Qbar: np.ndarray
    P: np.ndarray
    p: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        """Sources keyed by ``SOURCE_NAMES``."""
        return {"tr": self.T_tr, "imb": self.T_imb, "fluc": self.T_fluc, "gate": self.T_gate}

    def total(self) -> np.ndarray:
        """``T_tr + T_imb + T_fluc + T_gate``, the right-hand side of the recursion."""
        return self.T_tr + self.T_imb + self.T_fluc + self.T_gate

    def recursion_residual(self, eps: float = 1e-30) -> np.ndarray:
        """``Res(C_int_l, sum of sources)`` (Sec. 10.7); ~1e-15 in float64."""
        return residual(self.C_int, self.total(), eps)


def four_sources(
    W: np.ndarray,
    W_next: np.ndarray,
    d: np.ndarray,
    g_next: np.ndarray,
    C_int_next: np.ndarray | None,
) -> Sources:
    """Four-source decomposition of ``C_int_l`` on a sample (Sec. 4).

    Parameters
    ----------
    W, W_next:
        ``W_l`` of shape ``(..., m_{l+1}, m_l)`` and ``W_{l+1}`` of shape
        ``(..., m_{l+2}, m_{l+1})``.
    d:
        Gates ``d_l`` of shape ``(..., N, m_{l+1})``.
    g_next:
        Sensitivities ``g_{l+1}`` of shape ``(..., N, m_{l+1})``.
    C_int_next:
        ``C_int_{l+1} = [Qbar_{l+1}, P_{l+1}]``, shape ``(..., m_{l+2}, m_{l+2})``, or
        ``None`` at the last hidden layer where ``C_int_{L-1} = 0``.
    """
    P = gram_P(W)
    p = coactivation(d)
    Qb = Qbar(d, g_next)
    Sb_next = Sbar(g_next)
    C_int = commutator(Qb, P)

    if C_int_next is None:
        T_tr = np.zeros_like(P)
    else:
        T_tr = p * (transpose(W_next) @ C_int_next @ W_next)
    T_imb = p * commutator(Sb_next, imbalance(W, W_next))
    T_fluc = commutator(Qb - p * Sb_next, P)
    pS = p * Sb_next
    T_gate = pS @ P - p * (Sb_next @ P) + p * (P @ Sb_next) - P @ pS
    return Sources(
        T_tr=T_tr, T_imb=T_imb, T_fluc=T_fluc, T_gate=T_gate, C_int=C_int, Qbar=Qb, P=P, p=p
    )


def source_geometry(
    T: dict[str, np.ndarray], C_int: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Energies, fractions, correlations and cancellation ratio of the sources (Secs. 4, 10.3).

    ``E^nu = ||T_nu||_F^2``; ``e^nu = E^nu / sum E``; ``rho_tr_imb`` is the Frobenius
    cosine of ``T_tr`` and ``T_imb``; ``I^{nu,eta} = 2 <T_nu, T_eta>_F / sum E`` for the
    six unordered pairs; ``chi = ||C_int||_F / sum_nu ||T_nu||_F``. Ratios with a zero
    denominator are NaN. ``C_int`` defaults to the sum of the sources.

    Parameters
    ----------
    T:
        Mapping from each name in ``SOURCE_NAMES`` to a ``(..., m, m)`` array.
    """
    E = {nu: frob2(T[nu]) for nu in SOURCE_NAMES}
    total = E["tr"] + E["imb"] + E["fluc"] + E["gate"]
    out: dict[str, np.ndarray] = {}
    for nu in SOURCE_NAMES:
        out[f"E_{nu}"] = E[nu]
    for nu in SOURCE_NAMES:
        out[f"e_{nu}"] = safe_divide(E[nu], total)
    norms = {nu: np.sqrt(E[nu]) for nu in SOURCE_NAMES}
    out["rho_tr_imb"] = safe_divide(frob_inner(T["tr"], T["imb"]), norms["tr"] * norms["imb"])
    for i, nu in enumerate(SOURCE_NAMES):
        for eta in SOURCE_NAMES[i + 1 :]:
            out[f"I_{nu}_{eta}"] = safe_divide(2.0 * frob_inner(T[nu], T[eta]), total)
    if C_int is None:
        C_int = T["tr"] + T["imb"] + T["fluc"] + T["gate"]
    out["C_int_norm"] = np.sqrt(frob2(C_int))
    out["chi"] = safe_divide(
        out["C_int_norm"], norms["tr"] + norms["imb"] + norms["fluc"] + norms["gate"]
    )
    return out
