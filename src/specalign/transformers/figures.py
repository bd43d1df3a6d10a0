"""Figures of the transformer study (Li & Altafini, arXiv:2605.25619) from its data files.

Inputs are the loaded contracts of :mod:`specalign.transformers`:
``spectra.nc`` (:func:`specalign.transformers.spectra.spectra_dataset`),
``propagation.nc`` (:func:`specalign.transformers.propagate.propagation_dataset`),
``steering.nc`` (:func:`specalign.transformers.steer.steering_dataset`) and
``sphere.nc`` (:func:`specalign.transformers.sphere.sphere_dataset`). Every function returns
``(Figure, caption)`` or ``None`` when the data it needs is absent; saving is left to
:func:`specalign.output.save_figure`.

Every figure draws a null level beside the measured curve, because an alignment
|corr| of 0.2 means nothing without the level a direction unrelated to F would give:

* random-direction null (dashed gray, band = token sd): the same metric against random
  unit directions (``*_null`` variables). Under cosine correlation its expectation is
  E|<x, r>| = Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2)) ~ sqrt(2/(pi d)) for any x;
* most-negative-eigenvector null (dotted purple): the same metric against the
  eigenvector of F_t's most negative real eigenvalue (``*_neg_null``), a direction of F
  that the power-method reading says tokens should *not* tilt to;
* cross-model figures overlay the random-weight twin of a model (the random model
  whose ``like:`` names it; ``like`` maps random models to the models they copy) in
  gray, the chance level of every trained-model curve.

Layer indices are 1-based in every figure (layer t = 1..T, state 0 is the input), as in
every file and the paper (specalign.transformers.variables); blocks are 0-based.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import seaborn as sns
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from mpl_toolkits.mplot3d.axes3d import Axes3D

from specalign.output import nanmean as _nanmean
from specalign.output import placeholder_figure
from specalign.transformers.contracts import MODES
from specalign.transformers.families import FAMILIES
from specalign.transformers.paper import MODE_FIGURES, PAPER_FAMILIES
from specalign.transformers.tables import (
    bipartite_outcomes,
    is_random_model,
    layer_eigenvalues,
    leading_vector_overlaps,
    mode_view,
    random_unit_overlap,
    relative_gaps,
)

__all__ = [
    "alignment_figure",
    "corr_choice_figure",
    "correlations_figure",
    "eigenvalue_figure",
    "eigvec_continuity_figure",
    "layer_eigenvalues",
    "leading_vector_overlaps",
    "MODEL_FIGURES",
    "OVERVIEW_FIGURES",
    "model_figures",
    "prolonged_figure",
    "random_unit_overlap",
    "sphere_figure13",
    "sphere_figure14",
    "spectrum_overview_figure",
    "steering_figure",
    "token_distance_figure",
]

_STYLE = "whitegrid"
_NULL = "0.35"  # random-direction null
_NEG = "tab:purple"  # most-negative-eigenvector null
_RANDOM_MODEL = "0.55"
_N_EIGS = 5  # the paper's Figure 7 shows lambda_1..5
_SPHERE_NULL_DIRECTIONS = 64


# --------------------------------------------------------------------------- helpers


def _nanstats(da: xr.DataArray, dim: str) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population sd (ddof 0) over ``dim``, NaN-skipping, without warnings for
    all-NaN slices (a missing direction makes a whole layer NaN by design)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        axis = da.get_axis_num(dim)
        vals = np.asarray(da.values, dtype=float)
        return np.nanmean(vals, axis=axis), np.nanstd(vals, axis=axis)


def _modes(prop: xr.Dataset) -> list[str]:
    return [str(m) for m in prop["mode"].values]


def _is_shared(prop: xr.Dataset) -> bool:
    """Shared-weight model (ALBERT): its family shares one block across layers, or, for a
    family the package does not know, every layer has the same leading eigenvalue."""
    family = FAMILIES.get(str(prop.attrs.get("family", "")))
    if family is not None and family.shared_weights:
        return True
    lam = np.asarray(prop["lambda_v1"].values, dtype=float)
    return lam.size > 1 and bool(np.all(lam == lam[0]))


def _paper_figure(prop: xr.Dataset, mode: str) -> str:
    shared_fig, other_fig = MODE_FIGURES.get(mode, (None, None))
    figure = shared_fig if _is_shared(prop) else other_fig
    if figure is not None:
        return figure
    if mode == "simplified_full":
        return (
            "no paper counterpart (full attention A = 1/n, the exact power-method step on "
            "I + eta F)"
        )
    return "no paper counterpart"


def _mode_text(mode: str) -> str:
    return {
        "simplified_real": "simplified model (no FFN, LayerNorm as normalisation) with the "
        "layers' real attention",
        "simplified_full": "simplified model with full attention A = 1/n",
        "real_model": "real model (embeddings, FFN, affine LayerNorm)",
        "prolonged_real": "simplified model prolonged by repeating its last layer, real attention",
        "prolonged_full": "simplified model prolonged by repeating its last layer, full attention",
    }.get(mode, mode)


#: Readable names of the propagation modes, for titles and legends (the code names stay
#: in the files and the captions, which say both).
MODE_NAMES: dict[str, str] = {
    "simplified_real": "simplified model, real attention",
    "simplified_full": "simplified model, full attention (A = 1/n)",
    "real_model": "real model",
    "prolonged_real": "prolonged, real attention",
    "prolonged_full": "prolonged, full attention (A = 1/n)",
}


def mode_name(mode: str) -> str:
    """The readable name of a propagation mode (the code name when it has none)."""
    return MODE_NAMES.get(mode, mode)


def _legend_outside(ax: Axes, **kw: Any) -> None:
    """The legend to the right of the axes, where it covers no curve and no reference
    line (constrained layout makes room for it)."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kw)


def _integer_x(ax: Axes) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _line_band(
    ax: Axes,
    x: np.ndarray,
    mean: np.ndarray,
    sd: np.ndarray | None,
    *,
    color: object,
    label: str,
    linestyle: str = "-",
    marker: str | None = "o",
    alpha: float = 0.18,
) -> None:
    ax.plot(x, mean, color=color, linestyle=linestyle, marker=marker, ms=3, lw=1.4, label=label)
    if sd is not None:
        ax.fill_between(x, mean - sd, mean + sd, color=color, alpha=alpha, lw=0)


def _null_band(ax: Axes, x: np.ndarray, da: xr.DataArray, dim: str, label: str) -> float:
    """Random-direction null: dashed gray mean with a light sd band; returns its mean."""
    m, s = _nanstats(da, dim)
    _line_band(ax, x, m, s, color=_NULL, label=label, linestyle="--", marker=None, alpha=0.12)
    return _nanmean(m)


def _neg_line(ax: Axes, x: np.ndarray, da: xr.DataArray, dim: str | None, label: str) -> float:
    m = _nanstats(da, dim)[0] if dim else np.asarray(da.values, dtype=float)
    ax.plot(x, m, color=_NEG, linestyle=":", lw=1.4, label=label)
    return _nanmean(m)


