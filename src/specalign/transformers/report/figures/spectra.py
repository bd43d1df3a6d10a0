"""The figures of one model's ``spectra.nc`` (Li & Altafini, arXiv:2605.25619, Sections
2-3): every eigenvalue of each distinct F = W_O W_V in the complex plane with the
circular-law disk (paper Fig. 1a), Re(lambda_1..5) per layer, and the per-head OV
circuits F_h = W_O^h W_V^h; the random-weight twin in gray where one is configured."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from specalign import figstyle
from specalign.lazy import LazyModule
from specalign.transformers.report.figures.style import (
    _N_EIGS,
    _NULL,
    _RANDOM_MODEL,
    _d_model,
    _integer_x,
    _legend_outside,
)
from specalign.transformers.report.tables import layer_eigenvalues
from specalign.transformers.weights import shares_weights

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

xr = LazyModule("xarray")
mpl_figure = LazyModule("matplotlib.figure")
mpl_ticker = LazyModule("matplotlib.ticker")


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
    colors = figstyle.sequential(n_blocks)
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
    n_zero = _n_zero(spectra)
    if n_zero:
        ax.scatter([0.0], [0.0], marker="x", s=40, color="k", zorder=3,
                   label=f"{n_zero} exact zeros (rank $\\leq$ {lam_r.shape[1]})")  # fmt: skip
    if lam_r.shape[1] + n_zero == _d_model(spectra):
        # the i.i.d. reference for the listed (nonzero) spectrum: of M = W_V' W_O' when
        # F is factored (an r x r matrix), of F itself otherwise
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


def _n_zero(spectra: xr.Dataset) -> int:
    """F's exact zero eigenvalues per block that a factored spectra.nc does not list."""
    if "n_zero_eigenvalues" not in spectra:
        return 0
    return int(np.max(spectra["n_zero_eigenvalues"].values, initial=0))


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
    pal = figstyle.qualitative(_N_EIGS)
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
    with figstyle.axes_style():
        fig = mpl_figure.Figure(figsize=(13.0, 4.6), layout="constrained")
        ax_c, ax_l = fig.subplots(1, 2, width_ratios=[1.0, 1.3])
        radius = _complex_plane_panel(ax_c, spectra, null_spectra)
        complex1 = _layer_eigenvalue_panel(ax_l, per_layer, null_spectra)
    shared = shares_weights(spectra.attrs)
    caption = (
        f"Eigenvalues of F = W_O W_V for {model} (d = {d}, {per_layer.shape[0]} layers, "
        f"{n_blocks} distinct block{'s' if n_blocks != 1 else ''}"
        + ("; shared weights: one F for all layers" if shared else "")
        + "). Left: every eigenvalue of each distinct F in the complex plane (paper Fig. 1a "
        "for ALBERT). Right: Re(lambda_1..5) per layer (sorted by real part; squares mark "
        f"layers whose lambda_1 is complex, {complex1.size} of {per_layer.shape[0]}). "
        + (
            f"Grouped-query attention: rank F <= {spectra.sizes['eig']} (r = n_kv_heads x "
            f"d_head), so each F has {_n_zero(spectra)} exact zero eigenvalues (the cross "
            "at 0), and its nonzero ones are those of the r x r product W_V' W_O'. "
            if _n_zero(spectra) and spectra.sizes["eig"] + _n_zero(spectra) == d
            else ""
        )
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


def heads_figure(
    spectra: xr.Dataset,
    model: str,
    null_spectra: xr.Dataset | None = None,
    null_name: str | None = None,
) -> tuple[Figure, str] | None:
    """Per-head OV circuits F_h = W_O^h W_V^h: heatmaps over layers x heads of Re lambda_1
    of F_h and of the fraction of its eigenvalue mass with positive real part (issue 17;
    the per-head view of Elhage et al. 2021). The twin's median fraction is the null.
    None when ``spectra`` predates the per-head variables."""
    if "head_positive_fraction" not in spectra:
        return None
    lb = np.asarray(spectra["layer_block"].values, dtype=int)
    lam1 = np.asarray(spectra["head_lambda1_real"].values, dtype=float)[lb]
    frac = np.asarray(spectra["head_positive_fraction"].values, dtype=float)[lb]
    L, H = frac.shape
    with figstyle.axes_style(grid=False):
        fig = mpl_figure.Figure(figsize=(2.0 * min(3.5 + 0.2 * H, 8.0), 2.0 + 0.22 * L),
                                layout="constrained")  # fmt: skip
        ax_l, ax_f = fig.subplots(1, 2)
        lim = float(np.nanmax(np.abs(lam1))) if np.isfinite(lam1).any() else 1.0
        for ax, data, cmap, vmin, vmax, label in (
            (ax_l, lam1, "RdBu_r", -lim, lim, "Re $\\lambda_1(F_h)$"),
            (ax_f, frac, "viridis", 0.0, 1.0, "positive share of $\\sum|\\lambda|$"),
        ):
            im = ax.imshow(data, aspect="auto", origin="lower", cmap=cmap, vmin=vmin,
                           vmax=vmax, extent=(-0.5, H - 0.5, 0.5, L + 0.5))  # fmt: skip
            fig.colorbar(im, ax=ax, label=label)
            ax.set_xlabel("head $h$")
            ax.set_ylabel("layer $t$")
            ax.xaxis.set_major_locator(mpl_ticker.MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(mpl_ticker.MaxNLocator(integer=True))
        ax_l.set_title("leading eigenvalue of $F_h = W_O^h W_V^h$", fontsize="medium")
        ax_f.set_title("eigenvalue mass with Re $\\lambda > 0$", fontsize="medium")
    med = float(np.nanmedian(frac)) if np.isfinite(frac).any() else float("nan")
    n_pos = int(np.sum(lam1 > 0))
    null_text = f"No random model has like: {model}, so there is no null from a random-weight twin."
    if null_spectra is not None and "head_positive_fraction" in null_spectra:
        null_med = float(np.nanmedian(null_spectra["head_positive_fraction"].values))
        null_text = (
            f"Null: the random-weight twin {null_name or '(unnamed)'} has median fraction "
            f"{null_med:.3f}; heads far above it copy their input (F_h close to a map with a "
            "nonnegative spectrum)."
        )
    caption = (
        f"Per-head OV circuits of {model} ({L} layers x {H} heads): left, the real part of "
        "the leading eigenvalue (largest real part) of each head's F_h = W_O^h W_V^h, "
        "computed from the d_head x d_head product W_V^h W_O^h; right, sum max(Re lambda, 0) "
        f"/ sum |lambda| over F_h's eigenvalues (1: all mass positive real). {n_pos} of "
        f"{L * H} heads have Re lambda_1 > 0; median fraction {med:.3f}. " + null_text
    )
    return fig, caption
