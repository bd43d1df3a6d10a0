"""The principal directions of each layer's F_t = W_O W_V that the alignment metrics
measure against (Li & Altafini, arXiv:2605.25619, Section 3).

``v1_t`` is the eigenvector of F_t whose eigenvalue has the largest real part when that
eigenvalue is real, otherwise the eigenvector of the real eigenvalue with the largest
real part ("leading real", as ``spectra.py``); ``v2_t`` the next real one; ``v_neg`` that
of the most negative real eigenvalue. Real eigenvalues are those with an exactly zero
imaginary part (LAPACK ``geev`` returns them so). A direction that does not exist (no
real eigenvalue) is NaN and so are the metrics that use it.

The layer schedule (:func:`layer_schedule`) says which block and attention kind each
layer of a possibly prolonged run uses; the simplified forward follows the same one.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from specalign.transformers.measure import spectra
from specalign.transformers.weights import BlockWeights, ModelWeights

__all__ = [
    "block_principal_directions",
    "layer_directions",
    "layer_schedule",
    "principal_directions",
]


def principal_directions(F: np.ndarray) -> dict[str, Any]:
    """Real unit directions of one layer matrix F used by the metrics
    (:func:`specalign.transformers.measure.spectra.directions` of its eigen-decomposition).

    Returns ``v1``, ``v2``, ``v_neg`` (each (d,), NaN when missing), their eigenvalues
    ``lambda_v1``, ``lambda_v2``, ``lambda_neg``, ``lambda1_is_complex`` and ``top2_basis``
    (d, 3). The spectra rule stores the same for every block in ``spectra.nc``; pass them
    to :func:`layer_directions` instead of decomposing again.
    """
    lam, column = spectra.sorted_eigenpairs(F)
    out = spectra.directions(lam, column, np.shape(F)[0])
    if np.isnan(out["lambda_v1"]):
        warnings.warn("F has no real eigenvalue: v1/v2/v_neg are NaN", stacklevel=2)
    return out


def block_principal_directions(mw: ModelWeights, blk: BlockWeights) -> dict[str, Any]:
    """:func:`principal_directions` of a block of ``mw``, through the r x r product
    (:func:`specalign.transformers.measure.spectra.spectrum_factored`) when the model is
    factored (grouped-query attention, r < d), so that no d x d F is formed."""
    if not mw.factored:
        return principal_directions(blk.F)
    out = spectra.spectrum_factored(*mw.ov_factors(blk), eta=1.0)["directions"]
    if np.isnan(out["lambda_v1"]):
        warnings.warn("F has no real eigenvalue: v1/v2/v_neg are NaN", stacklevel=2)
    return out


def layer_schedule(mw: ModelWeights, n_layers: int | None) -> list[tuple[int, str, int]]:
    """(block index, "global"/"local", model layer) for each layer of a possibly prolonged
    run; the model layer says whose rotary frequencies the step uses.

    Layers past ``mw.n_layers`` repeat the last layer (for ALBERT that is the one shared
    block), as the paper's "artificially prolonged" transformers (Figure 6).
    """
    T = mw.n_layers if n_layers is None else int(n_layers)
    if T < 1:
        raise ValueError("n_layers must be >= 1")
    L = mw.n_layers
    kinds = list(mw.layer_attention) if mw.layer_attention else ["global"] * L
    layers = [min(t, L - 1) for t in range(T)]
    return [(int(mw.layer_block[ell]), kinds[ell], ell) for ell in layers]


def layer_directions(
    mw: ModelWeights,
    n_layers: int | None = None,
    directions: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, np.ndarray]:
    """Per-layer directions and eigenvalues (blocks decomposed once): arrays over layers.

    Keys: ``v1``, ``v2``, ``v_neg`` (T, d); ``lambda_v1``, ``lambda_v2``, ``lambda_neg``,
    ``lambda1_is_complex`` (T,); ``top2_basis`` (T, d, 3) (see :func:`principal_directions`).
    ``directions``: the per-block directions already computed (from ``spectra.nc``, by
    :func:`specalign.transformers.measure.spectra.block_directions`), one per block of ``mw``;
    when None each block used is decomposed here.
    """
    sched = layer_schedule(mw, n_layers)
    if directions is not None:
        if len(directions) != len(mw.blocks):
            raise ValueError(
                f"{len(directions)} blocks of directions for a model of {len(mw.blocks)} blocks"
            )
        per_block = dict(enumerate(directions))
    else:
        per_block = {b: block_principal_directions(mw, mw.blocks[b]) for b in {s[0] for s in sched}}
    keys = (
        "v1", "v2", "v_neg", "lambda_v1", "lambda_v2", "lambda_neg", "lambda1_is_complex",
        "top2_basis",
    )  # fmt: skip
    return {k: np.array([per_block[s[0]][k] for s in sched]) for k in keys}