def _d_model(spectra: xr.Dataset) -> int:
    return int(spectra.attrs.get("d_model", spectra.sizes.get("component", 0)))


# --------------------------------------------------------------------------- per model


def _complex_plane_panel(ax: Axes, spectra: xr.Dataset, null_spectra: xr.Dataset | None) -> float:
    """Every eigenvalue of each distinct F in the complex plane; returns the radius of
    the circular-law disk drawn (NaN when only the leading eigenvalues are stored)."""
    lam_r = np.asarray(spectra["eigenvalues_real"].values, dtype=float)
    lam_i = np.asarray(spectra["eigenvalues_imag"].values, dtype=float)
    n_blocks = lam_r.shape[0]
    if null_spectra is not None:
        ax.scatter(
            null_spectra["eigenvalues_real"].values.ravel(),
            null_spectra["eigenvalues_imag"].values.ravel(),
            s=5,
            color=_RANDOM_MODEL,
            alpha=0.5,
            label="random-weight model",
        )
    colors = sns.color_palette("viridis", n_blocks)
    layers_of = _layers_of_blocks(spectra)
    for b in range(n_blocks):
        ax.scatter(
            lam_r[b],
            lam_i[b],
            s=7,
            color=colors[b],
            alpha=0.8,
            label=layers_of[b] if n_blocks <= 8 else None,
        )
    radius = float("nan")
    if lam_r.shape[1] == _d_model(spectra):
        radius = float(np.sqrt(2.0 * np.mean(lam_r**2 + lam_i**2)))
        t = np.linspace(0.0, 2.0 * np.pi, 200)
        ax.plot(
            radius * np.cos(t),
            radius * np.sin(t),
            color=_NULL,
            ls="--",
            lw=1.0,
            label="circular law, same $\\sum|\\lambda|^2$",
        )
    ax.axvline(0.0, color="k", lw=0.6)
    ax.set_xlabel("Re $\\lambda$")
    ax.set_ylabel("Im $\\lambda$")
    ax.set_title(f"eigenvalues of $F = W_O W_V$ ({n_blocks} distinct)")
    _legend_outside(ax, fontsize="x-small")
    return radius


def _layers_of_blocks(spectra: xr.Dataset) -> list[str]:
    """``"layer t"`` (or ``"layers 1-12"`` for a shared block) for each block, in the
    paper's layer numbering 1..L, from ``layer_block``."""
    lb = np.asarray(spectra["layer_block"].values, dtype=int)
    layers = np.asarray(spectra["layer"].values, dtype=int)
    # spectra.nc counted layers from 0 before the numbering was made one (issue 17)
    layers = layers + 1 if layers.size and layers.min() == 0 else layers
    out = []
    for b in range(spectra.sizes["block"]):
        ts = layers[lb == b]
        if ts.size == 1:
            out.append(f"layer {ts[0]}")
        elif ts.size and np.array_equal(ts, np.arange(ts[0], ts[0] + ts.size)):
            out.append(f"layers {ts[0]}-{ts[-1]}")
        else:
            out.append("layers " + ", ".join(str(t) for t in ts))
    return out


def _layer_eigenvalue_panel(
    ax: Axes, per_layer: np.ndarray, null_spectra: xr.Dataset | None
) -> np.ndarray:
    """Re(lambda_1..5) per layer, the random-weight model's dashed; returns the layers
    (0-based) whose lambda_1 is complex, which are marked."""
    layers = np.arange(1, per_layer.shape[0] + 1)
    pal = sns.color_palette("colorblind", _N_EIGS)
    for i in range(per_layer.shape[1]):
        ax.plot(
            layers,
            per_layer[:, i].real,
            marker="o",
            ms=3,
            color=pal[i],
            label=f"Re $\\lambda_{i + 1}$",
        )
    if null_spectra is not None:
        nl = layer_eigenvalues(null_spectra)
        for i in range(nl.shape[1]):
            ax.plot(
                np.arange(1, nl.shape[0] + 1),
                nl[:, i].real,
                color=_RANDOM_MODEL,
                ls="--",
                lw=1.0,
                label="random-weight model" if i == 0 else None,
            )
    complex1 = np.flatnonzero(np.asarray(per_layer[:, 0].imag != 0))
    if complex1.size:
        ax.scatter(
            layers[complex1],
            per_layer[complex1, 0].real,
            marker="s",
            facecolors="none",
            edgecolors="k",
            s=40,
            label="$\\lambda_1$ complex",
        )
    ax.axhline(0.0, color="k", lw=0.6)
    ax.set_xlabel("layer $t$")
    ax.set_ylabel("Re $\\lambda_{i,t}$")
    ax.set_title("leading eigenvalues per layer")
    _integer_x(ax)
    _legend_outside(ax, fontsize="x-small")
    return complex1


def eigenvalue_figure(
    spectra: xr.Dataset,
    model: str,
    null_spectra: xr.Dataset | None = None,
    null_name: str | None = None,
    like_of: str | None = None,
) -> tuple[Figure, str]:
    """Eigenvalues of every distinct F = W_O W_V in the complex plane (paper Fig. 1a) and
    Re(lambda_1..5) per layer.

    Null levels: the circular-law disk of an i.i.d. random matrix with the same
    eigenvalue energy (radius sqrt(2 mean |lambda|^2), drawn when ``spectra`` holds the
    whole spectrum), and, when ``null_spectra`` (the random-weight twin ``null_name``) is
    given, its eigenvalues in gray and its Re(lambda_1..5) per layer as gray dashed lines.
    ``like_of``: the model whose configuration ``model`` copies, when it is random itself.
    """
    n_blocks = spectra.sizes["block"]
    d = _d_model(spectra)
    per_layer = layer_eigenvalues(spectra)
    with sns.axes_style(_STYLE):
        fig = Figure(figsize=(13.0, 4.6), layout="constrained")
        ax_c, ax_l = fig.subplots(1, 2, width_ratios=[1.0, 1.3])
        radius = _complex_plane_panel(ax_c, spectra, null_spectra)
        complex1 = _layer_eigenvalue_panel(ax_l, per_layer, null_spectra)
    shared = bool(int(spectra.attrs.get("shared", 0)))
    caption = (
        f"Eigenvalues of F = W_O W_V for {model} (d = {d}, {per_layer.shape[0]} layers, "
        f"{n_blocks} distinct block{'s' if n_blocks != 1 else ''}"
        + ("; shared weights: one F for all layers" if shared else "")
        + "). Left: every eigenvalue of each distinct F in the complex plane (paper Fig. 1a "
        "for ALBERT). Right: Re(lambda_1..5) per layer (sorted by real part; squares mark "
        f"layers whose lambda_1 is complex, {complex1.size} of {per_layer.shape[0]}). "
        + (
            f"Null: the dashed circle (radius {radius:.3g}) is where an i.i.d. random matrix "
            "with the same sum |lambda|^2 would put its eigenvalues (circular law); an "
            "isolated real eigenvalue outside it is structure. "
            if np.isfinite(radius)
            else "Only the first eigenvalues are stored, so no circular-law disk is drawn. "
        )
        + (
            f"Gray: the eigenvalues and Re(lambda_1..5) of the random-weight twin "
            f"{null_name or '(unnamed)'} (like: {model})."
            if null_spectra is not None
            else f"{model} is itself the random-weight twin of {like_of} (like: {like_of})."
            if like_of
            else f"No random model has like: {model}, so there is no random-weight twin."
        )
    )
    return fig, caption


