"""Spectra of the layer matrices F = W_O W_V: eigenvalues, leading eigenvectors, gaps.

In the power-method view a layer maps a token x to (roughly) normalise(x + eta F x),
so tokens tilt towards the eigenvector of F whose eigenvalue has the largest REAL part
(lambda_1): that one maximises |1 + eta lambda| for small eta > 0. The plain power
method on F itself would instead chase the eigenvalue of largest *modulus*, which for
trained transformers is often a large negative one (``radius_is_negative``); the shift
I + eta F repairs that only for eta below the paper's bound (Theorem 3):
eta < 2 / |lambda_1 + lambda_d| when -lambda_d > lambda_1, lambda_d being the
eigenvalue with the most negative real part.

Conventions (all computed in float64: on the CPU the eigenvalues by LAPACK ``geev``'s
steps without vectors (numpy's ``eigvals``) and only the eigenvectors the outputs use, by
inverse iteration on the Hessenberg form (:func:`sorted_eigenpairs`); on a CUDA device, when the job
was granted a GPU, ``torch.linalg.eig`` in float64):

* Eigenvalues are sorted by real part descending, ties (a conjugate pair) by imaginary
  part descending, so lambda_1 of a complex pair has positive imaginary part.
* Real eigenvalues are those with imaginary part exactly 0: LAPACK returns real
  eigenvalues of a real matrix with zero imaginary part, and conjugate pairs with
  exactly opposite ones, so no tolerance is needed.
* Eigenvectors are scaled to unit 2-norm, then multiplied by a phase that makes their
  largest-modulus component (first one on ties) real and positive; for a real
  eigenvalue this fixes the sign, so results are deterministic.
* ``gap`` = Re lambda_1 - Re lambda_2, or Re lambda_1 - Re lambda_3 when lambda_2 is
  the conjugate of a complex lambda_1 (as the paper's Fig. 7 does).
* ``v1`` (complex) is the eigenvector of lambda_1. ``v1_leading_real`` is what
  propagation's alignment gamma uses: v1 itself when lambda_1 is real, otherwise the
  eigenvector of the real eigenvalue with the largest real part (NaN if F has no real
  eigenvalue). When lambda_1 is complex the tilt is towards the real 2-plane spanned by
  Re v1 and Im v1 (invariant under F); ``v1_plane`` is an orthonormal basis of it
  (Gram-Schmidt of Re v1 then Im v1; NaN when lambda_1 is real).
* ``spectral_radius`` = max |lambda|; ``radius_is_negative`` says whether the
  eigenvalue attaining it has negative real part (ties go to the eigenvalue earliest in
  the sort order, i.e. the one with the larger real part).
* Grouped-query attention (issue 14): F = W_O' W_V' with W_V' (r, d) the key/value heads'
  rows and W_O' (d, r) the summed output columns of the query heads sharing each
  (:meth:`~specalign.transformers.weights.ModelWeights.ov_factors`), so rank F <= r =
  n_kv_heads * d_head. When r < d (Mistral-7B: 1024 of 4096) the block is decomposed
  through the r x r product M = W_V' W_O' (:func:`spectrum_factored`): M u = lambda u
  gives F (W_O' u) = lambda W_O' u, so the eigenvalues of F are those of M and d - r
  exact zeros (kept as the count ``n_zero_eigenvalues``, not as d - r values of
  round-off), and the eigenvector of F for an eigenvalue of M is W_O' u, normalised as
  below. An exact zero of F has an eigenspace of dimension >= d - r, so an eigenvector
  asked for at one of them (``v2`` when M has one eigenvalue of positive real part, say)
  is NaN. Every summary (gap, radius, eta bound, dominant eigenvalue of I + eta F) is of
  F's whole spectrum, the zeros included. 64x fewer flops than ``geev`` of F at d 4096.
* ``eigenpair_residual`` = max over the returned eigenpairs (v1, v2 and the three
  directions) of |F v - lambda v|_2 / spectral radius (v unit): the identity F v =
  lambda v checked on every decomposition.
* ``lambda_I_plus_etaF`` is the dominant (largest-modulus) eigenvalue 1 + eta lambda_k
  of I + eta F; ``dominant_is_lambda1`` says whether k = 1, i.e. whether the power
  method on I + eta F converges to v1's direction.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from specalign.transformers.variables import SPECTRA, describe
from specalign.transformers.weights import SHARED, ModelWeights


def _order(eigenvalues: np.ndarray) -> np.ndarray:
    """Sort order: real part descending, then imaginary part descending."""
    return np.lexsort((-eigenvalues.imag, -eigenvalues.real))


def eig(
    F: np.ndarray, vectors: bool = True, device: str = "cpu"
) -> tuple[np.ndarray, np.ndarray | None]:
    """Eigenvalues (complex128) and, with ``vectors``, right eigenvectors (columns) of the
    float64 matrix ``F``, unsorted: numpy's LAPACK ``geev`` on the CPU, ``torch.linalg.eig``
    in float64 on ``device`` otherwise (a CUDA device). Both return real eigenvalues of a
    real matrix with an exactly zero imaginary part and conjugate pairs as such."""
    F = np.asarray(F, dtype=np.float64)
    if device == "cpu":
        return np.linalg.eig(F) if vectors else (np.linalg.eigvals(F), None)
    import torch

    T = torch.as_tensor(F, dtype=torch.float64, device=device)
    if vectors:
        lam, vecs = torch.linalg.eig(T)
        return lam.cpu().numpy(), vecs.cpu().numpy()
    return torch.linalg.eigvals(T).cpu().numpy(), None


def eigvals_fast(F: np.ndarray) -> np.ndarray:
    """All eigenvalues of ``F`` (complex, float64), sorted as in the module doc.

    Eigenvalues alone (``np.linalg.eigvals``) skip the eigenvector back-substitution,
    about 2-3x faster than ``eig``; use it when no eigenvector is needed. For the
    d <= 2048 of the studied models the full ``eig`` is affordable too, so there is no
    partial (Arnoldi) solver: the sort needs every eigenvalue's real part anyway, which
    a largest-modulus Krylov method would not deliver for negative-dominated spectra.
    """
    lam = np.linalg.eigvals(np.asarray(F, dtype=np.float64))
    return lam[_order(lam)]


def normalise_eigenvector(v: np.ndarray) -> np.ndarray:
    """Unit 2-norm, phase chosen so the largest-|component| entry is real positive."""
    v = np.asarray(v, dtype=np.complex128)
    v = v / np.linalg.norm(v)
    k = int(np.argmax(np.abs(v)))
    v = v * (np.conj(v[k]) / np.abs(v[k]))
    v[k] = np.abs(v[k])  # exactly real, not real up to rounding
    return v


def _plane_basis(v: np.ndarray) -> np.ndarray:
    """Orthonormal (2, d) basis of span{Re v, Im v} by Gram-Schmidt in that order."""
    a, b = v.real.copy(), v.imag.copy()
    e1 = a / np.linalg.norm(a)
    b = b - (e1 @ b) * e1
    return np.stack([e1, b / np.linalg.norm(b)])


def gap_from_sorted(lam: np.ndarray) -> float:
    """Re l1 - Re l2, or Re l1 - Re l3 when l2 = conj(l1) (complex leading pair)."""
    if lam.size < 2:
        return float("nan")
    if lam[0].imag != 0:
        return float(lam[0].real - lam[2].real) if lam.size > 2 else float("nan")
    return float(lam[0].real - lam[1].real)


def eta_bound(lam: np.ndarray) -> float:
    """The paper's step-size bound 2/|Re l1 + Re ld| if -Re ld > Re l1, else +inf.

    From 1 + eta l1 > |1 + eta ld| for real eigenvalues. For complex eigenvalues the
    real parts are used, so the bound is the paper's (it ignores imaginary parts);
    ``dominant_is_lambda1`` in ``spectrum`` is the exact check for a given eta.
    """
    l1, ld = float(lam[0].real), float(lam[-1].real)
    return 2.0 / abs(l1 + ld) if -ld > l1 else float("inf")


def sorted_eig(F: np.ndarray, device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues and right eigenvectors (columns) of ``F`` in the module's sort order,
    computed on ``device`` (:func:`eig`)."""
    lam, vecs = eig(F, True, device)
    assert vecs is not None
    order = _order(lam)
    return lam[order], vecs[:, order]


