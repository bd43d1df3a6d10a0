"""The cross-model figures of the transformer study (Li & Altafini, arXiv:2605.25619):
the leading eigenvalues of every model against the layer (paper Fig. 7) and the overlap
of consecutive layers' leading eigenvectors (our reading of Fig. 9), each model's
random-weight twin beside it; and :data:`OVERVIEW_FIGURES`, these and the sphere
figures (supplement Figs. 13, 14) by the stem the workflow writes."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from specalign import figstyle
from specalign.lazy import LazyModule
from specalign.output import nanmean as _nanmean
from specalign.transformers.report.figures.sphere import sphere_figure13, sphere_figure14
from specalign.transformers.report.figures.style import (
    _N_EIGS,
    _NULL,
    _RANDOM_MODEL,
    _d_model,
    _integer_x,
)
from specalign.transformers.report.paper import PAPER_FAMILIES
from specalign.transformers.report.tables import (
    is_random_model,
    layer_eigenvalues,
    leading_vector_overlaps,
    random_unit_overlap,
    relative_gaps,
)
from specalign.transformers.weights import shares_weights

if TYPE_CHECKING:
    from matplotlib.figure import Figure

xr = LazyModule("xarray")
mpl_figure = LazyModule("matplotlib.figure")


def _panel_groups(models: Sequence[str], like: Mapping[str, str]) -> list[tuple[str, list[str]]]:
    """(panel model, [random models whose like: names it]) for every other model; a
    random model whose like: model is not drawn gets its own panel."""
    trained = [m for m in models if not is_random_model(m, like)]
    groups = [(m, sorted(r for r in models if like.get(r) == m)) for m in trained]
    paired = {r for _, rs in groups for r in rs}
    groups += [(r, []) for r in models if is_random_model(r, like) and r not in paired]
    return groups


def _family_title(name: str, ds: xr.Dataset) -> str:
    """``name (family)``, marked when the paper does not study that family."""
    fam = str(ds.attrs.get("family", ""))
    if not fam:
        return name
    return f"{name} ({fam}{'' if fam in PAPER_FAMILIES else ', beyond the paper'})"


def spectrum_overview_figure(
    spectra_by_model: Mapping[str, xr.Dataset], like: Mapping[str, str] | None = None
) -> tuple[Figure, str] | None:
    """Re(lambda_i,t), i = 1..5, against layer t for every model (paper Fig. 7).

    A random model (a key of ``like``) is drawn in gray dashed inside the panel of the
    model its ``like:`` names: its curves are the chance level of that model's gaps.
    None without models.
    """
    if not spectra_by_model:
        return None
    like = dict(like or {})
    groups = _panel_groups(list(spectra_by_model), like)
    pal = figstyle.qualitative(_N_EIGS)
    notes = []
    with figstyle.axes_style():
        n = len(groups)
        ncol = min(n, 3)
        nrow = math.ceil(n / ncol)
        fig = mpl_figure.Figure(figsize=(4.4 * ncol, 3.6 * nrow), layout="constrained")
        axes = np.atleast_1d(fig.subplots(nrow, ncol, squeeze=False)).ravel()
        for ax, (name, randoms) in zip(axes, groups, strict=False):
            lam = layer_eigenvalues(spectra_by_model[name])
            x = np.arange(1, lam.shape[0] + 1)
            for i in range(lam.shape[1]):
                ax.plot(
                    x,
                    lam[:, i].real,
                    color=pal[i],
                    marker="o",
                    ms=3,
                    label=f"Re $\\lambda_{i + 1}$",
                )
            for r in randoms:
                lr = layer_eigenvalues(spectra_by_model[r])
                for i in range(lr.shape[1]):
                    ax.plot(
                        np.arange(1, lr.shape[0] + 1),
                        lr[:, i].real,
                        color=_RANDOM_MODEL,
                        ls="--",
                        lw=0.9,
                        label=r if i == 0 else None,
                    )
            rel = relative_gaps(spectra_by_model[name])
            small = float(np.mean(rel < 0.1)) if rel.size else float("nan")
            notes.append(f"{name}: {small:.0%} of layers with gap/|lambda_1| < 0.1")
            for r in randoms:
                rr = relative_gaps(spectra_by_model[r])
                notes.append(f"{r}: {float(np.mean(rr < 0.1)):.0%}")
            ax.set_title(_family_title(name, spectra_by_model[name]))
            ax.set_xlabel("layer $t$")
            ax.set_ylabel("Re $\\lambda_{i,t}$")
            _integer_x(ax)
            ax.legend(fontsize="x-small", ncol=2)
        for ax in axes[len(groups) :]:
            ax.set_axis_off()
    caption = (
        "Real parts of the five leading eigenvalues (sorted by real part) of each layer's "
        "F_t = W_O W_V against the layer, one panel per model (paper Fig. 7, BERT/GPT-2/"
        "GPT-Neo). The paper's reading: the spectral gap Re lambda_1 - Re lambda_2 (Re "
        "lambda_1 - Re lambda_3 for a complex lambda_1) is small in most layers. Each panel "
        "names the model's family; a family the paper does not study is marked 'beyond the "
        "paper'. Null: the random model whose like: names the panel's model (gray dashed), "
        "where one is configured. " + "; ".join(notes) + "."
    )
    return fig, caption


def eigvec_continuity_figure(
    spectra_by_model: Mapping[str, xr.Dataset], like: Mapping[str, str] | None = None
) -> tuple[Figure, str] | None:
    """|<v1_t, v1_{t+1}>| between consecutive layers per model, with the random-unit
    null E|<u, v>| ~ sqrt(2/(pi d)). Our reading of paper Fig. 9, whose caption is
    truncated. None when no model has two layers."""
    series = {
        m: leading_vector_overlaps(s) for m, s in spectra_by_model.items() if s.sizes["layer"] > 1
    }
    if not series:
        return None
    like = dict(like or {})
    trained = [m for m in series if not is_random_model(m, like)]
    pal = dict(zip(trained, figstyle.qualitative(max(len(trained), 1)), strict=False))
    dims = sorted({_d_model(spectra_by_model[m]) for m in series})
    notes = []
    with figstyle.axes_style():
        fig = mpl_figure.Figure(figsize=(7.0, 4.2), layout="constrained")
        ax = fig.subplots()
        for m, ov in series.items():
            x = np.arange(1, ov.size + 1)
            if is_random_model(m, like):
                label = f"{m} (random, like {like[m]})"
                ax.plot(x, ov, color=_RANDOM_MODEL, ls="--", marker="x", ms=4, label=label)
            else:
                ax.plot(x, ov, color=pal[m], marker="o", ms=4, label=m)
            shared = shares_weights(spectra_by_model[m].attrs)
            notes.append(
                f"{m}: mean {_nanmean(ov):.3f}"
                + (" (shared weights: 1 by construction)" if shared else "")
            )
        for d in dims:
            ax.axhline(
                random_unit_overlap(d),
                color=_NULL,
                ls=":",
                lw=1.2,
                label=f"random unit vectors, d={d}",
            )
        ax.set_xlabel("layer pair $(t, t+1)$")
        ax.set_ylabel("$|\\langle v_{1,t}, v_{1,t+1}\\rangle|$")
        ax.set_ylim(-0.02, 1.02)
        _integer_x(ax)
        ax.legend(fontsize="x-small")
    caption = (
        "Absolute overlap |<v1_t, v1_{t+1}>| between the leading real eigenvectors of "
        "consecutive layers' F_t, per model. This is OUR reading of paper Fig. 9, whose "
        "caption is truncated in our copy ('Absolute correlation between the principal "
        "eigenvector ...'); the paper may correlate something else with v1. Null (dotted): "
        "two independent uniformly random unit vectors, E|<u, v>| = "
        + ", ".join(f"{random_unit_overlap(d):.4f} (d={d})" for d in dims)
        + " ~ sqrt(2/(pi d)); random-weight models in gray. "
        + "; ".join(notes)
        + "."
    )
    return fig, caption


Overview = Callable[
    [Mapping[str, "xr.Dataset"], "xr.Dataset", Mapping[str, str]], "tuple[Figure, str] | None"
]

#: The cross-model and sphere figures: stem -> builder(spectra by model, sphere.nc,
#: like), ``like`` mapping each random model to the model whose configuration it copies.
OVERVIEW_FIGURES: dict[str, Overview] = {
    "figure7_spectra": lambda spectra, sphere, like: spectrum_overview_figure(spectra, like),
    "figure9_eigvec_continuity": lambda spectra, sphere, like: eigvec_continuity_figure(
        spectra, like
    ),
    "figure13": lambda spectra, sphere, like: sphere_figure13(sphere),
    "figure14": lambda spectra, sphere, like: sphere_figure14(sphere),
}