def alignment_figure(
    prop: xr.Dataset,
    model: str,
    mode: str = "simplified_real",
    null_prop: xr.Dataset | None = None,
    null_name: str | None = None,
) -> tuple[Figure, str] | None:
    """gamma_t, psi_t and rho_t across layers (paper Figs. 2, 8; 11, 12; 1b).

    Token mean +- sd and the prompt-mean-token variant, with the random-direction null
    (dashed, band = sd over tokens) and the most-negative-eigenvector null (dotted).
    ``null_prop``: the propagation of the model's random-weight twin ``null_name``, whose
    token mean is drawn in the same panels (gray dash-dotted), so that the model and its
    null are read off one axis. None when ``mode`` is not in ``prop``.
    """
    ds = mode_view(prop, mode)
    if ds is None:
        return None
    twin = mode_view(null_prop, mode) if null_prop is not None else None
    twin_means: dict[str, float] = {}
    x = ds["layer"].values
    pal = sns.color_palette("colorblind", 2)
    rows = (
        ("gamma", "$\\gamma_t = |corr(x_i^t, v_{1,t})|$"),
        ("psi", "$\\psi_t = \\gamma_t - |corr(x_i^{t-1}, v_{1,t})|$"),
        ("rho", "$\\rho_t = P(\\psi_t > 0)$"),
    )
    nulls: dict[str, float] = {}
    with sns.axes_style(_STYLE):
        fig = Figure(figsize=(9.0, 8.6), layout="constrained")
        axes = fig.subplots(3, 1, sharex=True)
        for ax, (var, title) in zip(axes, rows, strict=True):
            if var == "rho":
                ax.plot(x, ds["rho"].values, color=pal[0], marker="o", ms=3, label="tokens")
                ax.plot(
                    x, ds["rho_mean"].values, color=pal[1], marker="s", ms=3, label="mean token"
                )
                nulls["rho"] = _nanmean(ds["rho_null"])
                ax.plot(x, ds["rho_null"].values, color=_NULL, ls="--", label="random direction")
                nulls["rho_neg"] = _neg_line(
                    ax, x, ds["rho_neg_null"], None, "most negative eigvec"
                )
                if twin is not None:
                    tr = np.asarray(twin["rho"].values, dtype=float)
                    ax.plot(
                        twin["layer"].values, tr, color=_RANDOM_MODEL, ls="-.", marker="x",
                        ms=4, label=f"random twin {null_name or ''}".rstrip(),
                    )  # fmt: skip
                    twin_means["rho"] = _nanmean(tr)
                ax.axhline(0.5, color="k", lw=0.6)
                ax.set_ylim(-0.03, 1.03)
            else:
                m, s = _nanstats(ds[var], "token")
                _line_band(ax, x, m, s, color=pal[0], label="tokens (mean $\\pm$ sd)")
                mm, ms_ = _nanstats(ds[f"{var}_mean"], "prompt")
                _line_band(
                    ax, x, mm, ms_, color=pal[1], label="mean token (mean $\\pm$ sd)", marker="s"
                )
                nulls[var] = _null_band(ax, x, ds[f"{var}_null"], "token", "random direction")
                nulls[f"{var}_neg"] = _neg_line(
                    ax, x, ds[f"{var}_neg_null"], "token", "most negative eigvec"
                )
                if twin is not None:
                    tm = _nanstats(twin[var], "token")[0]
                    ax.plot(
                        twin["layer"].values, tm, color=_RANDOM_MODEL, ls="-.", marker="x",
                        ms=4, label=f"random twin {null_name or ''} (token mean)",
                    )  # fmt: skip
                    twin_means[var] = _nanmean(tm)
                if var == "psi":
                    ax.axhline(0.0, color="k", lw=0.6)
            ax.set_title(title, fontsize="medium")
        axes[-1].set_xlabel("layer $t$")
        _integer_x(axes[-1])
        for ax in axes:
            _legend_outside(ax, fontsize="x-small")
        fig.suptitle(f"{model}: {mode_name(mode)}")
    gamma_m = _nanmean(ds["gamma"])
    psi_m = _nanmean(ds["psi"])
    rho = np.asarray(ds["rho"].values, dtype=float)
    above = np.asarray(ds["rho"].values > ds["rho_null"].values)
    caption = (
        f"Token alignment with the principal eigenvector v1_t of F_t across layers, {model}, "
        f"mode {mode} ({_mode_text(mode)}; {_paper_figure(prop, mode)}). Rows: gamma_t, "
        "psi_t (the tilt layer t produces towards its own v1_t) and rho_t (fraction of "
        "tokens with psi_t > 0); blue: all tokens, mean +- sd; orange: the mean token of "
        f"each prompt, mean +- sd over {ds.sizes['prompt']} prompts. Correlation: "
        f"{prop.attrs.get('corr', 'cosine')}. Null levels: random unit directions (dashed, "
        f"{int(prop.attrs.get('n_null_draws', 0))} draws averaged; mean gamma "
        f"{nulls['gamma']:.3f}, psi {nulls['psi']:+.3f}, rho {nulls['rho']:.2f}) and the "
        f"eigenvector of F_t's most negative eigenvalue (dotted; gamma {nulls['gamma_neg']:.3f}"
        f", rho {nulls['rho_neg']:.2f}). Measured means over layers: gamma {gamma_m:.3f}, "
        f"psi {psi_m:+.3f}, rho {_nanmean(rho):.2f}; rho exceeds its random-direction null "
        f"in {int(above.sum())} of {x.size} layers. "
        + (
            f"Gray dash-dotted: the random-weight twin {null_name} in the same mode (means "
            f"over layers: gamma {twin_means['gamma']:.3f}, psi {twin_means['psi']:+.3f}, "
            f"rho {twin_means['rho']:.2f}); the model's curves above the twin's are what "
            "training put there."
            if twin is not None
            else "No random-weight twin of this model has this mode in the run."
        )
    )
    return fig, caption


def _correlation_panel(
    ax: Axes,
    ds: xr.Dataset,
    var: str,
    null: tuple[np.ndarray, np.ndarray],
    null_label: str,
) -> float:
    """One row of the correlations figure: each prompt's token average (gray), the
    average over all tokens (red), the null (dashed, sd band); returns the average over
    layers."""
    x = ds["layer"].values
    per_prompt = ds[var].groupby("token_prompt").mean(skipna=True)  # (layer, prompt)
    pp = np.asarray(per_prompt.transpose("layer", ...).values, dtype=float)
    ax.plot(x, pp, color="0.6", lw=0.5, alpha=0.6)
    avg = _nanstats(ds[var], "token")[0]
    ax.plot(x, avg, color="tab:red", lw=2.0, marker="o", ms=3, label="average")
    _line_band(
        ax, x, null[0], null[1], color=_NULL, label=null_label, linestyle="--", marker=None,
        alpha=0.12,
    )  # fmt: skip
    if var == "gamma":
        _neg_line(ax, x, ds["gamma_neg_null"], "token", "most negative eigvec")
    return _nanmean(avg)


