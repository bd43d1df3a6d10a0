"""Self-attention dynamics on the sphere S^{d-1} (Li & Altafini, arXiv:2605.25619, supplement).

The supplement studies the simplified transformer layer, read as a discrete-time map on
the product of spheres (S^{d-1})^n,

    x_i <- normalize(x_i + eta * sum_h sum_j A^h_ij F^h x_j),    F^h = W_O^h W_V^h,

where ``normalize`` is the LayerNorm read as projection onto the unit sphere and the
feed-forward sub-layer is dropped. With softmax attention A^h_ij is the softmax over j of
``beta * x_i^T B^h x_j`` (``B^h = W_Q^h^T W_K^h``); with "full" attention A_ij = 1/n, and the
map becomes a power-method step on ``I + eta F`` (``F = sum_h F^h``) that every token takes
in the direction of the common mean -- the mechanism that tilts tokens towards the
eigenvector of F whose eigenvalue has the largest real part (Figure 13).

Equilibria (supplement, Lemma 1): consensus ``x_i = v_k`` for every eigenvector v_k of F,
bipartite consensus ``x_i = +-v_k`` and polygonal equilibria. This module offers the map,
trajectories, the equilibria, and a float64 autograd Jacobian restricted to the tangent
space of the product of spheres (dimension ``n d - n``), to be compared with the closed-form
eigenvalues of the supplement.

Jacobian at consensus, derived here (and checked numerically in the tests). At
``x_i = v_k`` with ``F v_k = lambda_k v_k``, ``||v_k|| = 1`` and full attention, every token
maps to ``xt = (1 + eta lambda_k) v_k``, so with ``P = I - v_k v_k^T``

    J = (I_n (x) P + (eta/n) 11^T (x) P F) / |1 + eta lambda_k|.

On the tangent space ``{z : v_k^T z_i = 0}`` this has the eigenvalues

* ``(1 + eta lambda_h) / |1 + eta lambda_k|`` for h != k (common mode ``z_i = w`` for all i;
  the quotient of ``I + eta F`` by its invariant line span(v_k), so it holds for any F with
  real spectrum, not only symmetric F),
* ``1 / |1 + eta lambda_k|`` with multiplicity ``n d - d - n + 1`` (modes with sum_i z_i = 0),

which fill the whole tangent space (``(d - 1) + (n d - d - n + 1) = n d - n``). The
supplement (eq. (12) and the lemma after it) agrees on these two families but also lists
``(1 - eta lambda_k + eta^2 lambda_k^2)/(1 + eta lambda_k)`` with multiplicity n (and, for
1 + eta lambda_k < 0, ``(-1 - 3 eta lambda_k + eta^2 lambda_k^2)/(1 + eta lambda_k)`` once
and ``(-1 - eta lambda_k + eta^2 lambda_k^2)/(1 + eta lambda_k)`` n - 1 times). Those belong
to the radial directions ``p = (0, ..., v_k, ..., 0)``, which are normal to the product of
spheres: they are not eigenvalues of the linearisation of the dynamics on the sphere, and
the ambient derivative of ``x -> xt / ||xt||`` is exactly 0 there (moving x_i along v_k
keeps every xt_j parallel to v_k). Read as a stability condition they would be wrong: for
eta lambda_1 >= 2 the radial value is >= 1 although v_1 is attracting. The supplement's
eq. (12) also writes ``F - lambda_k v_k v_k^T`` where the derivative has ``(I - v_k v_k^T) F``;
the two agree for symmetric F (and have the same spectrum in general). See
:func:`supplement_consensus_eigenvalues` and :func:`consensus_jacobian_eigenvalues`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import xarray as xr
from scipy.linalg import null_space

from specalign.lazy import LazyModule
from specalign.transformers.variables import SPHERE, describe

# imported on first use: the report job reads measured_convergence_rate (numpy only),
# and torch's import was 1.9 s of that job's 6.8 s
torch = LazyModule("torch")

Attention = Literal["softmax", "full"]
ArrayPair = tuple[np.ndarray, np.ndarray]

__all__ = [
    "asymptotic_rate",
    "attention_matrices",
    "bipartite_state",
    "consensus_jacobian_eigenvalues",
    "consensus_points",
    "consensus_state",
    "convergence_rate_prediction",
    "extrinsic_jacobian",
    "measured_convergence_rate",
    "rate_min_steps",
    "simulate",
    "spectral_radius",
    "step",
    "stepsize_bound",
    "supplement_consensus_eigenvalues",
    "tangent_basis",
    "tangent_jacobian",
]


# --------------------------------------------------------------------------- inputs


def _heads(F_heads: np.ndarray | Sequence[np.ndarray]) -> np.ndarray:
    """``F_heads`` as a float64 (H, d, d) stack; a single (d, d) matrix is one head."""
    F = np.asarray(F_heads, dtype=np.float64)
    if F.ndim == 2:
        F = F[None]
    if F.ndim != 3 or F.shape[1] != F.shape[2]:
        raise ValueError(f"F_heads must be (d, d) or (n_heads, d, d), got shape {F.shape}")
    return F


def _bilinear(W_QK: np.ndarray | ArrayPair | None, n_heads: int, d: int) -> np.ndarray:
    """The (H, d, d) bilinear forms B^h with score_ij = x_i^T B^h x_j.

    ``None`` -> identity for every head (the setting of Geshkovski et al.); an array of
    shape (d, d) or (H, d, d) is taken as B^h itself; a pair ``(W_Q, W_K)`` of shape
    (k, d) or (H, k, d) gives ``B^h = W_Q^h^T W_K^h`` since <W_Q x_i, W_K x_j> =
    x_i^T W_Q^T W_K x_j.
    """
    if W_QK is None:
        B = np.broadcast_to(np.eye(d), (n_heads, d, d)).copy()
    elif isinstance(W_QK, tuple):
        if len(W_QK) != 2:
            raise ValueError("W_QK as a tuple must be (W_Q, W_K)")
        WQ = np.asarray(W_QK[0], dtype=np.float64)
        WK = np.asarray(W_QK[1], dtype=np.float64)
        if WQ.ndim == 2:
            WQ, WK = WQ[None], WK[None]
        if WQ.shape != WK.shape or WQ.shape[-1] != d:
            raise ValueError(f"W_Q {WQ.shape} and W_K {WK.shape} must match and end in d={d}")
        B = np.einsum("hkd,hke->hde", WQ, WK)
    else:
        B = np.asarray(W_QK, dtype=np.float64)
        if B.ndim == 2:
            B = B[None]
    if B.shape[1:] != (d, d):
        raise ValueError(f"bilinear forms must be (d, d) per head, got {B.shape}")
    if B.shape[0] == 1 and n_heads > 1:
        B = np.broadcast_to(B, (n_heads, d, d)).copy()
    if B.shape[0] != n_heads:
        raise ValueError(f"{B.shape[0]} attention heads given for {n_heads} value heads")
    return B


def _check_X(X: np.ndarray, d: int) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != d:
        raise ValueError(f"X must be (n_tokens, d={d}), got shape {X.shape}")
    return X


# --------------------------------------------------------------------------- the map


def _attention_t(
    X: torch.Tensor, B: torch.Tensor | None, attention: Attention, beta: float
) -> torch.Tensor:
    """(H, n, n) row-stochastic attention matrices (torch, so autograd sees them)."""
    n = X.shape[0]
    if attention == "full":
        H = 1 if B is None else B.shape[0]
        return torch.full((H, n, n), 1.0 / n, dtype=X.dtype)
    if attention == "softmax":
        assert B is not None
        scores = beta * torch.einsum("id,hde,je->hij", X, B, X)
        return torch.softmax(scores, dim=-1)
    raise ValueError(f"attention must be 'softmax' or 'full', got {attention!r}")


def _step_t(
    X: torch.Tensor,
    F: torch.Tensor,
    B: torch.Tensor | None,
    eta: float,
    attention: Attention,
    beta: float,
) -> torch.Tensor:
    A = _attention_t(X, B, attention, beta)
    if A.shape[0] == 1 and F.shape[0] > 1:
        # one attention pattern for all heads: sum_h A F^h x = A (sum_h F^h) x
        drift = A[0] @ X @ F.sum(0).T
    else:
        drift = torch.einsum("hij,hde,je->id", A, F, X)
    Xt = X + eta * drift
    return Xt / torch.linalg.vector_norm(Xt, dim=1, keepdim=True)


def _prepare(
    X: np.ndarray,
    F_heads: np.ndarray | Sequence[np.ndarray],
    attention: Attention,
    W_QK: np.ndarray | ArrayPair | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    F = _heads(F_heads)
    X = _check_X(X, F.shape[1])
    if attention not in ("softmax", "full"):
        raise ValueError(f"attention must be 'softmax' or 'full', got {attention!r}")
    B = None
    if attention == "softmax":
        B = torch.from_numpy(_bilinear(W_QK, F.shape[0], F.shape[1]))
    return torch.from_numpy(X.copy()), torch.from_numpy(F), B


def attention_matrices(
    X: np.ndarray,
    n_heads: int = 1,
    attention: Attention = "softmax",
    W_QK: np.ndarray | ArrayPair | None = None,
    beta: float = 1.0,
) -> np.ndarray:
    """The (H, n, n) attention matrices A^h of the supplement's dynamics at state X."""
    X = np.asarray(X, dtype=np.float64)
    B = None
    if attention == "softmax":
        B = torch.from_numpy(_bilinear(W_QK, n_heads, X.shape[1]))
    A = _attention_t(torch.from_numpy(X.copy()), B, attention, beta)
    if attention == "full" and A.shape[0] != n_heads:
        A = A.expand(n_heads, -1, -1)
    return A.numpy().copy()


