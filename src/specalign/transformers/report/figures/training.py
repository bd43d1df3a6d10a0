"""The series figure: each claim's metric against the training step
(``results/transformers/series/{series}/training.png``), drawn from ``training.nc``
(:func:`specalign.transformers.report.series.series_dataset`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from specalign.lazy import LazyModule
from specalign.transformers.metric_table import Metric, trends
from specalign.transformers.report.claims import GAMMA_CONVERGED, SMALL_GAP
from specalign.transformers.report.figures.style import line_band
from specalign.transformers.report.series import BAND
from specalign.transformers.train.training import FAMILIES

# imported when first used (specalign.lazy): the rule files import these modules for
# their names, and every snakemake call would pay these imports
xr = LazyModule("xarray")


def _x(steps: np.ndarray) -> np.ndarray:
    return np.asarray(steps, dtype=float)


def _step_scale(step: np.ndarray) -> np.ndarray:
    """The step axis: log2(1 + step), so that step 0 (the initialisation) is at the left
    edge and the doubling points of a series (0, 8, 16, ..., 1024) are about evenly
    spaced; the ticks name the steps themselves."""
    return np.log2(1.0 + np.maximum(np.asarray(step, dtype=float), 0.0))


def _step_unscale(value: np.ndarray) -> np.ndarray:
    return np.exp2(np.asarray(value, dtype=float)) - 1.0


#: The panels in reading order: does the model learn, does the tilt appear (the
#: metric table's trends, a panel each as they declare), does the prolonged run
#: converge, then the spectra and steering.
_PANEL_ORDER = ("loss", "trends", "prolonged", "gaps", "radius", "steer")
_COLUMNS = 3


def _trend_panels() -> dict[str, list[Metric]]:
    """The metric table's trends by the series panel they are drawn in, the panels in
    the order of their first trend's rank, each panel's trends in rank order."""
    out: dict[str, list[Metric]] = {}
    for m in trends():
        if m.trend.panel in _PANEL_ORDER:
            raise ValueError(
                f"metric {m.name}: its trend's panel {m.trend.panel!r} is one of the series "
                f"figure's own ({', '.join(_PANEL_ORDER)}); name another"
            )
        out.setdefault(m.trend.panel, []).append(m)
    return out


def _trend_title(metrics: list[Metric]) -> str:
    """A trend panel's title: the claim, and which line is which."""
    first, rest = metrics[0], metrics[1:]
    parts = [first.label + (" (solid)" if rest else "")]
    parts += [f"{m.label} (dashed{', band' if m.trend.band else ''})" for m in rest]
    if first.trend.null == "beside":
        parts.append("null dashed gray")
    return f"({first.trend.claim}) " + ", ".join(parts)


def _trend_panel(ax: Any, ds: xr.Dataset, x: np.ndarray, metrics: list[Metric], null0: Any) -> None:
    """One panel of trends per mode: the first trend's headline solid and marked, with
    its band and its null beside it (gray dashed) where it has them, its step-0 value
    dotted; the others dashed in the mode's colour, with their bands."""
    first, rest = metrics[0], metrics[1:]
    for mode in ds["mode"].values:
        y = ds[first.headline].sel(mode=mode).values
        if first.trend.band:
            line = line_band(
                ax, x, y, ds[f"{first.name}_lo"].sel(mode=mode),
                ds[f"{first.name}_hi"].sel(mode=mode), alpha=0.2, band_lw=None, marker="o",
                ms=3, label=str(mode),
            )  # fmt: skip
        else:
            (line,) = ax.plot(x, y, marker="o", ms=3, label=str(mode))
        color = line.get_color()
        if first.trend.null == "beside":
            ax.plot(x, ds[f"{first.name}_null"].sel(mode=mode), color="0.35", lw=0.8, ls="--")
        null0(ax, y, color)
        for m in rest:
            if m.trend.band:
                ax.fill_between(
                    x, ds[f"{m.name}_lo"].sel(mode=mode), ds[f"{m.name}_hi"].sel(mode=mode),
                    color=color, alpha=0.15,
                )  # fmt: skip
            ax.plot(x, ds[m.headline].sel(mode=mode), ls="--", color=color, lw=1)
    if first.trend.null == "excess":
        ax.axhline(0, color="0.35", lw=0.8)  # an excess's null