def sorted_eigenpairs(
    A: np.ndarray, device: str = "cpu"
) -> tuple[np.ndarray, Callable[[int], np.ndarray]]:
    """Eigenvalues of ``A`` in the module's sort order, and ``column(i)``: a right
    eigenvector of the i-th, computed when it is asked for.

    The outputs read a handful of eigenvectors (v1, v2, the leading and the most negative
    real one), not d of them. On the CPU the eigenvalues are ``geev``'s without vectors,
    the eigen-solver's floor (issue 33), computed by its own steps so that the Hessenberg
    form stays (:class:`~specalign.transformers.measure.hessenberg.HessenbergEigen`:
    numpy's ``eigvals``, bit for bit on one BLAS thread), and each eigenvector asked for
    is inverse iteration on that form (:class:`_InverseIteration`, O(d^2) a vector).
    Every vector is checked, ``|A v - lambda v| <= d eps |A|_1``; where the Hessenberg
    route does not reach that, inverse iteration on A itself gives it, and where that
    fails too (a defective or badly clustered eigenvalue) a full ``geev``. On a CUDA
    device ``torch.linalg.eig`` computes all of them at once.
    """
    if device != "cpu":
        lam, vecs = sorted_eig(A, device)
        return lam, lambda i: vecs[:, i]
    from specalign.transformers.measure.hessenberg import HessenbergEigen

    A = np.asarray(A, dtype=np.float64)
    solver = HessenbergEigen(A)
    if not solver.supported:  # geev scales such a matrix first (hessenberg module doc)
        lam, vecs = sorted_eig(A)
        return lam, lambda i: vecs[:, i]
    order = _order(solver.eigenvalues)
    return solver.eigenvalues[order], _InverseIteration(A, solver, order)


