"""Buffered spectral localisation and the spectral reliability test (paper Secs. 5.1, 10.1).

With ``P_l = sum_i lambda_i u_i u_i^T`` (eigenvalues descending), ``Pi^(k)`` projects
onto ``u_1..u_k`` and ``Pi^{(k+beta),perp}`` onto ``u_{k+beta+1}..u_m``. The buffered
localised energy of an operator ``A`` is

    ||Pi^(k) A Pi^{(k+beta),perp}||_F^2 = sum_{i<=k, j>k+beta} (u_i^T A u_j)^2,

which ignores mixing through the ``beta`` buffer modes. The projectors are intrinsic
only if the spectrum is separated at both boundaries, so an energy is reported only
when the relative gaps ``gamma_j = (lambda_j - lambda_{j+1}) / lambda_1`` at
``j = k`` and ``j = k + beta`` exceed a threshold (Sec. 10.1); otherwise it is NaN.
Indices in docstrings are 1-based as in the paper; the code slices 0-based.
"""

from __future__ import annotations

import numpy as np

from specalign.commutators.measure.defects import safe_divide, transpose

__all__ = [
    "spectral_decomposition",
    "projector",
    "perp_projector",
    "relative_gaps",
    "reliable_boundaries",
    "localized_energy",
    "localized_energy_gate",
    "localized_energy_rank_one",
]


def _check_kbeta(k: int, beta: int) -> None:
    if k < 1 or beta < 0:
        raise ValueError(f"need k >= 1 and beta >= 0, got k={k}, beta={beta}")


def spectral_decomposition(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Descending eigenvalues and orthonormal eigenvector columns of symmetric ``A`` (Sec. 3.4)."""
    lam, U = np.linalg.eigh(A)
    return lam[..., ::-1], U[..., ::-1]


def projector(U: np.ndarray, k: int) -> np.ndarray:
    """Spectral projector ``Pi^(k) = sum_{i<=k} u_i u_i^T`` (Sec. 3.4)."""
    Uk = U[..., :, :k]
    return Uk @ transpose(Uk)


def perp_projector(U: np.ndarray, k: int) -> np.ndarray:
    """Complementary projector ``Pi^{(k),perp} = sum_{i>k} u_i u_i^T`` (Sec. 3.4)."""
    Up = U[..., :, k:]
    return Up @ transpose(Up)


def relative_gaps(lam: np.ndarray, k: int, beta: int) -> tuple[np.ndarray, np.ndarray]:
    """Relative boundary gaps at ``j = k`` and ``j = k + beta`` (Sec. 10.1).

    ``gamma_j = (lambda_j - lambda_{j+1}) / lambda_1`` (1-based indices).
    ``lam`` is descending with shape ``(..., m)``. A boundary without a successor
    eigenvalue (``j >= m``) or ``lambda_1 = 0`` gives NaN.
    """
    _check_kbeta(k, beta)
    m = lam.shape[-1]
    lam1 = lam[..., 0]

    def gap(j: int) -> np.ndarray:
        if j >= m:
            return np.full(lam.shape[:-1], np.nan)
        return safe_divide(lam[..., j - 1] - lam[..., j], lam1)

    return gap(k), gap(k + beta)


def reliable_boundaries(lam: np.ndarray, k: int, beta: int, threshold: float = 1e-3) -> np.ndarray:
    """Spectral reliability test: both relative boundary gaps exceed ``threshold`` (Sec. 10.1).

    False when ``k + beta >= m`` (no complementary block) or ``lambda_1 = 0``.
    """
    gk, gkb = relative_gaps(lam, k, beta)
    # NaN compares False, which covers the missing-block and zero-spectrum cases.
    return (gk > threshold) & (gkb > threshold)


def _blocks(U: np.ndarray, k: int, beta: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Top-``k`` and perp eigenvector blocks; ``None`` if the perp block is empty."""
    _check_kbeta(k, beta)
    if k + beta >= U.shape[-1]:
        return None
    return U[..., :, :k], U[..., :, k + beta :]


def _undefined(U: np.ndarray) -> np.ndarray:
    # Without a complementary block (k + beta >= m) the buffered energy is not defined
    # (Sec. 5.1 requires k + beta < m); NaN keeps it from reading as perfect alignment.
    return np.full(U.shape[:-2], np.nan)


def localized_energy(A: np.ndarray, U: np.ndarray, k: int, beta: int) -> np.ndarray:
    """Buffered energy ``||Pi^(k) A Pi^{(k+beta),perp}||_F^2`` of a fixed operator (Sec. 5.1).

    ``A`` has shape ``(..., m, m)``; ``U`` holds descending eigenvectors. NaN when the
    complementary block is empty; gap-based masking is the caller's job.
    """
    blocks = _blocks(U, k, beta)
    if blocks is None:
        return _undefined(U)
    Uk, Up = blocks
    B = transpose(Uk) @ A @ Up
    return np.sum(B * B, axis=(-2, -1))


def localized_energy_gate(p: np.ndarray, U: np.ndarray, k: int, beta: int) -> np.ndarray:
    """Buffered gate energy ``mean_x ||Pi^(k) D(x) Pi^{(k+beta),perp}||_F^2`` (Sec. 5.1).

    For diagonal ``D = diag(d)`` and symmetric projectors,
    ``||Pi D Pi_perp||_F^2 = tr(Pi D Pi_perp D) = sum_rs d_r d_s (Pi o Pi_perp)_rs``,
    so the mean is ``<p, Pi o Pi_perp>_F`` with ``p`` the co-activation matrix and no
    per-sample ``m x m`` blocks are formed.
    """
    if _blocks(U, k, beta) is None:
        return _undefined(U)
    Pi = projector(U, k)
    Pp = perp_projector(U, k + beta)
    return np.sum(p * Pi * Pp, axis=(-2, -1))


def localized_energy_rank_one(q: np.ndarray, U: np.ndarray, k: int, beta: int) -> np.ndarray:
    """Sample mean ``mean_x ||Pi^(k) q q^T Pi^{(k+beta),perp}||_F^2`` for rows ``q`` (Sec. 5.1).

    ``q`` has shape ``(..., N, m)``; for a rank-one operator the energy factorises as
    ``||Pi q||^2 ||Pi_perp q||^2``. Used for ``Q_l(x) = (D_l g_{l+1})(D_l g_{l+1})^T``
    and ``S_l(x) = g_l g_l^T``. NaN when the complementary block is empty.
    """
    blocks = _blocks(U, k, beta)
    if blocks is None:
        return _undefined(U)
    Uk, Up = blocks
    top = np.sum((q @ Uk) ** 2, axis=-1)
    rest = np.sum((q @ Up) ** 2, axis=-1)
    return np.mean(top * rest, axis=-1)
