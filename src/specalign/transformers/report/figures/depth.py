"""What depth does to the tokens of one model's ``propagation.nc`` (Li & Altafini,
arXiv:2605.25619, Section 3): the inter-token distance after each layer (paper Fig. 4)
and the alignment over the artificially prolonged transformer (Fig. 6), where a
power-method convergence is a straight line of sin(angle to v1) on a log axis."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import numpy as np

from specalign import figstyle
from specalign.lazy import LazyModule
from specalign.transformers.report.figures.style import (
    _NULL,
    _integer_x,
    _legend_outside,
    _line_band,
    _modes,
    _nanstats,
    _neg_line,
    _null_band,
    mode_name,
)
from specalign.transformers.report.tables import mode_view

if TYPE_CHECKING:
    from matplotlib.figure import Figure

xr = LazyModule("xarray")
mpl_figure = LazyModule("matplotlib.figure")


def token_distance_figure(prop: xr.Dataset, model: str) -> tuple[Figure, str]:
    """Mean inter-token distance per layer for every mode (paper Fig. 4).

    Null: sqrt(2), the mean distance of independent uniformly random unit tokens in
    high dimension (when distances are taken on unit-normalised tokens), and 0 =
    consensus. Prolonged modes get their own panel so the original depth stays legible.
    """
    modes = _modes(prop)
    short = [m for m in modes if not m.startswith("prolonged")]
    long_ = [m for m in modes if m.startswith("prolonged")]
    pal = dict(zip(modes, figstyle.qualitative(len(modes)), strict=True))
    normalized = bool(int(prop.attrs.get("normalize_distance", 1)))
    finals: dict[str, float] = {}
    with figstyle.axes_style():
        n_panels = 2 if long_ and short else 1
        fig = mpl_figure.Figure(figsize=(5.2 * n_panels + 1.0, 4.0), layout="constrained")
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
    pal = dict(zip(data, figstyle.qualitative(len(data)), strict=True))
    finals: dict[str, float] = {}
    null_level = float("nan")
    sin_all: list[np.ndarray] = []
    with figstyle.axes_style():
        fig = mpl_figure.Figure(figsize=(13.0, 4.4), layout="constrained")
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