class _InverseIteration:
    """Right eigenvectors of ``A`` for its sorted eigenvalues, one at a time: inverse
    iteration on the Hessenberg form of ``solver`` at the eigenvalue
    ``solver.eigenvalues[order[i]]``, from a fixed pseudo-random start, until
    ``|A x - lambda x| <= d eps |A|_1`` (at most :attr:`MAX_SOLVES` solves; one or two
    when lambda is as accurate as geev makes it); where that check is not met, inverse
    iteration on A itself (:meth:`_on_a`), then a full ``geev``. The
    conjugate of a complex eigenvalue gets the conjugate vector; a repeated eigenvalue
    starts its k-th copy from another vector, so that its vectors span more than one
    direction of its eigenspace where they can. Deterministic on one BLAS thread, as
    the spectra rule computes them (:func:`map_blocks`).
    """

    MAX_SOLVES = 4

    def __init__(self, A: np.ndarray, solver: Any, order: np.ndarray) -> None:
        self.A, self.solver, self.order = A, solver, order
        self.lam = solver.eigenvalues[order]
        self.d = A.shape[0]
        self.norm = float(np.linalg.norm(A, 1)) if A.size else 0.0
        self.tol = self.d * float(np.finfo(np.float64).eps) * max(self.norm, np.finfo(float).tiny)
        self.cache: dict[tuple[float, float, int], np.ndarray] = {}
        self._full: tuple[np.ndarray, np.ndarray] | None = None
        self.on_a = 0  # vectors the Hessenberg route left to inverse iteration on A

    def __call__(self, i: int) -> np.ndarray:
        value = complex(self.lam[i])
        upper = complex(value.real, abs(value.imag))  # the pair's member with Im >= 0
        # the how-many-th copy of this eigenvalue (or of its conjugate) i is
        copy = int(
            np.count_nonzero(
                (self.lam[:i].real == upper.real) & (np.abs(self.lam[:i].imag) == upper.imag)
            )
        )
        if upper.imag != 0:
            copy //= 2  # each copy of a pair is listed twice
        key = (upper.real, upper.imag, copy)
        if key not in self.cache:
            # LAPACK lists a pair's member with Im > 0 first, right before its conjugate
            j = int(self.order[i]) - (1 if value.imag < 0 else 0)
            self.cache[key] = self._vector(j, upper, copy)
        v = self.cache[key]
        return v if value.imag >= 0 else v.conj()

    def _vector(self, j: int, value: complex, copy: int) -> np.ndarray:
        x = self.solver.vector(j, self._start(copy), self.tol, self.MAX_SOLVES)
        if x is None:
            self.on_a += 1
            x = self._on_a(value, copy)
        return x if x is not None else self._from_geev(value)

    def _start(self, copy: int) -> np.ndarray:
        return np.random.default_rng(copy).standard_normal(self.d)

    def _on_a(self, value: complex, copy: int) -> np.ndarray | None:
        """Inverse iteration on A itself: one LU of A - lambda I (O(d^3), at the GEMM
        rate), a zero pivot replaced by eps |A|_1, then up to :attr:`MAX_SOLVES` solves.
        For the few matrices where the Hessenberg route's floor, the reduction's backward
        error of a few d eps |A|, lies above the check (symmetric-like ones)."""
        import scipy.linalg

        real = value.imag == 0
        shift = value.real if real else value
        M = self.A.astype(np.float64 if real else np.complex128, copy=True)
        M[np.diag_indices(self.d)] -= shift
        with warnings.catch_warnings():  # an exact eigenvalue makes a zero pivot: wanted
            warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
            lu, piv = scipy.linalg.lu_factor(M, overwrite_a=True, check_finite=False)
        pivots = lu[np.diag_indices(self.d)]
        floor = float(np.finfo(np.float64).eps) * (self.norm or 1.0)
        pivots[np.abs(pivots) < floor] = floor
        lu[np.diag_indices(self.d)] = pivots
        x = self._start(copy).astype(M.dtype)
        for _ in range(self.MAX_SOLVES):
            # a defective eigenvalue can overflow the solve: then geev
            with np.errstate(over="ignore", invalid="ignore"):
                x = scipy.linalg.lu_solve((lu, piv), x, check_finite=False)
                size = np.linalg.norm(x)
            if not (np.isfinite(size) and size > 0):
                return None
            x = x / size
            if np.linalg.norm(_real_matmul(self.A, x) - shift * x) <= self.tol:
                return x
        return None

    def _from_geev(self, value: complex) -> np.ndarray:
        """The eigenvector of the eigenvalue nearest ``value`` from a full ``geev``."""
        if self._full is None:
            self._full = np.linalg.eig(self.A)
        lam, vecs = self._full
        return vecs[:, int(np.argmin(np.abs(lam - value)))]


def _real_unit(v: np.ndarray) -> np.ndarray:
    """Real part, unit 2-norm, sign making the largest-|component| entry positive."""
    v = v.real.copy()
    v /= np.linalg.norm(v)
    return v if v[np.argmax(np.abs(v))] > 0 else -v