def step(
    X: np.ndarray,
    F_heads: np.ndarray | Sequence[np.ndarray],
    eta: float,
    attention: Attention = "softmax",
    W_QK: np.ndarray | ArrayPair | None = None,
    beta: float = 1.0,
) -> np.ndarray:
    """One step of the supplement's self-attention dynamics on (S^{d-1})^n.

    ``x_i <- normalize(x_i + eta * sum_h sum_j A^h_ij F^h x_j)``.

    Parameters
    ----------
    X : (n, d) token states (rows); they need not be unit vectors, the output is.
    F_heads : (d, d) single-head ``F = W_O W_V`` or (H, d, d) per-head ``F^h``.
    eta : step size (the weight of the attention sub-layer against the residual).
    attention : "softmax" -- ``A^h_ij = softmax_j(beta x_i^T B^h x_j)``; "full" -- A_ij = 1/n,
        the power-method case.
    W_QK : bilinear forms of the softmax: None (identity), B^h as (d, d)/(H, d, d), or a pair
        (W_Q, W_K) of (k, d)/(H, k, d) with ``B^h = W_Q^h^T W_K^h``.
    beta : inverse temperature multiplying the scores.
    """
    Xt, F, B = _prepare(X, F_heads, attention, W_QK)
    with torch.no_grad():
        return _step_t(Xt, F, B, eta, attention, beta).numpy().copy()


