"""The look every figure of both studies shares: colours and the axes' style.

Matplotlib alone (no seaborn): a figure job imports what it draws with, and seaborn's
import (scipy.stats among it) was a fifth of every figure job's time.

- :func:`qualitative`: the eight colours of Okabe and Ito's "Color Universal Design"
  (2008), told apart under the common forms of colour blindness and in greyscale
  print; the pale yellow and black come last. Beyond eight, colours of matplotlib's
  ``tab20`` follow, so that no two curves of one legend share a colour.
- :func:`sequential`: ordered levels (layers, steering strengths) along a perceptually
  uniform colour map.
- :func:`cyclic`: unordered items drawn together in one panel (tokens on the sphere),
  evenly spaced hues.
- :func:`axes_style`: white axes with a light grid behind the data (or without the
  grid, for heat maps), muted text, no top or right spine.
- :func:`set_theme`: that style for the whole job, with fonts and lines scaled by the
  configuration's ``plots: context:`` (:data:`CONTEXT_SCALE`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from specalign.lazy import LazyModule

mpl = LazyModule("matplotlib")

OKABE_ITO: tuple[str, ...] = (
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#D55E00",  # vermillion
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#F0E442",  # yellow
    "#000000",  # black
)


def qualitative(n: int) -> list[Any]:
    """``n`` distinct colours for categories (methods, modes, runs), in a fixed order."""
    if n <= len(OKABE_ITO):
        return list(OKABE_ITO[:n])
    more = [mpl.colormaps["tab20"](i % 20) for i in range(n - len(OKABE_ITO))]
    return [*OKABE_ITO, *more]


def sequential(n: int, cmap: str = "viridis") -> list[Any]:
    """``n`` colours in order along ``cmap``; the ends are left out (the darkest and the
    palest colours of a map read poorly against white)."""
    return [mpl.colormaps[cmap](t) for t in np.linspace(0.0, 1.0, n + 2)[1:-1]]


def cyclic(n: int) -> list[Any]:
    """``n`` evenly spaced hues (``n`` unordered items of one panel)."""
    return [mpl.colormaps["hsv"](t) for t in np.arange(n) / max(n, 1)]


_INK = "0.15"  # text, labels and ticks: dark grey, softer than black beside the data

_BASE = {
    "axes.facecolor": "white",
    "figure.facecolor": "white",
    "axes.edgecolor": "0.8",
    "axes.labelcolor": _INK,
    "text.color": _INK,
    "xtick.color": _INK,
    "ytick.color": _INK,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.axisbelow": True,
    "grid.color": "0.88",
    "grid.linestyle": "-",
    "lines.solid_capstyle": "round",
}


#: ``plots: context:`` -> the factor on every font size and line width below: the
#: same figure read on paper, on screen, on a slide, on a poster.
CONTEXT_SCALE: dict[str, float] = {"paper": 0.8, "notebook": 1.0, "talk": 1.5, "poster": 2.0}

_SIZES = {  # at scale 1 (notebook)
    "font.size": 12.0,
    "axes.labelsize": 12.0,
    "axes.titlesize": 12.0,
    "xtick.labelsize": 11.0,
    "ytick.labelsize": 11.0,
    "legend.fontsize": 11.0,
    "legend.title_fontsize": 12.0,
    "axes.linewidth": 1.25,
    "grid.linewidth": 1.0,
    "lines.linewidth": 1.5,
    "lines.markersize": 6.0,
    "patch.linewidth": 1.0,
    "xtick.major.width": 1.25,
    "ytick.major.width": 1.25,
    "xtick.minor.width": 1.0,
    "ytick.minor.width": 1.0,
    "xtick.major.size": 6.0,
    "ytick.major.size": 6.0,
    "xtick.minor.size": 4.0,
    "ytick.minor.size": 4.0,
}


def set_theme(context: str = "paper") -> None:
    """The shared style, with a grid, for every figure this process makes after the call,
    at the size of ``context`` (a key of :data:`CONTEXT_SCALE`)."""
    if context not in CONTEXT_SCALE:
        raise ValueError(f"plots.context: {context!r} is not one of {sorted(CONTEXT_SCALE)}")
    scale = CONTEXT_SCALE[context]
    mpl.rcParams.update(
        {**_BASE, "axes.grid": True, "axes.prop_cycle": mpl.cycler(color=list(OKABE_ITO))}
    )
    mpl.rcParams.update({key: size * scale for key, size in _SIZES.items()})


@contextlib.contextmanager
def axes_style(grid: bool = True) -> Iterator[None]:
    """The shared style for the figures made inside the ``with`` block (the style is set
    when axes are made, so the figure and its subplots are created inside)."""
    with mpl.rc_context({**_BASE, "axes.grid": grid}):
        yield