#: The per-block directions of :func:`directions` and their names in ``spectra.nc``.
DIRECTION_VECTORS = {"v1": "direction_v1", "v2": "direction_v2", "v_neg": "direction_v_neg"}
DIRECTION_VALUES = ("lambda_v1", "lambda_v2", "lambda_neg")


def directions(
    lam: np.ndarray, vecs: np.ndarray | Callable[[int], np.ndarray], d: int | None = None
) -> dict[str, Any]:
    """The real unit directions that the alignment metrics of propagation measure against,
    from a sorted eigen-decomposition of one layer matrix F: the eigenvectors as columns
    (:func:`sorted_eig`), or as the ``column`` of :func:`sorted_eigenpairs` with the
    width ``d``.

    ``v1``, ``v2``, ``v_neg`` (each (d,), NaN when missing) are the eigenvectors of the
    real eigenvalues with the largest, the second largest and the most negative real part
    (``lambda_v1``, ``lambda_v2``, ``lambda_neg``); when lambda_1 is complex, ``v1`` is
    therefore the leading *real* eigenvector. Signs make the largest-|component| entry
    positive. ``top2_basis`` (d, 3) is an orthonormal basis, zero-padded to three columns,
    of the real F-invariant subspace of the first two eigenvalues in the sort order:
    span(v1, v2) for a real lambda_1 and lambda_2, the plane of the pair when lambda_1 is
    complex (lambda_2 is its conjugate), three dimensions when only lambda_2 is complex.
    Computed once per distinct block by the spectra rule and stored in ``spectra.nc``, so
    that propagation and steering never decompose a layer again.
    """
    if callable(vecs):
        if d is None:
            raise ValueError("directions: give the width d with a column function")
        return _directions(lam, vecs, d)
    return _directions(lam, lambda i: vecs[:, i], vecs.shape[0])


def _directions(lam: np.ndarray, column: Callable[[int], np.ndarray], d: int) -> dict[str, Any]:
    """:func:`directions` with the eigenvector of the ``i``-th sorted eigenvalue given by
    ``column(i)`` ((d,), NaN where it is not defined: an exact zero of a factored F)."""
    real = np.flatnonzero(lam.imag == 0)
    nan_v = np.full(d, np.nan)

    def pick(i: int | None) -> tuple[np.ndarray, float]:
        if i is None:
            return nan_v, np.nan
        v = column(real[i])
        return (_real_unit(v) if np.isfinite(v).all() else nan_v), float(lam[real[i]].real)

    out: dict[str, Any] = {"lambda1_is_complex": bool(lam[0].imag != 0)}
    out["v1"], out["lambda_v1"] = pick(0 if real.size >= 1 else None)
    out["v2"], out["lambda_v2"] = pick(1 if real.size >= 2 else None)
    out["v_neg"], out["lambda_neg"] = pick(-1 if real.size >= 1 else None)
    top = np.stack([column(i) for i in range(min(2, lam.size))], axis=1)
    basis = np.zeros((d, 3))
    if not np.isfinite(top).all():
        basis[:] = np.nan  # the invariant subspace of an exact zero is not 1- or 2-D
    else:
        U, sv, _ = np.linalg.svd(np.concatenate([top.real, top.imag], axis=1), full_matrices=False)
        rank = int(np.sum(sv > 1e-10 * sv[0]))
        basis[:, :rank] = U[:, :rank]
        # the SVD's signs are arbitrary and follow the last bits of its input: the same
        # convention as the vectors (largest-|component| entry positive)
        for k in range(rank):
            if basis[np.argmax(np.abs(basis[:, k])), k] < 0:
                basis[:, k] = -basis[:, k]
    out["top2_basis"] = basis
    return out


def block_directions(ds: Any, path: str = "spectra.nc") -> list[dict[str, Any]]:
    """The per-block :func:`directions` stored in a ``spectra.nc`` dataset, in block order.

    ``path`` names the file in the error when it predates these variables.
    """
    from specalign.io import InputFileError

    names = [*DIRECTION_VECTORS.values(), *DIRECTION_VALUES, "direction_basis"]
    missing = [n for n in names if n not in ds]
    if missing:
        raise InputFileError(
            f"{path}: missing {', '.join(missing)} (written by an older specalign); "
            "fix: delete it and rerun the spectra rule"
        )
    out = []
    for b in range(ds.sizes["block"]):
        blk = {k: np.asarray(ds[v].values[b], np.float64) for k, v in DIRECTION_VECTORS.items()}
        blk.update({k: float(ds[k].values[b]) for k in DIRECTION_VALUES})
        blk["lambda1_is_complex"] = bool(ds["lambda1_is_complex"].values[b])
        blk["top2_basis"] = np.asarray(ds["direction_basis"].values[b], np.float64)
        out.append(blk)
    return out