def series_figure(ds: xr.Dataset) -> tuple[Any, str]:
    """Each claim's metric against the training step, one panel per claim on a grid of
    three columns, the points marked; step 0 (the initialisation) is the left edge and
    its value, drawn as a dotted line, the null of every curve."""
    import matplotlib.pyplot as plt

    trend_panels = _trend_panels()
    present = {*trend_panels, "gaps", "radius", "steer"}
    if "final_gamma" in ds:
        present.add("prolonged")
    if "heldout_loss" in ds:
        present.add("loss")
    panels = [
        q for p in _PANEL_ORDER for q in (trend_panels if p == "trends" else [p]) if q in present
    ]
    rows = -(-len(panels) // _COLUMNS)
    fig, grid = plt.subplots(
        rows, _COLUMNS, figsize=(4.2 * _COLUMNS, 3.3 * rows), squeeze=False, layout="constrained"
    )
    for ax in grid.flat[len(panels) :]:
        ax.set_visible(False)
    x = _x(ds["step"].values)
    at0 = 0 if 0 in ds["step"].values else None

    def setup(ax: Any, title: str) -> None:
        ax.set_xscale("function", functions=(_step_scale, _step_unscale))
        ax.set_xlim(0, max(float(x.max()), 1.0) * 1.15)
        ax.set_xticks(x, [f"{int(s)}" for s in x], fontsize=7, rotation=45 if len(x) > 6 else 0)
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.set_xlabel("training step")
        ax.set_title(title, fontsize=9)

    def null0(ax: Any, y: np.ndarray, color: Any) -> None:
        if at0 is not None and np.isfinite(y[at0]):
            ax.axhline(y[at0], color=color, ls=":", lw=1)

    for ax, panel in zip(grid.flat, panels, strict=False):
        if panel in trend_panels:
            _trend_panel(ax, ds, x, trend_panels[panel], null0)
            setup(ax, _trend_title(trend_panels[panel]))
            ax.legend(fontsize=6)
        elif panel == "gaps":
            for name, label in (
                ("frac_small_gap", f"gap/|l1| < {SMALL_GAP:g}"),
                ("frac_complex_lambda1", "complex l1"),
            ):
                y = ds[name].values
                (line,) = ax.plot(x, y, marker="o", ms=3, label=label)
                null0(ax, y, line.get_color())
            ax.set_ylim(-0.05, 1.05)
            setup(ax, "(3) fraction of layers")
            ax.legend(fontsize=6)
        elif panel == "radius":
            y = np.nanmean(ds["spectral_radius"].values, axis=1)
            (line,) = ax.plot(x, y, marker="o", ms=3, label="mean radius")
            null0(ax, y, line.get_color())
            ax2 = ax.twinx()
            ax2.plot(
                x,
                np.nanmean(ds["radius_is_negative"].values, axis=1),
                color="tab:red",
                marker="s",
                ms=3,
                label="negative share",
            )
            ax2.set_ylim(-0.05, 1.05)
            setup(ax, "(3) spectral radius; red: share negative")
        elif panel == "steer":
            for i, m in enumerate(ds["method"].values):
                for j, c in enumerate(ds["c"].values):
                    line_band(
                        ax, x, ds["steer_gain"].values[:, i, j],
                        ds["steer_gain_lo"].values[:, i, j], ds["steer_gain_hi"].values[:, i, j],
                        alpha=0.15, band_lw=None, marker="o", ms=3, label=f"{m} c={c:g}",
                    )  # fmt: skip
            ax.axhline(0, color="0.35", lw=0.8)
            setup(ax, "(4) steering gain of gamma_u")
            ax.legend(fontsize=5)
        elif panel == "prolonged":
            for p in ds["prolonged"].values:
                y = ds["final_gamma"].sel(prolonged=p).values
                (line,) = ax.plot(x, y, marker="o", ms=3, label=f"final gamma {p}")
                ax.plot(
                    x,
                    ds["measured_rate"].sel(prolonged=p),
                    ls="--",
                    color=line.get_color(),
                    label=f"rate {p}",
                )
                ax.plot(
                    x,
                    ds["predicted_rate"].sel(prolonged=p),
                    ls=":",
                    color=line.get_color(),
                    label=f"|mu2/mu1| {p}",
                )
            ax.axhline(GAMMA_CONVERGED, color="0.35", lw=0.8)
            setup(ax, "(2) prolonged: final gamma, rate")
            ax.legend(fontsize=5)
        elif panel == "loss":
            # a masked LM trains on targets a tenth of which it sees, and is held out
            # on hidden ones: the two curves measure different things, and say so
            masked = FAMILIES.get(str(ds.attrs.get("family", ""))) == "masked_lm"
            train_label = "train (targets as trained, a tenth in view)" if masked else "train"
            ax.plot(x, ds["train_loss"], marker="o", ms=3, label=train_label)
            ax.plot(
                x, ds["heldout_loss"], marker="s", ms=3,
                label="held-out (hidden tokens)" if masked else "held-out (next tokens)",
            )  # fmt: skip
            ax.axhline(
                float(ds["heldout_unigram_entropy"]), color="0.35", ls="--", label="unigram entropy"
            )
            setup(ax, "held-out loss against the unigram entropy (nats/token)")
            ax.legend(fontsize=6)
    caption = (
        f"Series {ds.attrs['series']}: each claim's metric against the training step "
        "(axis log2(1 + step): step 0, the initialisation, at the left edge; its value, "
        "dotted, is the null of every curve). Bands: bootstrap "
        f"{BAND[0]:g}-{BAND[1]:g} % over prompts."
    )
    return fig, caption