def correlations_figure(
    prop: xr.Dataset, model: str, mode: str = "simplified_real"
) -> tuple[Figure, str] | None:
    """|corr(x_i, v1)|, |corr(x_i, v2)| and |corr(x_i, x_i_proj)| per layer (paper Fig. 5).

    Thin gray lines: each prompt's average over its tokens; red: the average over all
    tokens; dashed: the random-direction null (for the projection panel, the expected
    value for a random 2-plane, exactly (pi/2) times the 1-D null under cosine
    correlation). None when ``mode`` is absent.
    """
    ds = mode_view(prop, mode)
    if ds is None:
        return None
    proj = str(prop.attrs.get("proj", "top2"))
    corr = str(prop.attrs.get("corr", "cosine"))
    rows = (
        ("gamma", "$|corr(x_i, v_1)|$"),
        ("gamma_v2", "$|corr(x_i, v_2)|$"),
        ("corr_proj", "$|corr(x_i, x_{i,proj})|$"),
    )
    null_m, null_s = _nanstats(ds["gamma_null"], "token")
    # A uniform random 2-plane keeps a fraction ||P x||^2/||x||^2 ~ Beta(1, (d-2)/2) of a
    # unit vector, whose root has mean (pi/2) E|<x, r>|: the plane null needs no d.
    plane = proj == "top2"
    factor = math.pi / 2 if plane else 1.0
    means: dict[str, float] = {}
    with sns.axes_style(_STYLE):
        fig = Figure(figsize=(9.2, 8.2), layout="constrained")
        axes = fig.subplots(3, 1, sharex=True)
        for ax, (var, title) in zip(axes, rows, strict=True):
            null_scale = factor if var == "corr_proj" else 1.0
            null_label = (
                "random 2-plane ($\\pi/2 \\times$ random direction)"
                if var == "corr_proj" and plane
                else "random direction"
            )
            means[var] = _correlation_panel(
                ax, ds, var, (null_scale * null_m, null_scale * null_s), null_label
            )
            ax.set_title(title, fontsize="medium")
            ax.set_ylim(-0.02, 1.02)
            _legend_outside(ax, fontsize="x-small")
        axes[-1].set_xlabel("layer $t$")
        _integer_x(axes[-1])
        fig.suptitle(f"{model}: {mode_name(mode)}")
    null_level = _nanmean(null_m)
    caption = (
        f"Absolute correlation of tokens with the principal directions of F_t, {model}, mode "
        f"{mode} ({_mode_text(mode)}; paper Fig. 5, which shows the four ALBERT models). "
        f"Gray: each of the {ds.sizes['prompt']} prompts, averaged over its "
        f"{ds.sizes['token'] // max(ds.sizes['prompt'], 1)} tokens; red: the average over "
        "all tokens. Top: v1 (leading real eigenvector); middle: v2 (next real one); bottom: "
        "the token against its orthogonal projection onto "
        + (
            "the real invariant subspace of F_t's two leading eigenvalues (span(v1, v2), or "
            "the plane of a complex leading pair)"
            if plane
            else "span(v1) (then identical to the top row under cosine correlation)"
        )
        + f". Correlation: {corr}. Null (dashed, sd band): random unit directions, mean "
        f"{null_level:.3f}"
        + (
            f"; for the projection panel a random 2-plane, {factor * null_level:.3f} "
            "(exact in expectation under cosine correlation, approximate under Pearson)"
            if plane
            else ""
        )
        + f". Averages over layers: v1 {means['gamma']:.3f}, v2 {means['gamma_v2']:.3f}, "
        f"projection {means['corr_proj']:.3f}."
    )
    return fig, caption


def token_distance_figure(prop: xr.Dataset, model: str) -> tuple[Figure, str]:
    """Mean inter-token distance per layer for every mode (paper Fig. 4).

    Null: sqrt(2), the mean distance of independent uniformly random unit tokens in
    high dimension (when distances are taken on unit-normalised tokens), and 0 =
    consensus. Prolonged modes get their own panel so the original depth stays legible.
    """
    modes = _modes(prop)
    short = [m for m in modes if not m.startswith("prolonged")]
    long_ = [m for m in modes if m.startswith("prolonged")]
    pal = dict(zip(modes, sns.color_palette("colorblind", len(modes)), strict=True))
    normalized = bool(int(prop.attrs.get("normalize_distance", 1)))
    finals: dict[str, float] = {}
    with sns.axes_style(_STYLE):
        n_panels = 2 if long_ and short else 1
        fig = Figure(figsize=(5.2 * n_panels + 1.0, 4.0), layout="constrained")
        axes = np.atleast_1d(fig.subplots(1, n_panels))
        for ax, group in zip(axes, [g for g in (short, long_) if g], strict=True):
            for mode in group:
                ds = mode_view(prop, mode)
                if ds is None:
                    continue
                m, s = _nanstats(ds["token_distance"], "prompt")
                _line_band(ax, ds["state"].values, m, s, color=pal[mode], label=mode_name(mode))
                finals[mode] = float(m[-1])
            if normalized:
                ax.axhline(
                    math.sqrt(2.0),
                    color=_NULL,
                    ls="--",
                    lw=1.0,
                    label="random tokens ($\\sqrt{2}$)",
                )
            ax.axhline(0.0, color="k", lw=0.6)
            ax.set_xlabel("state $t$ (0 = input)")
            ax.set_ylabel("mean $\\|x_i - x_j\\|$ over pairs")
            _integer_x(ax)
            ax.legend(fontsize="x-small")
        fig.suptitle(f"{model}: inter-token distance")
    caption = (
        f"Mean pairwise distance between the tokens of a prompt after each layer, {model} "
        f"(paper Fig. 4, ALBERT). One curve per mode, mean +- sd over {prop.sizes['prompt']} "
        "prompts; "
        + (
            "tokens are unit-normalised before measuring. Null: sqrt(2) (dashed), the mean "
            "distance of independent uniformly random unit tokens in high dimension; 0 is "
            "consensus. "
            if normalized
            else "raw (unnormalised) tokens, so there is no scale-free null; 0 is consensus. "
        )
        + "Final distance per mode: "
        + ", ".join(f"{m} {v:.3f}" for m, v in finals.items())
        + "."
    )
    return fig, caption


def _sin_theta(gamma: xr.DataArray) -> np.ndarray:
    g = np.asarray(gamma.values, dtype=float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.sqrt(np.clip(1.0 - g**2, 0.0, None)), axis=gamma.get_axis_num("token"))