def spectrum(
    F: np.ndarray, eta: float, vectors: bool = True, device: str = "cpu"
) -> dict[str, Any]:
    """Spectral summary of one layer matrix ``F`` (see the module doc for definitions).

    Returns a dict with ``eigenvalues`` (complex, sorted), ``n_zero_eigenvalues`` (0: a
    dense F lists every eigenvalue), ``gap``, ``spectral_radius``, ``radius_is_negative``,
    ``lambda1_is_complex``, ``lambda_I_plus_etaF`` (complex), ``dominant_is_lambda1``,
    ``eta_bound`` and, when ``vectors``: ``v1``, ``v2`` (complex, unit, phase-fixed),
    ``v1_leading_real`` (real, the vector propagation's gamma uses) and ``v1_plane``
    (2, d), ``directions`` (:func:`directions`) and ``eigenpair_residual``. With
    ``vectors=False`` only eigenvalues are computed. ``device``: where the decomposition
    runs (see :func:`eig`).
    """
    F = np.asarray(F, dtype=np.float64)
    if F.ndim != 2 or F.shape[0] != F.shape[1]:
        raise ValueError(f"F must be square, got shape {F.shape}")
    d = F.shape[0]
    if vectors:
        lam, column = sorted_eigenpairs(F, device)
    else:
        lam = eig(F, False, device)[0]
        lam = lam[_order(lam)]
    out = _summary(lam, eta)
    out.update(n_zero_eigenvalues=0, zero_eigenvalues_index=-1)
    if vectors:
        out.update(_vector_summary(lam, column, d, lambda v: _real_matmul(F, v)))
    return out


def spectrum_factored(
    W_O: np.ndarray, W_V: np.ndarray, eta: float, vectors: bool = True, device: str = "cpu"
) -> dict[str, Any]:
    """:func:`spectrum` of F = W_O W_V through the r x r product M = W_V W_O (module doc).

    ``W_O`` (d, r), ``W_V`` (r, d) with r < d: the factors of a grouped-query block
    (:meth:`~specalign.transformers.weights.ModelWeights.ov_factors`). The summaries are
    of F's whole spectrum, M's eigenvalues and d - r exact zeros; ``eigenvalues`` lists
    M's r eigenvalues in the sort order, ``n_zero_eigenvalues`` = d - r counts the zeros
    and ``zero_eigenvalues_index`` says how many listed eigenvalues precede them in F's
    sort order. Eigenvectors are W_O u for M's u, normalised as the module says; one at an
    exact zero of F is NaN (its eigenspace has dimension >= d - r). F is never formed.
    """
    W_O = np.asarray(W_O, dtype=np.float64)
    W_V = np.asarray(W_V, dtype=np.float64)
    d, r = W_O.shape
    if W_V.shape != (r, d) or r >= d:
        raise ValueError(f"W_O {W_O.shape}, W_V {W_V.shape}: expected (d, r) and (r, d), r < d")
    M = W_V @ W_O
    if vectors:
        lam_M, U = sorted_eigenpairs(M, device)
    else:
        lam_M = eig(M, False, device)[0]
        lam_M = lam_M[_order(lam_M)]
    # F's spectrum in the sort order: M's eigenvalues and d - r exact zeros; the sort is
    # stable, so an eigenvalue of M that is exactly 0 precedes the zeros (it has a vector)
    order = _order(np.concatenate([lam_M, np.zeros(d - r, np.complex128)]))
    lam = np.concatenate([lam_M, np.zeros(d - r, np.complex128)])[order]
    out = _summary(lam, eta)
    out["eigenvalues"] = lam_M
    out["n_zero_eigenvalues"] = d - r
    out["zero_eigenvalues_index"] = int(np.flatnonzero(order >= r)[0])
    if vectors:
        nan_v = np.full(d, np.nan + 0j)
        cache: dict[int, np.ndarray] = {}

        def column(i: int) -> np.ndarray:
            if order[i] >= r:
                return nan_v
            if i not in cache:
                cache[i] = _real_matmul(W_O, U(int(order[i])))
            return cache[i]

        def apply_F(v: np.ndarray) -> np.ndarray:
            return _real_matmul(W_O, _real_matmul(W_V, v))

        out.update(_vector_summary(lam, column, d, apply_F))
        real_idx = np.flatnonzero(lam.imag == 0)
        # the index into the listed eigenvalues (-1 when F's leading real one is a zero)
        k = int(order[real_idx[0]]) if real_idx.size else -1
        out["leading_real_index"] = k if 0 <= k < r else -1
    return out


def _real_matmul(A: np.ndarray, v: np.ndarray) -> np.ndarray:
    """A @ v for a real A and a real or complex v, without numpy's complex copy of A."""
    if np.iscomplexobj(v):
        return (A @ v.real) + 1j * (A @ v.imag)
    return A @ v


def _summary(lam: np.ndarray, eta: float) -> dict[str, Any]:
    """The eigenvalue summaries of a sorted spectrum (all of F's eigenvalues)."""
    complex1 = bool(lam[0].imag != 0)
    k_rad = int(np.argmax(np.abs(lam)))  # first maximum = larger real part on ties
    shifted = 1.0 + eta * lam
    k_dom = int(np.argmax(np.abs(shifted)))
    return {
        "eigenvalues": lam,
        "gap": gap_from_sorted(lam),
        "spectral_radius": float(np.abs(lam[k_rad])),
        "radius_is_negative": bool(lam[k_rad].real < 0),
        "lambda1_is_complex": complex1,
        "lambda_I_plus_etaF": complex(shifted[k_dom]),
        # argmax takes the first maximum, so lambda_1 wins over its conjugate partner.
        "dominant_is_lambda1": k_dom == 0,
        "eta_bound": eta_bound(lam),
    }


