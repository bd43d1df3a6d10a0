"""The per-model figures of the transformer study (Li & Altafini, arXiv:2605.25619,
paper Figs. 1-6, 8, 10-12) as one bundle: :func:`model_figures` draws every figure a
model's files allow, :data:`MODEL_FIGURES` names the files the workflow writes, and
:func:`unavailable_figure` stands in for a figure whose data the run does not have."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specalign.lazy import LazyModule
from specalign.output import placeholder_figure
from specalign.transformers.load.contracts import MODES
from specalign.transformers.report.figures.depth import prolonged_figure, token_distance_figure
from specalign.transformers.report.figures.propagation import (
    alignment_figure,
    corr_choice_figure,
    correlations_figure,
)
from specalign.transformers.report.figures.spectra import eigenvalue_figure, heads_figure
from specalign.transformers.report.figures.steering import steering_figure
from specalign.transformers.report.figures.style import _modes

# imported when first used (specalign.lazy): the rule files import these modules for
# their names, and every snakemake call would pay these imports
xr = LazyModule("xarray")

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def model_figures(
    model: str,
    spectra: xr.Dataset | None = None,
    prop: xr.Dataset | None = None,
    steer: xr.Dataset | None = None,
    null_spectra: xr.Dataset | None = None,
    null_name: str | None = None,
    like_of: str | None = None,
    null_prop: xr.Dataset | None = None,
) -> dict[str, tuple[Figure, str]]:
    """``{stem: (figure, caption)}`` of every per-model figure its data allows;
    ``null_spectra`` are those of the random-weight twin ``null_name``; ``like_of`` is
    the model whose configuration ``model`` copies when it is a random model itself;
    ``null_prop`` the twin's propagation, drawn in the alignment panels.

    Stems: ``eigenvalues``, ``heads``, ``alignment_{mode}`` and ``correlations_{mode}`` for each
    mode, ``token_distance``, ``prolonged``, ``corr_choice``, ``steering``.
    """
    out: dict[str, tuple[Figure, str]] = {}
    if spectra is not None:
        out["eigenvalues"] = eigenvalue_figure(spectra, model, null_spectra, null_name, like_of)
        heads = heads_figure(spectra, model, null_spectra, null_name)
        if heads is not None:
            out["heads"] = heads
    if prop is not None:
        for mode in _modes(prop):
            made = alignment_figure(prop, model, mode, null_prop, null_name, spectra)
            if made is not None:
                out[f"alignment_{mode}"] = made
            made = correlations_figure(prop, model, mode)
            if made is not None:
                out[f"correlations_{mode}"] = made
        out["token_distance"] = token_distance_figure(prop, model)
        for stem, make2 in (("prolonged", prolonged_figure), ("corr_choice", corr_choice_figure)):
            made2 = make2(prop, model)
            if made2 is not None:
                out[stem] = made2
    if steer is not None:
        out["steering"] = steering_figure(steer, model)
    return out


def unavailable_figure(title: str, reason: str) -> tuple[Figure, str]:
    """A placeholder for a figure whose data this run does not have (for example the
    prolonged run of a model that is already longer than ``prolonged_layers``), so that a
    workflow with fixed output files still tells the reader why the figure is empty."""
    return placeholder_figure(
        f"{title}\nnot available in this run:\n{reason}",
        f"{title}: not available in this run ({reason}).",
    )


#: The per-model figures the workflow writes (a placeholder where the data are absent):
#: each propagation mode but the prolonged ones (which share ``prolonged``) gets an
#: alignment and a correlations figure.
MODEL_FIGURES: tuple[str, ...] = (
    "eigenvalues",
    "heads",
    *(f"alignment_{mode}" for mode in MODES if not mode.startswith("prolonged")),
    *(f"correlations_{mode}" for mode in MODES if not mode.startswith("prolonged")),
    "token_distance",
    "prolonged",
    "corr_choice",
    "steering",
)