def _spans_a_decade(values: np.ndarray) -> bool:
    """Whether the positive finite ``values`` span at least a factor 10: only then does a
    log axis show anything (over 0.97-1.00 it shows unreadable ticks of one decade)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    return bool(v.size) and float(v.max() / v.min()) >= 10.0


def prolonged_figure(prop: xr.Dataset, model: str) -> tuple[Figure, str] | None:
    """gamma over the prolonged layers (paper Fig. 6) with its nulls, and the mean
    sin(angle to v1) on a log scale, where a power-method convergence is a straight line.
    None when ``prop`` has no prolonged mode."""
    long_ = [m for m in _modes(prop) if m.startswith("prolonged")]
    data = {m: mode_view(prop, m) for m in long_}
    data = {m: d for m, d in data.items() if d is not None}
    if not data:
        return None
    base = mode_view(prop, "simplified_real")
    depth = int(base.sizes["layer"]) if base is not None else None
    pal = dict(zip(data, sns.color_palette("colorblind", len(data)), strict=True))
    finals: dict[str, float] = {}
    null_level = float("nan")
    sin_all: list[np.ndarray] = []
    with sns.axes_style(_STYLE):
        fig = Figure(figsize=(13.0, 4.4), layout="constrained")
        ax_g, ax_s = fig.subplots(1, 2)
        for i, (mode, ds) in enumerate(data.items()):
            x = ds["layer"].values
            m, s = _nanstats(ds["gamma"], "token")
            _line_band(ax_g, x, m, s, color=pal[mode], label=mode_name(mode), marker=None)
            finals[mode] = float(m[-1])
            sines = _sin_theta(ds["gamma"])
            ax_s.plot(x, sines, color=pal[mode], label=mode_name(mode))
            sin_all.append(sines)
            if i == 0:
                null_level = _null_band(ax_g, x, ds["gamma_null"], "token", "random direction")
                _neg_line(ax_g, x, ds["gamma_neg_null"], "token", "most negative eigvec")
                sines = _sin_theta(ds["gamma_null"])
                ax_s.plot(x, sines, color=_NULL, ls="--", label="random direction")
                sin_all.append(sines)
        for ax in (ax_g, ax_s):
            if depth is not None:
                ax.axvline(depth + 0.5, color="k", lw=0.8, ls="-.", label="original depth")
            ax.set_xlabel("layer $t$")
            _integer_x(ax)
            _legend_outside(ax, fontsize="x-small")
        ax_g.set_ylabel("$\\gamma_t$ (mean $\\pm$ sd over tokens)")
        ax_g.set_ylim(-0.02, 1.02)
        log_scale = _spans_a_decade(np.concatenate(sin_all))
        if log_scale:
            ax_s.set_yscale("log")
        ax_s.set_ylabel(
            "mean $\\sin\\theta_t = \\sqrt{1 - \\gamma_t^2}$" + (" (log)" if log_scale else "")
        )
        fig.suptitle(f"{model}: prolonged run")
    caption = (
        f"Alignment gamma_t with v1_t over the artificially prolonged transformer, {model} "
        "(paper Fig. 6). Layers past the original depth"
        + (f" ({depth}, dash-dotted line)" if depth is not None else "")
        + " repeat the last layer (for a shared-weight model every layer is the same). Left: "
        "gamma_t, mean +- sd over tokens; right: the mean sine of the angle to v1_t, "
        + (
            "on a log scale, where convergence at the power-method rate is a straight line. "
            if log_scale
            else "on a linear scale: it stays within one decade here (no convergence to "
            "read off a log axis). "
        )
        + "Nulls: random "
        f"unit directions (dashed, mean gamma {null_level:.3f}) and the most-negative "
        "eigenvector (dotted). Final gamma: "
        + ", ".join(f"{m} {v:.4f}" for m, v in finals.items())
        + "."
    )
    return fig, caption


def _method_offsets(pos: np.ndarray, k: int, n_methods: int, width: float) -> np.ndarray:
    """x positions of method ``k``'s markers in a group of ``n_methods`` per c."""
    return pos + (k - (n_methods - 1) / 2) * width


def _steering_target_panel(
    ax: Axes, steer: xr.Dataset, pal: Mapping[str, Any], null_all: float
) -> None:
    """gamma_u after the last layer per (method, c), original (open) vs steered (filled)."""
    methods = [str(m) for m in steer["method"].values]
    cs = [float(c) for c in steer["c"].values]
    pos = np.arange(len(cs), dtype=float)
    width = 0.8 / max(len(methods), 1)
    for k, method in enumerate(methods):
        sub = steer.sel({"method": method})
        off = _method_offsets(pos, k, len(methods), width)
        for v, marker, fill in (("original", "o", "none"), ("steered", "D", pal[method])):
            m, s = _nanstats(sub["gamma_u"].sel(variant=v), "token")
            ax.errorbar(
                off + (0.12 * width if v == "steered" else -0.12 * width),
                m,
                yerr=s,
                fmt=marker,
                color=pal[method],
                mfc=fill,
                capsize=2,
                label=f"{method}, {v}",
            )
    ax.axhline(null_all, color=_NULL, ls="--", lw=1.0, label="random direction")
    ax.set_xticks(pos, [f"c={c:g}" for c in cs])
    ax.set_ylabel("$\\gamma_u = |cos(x_i^T, u)|$ after the last layer")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("alignment with the target u (mean $\\pm$ sd over tokens)")
    ax.legend(fontsize="x-small", ncol=2)


def _steering_size_panel(ax: Axes, steer: xr.Dataset, pal: Mapping[str, Any]) -> None:
    """||Delta W_O||_F / ||W_O||_F per method against c."""
    cs = [float(c) for c in steer["c"].values]
    for method in [str(m) for m in steer["method"].values]:
        sub = steer.sel({"method": method})
        ax.semilogy(cs, sub["relative_change"].values, marker="o", color=pal[method], label=method)
    ax.axhline(1.0, color="tab:red", ls=":", lw=1.0, label="$\\|\\Delta\\| = \\|W_O\\|$")
    ax.set_xlabel("c (target eigenvalue / spectral radius)")
    ax.set_ylabel("$\\|\\Delta W_O\\|_F / \\|W_O\\|_F$")
    ax.set_title("size of the change")
    ax.legend(fontsize="x-small")


def _steered_layers_panels(ax_g: Axes, ax_r: Axes, steer: xr.Dataset, null_all: float) -> None:
    """The paper's per-layer gamma_t and rho_t of every steered model."""
    cs = [float(c) for c in steer["c"].values]
    c_pal = sns.color_palette("viridis", len(cs))
    layers = steer["layer"].values
    for k, method in enumerate(str(m) for m in steer["method"].values):
        sub = steer.sel({"method": method})
        ls = "-" if k == 0 else "--"
        for j, c in enumerate(cs):
            g = _nanstats(sub["gamma_layers"].sel(c=c), "token")[0]
            label = f"{method}, c={c:g}"
            ax_g.plot(layers, g, color=c_pal[j], ls=ls, marker="o", ms=3, label=label)
            rho = sub["rho_layers"].sel(c=c).values
            ax_r.plot(layers, rho, color=c_pal[j], ls=ls, marker="o", ms=3, label=label)
    ax_g.axhline(null_all, color=_NULL, ls="--", lw=1.0, label="random direction")
    ax_g.set_ylabel("$\\gamma_t$ of the steered model")
    ax_g.set_ylim(-0.02, 1.02)
    ax_r.axhline(0.5, color=_NULL, ls="--", lw=1.0, label="0.5 (no preferred sign)")
    ax_r.set_ylabel("$\\rho_t$ of the steered model")
    ax_r.set_ylim(-0.03, 1.03)
    for ax in (ax_g, ax_r):
        ax.set_xlabel("layer $t$")
        _integer_x(ax)
        ax.legend(fontsize="x-small", ncol=2)


