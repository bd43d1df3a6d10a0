"""What every transformer figure draws alike: the colours of the null levels, the
token statistics, a curve with its band, the legend beside the axes, and the names of
the propagation modes (Li & Altafini, arXiv:2605.25619, Section 3 and supplement).

The reading of the null levels is in :mod:`specalign.transformers.report.figures`.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from specalign.lazy import LazyModule
from specalign.output import nanmean as _nanmean

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.lines import Line2D

xr = LazyModule("xarray")
mpl_ticker = LazyModule("matplotlib.ticker")

_NULL = "0.35"  # random-direction null
_NEG = "tab:purple"  # most-negative-eigenvector null
_RANDOM_MODEL = "0.55"
_N_EIGS = 5  # the paper's Figure 7 shows lambda_1..5


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
    ax.xaxis.set_major_locator(mpl_ticker.MaxNLocator(integer=True))


def line_band(
    ax: Axes,
    x: Any,
    y: Any,
    lo: Any = None,
    hi: Any = None,
    *,
    alpha: float,
    band_lw: float | None = 0.0,
    **line: Any,
) -> Line2D:
    """The curve ``y`` against ``x`` (``line``: its Line2D properties) and, when ``lo`` and
    ``hi`` are given, the band between them, shaded in the curve's colour; returns the
    curve. ``band_lw``: the band's edge width (None: matplotlib's default edge, which the
    checkpoint-series figure of :mod:`specalign.transformers.report.series` draws)."""
    (curve,) = ax.plot(x, y, **line)
    if lo is not None and hi is not None:
        edge = {} if band_lw is None else {"lw": band_lw}
        ax.fill_between(x, lo, hi, color=curve.get_color(), alpha=alpha, **edge)
    return curve


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
    """Mean +- sd: the mean as a line, the sd as an edgeless band of the same colour."""
    lo, hi = (None, None) if sd is None else (mean - sd, mean + sd)
    line_band(
        ax, x, mean, lo, hi, alpha=alpha, color=color, linestyle=linestyle, marker=marker,
        ms=3, lw=1.4, label=label,
    )  # fmt: skip


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
