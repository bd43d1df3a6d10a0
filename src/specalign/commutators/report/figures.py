"""Figures 1-5 of Nyström (arXiv:2608.22910), Section 10, from ``diagnostics.nc`` runs.

Every function takes ``experiments: dict[str, xr.Dataset]`` (loaded diagnostics),
finds its runs by attributes through :mod:`specalign.commutators.report.runs` (never by name), and
returns ``(Figure, caption)``, or ``None`` when none of the runs it needs is present.
Seed summaries follow the active-seed convention of that module, as the tables do:
diverged seeds, seeds that did not reach the checkpoint and undefined (NaN) entries are
left out, never read as 0.
Intervals are the percentile bootstrap of the seed mean (95 %; :func:`_seed_mean_lines`),
seeded so that a rerun redraws the same figure.

Null levels are drawn where the quantity has one: rho_tr_imb = 0 (transport and
imbalance uncorrelated) and chi = 1 (no net cancellation among the four sources).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from specalign import figstyle
from specalign.commutators.report import paper as P
from specalign.commutators.report.runs import Experiments, benchmark_runs, seed_frame, synthetic_run
from specalign.lazy import LazyModule
from specalign.output import placeholder_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# imported when first used (specalign.lazy): the rule files import this module for its
# figure names, and every snakemake call would pay these imports
pd = LazyModule("pandas")
xr = LazyModule("xarray")
mpl_figure = LazyModule("matplotlib.figure")
mpl_ticker = LazyModule("matplotlib.ticker")

DEFECTS: tuple[str, ...] = ("G_D", "G_Q", "G_S")
_DEFECT_TITLES = {
    "G_D": "gate defect $G_{D,\\ell}$",
    "G_Q": "internal defect $G_{Q,\\ell}$",
    "G_S": "feature defect $G_{S,\\ell}$",
}
FRACTIONS: tuple[str, ...] = ("e_tr", "e_imb", "e_fluc", "e_gate")
_FRACTION_LABELS = {
    "e_tr": "transport",
    "e_imb": "imbalance",
    "e_fluc": "fluctuation",
    "e_gate": "gate",
}
_CI_PERCENT = 95.0


# --- shared pieces ------------------------------------------------------------------


def _collect(
    runs: Sequence[tuple[str, str, xr.Dataset]],
    variables: Sequence[str],
    checkpoints: Sequence[str],
) -> tuple[pd.DataFrame, int]:
    """Long frame over ``(group label, name, ds)`` runs, and total diverged seeds."""
    frames, n_div = [], 0
    for group, _name, ds in runs:
        df = seed_frame(ds, variables, checkpoints)
        df["group"] = group
        frames.append(df)
        n_div += int(np.asarray(ds["diverged"].values, bool).sum()) if "diverged" in ds else 0
    return pd.concat(frames, ignore_index=True), n_div


def _run_list(runs: Sequence[tuple[str, str, xr.Dataset]]) -> str:
    return ", ".join(f"{group} = {name} ({ds.sizes['seed']} seeds)" for group, name, ds in runs)


def _integer_x(ax: Axes) -> None:
    ax.xaxis.set_major_locator(mpl_ticker.MaxNLocator(integer=True))


def _seed_mean_lines(
    ax: Axes,
    data: pd.DataFrame,
    x: str,
    hue_order: Sequence[str],
    palette: dict[str, object],
    *,
    n_boot: int,
    seed: int,
) -> bool:
    """One curve per group of ``hue_order``: the mean of ``value`` over the active seeds at
    each ``x``, in a band from the 95 % percentile bootstrap of that mean (``n_boot``
    resamples of the seeds, from one generator seeded with ``seed``). Undefined (NaN)
    entries are left out, as in the tables. Returns whether anything was drawn."""
    rng = np.random.default_rng(seed)
    tail = (100.0 - _CI_PERCENT) / 2
    drawn = False
    for group in hue_order:
        sub = data[data["group"] == group].dropna(subset=["value"])
        if not len(sub):
            continue
        xs, means, lows, highs = [], [], [], []
        for at, values in sub.groupby(x, sort=True)["value"]:
            v = values.to_numpy(dtype=float)
            boot = v[rng.integers(0, len(v), size=(n_boot, len(v)))].mean(axis=1)
            low, high = np.percentile(boot, [tail, 100.0 - tail])
            xs.append(at)
            means.append(v.mean())
            lows.append(low)
            highs.append(high)
        color = palette[group]
        ax.plot(xs, means, marker="o", color=color, label=group)
        ax.fill_between(xs, lows, highs, color=color, alpha=0.2, linewidth=0)
        drawn = True
    return drawn


def _defect_panels(
    axes: Sequence[Axes],
    data: pd.DataFrame,
    hue_order: Sequence[str],
    *,
    n_boot: int,
    seed: int,
    legend_title: str,
) -> bool:
    """G_D, G_Q, G_S per layer on three shared-y axes; returns whether y is log.

    A shared log axis puts the three levels on one scale, which is the point of the
    comparison (the gate defect sits an order of magnitude above the other two); it
    falls back to linear if any entered value is not positive.
    """
    palette = dict(zip(hue_order, figstyle.qualitative(len(hue_order)), strict=True))
    log = bool(len(data)) and bool((data["value"] > 0).all())
    legend = False
    for ax, var in zip(axes, DEFECTS, strict=True):
        sub = data[data["variable"] == var]
        drawn = _seed_mean_lines(ax, sub, "layer", hue_order, palette, n_boot=n_boot, seed=seed)
        legend = legend or (drawn and ax is axes[0])
        ax.set_title(_DEFECT_TITLES[var])
        ax.set_xlabel("layer $\\ell$")
        ax.set_ylabel("seed mean" if ax is axes[0] else "")
        _integer_x(ax)
    if log:
        axes[0].set_yscale("log")
    if legend:  # one legend for the three panels
        axes[0].legend(title=legend_title, fontsize="small")
    return log


def _stacked_fractions(ax: Axes, data: pd.DataFrame, title: str) -> None:
    """Seed-mean source energy fractions per layer as stacked bars."""
    means = data.groupby(["layer", "variable"])["value"].mean().unstack("variable")
    colors = dict(zip(FRACTIONS, figstyle.qualitative(len(FRACTIONS)), strict=True))
    layers = np.asarray(means.index, dtype=int)
    bottom = np.zeros(len(layers))
    for var in FRACTIONS:
        vals = means[var].to_numpy(dtype=float) if var in means else np.full(len(layers), np.nan)
        # The four fractions are defined together (when any source is nonzero), so a
        # NaN here means no active seed at that layer: it draws nothing, and the empty
        # slot is not confused with a small fraction.
        vals = np.nan_to_num(vals, nan=0.0)
        ax.bar(layers, vals, bottom=bottom, color=colors[var], label=_FRACTION_LABELS[var])
        bottom += vals
    ax.set_ylim(0.0, 1.05)
    ax.set_title(title)
    ax.set_xlabel("layer $\\ell$")
    _integer_x(ax)


def _line_panel(
    ax: Axes,
    data: pd.DataFrame,
    x: str,
    hue_order: Sequence[str],
    *,
    n_boot: int,
    seed: int,
    title: str,
    null: float | None,
    null_label: str,
    legend_title: str,
    legend_outside: bool = True,
) -> None:
    palette = dict(zip(hue_order, figstyle.qualitative(len(hue_order)), strict=True))
    drawn = _seed_mean_lines(ax, data, x, hue_order, palette, n_boot=n_boot, seed=seed)
    if null is not None:
        ax.axhline(null, color="0.4", linestyle="--", linewidth=1.0, label=null_label)
    ax.set_title(title)
    ax.set_ylabel("seed mean")
    if (drawn or null is not None) and legend_outside:
        # beside the axes: inside, "best" can still sit on the null level or a band
        ax.legend(
            title=legend_title,
            fontsize="small",
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            borderaxespad=0.0,
        )
    elif drawn or null is not None:
        ax.legend(title=legend_title, fontsize="small")


def _depth_runs(
    experiments: Experiments, depths: Sequence[int], width: int
) -> list[tuple[str, str, xr.Dataset]]:
    runs = []
    for h in depths:
        hit = synthetic_run(experiments, h, width)
        if hit is not None:
            runs.append((f"H={h}", hit[0], hit[1]))
    return runs


def _width_runs(
    experiments: Experiments, widths: Sequence[int], hidden: int
) -> list[tuple[str, str, xr.Dataset]]:
    runs = []
    for w in widths:
        hit = synthetic_run(experiments, hidden, w)
        if hit is not None:
            runs.append((f"width {w}", hit[0], hit[1]))
    return runs


def _defect_figure(
    runs: Sequence[tuple[str, str, xr.Dataset]],
    checkpoint: str,
    legend_title: str,
    n_boot: int,
    seed: int,
    intro: str,
) -> tuple[Figure, str]:
    """The three defect panels (G_D, G_Q, G_S per layer) of Figures 1 and 3, one curve per
    run, and the caption: ``intro``, then the conventions shared by both figures."""
    data, n_div = _collect(runs, DEFECTS, [checkpoint])
    hue = [g for g, _, _ in runs]
    with figstyle.axes_style():
        fig = mpl_figure.Figure(figsize=(11.0, 3.6), layout="constrained")
        axes = fig.subplots(1, 3, sharey=True)
        log = _defect_panels(axes, data, hue, n_boot=n_boot, seed=seed, legend_title=legend_title)
    caption = (
        f"{intro} Seed means over active seeds with 95% bootstrap intervals; "
        f"{'shared log' if log else 'shared linear'} y axis. {n_div} diverged seed(s) "
        f"excluded. Runs: {_run_list(runs)}."
    )
    return fig, caption


# --- figures ------------------------------------------------------------------------


def figure1(
    experiments: Experiments,
    *,
    depths: Sequence[int] = P.DEPTHS,
    width: int = P.DEPTH_WIDTH,
    checkpoint: str = P.MATCHED_RISK,
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[Figure, str] | None:
    """Paper Figure 1: G_D, G_Q, G_S per layer at matched risk, one curve per depth H."""
    runs = _depth_runs(experiments, depths, width)
    if not runs:
        return None
    return _defect_figure(
        runs,
        checkpoint,
        "depth",
        n_boot,
        seed,
        "Figure 1 (reproduces paper Figure 1). Normalised gate, internal and feature "
        f"defects G_D, G_Q, G_S per layer at {checkpoint} on the diagnostic sample, "
        f"synthetic target, width {width}, one curve per depth.",
    )


def figure2(
    experiments: Experiments,
    *,
    depths: Sequence[int] = P.DEPTHS,
    width: int = P.DEPTH_WIDTH,
    checkpoint: str = P.MATCHED_RISK,
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[Figure, str] | None:
    """Paper Figure 2: source fractions per layer by depth, and chi, rho_tr_imb per layer."""
    runs = _depth_runs(experiments, depths, width)
    if not runs:
        return None
    data, n_div = _collect(runs, FRACTIONS + ("chi", "rho_tr_imb"), [checkpoint])
    hue = [g for g, _, _ in runs]
    with figstyle.axes_style():
        fig = mpl_figure.Figure(figsize=(3.4 * max(len(runs), 2), 7.0), layout="constrained")
        top, bottom = fig.subfigures(2, 1)
        bars = np.atleast_1d(top.subplots(1, len(runs), sharey=True))
        for ax, group in zip(bars, hue, strict=True):
            sub = data[(data["group"] == group) & data["variable"].isin(FRACTIONS)]
            _stacked_fractions(ax, sub, group)
        bars[0].set_ylabel("share of source energy $e^{\\nu}_{\\ell}$")
        # Outside the panels: full-height bars leave no free corner inside them.
        handles, labels = bars[0].get_legend_handles_labels()
        top.legend(handles, labels, loc="outside right upper", fontsize="small", title="source")
        ax_chi, ax_rho = bottom.subplots(1, 2)
        for ax, var, title, null, null_label in (
            (ax_chi, "chi", "cancellation ratio $\\chi_\\ell$", 1.0, "no cancellation"),
            (ax_rho, "rho_tr_imb", "$\\rho^{tr,imb}_\\ell$", 0.0, "uncorrelated"),
        ):
            _line_panel(
                ax,
                data[data["variable"] == var],
                "layer",
                hue,
                n_boot=n_boot,
                seed=seed,
                title=title,
                null=null,
                null_label=null_label,
                legend_title="depth",
                legend_outside=False,  # two narrow panels: no room beside them
            )
            ax.set_xlabel("layer $\\ell$")
            _integer_x(ax)
    caption = (
        "Figure 2 (reproduces paper Figure 2). Source geometry of the four-source "
        f"recursion at {checkpoint} on the training sample, synthetic target, width {width}. "
        "Top: seed-mean energy fractions of the transport, imbalance, fluctuation and "
        "gate sources per layer, stacked, one panel per depth. Bottom: cancellation ratio "
        "chi and transport-imbalance correlation rho per layer, seed means with 95% "
        "bootstrap intervals; dashed lines are the null levels chi = 1 (no cancellation) "
        "and rho = 0. Undefined ratios are omitted (active seeds). "
        f"{n_div} diverged seed(s) excluded. Runs: {_run_list(runs)}."
    )
    return fig, caption


def figure3(
    experiments: Experiments,
    *,
    widths: Sequence[int] = P.WIDTHS,
    hidden: int = P.CAPACITY_HIDDEN,
    checkpoint: str = P.MATCHED_RISK,
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[Figure, str] | None:
    """Paper Figure 3: G_D, G_Q, G_S per layer at matched risk, one curve per width."""
    runs = _width_runs(experiments, widths, hidden)
    if not runs:
        return None
    return _defect_figure(
        runs,
        checkpoint,
        "width",
        n_boot,
        seed,
        "Figure 3 (reproduces paper Figure 3). Width dependence of the normalised gate, "
        f"internal and feature defects per layer at {checkpoint}, synthetic target, "
        f"{hidden} hidden layers, one curve per width.",
    )


def figure4(
    experiments: Experiments,
    *,
    datasets: Sequence[str] = P.BENCHMARK_DATASETS,
    hidden: int = P.BENCHMARK_HIDDEN,
    width: int = P.BENCHMARK_WIDTH,
    checkpoint: str = P.FINAL_TIME,
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[Figure, str] | None:
    """Paper Figure 4: benchmark defects per layer on the test sample, and source fractions."""
    runs = [
        (label, name, ds)
        for d in datasets
        for label, name, ds in benchmark_runs(experiments, d, hidden, width)
    ]
    if not runs:
        return None
    data, n_div = _collect(runs, DEFECTS + FRACTIONS, [checkpoint])
    hue = [g for g, _, _ in runs]
    with figstyle.axes_style():
        fig = mpl_figure.Figure(figsize=(11.0, 7.0), layout="constrained")
        top, bottom = fig.subfigures(2, 1)
        axes = top.subplots(1, 3, sharey=True)
        log = _defect_panels(
            axes,
            data[data["variable"].isin(DEFECTS)],
            hue,
            n_boot=n_boot,
            seed=seed,
            legend_title="data set",
        )
        bars = np.atleast_1d(bottom.subplots(1, len(runs), sharey=True))
        for ax, group in zip(bars, hue, strict=True):
            sub = data[(data["group"] == group) & data["variable"].isin(FRACTIONS)]
            _stacked_fractions(ax, sub, group)
        bars[0].set_ylabel("share of source energy $e^{\\nu}_{\\ell}$")
        # Outside the panels: full-height bars leave no free corner inside them.
        handles, labels = bars[0].get_legend_handles_labels()
        bottom.legend(handles, labels, loc="outside right upper", fontsize="small", title="source")
    caption = (
        "Figure 4 (reproduces paper Figure 4). Benchmarks at the final time "
        f"{checkpoint}, {hidden} hidden layers, width {width}. Top: normalised gate, "
        "internal and feature defects per layer on the test sample, seed means over active "
        f"seeds with 95% bootstrap intervals ({'shared log' if log else 'shared linear'} y "
        "axis). Bottom: seed-mean source energy fractions per layer on the training "
        f"sample, stacked. {n_div} diverged seed(s) excluded. Runs: {_run_list(runs)}."
    )
    return fig, caption


def _time_of(label: str) -> float | None:
    m = re.fullmatch(r"t=([0-9.eE+-]+)", str(label))
    return float(m.group(1)) if m else None


def figure5(
    experiments: Experiments,
    *,
    cs: Sequence[float] = P.RESCALE_CS,
    hidden: int = P.RESCALE_HIDDEN,
    width: int = P.RESCALE_WIDTH,
    layer: int = P.RESCALE_LAYER,
    n_boot: int = 1000,
    seed: int = 0,
) -> tuple[Figure, str] | None:
    """Paper Figure 5: layer-1 rho_tr_imb and chi against time for each rescaling c."""
    runs = []
    for c in cs:
        hit = synthetic_run(experiments, hidden, width, c)
        if hit is not None:
            label = {0.5: "c = 1/2", 1.0: "c = 1", 2.0: "c = 2"}.get(float(c), f"c = {c:g}")
            runs.append((label, hit[0], hit[1]))
    if not runs:
        return None
    frames, n_div = [], 0
    for group, _name, ds in runs:
        times = {str(ck): _time_of(ck) for ck in ds["checkpoint"].values}
        cks = [ck for ck, t in times.items() if t is not None]
        df = seed_frame(ds, ("rho_tr_imb", "chi"), cks, layers=[layer])
        df["t"] = df["checkpoint"].map(times).astype(float)
        df["group"] = group
        frames.append(df)
        n_div += int(np.asarray(ds["diverged"].values, bool).sum()) if "diverged" in ds else 0
    data = pd.concat(frames, ignore_index=True)
    hue = [g for g, _, _ in runs]
    with figstyle.axes_style():
        fig = mpl_figure.Figure(figsize=(12.0, 3.8), layout="constrained")
        ax_rho, ax_chi = fig.subplots(1, 2)
        for ax, var, title, null, null_label in (
            (ax_rho, "rho_tr_imb", f"$\\rho^{{tr,imb}}_{layer}$", 0.0, "uncorrelated"),
            (ax_chi, "chi", f"cancellation ratio $\\chi_{layer}$", 1.0, "no cancellation"),
        ):
            _line_panel(
                ax,
                data[data["variable"] == var],
                "t",
                hue,
                n_boot=n_boot,
                seed=seed,
                title=title,
                null=null,
                null_label=null_label,
                legend_title="rescaling",
            )
            ax.set_xlabel("training time $t$")
    caption = (
        "Figure 5 (reproduces paper Figure 5). Function-preserving rescaling "
        f"W1 -> c W1, W2 -> W2 / c, {hidden} hidden layers, width {width}: the "
        f"transport-imbalance correlation rho and the cancellation ratio chi at layer {layer} "
        "against training time t (every recorded t checkpoint), one curve per c; seed means "
        "over active seeds with 95% bootstrap intervals; dashed lines are the null levels "
        f"rho = 0 and chi = 1. {n_div} diverged seed(s) excluded. Runs: {_run_list(runs)}."
    )
    return fig, caption


#: What each figure needs from the run, for :func:`not_run_figure`.
FIGURE_NEEDS: dict[str, str] = {
    "figure1": "synthetic runs with width 32, rescale_c = 1 and H in {2, 4, 6}",
    "figure2": "synthetic runs with width 32, rescale_c = 1 and H in {2, 4, 6}",
    "figure3": "synthetic runs with H = 4, rescale_c = 1 and width in {16, 32, 64}",
    "figure4": "benchmark runs (concrete, energy) with H = 4 and width 32",
    "figure5": "synthetic runs with H = 3, width 32 and rescale_c in {1/2, 1, 2}",
}


def figure_number(stem: str) -> int:
    """The paper's number of the figure ``stem`` (``figure12`` -> 12)."""
    digits = stem[len(stem.rstrip("0123456789")) :]
    if not digits:
        raise ValueError(f"{stem!r} is not a paper figure's stem (figureN)")
    return int(digits)


def not_run_figure(stem: str) -> tuple[Figure, str]:
    """A placeholder saying which runs a paper figure needs, for fixed workflow outputs.

    A figure function returns ``None`` when its runs are absent; a workflow that must
    still produce the file writes this instead, so a reader sees why it is empty.
    """
    needs = FIGURE_NEEDS[stem]
    return placeholder_figure(
        f"{stem}: not run\nneeds {needs}",
        f"{stem} (paper Figure {figure_number(stem)}): not run; this reproduction has no {needs}.",
    )


FIGURES = {
    "figure1": figure1,
    "figure2": figure2,
    "figure3": figure3,
    "figure4": figure4,
    "figure5": figure5,
}


def all_figures(experiments: Experiments, n_boot: int = 1000) -> dict[str, tuple[Figure, str]]:
    """``{stem: (figure, caption)}`` for every paper figure this run can draw."""
    out = {}
    for stem, make in FIGURES.items():
        made = make(experiments, n_boot=n_boot)
        if made is not None:
            out[stem] = made
    return out