def _next_token_panel(ax: Axes, steer: xr.Dataset, pal: Mapping[str, Any]) -> str:
    """Change of the target's next-token probability per (method, c); returns the
    caption sentence."""
    methods = [str(m) for m in steer["method"].values]
    cs = [float(c) for c in steer["c"].values]
    pos = np.arange(len(cs), dtype=float)
    width = 0.8 / max(len(methods), 1)
    for k, method in enumerate(methods):
        sub = steer.sel({"method": method})
        m, s = _nanstats(sub["p_after"] - sub["p_before"], "prompt")
        off = _method_offsets(pos, k, len(methods), width)
        ax.errorbar(off, m, yerr=s, fmt="o", color=pal[method], capsize=2, label=method)
    ax.axhline(0.0, color=_NULL, ls="--", lw=1.0, label="no change")
    ax.set_xticks(pos, [f"c={c:g}" for c in cs])
    ax.set_ylabel("$p_{after} - p_{before}$ (target as next token)")
    ax.legend(fontsize="x-small")
    return (
        " Bottom: change of the probability that the real model (LM head) predicts the "
        f"target token next, mean +- sd over prompts (mean before "
        f"{_nanmean(steer['p_before']):.3g}); null: no change."
    )


def steering_target_text(steer: xr.Dataset) -> str:
    """The token the steering aimed at, as ``steer`` records it: ``'the' (id 1996)``.

    ``target_text`` is only what was configured; with a ``target_id`` (or a text that
    encodes to several tokens) the target is the token in ``target_tokens``/``target_id``.
    """
    import json

    pieces: list[str] = []
    try:
        pieces = [str(p) for p in json.loads(str(steer.attrs.get("target_tokens", "[]")))]
    except ValueError:
        pieces = []
    tid = steer.attrs.get("target_id")
    token = pieces[0] if pieces else str(steer.attrs.get("target_text", "?"))
    return f"'{token}'" + (f" (id {int(tid)})" if tid is not None else "")


def _steering_caption(steer: xr.Dataset, model: str, null_all: float, p_text: str) -> str:
    rows = []
    for method in [str(m) for m in steer["method"].values]:
        for c in [float(c) for c in steer["c"].values]:
            sub = steer.sel({"method": method, "c": c})
            rows.append(
                f"{method} c={c:g}: {_nanmean(sub['gamma_u'].sel(variant='original')):.3f} -> "
                f"{_nanmean(sub['gamma_u'].sel(variant='steered')):.3f} "
                f"(|dW_O|/|W_O| {float(sub['relative_change']):.3g})"
            )
    return (
        f"Steering {model}'s last layer towards the input embedding u of the token "
        f"{steering_target_text(steer)} by changing only W_O so that u is an "
        "eigenvector of F' = W_O' W_V with eigenvalue c r (paper Figs. 3 and 10; r the old "
        "spectral radius). Top left: gamma_u after the last layer of the simplified model "
        "(real attention), original (open) vs steered (filled); null: random unit "
        f"directions, {null_all:.3f} (dashed). Top right: relative Frobenius size of the W_O "
        "change per method (dotted: as large as W_O itself, beyond which the layer is "
        "replaced rather than steered). Middle: the paper's per-layer gamma_t (null: the "
        "same random-direction level) and rho_t (reference 0.5) of the steered models; "
        "only the last layer differs from the original. gamma_u original -> steered: "
        + "; ".join(rows)
        + "."
        + p_text
    )


def steering_figure(steer: xr.Dataset, model: str) -> tuple[Figure, str]:
    """Steering the last layer's W_O towards a token direction u (paper Figs. 3, 10).

    Panels: gamma_u = |cos(x_i, u)| after the last layer, original vs steered, per
    (method, c) with the random-direction null; per-layer gamma and rho of the steered
    models; ||Delta W_O||_F / ||W_O||_F per method; and, when the model is a causal LM
    with finite probabilities, the change of the target token's next-token probability.
    """
    methods = [str(m) for m in steer["method"].values]
    has_p = bool(np.isfinite(steer["p_before"].values).any())
    pal = dict(zip(methods, sns.color_palette("colorblind", len(methods)), strict=True))
    null_all = _nanmean(steer["gamma_u_null"])
    with sns.axes_style(_STYLE):
        fig = Figure(figsize=(11.0, 7.6 if not has_p else 11.0), layout="constrained")
        axes = fig.subplots(3 if has_p else 2, 2)
        _steering_target_panel(axes[0][0], steer, pal, null_all)
        _steering_size_panel(axes[0][1], steer, pal)
        _steered_layers_panels(axes[1][0], axes[1][1], steer, null_all)
        p_text = ""
        if has_p:
            axes[2][1].set_axis_off()
            p_text = _next_token_panel(axes[2][0], steer, pal)
        fig.suptitle(
            f"{model}: steering the last layer towards the token {steering_target_text(steer)}"
        )
    return fig, _steering_caption(steer, model, null_all, p_text)


def corr_choice_figure(prop: xr.Dataset, model: str) -> tuple[Figure, str] | None:
    """gamma and rho under cosine vs Pearson correlation side by side, with each one's
    random-direction null; None when ``prop`` lacks the other correlation's variables."""
    corr = str(prop.attrs.get("corr", "cosine"))
    other = str(prop.attrs.get("corr_other", "pearson" if corr == "cosine" else "cosine"))
    need = [f"{v}_{other}" for v in ("gamma", "rho", "gamma_null", "rho_null")]
    if any(v not in prop for v in need):
        return None
    modes = [m for m in _modes(prop) if not m.startswith("prolonged")]
    pal = dict(zip(modes, sns.color_palette("colorblind", len(modes)), strict=True))
    summary: list[str] = []
    with sns.axes_style(_STYLE):
        fig = Figure(figsize=(10.0, 7.0), layout="constrained")
        axes = fig.subplots(2, 2, sharex=True, sharey="row")
        for col, (name, suffix) in enumerate(((corr, ""), (other, f"_{other}"))):
            ax_g, ax_r = axes[0, col], axes[1, col]
            for mode in modes:
                ds = mode_view(prop, mode)
                if ds is None:
                    continue
                x = ds["layer"].values
                g = _nanstats(ds[f"gamma{suffix}"], "token")[0]
                gn = _nanstats(ds[f"gamma_null{suffix}"], "token")[0]
                ax_g.plot(x, g, color=pal[mode], marker="o", ms=3, label=mode_name(mode))
                ax_g.plot(x, gn, color=pal[mode], ls="--", lw=0.9)
                r = np.asarray(ds[f"rho{suffix}"].values, dtype=float)
                rn = np.asarray(ds[f"rho_null{suffix}"].values, dtype=float)
                ax_r.plot(x, r, color=pal[mode], marker="o", ms=3, label=mode_name(mode))
                ax_r.plot(x, rn, color=pal[mode], ls="--", lw=0.9)
                summary.append(f"{mode} {name}: rho - null {_nanmean(r - rn):+.2f}")
            ax_g.set_title(f"{name}: $\\gamma_t$ (dashed: random-direction null)")
            ax_r.set_title(f"{name}: $\\rho_t$ (dashed: random-direction null)")
            ax_r.axhline(0.5, color="k", lw=0.6)
            ax_r.set_xlabel("layer $t$")
            _integer_x(ax_r)
        axes[0, 0].set_ylabel("$\\gamma_t$ (token mean)")
        axes[1, 0].set_ylabel("$\\rho_t$")
        axes[0, 0].legend(fontsize="x-small")
        fig.suptitle(f"{model}: {corr} vs {other} correlation")
    caption = (
        f"The correlation choice, {model}: gamma_t (token mean) and rho_t per layer under "
        f"{corr} (left, the configured one) and {other} correlation (right; {other} "
        + (
            "centres each vector over its d components first"
            if other == "pearson"
            else "is the plain cosine"
        )
        + "), for every non-prolonged mode (no paper counterpart: the paper does not say "
        "which it uses). Dashed, same colour: that mode's random-direction null under the "
        "same correlation. Mean rho minus its null over layers: "
        + "; ".join(summary)
        + ". The conclusions agree when the solid curves sit on the same side of their "
        "nulls in both columns."
    )
    return fig, caption


