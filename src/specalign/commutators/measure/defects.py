"""Commutators, covariance operators and normalised global defects.

Notation follows the paper (Secs. 3.3-3.5, 4, 10.1): ``P_l = W_l W_l^T`` is the
covariance (weight Gram) operator, ``NFM_l = W_l^T W_l`` the neural feature matrix,
``S_l(x) = g_l g_l^T`` the pointwise sensitivity, ``Sbar_l`` its sample mean,
``Q_l(x) = D_l S_{l+1}(x) D_l`` and ``Qbar_l`` its sample mean. The three alignment
levels are the gate commutator ``[D_l(x), P_l]``, the internal commutator
``C_int_l = [Qbar_l, P_l]`` and the feature commutator ``C_feat_l = [Sbar_l, NFM_l]``.

Because ``D_l(x) = diag(d(x))`` is a 0/1 diagonal, every sample mean over gates
reduces to the co-activation matrix ``p = mean_x d d^T``; these reduced forms are
what the production kernels use. Every function accepts leading batch dimensions.
Matrices are ``(..., m, m)``; per-sample rows are ``(..., N, m)``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "transpose",
    "commutator",
    "frob_inner",
    "frob2",
    "op_norm",
    "safe_divide",
    "gram_P",
    "nfm",
    "imbalance",
    "coactivation",
    "gate_energy",
    "gate_energy_pointwise",
    "Qbar",
    "Sbar",
    "G_D",
    "G_Q",
    "G_S",
    "residual",
]


def transpose(A: np.ndarray) -> np.ndarray:
    """Transpose of the last two axes."""
    return np.swapaxes(A, -1, -2)


def commutator(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Matrix commutator ``[A, B] = AB - BA`` (Sec. 3.3, eq. 3.20; Sec. 4)."""
    return A @ B - B @ A


