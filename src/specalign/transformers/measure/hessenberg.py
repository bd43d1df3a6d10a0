"""Eigenvalues of a real square matrix, and the right eigenvectors of chosen ones, from
its Hessenberg form (issue 33, item 2: spectra at the eigen-solver's floor).

LAPACK's ``geev`` without vectors is: balance A (``dgebal``, permutation and scaling),
reduce it to upper Hessenberg form H = Q^T A_bal Q (``dgehrd``, about 10/3 d^3 flops),
then the eigenvalues of H by the QR algorithm (``dhseqr``, no Schur vectors). That is the
floor a decomposition of every eigenvalue cannot go below. :class:`HessenbergEigen` runs
those three steps itself, with the workspace ``geev`` gives them, so on one BLAS thread
its eigenvalues are numpy's ``eigvals``, bit for bit (test); and it keeps H, Q's
reflectors and the balancing, which ``geev`` discards. An eigenvector is then inverse
iteration on H, whose LU is a band LU with one subdiagonal (O(d^2) a vector, where
inverse iteration on A needs an O(d^3) LU), taken back to A by Q (``dormhr``) and the
balancing (``dgebak``). The study reads a handful of eigenvectors per matrix, so they
cost about nothing beside the floor. (LAPACK's own ``dhsein`` does the same inverse
iteration, but stops at a growth test that leaves residuals up to a few d eps |A|_1
on symmetric-like matrices: above the check every vector here must pass.)

The routines scipy's Python wrappers do not expose (``dgebal``'s outputs as geev uses
them, ``dgehrd``, ``dhseqr``, ``dormhr``, ``dgebak``) are called from scipy's LAPACK
(``scipy.linalg.cython_lapack``, its documented low-level interface) through ctypes.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

_P = ctypes.c_void_p

#: The routines and their argument counts (every argument a pointer, Fortran style).
_ROUTINES = {"dgebal": 8, "dgehrd": 9, "dhseqr": 14, "dormhr": 14, "dgebak": 10}


@functools.cache
def _lapack() -> dict[str, Any]:
    import scipy.linalg.cython_lapack as cython_lapack

    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    out = {}
    for name, n_args in _ROUTINES.items():
        capsule = cython_lapack.__pyx_capi__[name]
        # CFUNCTYPE (not PYFUNCTYPE): the GIL is released during the call, so the blocks
        # that spectra.map_blocks decomposes in threads run at once
        out[name] = ctypes.CFUNCTYPE(None, *[_P] * n_args)(get_pointer(capsule, get_name(capsule)))
    return out


def _int(value: int = 0) -> ctypes.c_int:
    return ctypes.c_int(value)


def _char(value: str) -> ctypes.c_char_p:
    return ctypes.c_char_p(value.encode())


def _ref(x: Any) -> Any:
    return x.ctypes.data_as(_P) if isinstance(x, np.ndarray) else ctypes.byref(x)


def _call(name: str, *args: Any) -> None:
    _lapack()[name](*(a if isinstance(a, ctypes.c_char_p) else _ref(a) for a in args))


def _geev_workspace(n: int) -> int:
    """The workspace ``geev`` without vectors gives itself (its query): ``dhseqr``'s
    choices depend on it, so the same size gives the same eigenvalues."""
    from scipy.linalg.lapack import dgeev_lwork

    work, info = dgeev_lwork(n, compute_vl=0, compute_vr=0)
    if info != 0:
        raise np.linalg.LinAlgError(f"geev's workspace query failed (info {info})")
    return max(int(work), 3 * n, 1)  # geev's minimum for no vectors is 3 n


class HessenbergEigen:
    """The eigenvalues of ``A`` (``eigenvalues``: complex, in LAPACK's order, a conjugate
    pair's member with positive imaginary part first) and :meth:`vector`.

    Raises ``numpy.linalg.LinAlgError`` where numpy's ``eigvals`` would: a non-finite
    entry, or QR iterations that do not converge. ``supported`` is False for a matrix
    whose largest entry lies outside [sqrt(tiny)/eps, eps/sqrt(tiny)], which ``geev``
    scales first: the caller then uses ``geev`` itself (no real layer comes near).
    """

    def __init__(self, A: np.ndarray) -> None:
        A = np.asarray(A, dtype=np.float64)
        if A.ndim != 2 or A.shape[0] != A.shape[1]:
            raise ValueError(f"a square matrix is needed, got shape {A.shape}")
        n = self.n = A.shape[0]
        # max and min propagate a NaN and pass an inf on, without a d x d temporary
        largest = max(float(A.max()), -float(A.min())) if A.size else 0.0
        if not np.isfinite(largest):
            raise np.linalg.LinAlgError("Array must not contain infs or NaNs")
        tiny, eps = np.finfo(np.float64).tiny, np.finfo(np.float64).eps
        small = np.sqrt(tiny) / eps
        self.supported = n > 0 and (largest == 0.0 or small <= largest <= 1.0 / small)
        if not self.supported:
            return
        # geev's steps on a copy in Fortran order; `a` keeps H (upper Hessenberg part)
        # and the reflectors of Q (below it), as dgehrd leaves them
        self.A = A
        self.a = a = np.array(A, order="F", copy=True)
        self.lo, self.hi, info = _int(), _int(), _int()
        self.scale = np.empty(n)
        _call("dgebal", _char("B"), _int(n), a, _int(n), self.lo, self.hi, self.scale, info)
        lwork = _geev_workspace(n)
        work = np.empty(lwork)
        self.tau = np.zeros(max(n - 1, 1))
        # geev hands dgehrd its workspace less the balancing's and tau's n each, and
        # dhseqr its workspace less the balancing's
        _call("dgehrd", _int(n), self.lo, self.hi, a, _int(n), self.tau, work,
              _int(lwork - 2 * n), info)  # fmt: skip
        if info.value != 0:
            raise np.linalg.LinAlgError(f"dgehrd failed (info {info.value})")
        schur = a.copy(order="F")  # dhseqr overwrites its H; inverse iteration needs it
        self._band_of_h: np.ndarray | None = None
        self._h_norm = 0.0
        self.wr, self.wi = np.empty(n), np.empty(n)
        unused = np.zeros(1)
        _call("dhseqr", _char("E"), _char("N"), _int(n), self.lo, self.hi, schur, _int(n),
              self.wr, self.wi, unused, _int(1), work, _int(lwork - n), info)  # fmt: skip
        if info.value != 0:
            raise np.linalg.LinAlgError("Eigenvalues did not converge")
        self.eigenvalues = self.wr + 1j * self.wi

    def vector(self, j: int, start: np.ndarray, tol: float, solves: int) -> np.ndarray | None:
        """A unit right eigenvector of ``eigenvalues[j]`` (``wi[j] >= 0``), real for a
        real eigenvalue and complex for a pair's, with ``|A v - lambda v| <= tol``; None
        where ``solves`` steps of inverse iteration do not reach that.

        Inverse iteration on H from ``start`` (real, length d; H's coordinates): the LU of
        H - lambda I as a band matrix with one subdiagonal (``gbtrf``: O(d^2), where A -
        lambda I would need O(d^3)), a zero pivot replaced by eps |H|_1 as ``dhsein``
        does, then x <- (H - lambda I)^-1 x, taken back to A by Q and the balancing
        (``dormhr``, ``dgebak``) and checked against A itself after each solve.
        """
        from scipy.linalg import lapack

        n, value = self.n, complex(self.eigenvalues[j])
        if value.imag < 0:
            raise ValueError("ask for a conjugate pair's member with positive imaginary part")
        real = value.imag == 0
        shift = value.real if real else value
        band = self._band().astype(np.float64 if real else np.complex128, order="F")
        band[n, :] -= shift
        factor, solve = (lapack.dgbtrf, lapack.dgbtrs) if real else (lapack.zgbtrf, lapack.zgbtrs)
        lu, piv, info = factor(band, 1, n - 1, overwrite_ab=1)
        if info < 0:
            return None
        # an eigenvalue exact to the last bit makes a zero pivot: replaced, as dhsein does
        floor = float(np.finfo(np.float64).eps) * (self._h_norm or 1.0)
        pivots = lu[n]
        small = np.abs(pivots) < floor
        pivots[small] = floor
        x = np.asarray(start, dtype=lu.dtype).reshape(n, 1)
        for _ in range(solves):
            with np.errstate(over="ignore", invalid="ignore"):
                x, info = solve(lu, 1, n - 1, x, piv)
                size = np.linalg.norm(x)
            if info != 0 or not (np.isfinite(size) and size > 0):
                return None
            x = x / size
            v = self._to_a(x[:, 0])
            v = v / np.linalg.norm(v)
            Av = self.A @ v if real else self.A @ v.real + 1j * (self.A @ v.imag)
            if np.linalg.norm(Av - shift * v) <= tol:
                return v
        return None

    def _band(self) -> np.ndarray:
        """H in ``gbtrf``'s band storage with one subdiagonal (kl 1, ku n - 1, ldab n + 2):
        H[i, k] in row n + i - k of column k, the first row the LU's room for fill-in;
        built once, with |H|_1 (the scale of a zero pivot's replacement)."""
        if self._band_of_h is None:
            n = self.n
            band = np.zeros((n + 2, n), order="F")
            for k in range(n):
                rows = min(k + 2, n)
                column = self.a[:rows, k]
                band[n - k : n - k + rows, k] = column
                self._h_norm = max(self._h_norm, float(np.abs(column).sum()))
            self._band_of_h = band
        return self._band_of_h

    def _to_a(self, y: np.ndarray) -> np.ndarray:
        """A vector of H's coordinates in A's: Q y (``dormhr``), then the balancing undone
        (``dgebak``); a complex y as its real and imaginary columns (Q and D are real)."""
        n, info = self.n, _int()
        pair = np.iscomplexobj(y)
        vr = np.asfortranarray(np.stack([y.real, y.imag], axis=1) if pair else y.reshape(n, 1))
        columns = vr.shape[1]
        query = np.zeros(1)  # dormhr's workspace query, then the product by Q
        _call("dormhr", _char("L"), _char("N"), _int(n), _int(columns), self.lo, self.hi,
              self.a, _int(n), self.tau, vr, _int(n), query, _int(-1), info)  # fmt: skip
        work = np.empty(max(int(query[0]), columns))
        _call("dormhr", _char("L"), _char("N"), _int(n), _int(columns), self.lo, self.hi,
              self.a, _int(n), self.tau, vr, _int(n), work, _int(work.size), info)  # fmt: skip
        _call("dgebak", _char("B"), _char("R"), _int(n), self.lo, self.hi, self.scale,
              _int(columns), vr, _int(n), info)  # fmt: skip
        return vr[:, 0] + 1j * vr[:, 1] if pair else vr[:, 0].copy()