# --------------------------------------------------------------------------- cross model


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
    pal = sns.color_palette("colorblind", _N_EIGS)
    notes = []
    with sns.axes_style(_STYLE):
        n = len(groups)
        ncol = min(n, 3)
        nrow = math.ceil(n / ncol)
        fig = Figure(figsize=(4.4 * ncol, 3.6 * nrow), layout="constrained")
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
    pal = dict(zip(trained, sns.color_palette("colorblind", max(len(trained), 1)), strict=False))
    dims = sorted({_d_model(spectra_by_model[m]) for m in series})
    notes = []
    with sns.axes_style(_STYLE):
        fig = Figure(figsize=(7.0, 4.2), layout="constrained")
        ax = fig.subplots()
        for m, ov in series.items():
            x = np.arange(1, ov.size + 1)
            if is_random_model(m, like):
                label = f"{m} (random, like {like[m]})"
                ax.plot(x, ov, color=_RANDOM_MODEL, ls="--", marker="x", ms=4, label=label)
            else:
                ax.plot(x, ov, color=pal[m], marker="o", ms=4, label=m)
            shared = bool(int(spectra_by_model[m].attrs.get("shared", 0)))
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


# --------------------------------------------------------------------------- sphere


def _eigen_coords(traj: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Coordinates of (..., d) states in F's first three eigenvectors (x . v_k), so a
    d > 3 example still lands on a 3-D picture; for d = 3 a rotation of S^2."""
    k = min(3, V.shape[1])
    out = np.zeros((*traj.shape[:-1], 3))
    out[..., :k] = traj @ V[:, :k]
    return out


def _sphere_axes(ax: Axes3D, V: np.ndarray) -> None:
    u, v = np.mgrid[0 : 2 * np.pi : 24j, 0 : np.pi : 12j]
    ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85", lw=0.4)
    ax.scatter(
        [1, -1],
        [0, 0],
        [0, 0],
        marker="*",
        s=90,
        color="tab:red",
        depthshade=False,
        label="$\\pm v_1$",
    )
    ax.set_xlabel("$\\langle x, v_1\\rangle$", fontsize="small", labelpad=-4)
    ax.set_ylabel("$\\langle x, v_2\\rangle$", fontsize="small", labelpad=-4)
    ax.set_zlabel("$\\langle x, v_3\\rangle$", fontsize="small", labelpad=-4)
    # three ticks per axis: the default eight run together at this size
    for axis in (ax.xaxis, ax.yaxis, ax.zaxis):
        axis.set_ticks([-1.0, 0.0, 1.0])
    ax.tick_params(labelsize="x-small", pad=0)
    ax.set_box_aspect((1, 1, 1))


def _trajectories_3d(ax: Axes3D, coords: np.ndarray) -> None:
    """coords (step, token, 3): one line per token and a solid dot at its endpoint."""
    pal = sns.color_palette("husl", coords.shape[1])
    for i in range(coords.shape[1]):
        c = coords[:, i]
        ax.plot(c[:, 0], c[:, 1], c[:, 2], color=pal[i], lw=1.0)
        ax.scatter(
            c[-1:, 0],
            c[-1:, 1],
            c[-1:, 2],
            color=pal[i],
            s=28,
            depthshade=False,
        )
        ax.scatter(
            c[:1, 0],
            c[:1, 1],
            c[:1, 2],
            color=pal[i],
            s=10,
            marker="o",
            facecolors="none",
            depthshade=False,
        )


def _random_direction_corr(traj: np.ndarray, seed: int) -> np.ndarray:
    """Mean over tokens and over seeded random unit directions r of |<x_i(step), r>|:
    what |corr(x_i, v1)| would read if v1 were unrelated to F."""
    d = traj.shape[-1]
    R = np.random.default_rng(seed).standard_normal((_SPHERE_NULL_DIRECTIONS, d))
    R /= np.linalg.norm(R, axis=1, keepdims=True)
    return np.abs(traj @ R.T).mean(axis=(1, 2))


def sphere_figure13(sphere: xr.Dataset) -> tuple[Figure, str]:
    """Supplement Fig. 13: single-head and multi-head softmax self-attention dynamics on
    S^{d-1}: trajectories with their endpoints, and |corr(x_i, v1)| against the step with
    the random-direction null."""
    V = np.asarray(sphere["eigenvectors"].values, dtype=float)
    seed = int(sphere.attrs.get("seed", 0))
    d, n, H = int(sphere.attrs["d"]), int(sphere.attrs["n"]), int(sphere.attrs["heads"])
    finals = {}
    with sns.axes_style(_STYLE):
        fig = Figure(figsize=(10.0, 8.6), layout="constrained")
        gs = fig.add_gridspec(2, 2, width_ratios=[1.0, 1.2])
        for row, (key, label) in enumerate(
            (("single", "single head"), ("multi", f"multi-head ({H} heads)"))
        ):
            traj = np.asarray(sphere[f"traj_{key}"].values, dtype=float)
            ax3 = fig.add_subplot(gs[row, 0], projection="3d")
            _sphere_axes(ax3, V)
            _trajectories_3d(ax3, _eigen_coords(traj, V))
            ax3.set_title(
                f"({'ab'[row]}) {label}: trajectories on $S^{{{d - 1}}}$", fontsize="medium"
            )
            ax3.legend(fontsize="x-small", loc="upper left")
            ax = fig.add_subplot(gs[row, 1])
            corr = np.abs(np.asarray(sphere[f"corr_v1_{key}"].values, dtype=float))
            steps = sphere["step"].values
            ax.plot(steps, corr, color="0.6", lw=0.6)
            ax.plot(steps, corr.mean(axis=1), color="tab:red", lw=2.0, label="mean over tokens")
            ax.plot(
                steps,
                _random_direction_corr(traj, seed),
                color=_NULL,
                ls="--",
                label=f"random direction ({_SPHERE_NULL_DIRECTIONS} draws)",
            )
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("step")
            ax.set_ylabel("$|corr(x_i, v_1)|$")
            ax.set_title(f"{label}: alignment with $v_1$", fontsize="medium")
            ax.legend(fontsize="x-small")
            finals[key] = (float(corr[-1].min()), float(corr[-1].mean()))
    null = random_unit_overlap(d)
    lam = ", ".join(f"{v:g}" for v in np.asarray(sphere["eigenvalues"].values, dtype=float))
    caption = (
        f"Self-attention dynamics on the sphere, d = {d}, n = {n} tokens (supplement Fig. 13): "
        f"(a) single head, (b) {H} heads, softmax attention with beta = "
        f"{sphere.attrs.get('beta', '?')}, eta = {sphere.attrs.get('eta', '?')}, symmetric "
        f"F with eigenvalues {lam}. Left: token trajectories in F's eigenbasis "
        "(coordinates <x, v_k>), open dot = start, solid dot = endpoint, stars = +-v1. "
        "Right: |corr(x_i, v1)| per token (gray) and its mean (red) against the step (absolute "
        "value: the consensus may form at -v1). Null (dashed): the same for random unit "
        f"directions, expectation {null:.3f} for d = {d}. Final min/mean |corr(x_i, v1)|: "
        f"single head {finals['single'][0]:.4f}/{finals['single'][1]:.4f}, multi-head "
        f"{finals['multi'][0]:.4f}/{finals['multi'][1]:.4f}."
    )
    return fig, caption


def sphere_figure14(sphere: xr.Dataset) -> tuple[Figure, str]:
    """Supplement Fig. 14: bipartite consensus along v1 perturbed by each configured size:
    trajectories and the distance to the bipartite equilibrium against the step."""
    V = np.asarray(sphere["eigenvectors"].values, dtype=float)
    d, n = int(sphere.attrs["d"]), int(sphere.attrs["n"])
    n1, n2 = n // 2, n - n // 2  # as sphere.sphere_dataset builds the equilibrium
    perts = [float(p) for p in sphere["perturbation"].values]
    dist = np.asarray(sphere["bipartite_distance"].values, dtype=float)
    steps = sphere["step"].values
    pal = sns.color_palette("colorblind", len(perts))
    outcomes = bipartite_outcomes(sphere)
    with sns.axes_style(_STYLE):
        fig = Figure(figsize=(10.0, 4.4 * max(len(perts), 1) ** 0.8), layout="constrained")
        left, right = fig.subfigures(1, 2, width_ratios=[1.0, 1.1])
        for k, p in enumerate(perts):
            ax3 = left.add_subplot(len(perts), 1, k + 1, projection="3d")
            _sphere_axes(ax3, V)
            traj = np.asarray(sphere["traj_bipartite"].isel(perturbation=k).values, dtype=float)
            _trajectories_3d(ax3, _eigen_coords(traj, V))
            ax3.set_title(
                f"({'abcdefgh'[k % 8]}) perturbation {p:g}: {outcomes[k]['outcome']}",
                fontsize="medium",
            )
        ax = right.subplots()
        for k, p in enumerate(perts):
            ax.semilogy(
                steps, np.maximum(dist[k], 1e-16), color=pal[k], label=f"perturbation {p:g}"
            )
        # Every token sitting at +-v1 puts the distance on a lattice: 2 sqrt(m) for m
        # tokens on the other side; full consensus is m = n1 or n2, one switch is m = 1.
        # One line per level: with an even split full consensus is at sqrt(2n), the
        # random-token level, and is drawn (and listed) once, saying both.
        random_level = math.sqrt(2.0 * n)
        levels = sorted({2 * math.sqrt(n1), 2 * math.sqrt(n2)})
        for lv in levels:
            same = math.isclose(lv, random_level, rel_tol=1e-12)
            ax.axhline(
                lv,
                color="k",
                ls=":",
                lw=1.0,
                label=f"full consensus at $\\pm v_1$ ({lv:.2f})"
                + (" = random tokens ($\\sqrt{2n}$)" if same else ""),
            )
        ax.axhline(2.0, color="k", ls="-.", lw=0.8, label="one token switched sides (2)")
        if not any(math.isclose(lv, random_level, rel_tol=1e-12) for lv in levels):
            ax.axhline(
                random_level,
                color=_NULL,
                ls="--",
                lw=1.0,
                label=f"random tokens ($\\sqrt{{2n}}$ = {random_level:.2f})",
            )
        ax.set_xlabel("step")
        ax.set_ylabel("$\\|X_t - X_{bip}\\|_F$")
        ax.set_title("distance to the bipartite equilibrium", fontsize="medium")
        # below the axes: inside, it would cover the reference levels near the top
        ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.1))
    caption = (
        f"Bipartite consensus on the sphere, d = {d}, n = {n} ({n1} tokens at v1, {n2} at "
        "-v1), single-head softmax attention (supplement Fig. 14): each configured "
        "perturbation of the bipartite equilibrium. Left: trajectories in F's eigenbasis "
        "(solid dot = endpoint, stars = +-v1). Right: Frobenius distance to the bipartite "
        "state against the step (log scale). Null level (dashed): sqrt(2n), the expected "
        "distance of independent uniformly random tokens in high dimension; reference "
        "levels (dotted, dash-dotted): full consensus at +-v1, where the paper's escaping "
        "trajectory ends (equal to sqrt(2n) for an even split), and one token switched to "
        "the other side. "
        + "; ".join(
            f"perturbation {o['perturbation']:g}: distance {o['distance_start']:.3g} -> "
            f"{o['distance_end']:.3g} ({o['text']})"
            for o in outcomes
        )
        + "."
    )
    return fig, caption


# --------------------------------------------------------------------------- bundles


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

    Stems: ``eigenvalues``, ``alignment_{mode}`` and ``correlations_{mode}`` for each
    mode, ``token_distance``, ``prolonged``, ``corr_choice``, ``steering``.
    """
    out: dict[str, tuple[Figure, str]] = {}
    if spectra is not None:
        out["eigenvalues"] = eigenvalue_figure(spectra, model, null_spectra, null_name, like_of)
    if prop is not None:
        for mode in _modes(prop):
            made = alignment_figure(prop, model, mode, null_prop, null_name)
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
    *(f"alignment_{mode}" for mode in MODES if not mode.startswith("prolonged")),
    *(f"correlations_{mode}" for mode in MODES if not mode.startswith("prolonged")),
    "token_distance",
    "prolonged",
    "corr_choice",
    "steering",
)

Overview = Callable[
    [Mapping[str, xr.Dataset], xr.Dataset, Mapping[str, str]], "tuple[Figure, str] | None"
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