def simulate(
    X0: np.ndarray,
    F_heads: np.ndarray | Sequence[np.ndarray],
    eta: float,
    n_steps: int,
    attention: Attention = "softmax",
    W_QK: np.ndarray | ArrayPair | None = None,
    beta: float = 1.0,
) -> np.ndarray:
    """Trajectory of :func:`step` from ``X0`` (normalised first): (n_steps + 1, n, d)."""
    if n_steps < 0:
        raise ValueError("n_steps must be >= 0")
    Xt, F, B = _prepare(X0, F_heads, attention, W_QK)
    Xt = Xt / torch.linalg.vector_norm(Xt, dim=1, keepdim=True)
    out = torch.empty((n_steps + 1, *Xt.shape), dtype=torch.float64)
    out[0] = Xt
    with torch.no_grad():
        for t in range(n_steps):
            Xt = _step_t(Xt, F, B, eta, attention, beta)
            out[t + 1] = Xt
    return out.numpy()


# --------------------------------------------------------------------------- equilibria


def consensus_points(F: np.ndarray, tol: float = 1e-9) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues and unit eigenvectors of F, the consensus points ``x_i = v_k``.

    Sorted by decreasing eigenvalue, so column 0 is the principal v_1. The supplement's
    consensus analysis assumes a real spectrum (Assumption 1); a complex eigenvalue raises.
    Symmetric F goes through ``eigh`` (orthonormal eigenvectors).
    """
    F = np.asarray(F, dtype=np.float64)
    if F.ndim != 2 or F.shape[0] != F.shape[1]:
        raise ValueError(f"F must be square, got {F.shape}")
    if np.allclose(F, F.T, rtol=0.0, atol=tol * max(1.0, np.abs(F).max())):
        lam, V = np.linalg.eigh((F + F.T) / 2)
    else:
        lam_c, V_c = np.linalg.eig(F)
        scale = max(1.0, np.abs(lam_c).max())
        if np.any(np.abs(lam_c.imag) > tol * scale):
            raise ValueError("F has complex eigenvalues: consensus points need a real spectrum")
        lam, V = lam_c.real, V_c.real
        V = V / np.linalg.norm(V, axis=0, keepdims=True)
    order = np.argsort(-lam, kind="stable")
    return lam[order], V[:, order]


def consensus_state(v: np.ndarray, n: int) -> np.ndarray:
    """All n tokens at the unit vector v: (n, d)."""
    v = np.asarray(v, dtype=np.float64)
    return np.tile(v / np.linalg.norm(v), (n, 1))


def bipartite_state(v: np.ndarray, n1: int, n2: int) -> np.ndarray:
    """Bipartite consensus: n1 tokens at v and n2 at -v (Figure 14): (n1 + n2, d)."""
    v = np.asarray(v, dtype=np.float64) / np.linalg.norm(v)
    return np.vstack([np.tile(v, (n1, 1)), np.tile(-v, (n2, 1))])


# --------------------------------------------------------------------------- Jacobians


def tangent_basis(X: np.ndarray) -> np.ndarray:
    """Orthonormal basis of the tangent space of (S^{d-1})^n at X: (n d, n d - n).

    Block diagonal, block i spanning x_i^perp; coordinates follow ``X.reshape(-1)``.
    """
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    basis = np.zeros((n * d, n * (d - 1)))
    for i in range(n):
        basis[i * d : (i + 1) * d, i * (d - 1) : (i + 1) * (d - 1)] = null_space(X[i][None, :])
    return basis


def extrinsic_jacobian(
    X: np.ndarray,
    F_heads: np.ndarray | Sequence[np.ndarray],
    eta: float,
    attention: Attention = "full",
    W_QK: np.ndarray | ArrayPair | None = None,
    beta: float = 1.0,
) -> np.ndarray:
    """Float64 autograd Jacobian (n d, n d) of the ambient map ``X -> step(X)``.

    Coordinates follow ``X.reshape(-1)``. This is the derivative of ``xt / ||xt||`` in
    R^{nd} (no identity ``||x_i|| = 1`` substituted), so radial directions that keep every
    xt_j's direction unchanged get eigenvalue 0.
    """
    Xt, F, B = _prepare(X, F_heads, attention, W_QK)
    n, d = Xt.shape

    def f(flat: torch.Tensor) -> torch.Tensor:
        return _step_t(flat.reshape(n, d), F, B, eta, attention, beta).reshape(-1)

    J = torch.autograd.functional.jacobian(f, Xt.reshape(-1))
    return J.numpy().copy()


def tangent_jacobian(
    X: np.ndarray,
    F_heads: np.ndarray | Sequence[np.ndarray],
    eta: float,
    attention: Attention = "full",
    W_QK: np.ndarray | ArrayPair | None = None,
    beta: float = 1.0,
    tol: float = 1e-9,
) -> np.ndarray:
    """The Jacobian restricted to the tangent space of the product of spheres.

    ``Q^T J Q`` with Q = :func:`tangent_basis` (n d - n columns). X must be a unit-norm
    point that the map sends to itself up to a sign per token (an equilibrium, or a
    consensus with 1 + eta lambda_k < 0, which flips to -v_k): then the tangent spaces at
    X and at step(X) coincide and the restriction is an endomorphism whose eigenvalues
    decide local stability (moduli < 1: asymptotically stable).
    """
    X = _check_X(X, _heads(F_heads).shape[1])
    if not np.allclose(np.linalg.norm(X, axis=1), 1.0, atol=tol):
        raise ValueError("tangent_jacobian needs unit-norm tokens")
    Y = step(X, F_heads, eta, attention, W_QK, beta)
    if not np.allclose(np.abs(np.sum(X * Y, axis=1)), 1.0, atol=1e-8):
        raise ValueError(
            "X is not mapped to itself up to sign; the tangent restriction has no eigenvalues "
            "there (use extrinsic_jacobian)"
        )
    Q = tangent_basis(X)
    return Q.T @ extrinsic_jacobian(X, F_heads, eta, attention, W_QK, beta) @ Q


def consensus_jacobian_eigenvalues(F: np.ndarray, eta: float, k: int, n: int) -> np.ndarray:
    """Closed-form eigenvalues of the tangent Jacobian at the consensus ``x_i = v_k``.

    Full attention, k 0-based in the order of :func:`consensus_points`. Returns the n d - n
    values ``(1 + eta lambda_h)/|1 + eta lambda_k|`` (h != k) and ``1/|1 + eta lambda_k|``
    (multiplicity n d - d - n + 1); see the module docstring for the derivation and the
    comparison with the supplement (whose n extra radial values are not tangent modes).
    """
    lam, _ = consensus_points(F)
    d = lam.size
    denom = abs(1.0 + eta * lam[k])
    if denom == 0.0:
        raise ValueError("1 + eta lambda_k = 0: the consensus maps to the origin")
    common = (1.0 + eta * np.delete(lam, k)) / denom
    differential = np.full(n * d - d - n + 1, 1.0 / denom)
    return np.concatenate([common, differential])


def supplement_consensus_eigenvalues(F: np.ndarray, eta: float, k: int, n: int) -> np.ndarray:
    """The supplement's Jacobian eigenvalues at ``x_i = v_k`` as rendered (n d values).

    The n "radial" values ``(1 - eta lambda_k + eta^2 lambda_k^2)/(1 + eta lambda_k)`` (for
    1 + eta lambda_k > 0; otherwise ``(-1 - 3 eta lambda_k + eta^2 lambda_k^2)/(1 + eta
    lambda_k)`` once and ``(-1 - eta lambda_k + eta^2 lambda_k^2)/(1 + eta lambda_k)`` n - 1
    times) come first, then the n d - n tangent values of
    :func:`consensus_jacobian_eigenvalues`. Kept to document the discrepancy: the radial
    values are neither tangent eigenvalues nor eigenvalues of the ambient derivative (0).
    """
    lam, _ = consensus_points(F)
    a = eta * lam[k]
    if 1.0 + a > 0:
        radial = np.full(n, (1.0 - a + a * a) / (1.0 + a))
    else:
        radial = np.concatenate(
            [[(-1.0 - 3.0 * a + a * a) / (1.0 + a)], np.full(n - 1, (-1.0 - a + a * a) / (1.0 + a))]
        )
    return np.concatenate([radial, consensus_jacobian_eigenvalues(F, eta, k, n)])


def stepsize_bound(F: np.ndarray) -> float:
    """The supplement's step-size condition for the stability of v_1 (Theorem 3).

    With real eigenvalues lambda_1 > 0 >= ... >= lambda_d and ``-lambda_d > lambda_1``, the
    principal consensus is stable for ``eta < 2 / |lambda_1 + lambda_d|`` (it keeps
    ``|1 + eta lambda_d| < 1 + eta lambda_1``); otherwise any eta > 0 works (returns inf).
    """
    lam, _ = consensus_points(F)
    if -lam[-1] > lam[0]:
        return 2.0 / abs(lam[0] + lam[-1])
    return float("inf")


def spectral_radius(M: np.ndarray) -> float:
    """max |eigenvalue| of a square matrix."""
    return float(np.max(np.abs(np.linalg.eigvals(np.asarray(M, dtype=np.float64)))))


# --------------------------------------------------------------------------- rates


def _power_mus(F: np.ndarray, eta: float) -> np.ndarray:
    """Eigenvalues of I + eta F ordered by decreasing real part of the eigenvalue of F."""
    lam = np.linalg.eigvals(np.asarray(F, dtype=np.float64))
    lam = lam[np.argsort(-lam.real, kind="stable")]
    return 1.0 + eta * lam


def convergence_rate_prediction(F: np.ndarray, eta: float) -> float:
    """Power-method rate ``|mu_2 / mu_1|``, mu the eigenvalues of I + eta F.

    mu_1 belongs to the eigenvalue of F with the largest real part (the direction tokens
    tilt to), mu_2 to the next. The angle between the tokens and v_1 shrinks by this factor
    per shared-weight layer under full attention when the common mode is the slowest one,
    i.e. when |mu_2| >= 1 (see :func:`asymptotic_rate`); ``1 - gamma`` then shrinks by its
    square, since 1 - cos(theta) ~ theta^2 / 2. When lambda_1 is complex, mu_2 is its
    conjugate and the rate is 1: the tokens rotate in the invariant plane instead of
    converging to one direction.
    """
    mu = _power_mus(F, eta)
    if mu.size < 2:
        raise ValueError("F must be at least 2 x 2")
    if abs(mu[0]) == 0:
        raise ValueError("mu_1 = 0")
    return float(abs(mu[1]) / abs(mu[0]))


def asymptotic_rate(F: np.ndarray, eta: float, n: int) -> float:
    """Local contraction rate at the principal consensus, from the tangent Jacobian.

    ``max(|mu_2|, 1) / |mu_1|`` for n >= 2 tokens (the differential modes contract by
    1/|mu_1|), ``|mu_2/mu_1|`` for one token. Equals :func:`convergence_rate_prediction`
    when |mu_2| >= 1, e.g. lambda_2 >= 0.
    """
    mu = _power_mus(F, eta)
    slow = max(abs(mu[1]), 1.0) if n >= 2 else abs(mu[1])
    return float(slow / abs(mu[0]))


#: :func:`measured_convergence_rate` needs this many layers above its floor, and fits a
#: line through at least ``RATE_FIT_POINTS`` of them (the tail).
RATE_MIN_LAYERS, RATE_FIT_POINTS = 4, 3


def rate_min_steps(tail: float = 0.5) -> int:
    """The fewest layers (sphere steps) in which :func:`measured_convergence_rate` can
    measure a rate at all (``transformers.sphere.steps``' minimum in the schema); fewer
    could never give one."""
    n = RATE_MIN_LAYERS
    while n - int(round((1.0 - tail) * n)) < RATE_FIT_POINTS:
        n += 1
    return n


def measured_convergence_rate(gamma: np.ndarray, tail: float = 0.5, floor: float = 1e-6) -> float:
    """Geometric per-layer rate of ``gamma_t -> 1`` measured on ``sin(theta_t)``.

    ``gamma`` is (n_layers,) or (n_layers, n_tokens) of |cos| with the target direction;
    ``sin theta = sqrt(1 - gamma^2)`` (averaged over tokens) is fitted by a log-linear least
    squares over the last ``tail`` fraction of the layers where it stays above ``floor``
    (1 - gamma^2 loses all digits near 1e-16, so sin theta below ~1e-8 is noise). Compare with
    :func:`convergence_rate_prediction`.
    """
    g = np.asarray(gamma, dtype=np.float64)
    if g.ndim == 2:
        s = np.sqrt(np.clip(1.0 - g**2, 0.0, None)).mean(axis=1)
    elif g.ndim == 1:
        s = np.sqrt(np.clip(1.0 - g**2, 0.0, None))
    else:
        raise ValueError("gamma must be (n_layers,) or (n_layers, n_tokens)")
    valid = np.nonzero(s > floor)[0]
    if valid.size < RATE_MIN_LAYERS:
        raise ValueError(
            f"{valid.size} layers before gamma reaches 1 (sin theta <= {floor:g}), fewer "
            f"than the {RATE_MIN_LAYERS} a rate needs"
        )
    last = valid[-1]
    t = np.arange(last + 1)
    start = int(round((1.0 - tail) * (last + 1)))
    t = t[start:]
    if t.size < RATE_FIT_POINTS:
        raise ValueError(f"a tail of {t.size} layers, fewer than the {RATE_FIT_POINTS} a fit needs")
    slope = np.polyfit(t, np.log(s[t]), 1)[0]
    return float(np.exp(slope))


# --------------------------------------------------------------------------- sphere.nc


def _consensus_jacobians(
    F: np.ndarray, V: np.ndarray, eta: float, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted moduli of the tangent Jacobian's eigenvalues at each consensus x_i = v_k:
    numeric (float64 autograd), closed form, and the supplement's list (NaN-padded to
    n d values), each (d, .)."""
    d = F.shape[0]
    numeric, closed, supplement = [], [], []
    for k in range(d):
        X = consensus_state(V[:, k], n)
        J = tangent_jacobian(X, F, eta, "full")
        numeric.append(np.sort(np.abs(np.linalg.eigvals(J)))[::-1])
        closed.append(np.sort(np.abs(consensus_jacobian_eigenvalues(F, eta, k, n)))[::-1])
        supplement.append(np.sort(np.abs(supplement_consensus_eigenvalues(F, eta, k, n)))[::-1])
    supp = np.full((d, n * d), np.nan)
    for k, s in enumerate(supplement):
        supp[k, : s.size] = s
    return np.array(numeric), np.array(closed), supp


def sphere_dataset(cfg: Mapping[str, Any]) -> xr.Dataset:
    """The supplement's examples on S^{d-1} (Figures 13, 14) and its stability claims.

    F = Q diag(eigenvalues) Q^T with a seeded random orthogonal Q (symmetric, so every
    consensus point x_i = v_k is an equilibrium of the full-attention map); the 5-head
    example splits F into random symmetric heads summing to F, each with its own random
    bilinear attention form.
    """
    rng = np.random.default_rng(int(cfg["seed"]))
    d, n, H = int(cfg["d"]), int(cfg["n"]), int(cfg["heads"])
    eta, beta, steps = float(cfg["eta"]), float(cfg["beta"]), int(cfg["steps"])
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    F = Q @ np.diag(np.asarray(cfg["eigenvalues"], dtype=float)) @ Q.T
    lam, V = consensus_points(F)
    v1 = V[:, 0]

    parts = rng.standard_normal((H, d, d))
    parts = (parts + parts.transpose(0, 2, 1)) / 2
    F_heads = F / H + parts - parts.mean(axis=0)
    B_heads = rng.standard_normal((H, d, d)) / np.sqrt(d)
    X0 = rng.standard_normal((n, d))

    single = simulate(X0, F, eta, steps, "softmax", None, beta)
    multi = simulate(X0, F_heads, eta, steps, "softmax", B_heads, beta)
    full = simulate(X0, F, eta, steps, "full")

    bip = bipartite_state(v1, n // 2, n - n // 2)
    perts = [float(p) for p in cfg["perturbations"]]
    bip_traj = []
    for p in perts:
        noise = rng.standard_normal((n, d))
        bip_traj.append(simulate(bip + p * noise, F, eta, steps, "softmax", None, beta))

    numeric_a, closed_a, supp = _consensus_jacobians(F, V, eta, n)

    gamma_full = np.abs(full @ v1)  # (steps + 1, n): unit tokens, unit v1
    # the rate is the data's: gamma may reach 1 (to the fit's floor) in fewer layers than
    # a fit needs, whatever the steps; then NaN, and why
    try:
        rate_measured, rate_note = measured_convergence_rate(gamma_full[1:]), ""
    except ValueError as exc:
        rate_measured, rate_note = float("nan"), f"rate not measured: {exc}"
    ds = xr.Dataset(
        {
            "F": (("row", "col"), F),
            "eigenvalues": (("k",), lam),
            "eigenvectors": (("component", "k"), V),
            "traj_single": (("step", "token", "component"), single),
            "traj_multi": (("step", "token", "component"), multi),
            "traj_full": (("step", "token", "component"), full),
            "corr_v1_single": (("step", "token"), single @ v1),
            "corr_v1_multi": (("step", "token"), multi @ v1),
            "traj_bipartite": (("perturbation", "step", "token", "component"), np.stack(bip_traj)),
            "bipartite_distance": (
                ("perturbation", "step"),
                np.linalg.norm(np.stack(bip_traj) - bip, axis=(-2, -1)),
            ),
            "jacobian_numeric": (("k", "mode"), numeric_a),
            "jacobian_closed_form": (("k", "mode"), closed_a),
            "jacobian_supplement": (("k", "mode_supplement"), supp),
            "jacobian_max_abs_diff": (("k",), np.max(np.abs(numeric_a - closed_a), axis=1)),
            "jacobian_spectral_radius": (("k",), numeric_a[:, 0]),
            "stable": (("k",), (numeric_a[:, 0] < 1.0).astype(np.int8)),
            "gamma_full": (("step", "token"), gamma_full),
        },
        coords={"perturbation": perts, "k": np.arange(d), "step": np.arange(steps + 1)},
    )
    ds.attrs.update(
        d=d,
        n=n,
        heads=H,
        eta=eta,
        beta=beta,
        seed=int(cfg["seed"]),
        stepsize_bound=float(stepsize_bound(F)),
        eta_within_bound=int(eta < stepsize_bound(F)),
        rate_predicted=float(convergence_rate_prediction(F, eta)),
        rate_asymptotic=float(asymptotic_rate(F, eta, n)),
        rate_measured=float(rate_measured),
        rate_note=rate_note,
        note=(
            "jacobian_closed_form: the tangent-space eigenvalues (1 + eta l_h)/|1 + eta l_k| "
            "and 1/|1 + eta l_k|; jacobian_supplement adds the supplement's n radial values "
            "(1 - eta l + eta^2 l^2)/(1 + eta l), which are not modes of the dynamics on the "
            "sphere (see specalign.transformers.measure.sphere)."
        ),
    )
    return describe(ds, SPHERE, conventions=False)
