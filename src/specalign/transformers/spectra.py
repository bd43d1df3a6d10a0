"""Spectra of the layer matrices F = W_O W_V: eigenvalues, leading eigenvectors, gaps.

In the power-method view a layer maps a token x to (roughly) normalise(x + eta F x),
so tokens tilt towards the eigenvector of F whose eigenvalue has the largest REAL part
(lambda_1): that one maximises |1 + eta lambda| for small eta > 0. The plain power
method on F itself would instead chase the eigenvalue of largest *modulus*, which for
trained transformers is often a large negative one (``radius_is_negative``); the shift
I + eta F repairs that only for eta below the paper's bound (Theorem 3):
eta < 2 / |lambda_1 + lambda_d| when -lambda_d > lambda_1, lambda_d being the
eigenvalue with the most negative real part.

Conventions (all computed in float64 with LAPACK ``geev`` via numpy, or with
``torch.linalg.eig`` in float64 on a CUDA device when the job was granted a GPU: d = 4096
models such as Mistral 7B take tens of minutes per model on two CPU cores):

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
* ``lambda_I_plus_etaF`` is the dominant (largest-modulus) eigenvalue 1 + eta lambda_k
  of I + eta F; ``dominant_is_lambda1`` says whether k = 1, i.e. whether the power
  method on I + eta F converges to v1's direction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from specalign.transformers.variables import SPECTRA, describe
from specalign.transformers.weights import ModelWeights


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


def _real_unit(v: np.ndarray) -> np.ndarray:
    """Real part, unit 2-norm, sign making the largest-|component| entry positive."""
    v = v.real.copy()
    v /= np.linalg.norm(v)
    return v if v[np.argmax(np.abs(v))] > 0 else -v


#: The per-block directions of :func:`directions` and their names in ``spectra.nc``.
DIRECTION_VECTORS = {"v1": "direction_v1", "v2": "direction_v2", "v_neg": "direction_v_neg"}
DIRECTION_VALUES = ("lambda_v1", "lambda_v2", "lambda_neg")


def directions(lam: np.ndarray, vecs: np.ndarray) -> dict[str, Any]:
    """The real unit directions that the alignment metrics of propagation measure against,
    from a sorted eigen-decomposition (:func:`sorted_eig`) of one layer matrix F.

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
    d = vecs.shape[0]
    real = np.flatnonzero(lam.imag == 0)
    nan_v = np.full(d, np.nan)

    def pick(i: int | None) -> tuple[np.ndarray, float]:
        if i is None:
            return nan_v, np.nan
        return _real_unit(vecs[:, real[i]]), float(lam[real[i]].real)

    out: dict[str, Any] = {"lambda1_is_complex": bool(lam[0].imag != 0)}
    out["v1"], out["lambda_v1"] = pick(0 if real.size >= 1 else None)
    out["v2"], out["lambda_v2"] = pick(1 if real.size >= 2 else None)
    out["v_neg"], out["lambda_neg"] = pick(-1 if real.size >= 1 else None)
    top = vecs[:, : min(2, d)]
    U, sv, _ = np.linalg.svd(np.concatenate([top.real, top.imag], axis=1), full_matrices=False)
    rank = int(np.sum(sv > 1e-10 * sv[0]))
    basis = np.zeros((d, 3))
    basis[:, :rank] = U[:, :rank]
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

    Returns a dict with ``eigenvalues`` (complex, sorted), ``gap``,
    ``spectral_radius``, ``radius_is_negative``, ``lambda1_is_complex``,
    ``lambda_I_plus_etaF`` (complex), ``dominant_is_lambda1``, ``eta_bound`` and, when
    ``vectors``: ``v1``, ``v2`` (complex, unit, phase-fixed), ``v1_leading_real``
    (real, the vector propagation's gamma uses) and ``v1_plane`` (2, d), and ``directions``
    (:func:`directions`). With ``vectors=False`` only eigenvalues are computed.
    ``device``: where the decomposition runs (see :func:`eig`).
    """
    F = np.asarray(F, dtype=np.float64)
    if F.ndim != 2 or F.shape[0] != F.shape[1]:
        raise ValueError(f"F must be square, got shape {F.shape}")
    d = F.shape[0]
    if vectors:
        lam, vecs = sorted_eig(F, device)
    else:
        lam, vecs = eig(F, False, device)
        lam = lam[_order(lam)]
    complex1 = bool(lam[0].imag != 0)
    k_rad = int(np.argmax(np.abs(lam)))  # first maximum = larger real part on ties
    shifted = 1.0 + eta * lam
    k_dom = int(np.argmax(np.abs(shifted)))
    out: dict[str, Any] = {
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
    if vectors:
        assert vecs is not None
        v1 = normalise_eigenvector(vecs[:, 0])
        v2 = normalise_eigenvector(vecs[:, 1]) if d > 1 else np.full(d, np.nan + 0j)
        real_idx = np.flatnonzero(lam.imag == 0)
        if not complex1:
            lead_real = v1.real.copy()
            plane = np.full((2, d), np.nan)
        else:
            lead_real = (
                normalise_eigenvector(vecs[:, real_idx[0]]).real
                if real_idx.size
                else np.full(d, np.nan)
            )
            plane = _plane_basis(v1)
        out.update(
            v1=v1,
            v2=v2,
            v1_leading_real=lead_real,
            v1_plane=plane,
            leading_real_index=int(real_idx[0]) if real_idx.size else -1,
            directions=directions(lam, vecs),
        )
    return out


def map_blocks(fn: Callable[[Any], Any], items: Sequence[Any], threads: int = 1) -> list[Any]:
    """``[fn(x) for x in items]`` with one BLAS thread, on up to ``threads`` items at once.

    LAPACK's nonsymmetric eigen-solver (the QR iterations of ``geev``) uses a second core
    poorly, and on a busy machine its threads wait for each other: on 2 cores one block per
    core with one BLAS thread each is about twice as fast as one block at a time on two
    BLAS threads. numpy releases the GIL inside LAPACK, so Python threads suffice. Every
    item is computed on one BLAS thread whatever ``threads`` is, so the result does not
    depend on the thread count (``spectra.nc`` is the same for any ``--cores``).
    """
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
    (block, component, basis), read back by :func:`block_directions`. ``threads``:
    decompose up to that many blocks at once (:func:`map_blocks`) on the CPU.
    ``device``: where the decompositions run (the CPU, or a CUDA device, one block at a
    time; :func:`eig`).
    """
    import xarray as xr

    d = mw.d_model
    n = d if n_eigs is None else max(1, min(int(n_eigs), d))
    per_block = map_blocks(
        lambda blk: spectrum(blk.F, eta, vectors=True, device=device),
        mw.blocks,
        threads if device == "cpu" else 1,
    )

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
    }
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
        },
        attrs={
            "family": mw.family,
            "source": mw.source,
            "revision": mw.revision,
            "d_model": int(d),
            "n_heads": int(mw.n_heads),
            "n_layers": int(mw.n_layers),
            "n_blocks": len(mw.blocks),
            "shared": int(mw.shared),
            "eta": float(eta),
            "n_eigs": int(n),
            "ordering": "real part descending, then imaginary part descending",
            "eigenvector_phase": "unit 2-norm; largest-|component| entry real positive",
            "gap_definition": "Re l1 - Re l2, or Re l1 - Re l3 if l2 = conj(l1)",
            "gamma_vector": "v1_leading_real: v1 if lambda_1 real, else leading real eigvec",
            "eta_bound_definition": "2/|Re l1 + Re ld| if -Re ld > Re l1 else inf",
        },
    )
    return describe(ds, SPECTRA)