def _vector_summary(
    lam: np.ndarray,
    column: Callable[[int], np.ndarray],
    d: int,
    apply_F: Callable[[np.ndarray], np.ndarray],
) -> dict[str, Any]:
    """The eigenvector entries of :func:`spectrum` from the sorted eigenvalues ``lam`` of
    F, the eigenvector ``column(i)`` of ``lam[i]`` and the map v -> F v (for the residual)."""
    complex1 = bool(lam[0].imag != 0)
    nan_c = np.full(d, np.nan + 0j)

    def unit(i: int) -> np.ndarray:
        v = column(i)
        return normalise_eigenvector(v) if np.isfinite(v).all() else nan_c

    v1 = unit(0)
    v2 = unit(1) if d > 1 else nan_c
    real_idx = np.flatnonzero(lam.imag == 0)
    if not complex1:
        lead_real = v1.real.copy()
        plane = np.full((2, d), np.nan)
    else:
        lead_real = unit(real_idx[0]).real if real_idx.size else np.full(d, np.nan)
        plane = _plane_basis(v1)
    dirs = _directions(lam, column, d)
    pairs = [(v1, lam[0]), (v2, lam[1] if d > 1 else np.nan)]
    pairs += [(dirs[k], dirs[f"lambda_{n}"]) for k, n in (("v1", "v1"), ("v2", "v2"),
                                                          ("v_neg", "neg"))]  # fmt: skip
    radius = float(np.max(np.abs(lam)))
    res = [
        float(np.linalg.norm(apply_F(v) - value * v))
        for v, value in pairs
        if np.isfinite(v).all() and np.isfinite(value)
    ]
    return {
        "v1": v1,
        "v2": v2,
        "v1_leading_real": lead_real,
        "v1_plane": plane,
        "leading_real_index": int(real_idx[0]) if real_idx.size else -1,
        "directions": dirs,
        "eigenpair_residual": max(res) / radius if res and radius > 0 else float("nan"),
    }


def head_spectra(mw: ModelWeights, blk: Any, device: str = "cpu") -> dict[str, np.ndarray]:
    """Per-head OV circuits F_h = W_O^h W_V^h of one block (issue 17; Elhage et al. 2021).

    F_h (d x d, rank <= d_head) is never formed: its nonzero eigenvalues are those of the
    d_head x d_head product W_V^h W_O^h (query head h reads key/value head
    h // (n_heads / n_kv_heads)), the other d - d_head are exact zeros. Returns, per head,
    ``eigenvalues`` (n_heads, d_head) complex in the module's sort order, ``lambda1``
    (n_heads,) complex (the first of them; 0 when every listed one has negative real part
    and d > d_head, as F_h's zeros then lead), and ``positive_fraction`` (n_heads,):
    sum_k max(Re lambda_k, 0) / sum_k |lambda_k|, the share of F_h's eigenvalue mass on
    the positive real side (1: F_h copies its input, as a nonnegative-spectrum map;
    0: none positive), NaN when F_h = 0.
    """
    return _head_spectra(mw, mw.ov_factors(blk)[1], blk.W_O, device)


def _head_spectra(
    mw: ModelWeights, W_V: np.ndarray, W_O: np.ndarray, device: str = "cpu"
) -> dict[str, np.ndarray]:
    """:func:`head_spectra` from the key/value heads' rows W_V' (n_kv_heads d_head, d)
    and W_O (d, n_heads d_head): W_V' is never expanded to the query heads (each product
    W_V^g W_O^h is the same BLAS call on the same operands as with the expanded rows)."""
    H, d, kv = mw.n_heads, mw.d_model, mw.kv_heads
    dh = W_O.shape[1] // H
    W_V = W_V.reshape(kv, 1, dh, d)
    W_O = W_O.reshape(d, kv, H // kv, dh).transpose(1, 2, 0, 3)  # (kv, group, d, dh)
    M = (W_V @ W_O).reshape(H, dh, dh)
    lam = np.stack([eig(m, False, device)[0] for m in M])
    lam = np.stack([row[_order(row)] for row in lam])
    lead = lam[:, 0].copy()
    if d > dh:
        lead[lead.real < 0] = 0.0
    mass = np.abs(lam).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        pos = np.where(mass > 0, np.clip(lam.real, 0.0, None).sum(axis=1) / mass, np.nan)
    return {"eigenvalues": lam, "lambda1": lead, "positive_fraction": pos}


def map_blocks(fn: Callable[[Any], Any], items: Sequence[Any], threads: int = 1) -> list[Any]:
    """``[fn(x) for x in items]`` with one BLAS thread, on up to ``threads`` items at once.

    LAPACK's nonsymmetric eigen-solver (the QR iterations of ``geev``) uses a second core
    poorly, and on a busy machine its threads wait for each other: on 2 cores one block per
    core with one BLAS thread each is about twice as fast as one block at a time on two
    BLAS threads. numpy releases the GIL inside LAPACK, so Python threads suffice. Every
    item is computed on one BLAS thread whatever ``threads`` is, so the result does not
    depend on the thread count (``spectra.nc`` is the same for any ``--cores``).
    """
    # scipy's LAPACK (the Hessenberg steps, inverse iteration) is its own OpenBLAS: loaded
    # first, so that the limit below reaches it (threadpoolctl limits only what is loaded
    # at entry)
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_limits

    workers = min(max(int(threads), 1), len(items))
    with threadpool_limits(1):
        if workers <= 1:
            return [fn(x) for x in items]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(fn, items))


