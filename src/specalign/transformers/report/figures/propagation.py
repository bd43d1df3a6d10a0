"""The alignment figures of one model's ``propagation.nc`` (Li & Altafini,
arXiv:2605.25619, Section 3): gamma, the tilt psi and rho per layer (paper Figs. 1b, 2,
8, 11, 12), the correlations with v1, v2 and their plane (Fig. 5), and the
cosine-vs-Pearson comparison, each with the random-direction and
most-negative-eigenvector nulls. What depth does to the tokens is in :mod:`.depth`."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from specalign import figstyle
from specalign.lazy import LazyModule
from specalign.output import nanmean as _nanmean
from specalign.transformers import metric_table
from specalign.transformers.report.figures.style import (
    _NULL,
    _RANDOM_MODEL,
    _integer_x,
    _legend_outside,
    _line_band,
    _mode_text,
    _modes,
    _nanstats,
    _neg_line,
    _null_band,
    mode_name,
)
from specalign.transformers.report.paper import MODE_FIGURES
from specalign.transformers.report.tables import mode_view
from specalign.transformers.weights import shares_weights

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

xr = LazyModule("xarray")
mpl_figure = LazyModule("matplotlib.figure")


def _paper_figure(mode: str, shared: bool | None) -> str:
    """The paper figure ``mode`` reproduces for a model whose weights are ``shared``
    across layers or not (None: not known, so both are named)."""
    shared_fig, other_fig = MODE_FIGURES.get(mode, (None, None))
    if shared is None and shared_fig != other_fig:
        none = "no paper counterpart"
        return f"{shared_fig or none} for shared weights, {other_fig or none} otherwise"
    figure = shared_fig if shared else other_fig
    if figure is not None:
        return figure
    if mode == "simplified_full":
        return (
            "no paper counterpart (full attention A = 1/n, the exact power-method step on "
            "I + eta F)"
        )
    return "no paper counterpart"


def alignment_figure(
    prop: xr.Dataset,
    model: str,
    mode: str = "simplified_real",
    null_prop: xr.Dataset | None = None,
    null_name: str | None = None,
    spectra: xr.Dataset | None = None,
) -> tuple[Figure, str] | None:
    """gamma_t, psi_t and rho_t across layers (paper Figs. 2, 8; 11, 12; 1b).

    Token mean +- sd and the prompt-mean-token variant, with the random-direction null
    (dashed, band = sd over tokens) and the most-negative-eigenvector null (dotted).
    ``null_prop``: the propagation of the model's random-weight twin ``null_name``, whose
    token mean is drawn in the same panels (gray dash-dotted), so that the model and its
    null are read off one axis. ``spectra``: the model's ``spectra.nc``, which says whether
    its weights are shared (:func:`specalign.transformers.weights.shares_weights`) and so
    which paper figure this is (without it, the caption names both). None when ``mode``
    is not in ``prop``.
    """
    ds = mode_view(prop, mode)
    if ds is None:
        return None
    twin = mode_view(null_prop, mode) if null_prop is not None else None
    twin_means: dict[str, float] = {}
    x = ds["layer"].values
    pal = figstyle.qualitative(2)
    rows = (
        ("gamma", "$\\gamma_t = |corr(x_i^t, v_{1,t})|$"),
        ("psi", "$\\psi_t = \\gamma_t - |corr(x_i^{t-1}, v_{1,t})|$"),
        ("rho", "$\\rho_t = P(\\psi_t > 0)$"),
    )
    nulls: dict[str, float] = {}
    with figstyle.axes_style():
        fig = mpl_figure.Figure(figsize=(9.0, 8.6), layout="constrained")
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
    shared = shares_weights(spectra.attrs) if spectra is not None else None
    gamma_m = _nanmean(ds["gamma"])
    psi_m = _nanmean(ds["psi"])
    rho = np.asarray(ds["rho"].values, dtype=float)
    above = np.asarray(ds["rho"].values > ds["rho_null"].values)
    caption = (
        f"Token alignment with the principal eigenvector v1_t of F_t across layers, {model}, "
        f"mode {mode} ({_mode_text(mode)}; {_paper_figure(mode, shared)}). Rows: gamma_t, "
        "psi_t (the tilt layer t produces towards its own v1_t) and rho_t (fraction of "
        "tokens with psi_t above round-off, d*eps); blue: all tokens, mean +- sd; orange: "
        f"the mean token of each prompt, mean +- sd over {ds.sizes['prompt']} prompts. "
        f"Correlation: {prop.attrs.get('corr', 'cosine')}. Null levels: random unit "
        "directions (dashed, "
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
    null: tuple[np.ndarray, np.ndarray] | None,
    null_label: str | None,
) -> float:
    """One row of the correlations figure: each prompt's token average (gray), the
    average over all tokens (red), the null if any (dashed, sd band); returns the
    average over layers."""
    x = ds["layer"].values
    per_prompt = ds[var].groupby("token_prompt").mean(skipna=True)  # (layer, prompt)
    pp = np.asarray(per_prompt.transpose("layer", ...).values, dtype=float)
    ax.plot(x, pp, color="0.6", lw=0.5, alpha=0.6)
    avg = _nanstats(ds[var], "token")[0]
    ax.plot(x, avg, color="tab:red", lw=2.0, marker="o", ms=3, label="average")
    if null is not None:
        _line_band(
            ax, x, null[0], null[1], color=_NULL, label=null_label, linestyle="--",
            marker=None, alpha=0.12,
        )  # fmt: skip
    if var == "gamma":
        _neg_line(ax, x, ds["gamma_neg_null"], "token", "most negative eigvec")
    return _nanmean(avg)


def _positions(n: int) -> list[str]:
    """Where each of ``n`` stacked rows is, for a caption."""
    if n == 1:
        return ["the one row"]
    ordinals = ("second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")
    middle = ["middle"] if n == 3 else [ordinals[i] if i < len(ordinals) else f"row {i + 2}"
                                        for i in range(n - 2)]  # fmt: skip
    return ["top", *middle, "bottom"]


def correlations_figure(
    prop: xr.Dataset, model: str, mode: str = "simplified_real"
) -> tuple[Figure, str] | None:
    """The correlations of tokens with the principal directions of F_t per layer (paper
    Fig. 5): a row per metric whose panel in the metric table
    (:mod:`specalign.transformers.metric_table`) is this figure, in the table's order:
    |corr(x_i, v1)|, |corr(x_i, v2)| and |corr(x_i, x_i_proj)|, then any added since.

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
    rows = [(m, panel) for m, panel in metric_table.panels("correlations") if m.name in ds]
    null_m, null_s = _nanstats(ds["gamma_null"], "token")
    # A uniform random 2-plane keeps a fraction ||P x||^2/||x||^2 ~ Beta(1, (d-2)/2) of a
    # unit vector, whose root has mean (pi/2) E|<x, r>|: the plane null needs no d.
    plane = proj == "top2"
    factor = math.pi / 2 if plane else 1.0
    means: dict[str, float] = {}
    with figstyle.axes_style():
        fig = mpl_figure.Figure(figsize=(9.2, 8.2 * len(rows) / 3), layout="constrained")
        axes = np.atleast_1d(fig.subplots(len(rows), 1, sharex=True))
        for ax, (metric, panel) in zip(axes, rows, strict=True):
            if panel.null is None:
                null, null_label = None, None
            elif panel.null == "plane" and plane:
                null = (factor * null_m, factor * null_s)
                null_label = "random 2-plane ($\\pi/2 \\times$ random direction)"
            else:
                null, null_label = (null_m, null_s), "random direction"
            means[metric.name] = _correlation_panel(ax, ds, metric.name, null, null_label)
            ax.set_title(panel.title, fontsize="medium")
            ax.set_ylim(-0.02, 1.02)
            _legend_outside(ax, fontsize="x-small")
        axes[-1].set_xlabel("layer $t$")
        _integer_x(axes[-1])
        fig.suptitle(f"{model}: {mode_name(mode)}")
    null_level = _nanmean(null_m)
    subspace = (
        "the real invariant subspace of F_t's two leading eigenvalues (span(v1, v2), or "
        "the plane of a complex leading pair)"
        if plane
        else "span(v1) (then identical to the top row under cosine correlation)"
    )
    row_text = "; ".join(
        f"{where}: {panel.caption.format(subspace=subspace)}"
        for where, (_, panel) in zip(_positions(len(rows)), rows, strict=True)
    )
    row_text = row_text[0].upper() + row_text[1:]
    has_plane = any(panel.null == "plane" for _, panel in rows)
    caption = (
        f"Absolute correlation of tokens with the principal directions of F_t, {model}, mode "
        f"{mode} ({_mode_text(mode)}; paper Fig. 5, which shows the four ALBERT models). "
        f"Gray: each of the {ds.sizes['prompt']} prompts, averaged over its "
        f"{ds.sizes['token'] // max(ds.sizes['prompt'], 1)} tokens; red: the average over "
        f"all tokens. {row_text}. Correlation: {corr}. Null (dashed, sd band): random unit "
        f"directions, mean {null_level:.3f}"
        + (
            f"; for the projection panel a random 2-plane, {factor * null_level:.3f} "
            "(exact in expectation under cosine correlation, approximate under Pearson)"
            if plane and has_plane
            else ""
        )
        + ". Averages over layers: "
        + ", ".join(f"{panel.short} {means[m.name]:.3f}" for m, panel in rows)
        + "."
    )
    return fig, caption


def corr_choice_figure(prop: xr.Dataset, model: str) -> tuple[Figure, str] | None:
    """gamma and rho under cosine vs Pearson correlation side by side, with each one's
    random-direction null; None when ``prop`` lacks the other correlation's variables."""
    corr = str(prop.attrs.get("corr", "cosine"))
    other = str(prop.attrs.get("corr_other", "pearson" if corr == "cosine" else "cosine"))
    need = [f"{v}_{other}" for v in ("gamma", "rho", "gamma_null", "rho_null")]
    if any(v not in prop for v in need):
        return None
    modes = [m for m in _modes(prop) if not m.startswith("prolonged")]
    pal = dict(zip(modes, figstyle.qualitative(len(modes)), strict=True))
    summary: list[str] = []
    with figstyle.axes_style():
        fig = mpl_figure.Figure(figsize=(10.0, 7.0), layout="constrained")
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