def frob_inner(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Frobenius inner product ``<A, B>_F = tr(A^T B)`` over the last two axes."""
    return np.sum(A * B, axis=(-2, -1))


def frob2(A: np.ndarray) -> np.ndarray:
    """Squared Frobenius norm ``||A||_F^2`` over the last two axes."""
    return frob_inner(A, A)


def op_norm(A: np.ndarray, hermitian: bool = False) -> np.ndarray:
    """Operator (spectral) norm ``||A||_op`` of each matrix in the stack.

    With ``hermitian=True`` the largest absolute eigenvalue is returned, which is
    cheaper and equals the spectral norm for the symmetric operators used here.
    """
    if A.shape[-1] == 0 or A.shape[-2] == 0:
        return np.zeros(A.shape[:-2])
    if hermitian:
        return np.max(np.abs(np.linalg.eigvalsh(A)), axis=-1)
    return np.linalg.svd(A, compute_uv=False)[..., 0]


def safe_divide(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den`` with NaN wherever ``den == 0``.

    The paper leaves a normalised quantity undefined when its normaliser vanishes
    (Sec. 10.1); returning NaN rather than 0 keeps a dead layer from reading as
    perfect alignment.
    """
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = num / den
    return np.where(den == 0, np.nan, out)


def gram_P(W: np.ndarray) -> np.ndarray:
    """Covariance operator ``P_l = W_l W_l^T``, shape ``(..., m_{l+1}, m_{l+1})`` (Sec. 3.3)."""
    return W @ transpose(W)


def nfm(W: np.ndarray) -> np.ndarray:
    """Neural feature matrix ``NFM_l = W_l^T W_l``, shape ``(..., m_l, m_l)`` (Sec. 3.3)."""
    return transpose(W) @ W


def imbalance(W: np.ndarray, W_next: np.ndarray) -> np.ndarray:
    """Adjacent-layer imbalance ``Delta_l = P_l - W_{l+1}^T W_{l+1}`` (Sec. 3.5)."""
    return gram_P(W) - nfm(W_next)


def coactivation(d: np.ndarray) -> np.ndarray:
    """Co-activation matrix ``p_ij = mean_x d_i(x) d_j(x)`` from gates ``d`` (``(..., N, m)``).

    For any constant ``A``, ``mean_x D(x) A D(x) = A * p`` (Hadamard product), which
    is how every gate average in the recursion is evaluated.
    """
    return transpose(d) @ d / d.shape[-2]


def gate_energy(P: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Gate-covariance energy ``G_l = mean_x ||[D_l(x), P_l]||_F^2`` (Sec. 4; Sec. 9.1).

    Uses ``([D, P])_ij = (d_i - d_j) P_ij`` and, for 0/1 gates,
    ``mean (d_i - d_j)^2 = p_ii + p_jj - 2 p_ij``.
    """
    diag = np.diagonal(p, axis1=-2, axis2=-1)
    # Grouped as (p_ii - p_ij) + (p_jj - p_ij): each bracket is a nonnegative
    # disagreement frequency and is exactly 0 when the gates never disagree.
    disagree = (diag[..., :, None] - p) + (diag[..., None, :] - p)
    return np.sum(P * P * disagree, axis=(-2, -1))


def gate_energy_pointwise(P: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Per-sample gate energies ``||[D_l(x), P_l]||_F^2``, shape ``(..., N)`` (Sec. 4).

    ``P`` has shape ``(..., m, m)`` and ``d`` has shape ``(..., N, m)``. Its sample
    mean equals :func:`gate_energy`; the per-sample values give Monte Carlo errors.
    """
    # For 0/1 gates (d_i - d_j)^2 = d_i (1 - d_j) + d_j (1 - d_i); this form sums
    # nonnegative terms only, so agreeing gates contribute exactly zero.
    P2 = P * P
    return 2.0 * np.sum((d @ P2) * (1.0 - d), axis=-1)


def Qbar(d: np.ndarray, g_next: np.ndarray) -> np.ndarray:
    """Internal sensitivity covariance ``Qbar_l = mean_x D_l S_{l+1}(x) D_l`` (Sec. 3.3).

    ``Q_l(x) = q q^T`` with ``q = D_l g_{l+1}`` is rank one, so the mean is the Gram
    matrix of the rows ``d_l * g_{l+1}`` (both of shape ``(..., N, m_{l+1})``).
    """
    q = d * g_next
    return transpose(q) @ q / q.shape[-2]


def Sbar(g: np.ndarray) -> np.ndarray:
    """Averaged sensitivity (AGOP) ``Sbar_l = mean_x g_l g_l^T`` from rows ``g_l`` (Sec. 3.3)."""
    return transpose(g) @ g / g.shape[-2]


def G_D(P: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Normalised gate defect ``G_D,l = mean_x ||[D_l, P_l]||_F^2 / ||P_l||_F^2`` (Sec. 10.1).

    NaN when ``P_l = 0``. The dead-layer rule (all gates closed gives NaN) is
    applied by the caller, which knows the gates.
    """
    return safe_divide(gate_energy(P, p), frob2(P))


def G_Q(Qb: np.ndarray, P: np.ndarray) -> np.ndarray:
    """Normalised internal defect (Sec. 10.1).

    ``G_Q,l = ||[Qbar_l, P_l]||_F^2 / (||Qbar_l||_op^2 ||P_l||_F^2)``;
    NaN when ``Qbar_l = 0`` or ``P_l = 0``.
    """
    return safe_divide(frob2(commutator(Qb, P)), op_norm(Qb, hermitian=True) ** 2 * frob2(P))


def G_S(Sb: np.ndarray, N: np.ndarray) -> np.ndarray:
    """Normalised feature defect (Sec. 10.1).

    ``G_S,l = ||[Sbar_l, NFM_l]||_F^2 / (||Sbar_l||_op^2 ||NFM_l||_F^2)``;
    NaN when ``Sbar_l = 0`` or ``NFM_l = 0``.
    """
    return safe_divide(frob2(commutator(Sb, N)), op_norm(Sb, hermitian=True) ** 2 * frob2(N))


def residual(A: np.ndarray, B: np.ndarray, eps: float = 1e-30) -> np.ndarray:
    """Normalised identity residual (Sec. 10.7).

    ``Res(A, B) = ||A - B||_F / (||A||_F + ||B||_F + eps)``.
    ``eps`` only guards the exact ``A = B = 0`` case (a dead layer), where the
    residual is then 0; it is far below any operator norm met in practice.
    """
    num = np.sqrt(frob2(A - B))
    return num / (np.sqrt(frob2(A)) + np.sqrt(frob2(B)) + eps)