def spectra_dataset(
    mw: ModelWeights,
    eta: float,
    n_eigs: int | None = None,
    threads: int = 1,
    device: str = "cpu",
) -> Any:
    """``spectra.nc`` content for every distinct block of ``mw`` (shared blocks once).

    Dims: ``block`` (distinct F), ``eig`` (the first ``n_eigs`` sorted eigenvalues,
    all when None), ``component`` (d_model), ``plane`` (2), ``layer`` (1..L, the
    paper's numbering, with the coordinate ``layer_block``: the block of each layer). No complex
    dtypes (plain netCDF readers cannot read them): complex quantities are split into
    ``*_real``/``*_imag`` variables, booleans stored as int8 0/1.

    Variables: ``eigenvalues_real``/``_imag`` (block, eig); ``v1_real``, ``v1_imag``,
    ``v2_real``, ``v2_imag``, ``v1_leading_real`` (block, component); ``v1_plane``
    (block, plane, component); ``gap``, ``spectral_radius``, ``radius_is_negative``,
    ``lambda1_is_complex``, ``leading_real_index``, ``lambda_I_plus_etaF_real``/``_imag``,
    ``dominant_is_lambda1``, ``eta_bound`` (block,); the
    directions that propagation and steering measure against (:func:`directions`):
    ``direction_v1``, ``direction_v2``, ``direction_v_neg`` (block, component),
    ``lambda_v1``, ``lambda_v2``, ``lambda_neg`` (block,) and ``direction_basis``
    (block, component, basis), read back by :func:`block_directions`;
    ``n_zero_eigenvalues``, ``zero_eigenvalues_index``, ``eigenpair_residual`` (block,)
    (module doc); the per-head OV spectra of :func:`head_spectra`:
    ``head_eigenvalues_real``/``_imag`` (block, head, head_eig), ``head_lambda1_real``/
    ``_imag``, ``head_positive_fraction`` (block, head). A grouped-query model with
    r = n_kv_heads * d_head < d (attribute ``factored``) lists r eigenvalues per block
    (:func:`spectrum_factored`), the others dense d. ``threads``:
    decompose up to that many blocks at once (:func:`map_blocks`) on the CPU.
    ``device``: where the decompositions run (the CPU, or a CUDA device, one block at a
    time; :func:`eig`). Each block is taken from ``mw.blocks`` when its decomposition
    starts and dropped when it ends, so with ``mw`` read lazily (the spectra rule) the
    peak is ``threads`` blocks, not the model.
    """
    import xarray as xr

    d = mw.d_model
    factored = mw.factored
    listed = mw.rank_bound if factored else d  # eigenvalues per block in the eig dim
    n = listed if n_eigs is None else max(1, min(int(n_eigs), listed))

    def one(b: int) -> dict[str, Any]:
        # read here, per block: a lazily read weights.h5 (read_weights_h5(lazy=True)) then
        # holds at most ``threads`` blocks' weights at a time, never the model's
        # a factored block of a lazily read v3 file reads only W_V' and W_O (no W_Q, W_K,
        # no K/V expansion): the same arrays as ov_factors of the whole block
        fields = getattr(mw.blocks, "ov_fields", lambda b: None)(b) if factored else None
        if fields is not None:
            W_Og, W_V, W_O = fields
            out = spectrum_factored(W_Og, W_V, eta, vectors=True, device=device)
        else:
            blk = mw.blocks[b]
            (W_Og, W_V), W_O = mw.ov_factors(blk), blk.W_O
            if factored:
                out = spectrum_factored(W_Og, W_V, eta, vectors=True, device=device)
            else:
                out = spectrum(blk.F, eta, vectors=True, device=device)
        out["heads"] = _head_spectra(mw, W_V, W_O, device)
        return out

    per_block = map_blocks(one, range(len(mw.blocks)), threads if device == "cpu" else 1)

    def stack(key: str, part: str | None = None) -> np.ndarray:
        arr = np.stack([np.asarray(s[key]) for s in per_block])
        return getattr(arr, part) if part else arr

    lam = stack("eigenvalues")[:, :n]
    bdims, vdims = ("block",), ("block", "component")
    shifted = np.array([s["lambda_I_plus_etaF"] for s in per_block])
    data_vars = {
        "eigenvalues_real": (("block", "eig"), lam.real),
        "eigenvalues_imag": (("block", "eig"), lam.imag),
        "v1_real": (vdims, stack("v1", "real")),
        "v1_imag": (vdims, stack("v1", "imag")),
        "v2_real": (vdims, stack("v2", "real")),
        "v2_imag": (vdims, stack("v2", "imag")),
        "v1_leading_real": (vdims, stack("v1_leading_real")),
        "v1_plane": (("block", "plane", "component"), stack("v1_plane")),
        "gap": (bdims, stack("gap")),
        "spectral_radius": (bdims, stack("spectral_radius")),
        "radius_is_negative": (bdims, stack("radius_is_negative").astype(np.int8)),
        "lambda1_is_complex": (bdims, stack("lambda1_is_complex").astype(np.int8)),
        "leading_real_index": (bdims, stack("leading_real_index").astype(np.int64)),
        "lambda_I_plus_etaF_real": (bdims, shifted.real),
        "lambda_I_plus_etaF_imag": (bdims, shifted.imag),
        "dominant_is_lambda1": (bdims, stack("dominant_is_lambda1").astype(np.int8)),
        "eta_bound": (bdims, stack("eta_bound")),
        "n_zero_eigenvalues": (bdims, stack("n_zero_eigenvalues").astype(np.int64)),
        "zero_eigenvalues_index": (bdims, stack("zero_eigenvalues_index").astype(np.int64)),
        "eigenpair_residual": (bdims, stack("eigenpair_residual").astype(np.float64)),
    }
    heads = [s["heads"] for s in per_block]
    head_lam = np.stack([h["eigenvalues"] for h in heads])
    head_lam1 = np.stack([h["lambda1"] for h in heads])
    hdims = ("block", "head")
    data_vars.update(
        head_eigenvalues_real=(("block", "head", "head_eig"), head_lam.real),
        head_eigenvalues_imag=(("block", "head", "head_eig"), head_lam.imag),
        head_lambda1_real=(hdims, head_lam1.real),
        head_lambda1_imag=(hdims, head_lam1.imag),
        head_positive_fraction=(hdims, np.stack([h["positive_fraction"] for h in heads])),
    )
    dirs = [s["directions"] for s in per_block]
    for key, name in DIRECTION_VECTORS.items():
        data_vars[name] = (vdims, np.stack([x[key] for x in dirs]))
    for key in DIRECTION_VALUES:
        data_vars[key] = (bdims, np.array([x[key] for x in dirs], dtype=np.float64))
    data_vars["direction_basis"] = (
        ("block", "component", "basis"),
        np.stack([x["top2_basis"] for x in dirs]),
    )
    ds = xr.Dataset(
        data_vars,
        coords={
            "block": np.arange(len(mw.blocks)),
            "eig": np.arange(1, n + 1),
            # layers 1..L as the paper counts them; layer_block maps each to its block
            "layer": np.arange(1, mw.n_layers + 1),
            "layer_block": ("layer", np.asarray(mw.layer_block, dtype=np.int64)),
            "head": np.arange(mw.n_heads),
            "head_eig": np.arange(1, head_lam.shape[2] + 1),
        },
        attrs={
            "family": mw.family,
            "source": mw.source,
            "revision": mw.revision,
            "d_model": int(d),
            "n_heads": int(mw.n_heads),
            "n_layers": int(mw.n_layers),
            "n_blocks": len(mw.blocks),
            SHARED: int(mw.shared),
            "eta": float(eta),
            "n_eigs": int(n),
            "ordering": "real part descending, then imaginary part descending",
            "eigenvector_phase": "unit 2-norm; largest-|component| entry real positive",
            "gap_definition": "Re l1 - Re l2, or Re l1 - Re l3 if l2 = conj(l1)",
            "gamma_vector": "v1_leading_real: v1 if lambda_1 real, else leading real eigvec",
            "eta_bound_definition": "2/|Re l1 + Re ld| if -Re ld > Re l1 else inf",
            "n_kv_heads": int(mw.kv_heads),
            "rank_bound": int(mw.rank_bound),
            "factored": int(factored),
            "decomposition": (
                "eigenvalues of the r x r product W_V' W_O' (r = rank_bound; F = W_O' W_V', "
                "geev without vectors, its eigenvectors u by inverse iteration; "
                "W_O' summing the output columns of the query heads sharing a key/value "
                "head), eigenvectors W_O' u; F's d - r exact zeros counted in "
                "n_zero_eigenvalues"
                if factored
                else "eigenvalues by geev (no vectors) of the d x d F = W_O W_V, the "
                "eigenvectors read by inverse iteration at them"
            ),
        },
    )
    if factored:  # the listed spectrum of a factored block: the table's text + the zeros
        ds["eig"].attrs["description"] = (
            "1-based rank of the eigenvalue among the listed ones in the sort order (F's "
            "exact zeros of a factored block are not listed: see n_zero_eigenvalues)"
        )
        ds["leading_real_index"].attrs["description"] = (
            "0-based index in the eig dim of the leading real eigenvalue, -1 if none listed "
            "(F's leading real eigenvalue is then one of its exact zeros, or there is none)"
        )
    return describe(ds, SPECTRA)
