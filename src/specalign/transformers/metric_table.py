"""The metrics of ``propagation.nc``, each declared once: its kernel, its dims, its
description, its columns in ``propagation.csv`` and its place in the figures.

Li & Altafini (arXiv:2605.25619, Section 3, Figures 2, 4, 5) measure, per layer t and
token i, how far the tokens lean towards the principal eigenvector v1_t of F_t:

* ``gamma_t = |corr(x_i^t, v1_t)|``, the alignment after layer t;
* ``psi_t = |corr(x_i^t, v1_t)| - |corr(x_i^{t-1}, v1_t)|``, the tilt layer t gives;
* ``rho_t``, the fraction of tokens whose tilt is a rise above round-off (``d * eps``,
  :func:`specalign.transformers.measure.metrics.psi_round_off`);

each also for the mean token of every prompt (``*_mean``) and against two null
directions (``*_null``: random unit directions, averaged over the draws;
``*_neg_null``: the eigenvector of F_t's most negative eigenvalue), and beside them
the correlations of Figure 5 and the token distances of Figure 4.

Everything that reads a metric reads it here: the stream that computes them
(:class:`~specalign.transformers.measure.metrics.MetricsStream`), the descriptions in
the files (:mod:`specalign.transformers.variables`), the copies under the other
correlation (:mod:`specalign.transformers.measure.propagate`), the per-layer table
(:func:`~specalign.transformers.report.tables.propagation_table`) and the correlations
figure (:func:`~specalign.transformers.report.figures.propagation.correlations_figure`).
A metric followed beyond one run carries a :class:`Trend`, and what follows it reads
the trend here too: the series over training (``training.nc``, ``training.csv`` and the
series figure, :mod:`specalign.transformers.report.series`) and the layer table
(``layers.csv``, :mod:`specalign.transformers.report.summary`). A new metric is one
:class:`Metric` in :data:`METRICS` with its kernel, and a trend if it is to be followed
(the recipe is in docs/extending.md). The claims' verdicts read the paper's three
metrics by name, since each claim is about those three.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, NamedTuple

import numpy as np

__all__ = [
    "METRICS",
    "Column",
    "NULLS",
    "LayerReading",
    "Metric",
    "Panel",
    "StateReading",
    "Trend",
    "by_name",
    "descriptions",
    "dims",
    "layer_values",
    "other_variables",
    "table_columns",
    "trends",
]

#: What a metric has one value of, beside its mode and layer: each token, each
#: prompt's mean token, the layer as a whole, or (for what is read off a state rather
#: than a layer) each prompt at each state 0..T.
Per = Literal["token", "prompt", "layer", "state"]

#: The null directions a metric measured against v1_t is also measured against, as the
#: suffix of their variables, with what each suffix means.
NULLS: dict[str, str] = {
    "_null": "v_t = random unit directions, averaged over null_draws draws (chance level)",
    "_neg_null": "v_t = the eigenvector of the most negative eigenvalue of F_t",
}
_V1 = "v_t = v1_t, the leading real eigenvector of F_t (direction_v1 of spectra.nc)"

_DIMS: dict[str, tuple[str, ...]] = {
    "token": ("mode", "layer", "token"),
    "prompt": ("mode", "layer", "prompt"),
    "layer": ("mode", "layer"),
    "state": ("mode", "state", "prompt"),
}


@dataclass(frozen=True)
class LayerReading:
    """What a layer's metrics are made of, under one correlation.

    The first four hold absolute correlations ``|<x, w>|`` of unit rows (centred first
    for Pearson) with K directions w on the leading axis: v1_t, then v_neg_t, then
    the random draws, in the stream; the layers of a run, in
    :func:`~specalign.transformers.measure.metrics.alignment`. The rest are the
    layer's own (None in a whole-run reading, whose metrics are the directions' only).
    """

    #: (K, P, N): each token after the layer, x^t
    after: np.ndarray
    #: (K, P, N): each token before it, x^{t-1}
    before: np.ndarray
    #: (K, P): each prompt's mean token after the layer
    mean_after: np.ndarray
    #: (K, P): each prompt's mean token before it
    mean_before: np.ndarray
    #: the largest |psi| round-off alone makes at this width
    round_off: float
    #: (P, N, d): the unit rows of x^{t-1} and x^t
    rows_before: np.ndarray | None = None
    rows_after: np.ndarray | None = None
    #: (P, N, d): the state x^t itself, in float64
    state: np.ndarray | None = None
    #: (P, N): |corr(x^t, v2_t)|, from the same matrix product as ``after``
    after_v2: np.ndarray | None = None
    #: (d, 3): orthonormal basis (zero-padded) of F_t's principal subspace
    basis: np.ndarray | None = None
    #: whether the correlation centres a row over its d components (Pearson) before
    #: taking its norm, as ``rows_after`` was prepared
    centred: bool = False

    @cached_property
    def psi(self) -> np.ndarray:
        """(K, P, N): the tilt of each token, read once by psi and rho."""
        return self.after - self.before

    @cached_property
    def psi_mean(self) -> np.ndarray:
        """(K, P): the tilt of each prompt's mean token, read by psi_mean and rho_mean."""
        return self.mean_after - self.mean_before


@dataclass(frozen=True)
class StateReading:
    """What a state's metrics are made of: the state (P, N, d) in float64, and whether
    tokens are put on the unit sphere before distances are taken."""

    state: np.ndarray
    normalize_distance: bool
    token_distance: Callable[[np.ndarray, bool], np.ndarray]


@dataclass(frozen=True)
class Panel:
    """A metric's row in a figure: the figure (``"correlations"``, paper Fig. 5), the
    axis title, the name in the caption's averages, the caption's text for the row, and
    the null drawn under it: ``"direction"`` (the random-direction null of gamma),
    ``"plane"`` (the random 2-plane, pi/2 times that under ``proj="top2"``) or None."""

    figure: Literal["correlations"]
    title: str
    short: str
    caption: str
    null: Literal["direction", "plane"] | None = "direction"


@dataclass(frozen=True)
class Trend:
    """How a metric is followed past one model's ``propagation.nc``: its mean over the
    layers per step and mode of a training series (``training.nc``, ``training.csv``,
    the series figure), and its value per layer and mode in the layer table
    (``layers.csv``).

    The metric's value at layer t is its token mean (the prompts' mean for
    ``per == "prompt"``; the layer's own value for ``per == "layer"``), called ``text``
    in the descriptions; the trend is the mean of that over the layers. ``null``:
    ``"beside"`` keeps the random-direction null's trend beside it (``<name>_null``);
    ``"excess"`` keeps it and also the value minus the null, layer by layer
    (``<name>_minus_null``), which is then the trend's *headline*: the value the
    tables, the per-layer variables and the figure's solid line show (otherwise the
    value itself). ``band``: a bootstrap band over prompts (``<name>_lo``,
    ``<name>_hi``; per-token metrics only). ``per_layer``: the headline per layer in
    ``training.nc`` (``<headline>_layer``). ``layer_column``: the headline per layer in
    ``layers.csv`` (``<headline>_<mode>``). ``claim``: the paper's claim it is read for.
    ``panel``: the series figure's panel it is drawn in; the trends of one panel share
    it, the first solid, the others dashed. ``rank`` orders the trends: their columns in
    ``training.csv`` and ``layers.csv``, their lines in a panel and their bands' draws
    (the bands of a series draw from one generator, so that order is part of the bands'
    identity).
    """

    rank: int
    text: str
    claim: int
    panel: str
    null: Literal["beside", "excess"] | None = None
    band: bool = False
    per_layer: bool = False
    layer_column: bool = False


@dataclass(frozen=True)
class Metric:
    """One variable of ``propagation.nc``.

    ``kernel`` computes it from a :class:`LayerReading` (a :class:`StateReading` when
    ``per == "state"``); with ``nulls`` the reading has K directions and the kernel
    returns the K values on the leading axis, and the stream keeps v1's as the metric,
    the random draws' mean as ``<name>_null`` and v_neg's as ``<name>_neg_null``.

    In ``propagation.csv``: ``columns`` are the reductions of the metric over its
    ``per`` dim ("mean", and "sd" as the column ``<column>_sd``), named ``column``
    (the metric's name unless given); ``null_columns`` the suffixes of :data:`NULLS`
    whose token mean is a column too. ``other_corr``: the suffixes ("" for the metric
    itself) also stored under the other correlation as ``<name><suffix>_<corr>``;
    ``other_columns``: those of them that are columns.
    """

    name: str
    per: Per
    description: str
    kernel: Callable[..., np.ndarray]
    nulls: bool = False
    columns: tuple[str, ...] = ()
    column: str = ""
    null_columns: tuple[str, ...] = ()
    other_corr: tuple[str, ...] = ()
    other_columns: tuple[str, ...] = ()
    panel: Panel | None = None
    trend: Trend | None = None

    def __post_init__(self) -> None:
        t = self.trend
        if t is None:
            return
        # what a trend reads must exist: a null needs the metric measured against the
        # random directions, a band the tokens' prompts, a layer column the table's
        # value and null columns (summary.py reads them there)
        if t.null and not self.nulls:
            raise ValueError(f"metric {self.name}: a trend with a null needs nulls=True")
        if t.band and self.per != "token":
            raise ValueError(f"metric {self.name}: a band is drawn over tokens' prompts")
        if self.per == "state":
            raise ValueError(f"metric {self.name}: a trend is a mean over layers")
        if t.layer_column and (
            "mean" not in self.columns or (t.null and "_null" not in self.null_columns)
        ):
            raise ValueError(
                f"metric {self.name}: a layer column is read from propagation.csv's "
                "mean column (and its _null column with a null)"
            )

    @property
    def dims(self) -> tuple[str, ...]:
        return _DIMS[self.per]

    @property
    def column_name(self) -> str:
        return self.column or self.name

    @property
    def _excess(self) -> bool:
        """Whether the trend's headline is the metric minus its random-direction null."""
        return self.trend is not None and self.trend.null == "excess"

    @property
    def headline(self) -> str:
        """The variable name of the trend's headline: the metric, or its excess over
        its random-direction null."""
        return f"{self.name}_minus_null" if self._excess else self.name

    @property
    def label(self) -> str:
        """The headline as a column title and a legend say it (``rho - null``)."""
        return f"{self.name} - null" if self._excess else self.name

    @property
    def trend_variables(self) -> list[str]:
        """The trend's variables per step and mode in ``training.nc``: the value, its
        null, its excess over the null, its band."""
        t = self.trend
        assert t is not None
        names = [self.name] + ([f"{self.name}_null"] if t.null else [])
        names += [self.headline] if t.null == "excess" else []
        return names + ([f"{self.name}_lo", f"{self.name}_hi"] if t.band else [])

    @property
    def headline_text(self) -> str:
        """What the headline is at one layer, in words."""
        assert self.trend is not None
        if self._excess:
            return f"{self.trend.text} minus its random-direction null"
        return self.trend.text


def _rise_fraction(psi: np.ndarray, round_off: float, axes: tuple[int, ...]) -> np.ndarray:
    """The fraction of values above round-off over ``axes``; NaN where all are NaN."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(psi).all(axis=axes), np.nan, (psi > round_off).mean(axis=axes))


def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], -1)


def _corr_proj(r: LayerReading) -> np.ndarray:
    """|corr(x^t, P x^t)|, P = B B^T the orthogonal projection onto the principal
    subspace (B its orthonormal basis, zero-padded to 3 columns).

    From the coordinates c = B^T x alone, never a d-long projection per token: with B_c
    the basis centred as the correlation centres a row (its column means taken off for
    Pearson; B itself for cosine), P x as the correlation reads it is B_c c, so
    corr = <u, B_c c> / |B_c c|, u the row's unit vector (``rows_after``) and
    |B_c c|^2 = c^T (B_c^T B_c) c. NaN where P x is constant (zero under cosine), as
    for a zero row."""
    assert r.state is not None and r.basis is not None and r.rows_after is not None
    B = r.basis
    d = B.shape[0]
    Bc = B - B.mean(axis=0) if r.centred else B
    c = r.state.reshape(-1, d) @ B
    num = np.einsum("mk,mk->m", r.rows_after.reshape(-1, d) @ Bc, c)
    norm2 = np.einsum("mk,mk->m", c @ (Bc.T @ Bc), c)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.abs(num) / np.sqrt(norm2)
    out[~(norm2 > 0)] = np.nan
    return out


#: The metrics, in the order of their columns in ``propagation.csv`` (each group of
#: columns, the metrics', then each null's, then the other correlation's, in this
#: order) and of their rows in a figure.
METRICS: tuple[Metric, ...] = (
    Metric(
        "gamma",
        "token",
        "gamma_t = |corr(x_t, v_t)| of each token after layer t",
        lambda r: _flat(r.after),
        nulls=True,
        columns=("mean", "sd"),
        null_columns=("_null", "_neg_null"),
        other_corr=("", "_null"),
        other_columns=("", "_null"),
        panel=Panel(
            "correlations",
            "$|corr(x_i, v_1)|$",
            "v1",
            "v1 (leading real eigenvector)",
        ),
        trend=Trend(
            rank=2,
            text="the token-mean gamma_t",
            claim=1,
            panel="gamma",
            null="beside",
            band=True,
            layer_column=True,
        ),
    ),
    Metric(
        "gamma_mean",
        "prompt",
        "gamma_t of the mean token of each prompt",
        lambda r: r.mean_after,
        nulls=True,
        columns=("mean",),
        column="gamma_meantok",
    ),
    Metric(
        "psi",
        "token",
        "psi_t = |corr(x_t, v_t)| - |corr(x_{t-1}, v_t)|: the tilt layer t gives",
        lambda r: _flat(r.psi),
        nulls=True,
        columns=("mean", "sd"),
        null_columns=("_null",),
        other_corr=("",),
        trend=Trend(
            rank=1,
            text="the token-mean psi_t",
            claim=1,
            panel="tilt",
            band=True,
            per_layer=True,
        ),
    ),
    Metric(
        "psi_mean",
        "prompt",
        "psi_t of the mean token of each prompt",
        lambda r: r.psi_mean,
        nulls=True,
    ),
    Metric(
        "rho",
        "layer",
        "rho_t = fraction of tokens with psi_t > d*eps (a rise above round-off)",
        lambda r: _rise_fraction(r.psi, r.round_off, (1, 2)),
        nulls=True,
        columns=("mean",),
        null_columns=("_null", "_neg_null"),
        other_corr=("", "_null"),
        other_columns=("", "_null"),
        trend=Trend(
            rank=0,
            text="rho_t",
            claim=1,
            panel="tilt",
            null="excess",
            per_layer=True,
            layer_column=True,
        ),
    ),
    Metric(
        "rho_mean",
        "layer",
        "rho_t over the mean tokens of the prompts",
        lambda r: _rise_fraction(r.psi_mean, r.round_off, (1,)),
        nulls=True,
        columns=("mean",),
        column="rho_meantok",
        other_corr=("",),
    ),
    Metric(
        "gamma_v2",
        "token",
        "|corr(x_t, v2_t)| of each token after layer t (paper Fig. 5)",
        lambda r: r.after_v2.reshape(-1),
        panel=Panel(
            "correlations",
            "$|corr(x_i, v_2)|$",
            "v2",
            "v2 (next real one)",
        ),
    ),
    Metric(
        "corr_proj",
        "token",
        "|corr(x_t, P x_t)|, P the orthogonal projection onto the principal subspace of F_t "
        "(attribute proj; paper Fig. 5)",
        _corr_proj,
        panel=Panel(
            "correlations",
            "$|corr(x_i, x_{i,proj})|$",
            "projection",
            "the token against its orthogonal projection onto {subspace}",
            null="plane",
        ),
    ),
    Metric(
        "corr_step",
        "token",
        "|corr(x_t, x_{t-1})| of each token: how little layer t turns it (1: not at all); "
        "successive iterates of the power method align as it converges",
        lambda r: np.abs(np.einsum("pnd,pnd->pn", r.rows_after, r.rows_before)).reshape(-1),
        columns=("mean",),
        panel=Panel(
            "correlations",
            "$|corr(x_i^t, x_i^{t-1})|$",
            "step",
            "each token against itself before the layer (1: the layer does not turn it; "
            "the power method's iterates align as it converges)",
            null=None,
        ),
    ),
    Metric(
        "token_distance",
        "state",
        "mean pairwise distance between the tokens of a prompt at each state, unit-normalised "
        "tokens unless normalize_distance = 0 (paper Fig. 4)",
        lambda r: r.token_distance(r.state, r.normalize_distance),
    ),
)


def by_name(name: str) -> Metric:
    """The metric called ``name``; a KeyError naming the known ones otherwise."""
    for m in METRICS:
        if m.name == name:
            return m
    raise KeyError(f"no metric {name!r}; the metrics are {[m.name for m in METRICS]}")


def trends() -> list[Metric]:
    """The metrics followed past one run, in the order of their trends' ``rank``."""
    return sorted((m for m in METRICS if m.trend is not None), key=lambda m: m.trend.rank)


def layer_values(ds: Any, metric: Metric, suffix: str = "") -> np.ndarray:
    """Per layer (ds's ``layer`` order) of one mode's view ``ds`` of ``propagation.nc``:
    the metric's value at the layer (its token or prompt mean; NaN where all are NaN),
    read from the variable ``metric.name + suffix`` (``"_null"`` for its null)."""
    da = ds[metric.name + suffix]
    values = np.asarray(da.values, dtype=float)
    if metric.per in ("token", "prompt"):
        # not specalign.output's nanmean: every rule reads this module, and an edit of
        # the figure and table writers must not rerun the kernels
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a layer of NaN only is NaN
            return np.nanmean(values, axis=da.get_axis_num(metric.per))
    return values


def _variants(m: Metric) -> tuple[str, ...]:
    return ("", *NULLS) if m.nulls else ("",)


def dims() -> dict[str, tuple[str, ...]]:
    """The dims of every metric variable of ``propagation.nc``, nulls included."""
    return {m.name + s: m.dims for m in METRICS for s in _variants(m)}


def descriptions() -> dict[str, str]:
    """The ``description`` of every metric variable of ``propagation.nc``: a metric
    measured against directions says which (v1_t, or each null)."""
    out = {}
    for m in METRICS:
        for s in _variants(m):
            against = NULLS[s] if s else _V1
            out[m.name + s] = f"{m.description}; {against}" if m.nulls else m.description
    return out


def other_variables() -> list[str]:
    """The variables (metric and suffix) also stored under the other correlation."""
    return [m.name + s for m in METRICS for s in m.other_corr]


class Column(NamedTuple):
    """A metric column of ``propagation.csv``."""

    #: the metric it is a column of
    metric: str
    #: the column's name
    name: str
    #: the variable of ``propagation.nc`` it reduces
    variable: str
    #: the dim it reduces over ("token" or "prompt"), "" for a value per layer
    over: str
    #: "mean" or "sd" over that dim
    reduction: str
    #: a column of the other correlation, which a file may lack (then no column)
    optional: bool = False


def table_columns(other: str) -> Iterator[Column]:
    """Every metric column of ``propagation.csv``, in order: the metrics' own, each
    null's, then the other correlation's (``other``)."""

    def over(m: Metric) -> str:
        return m.per if m.per in ("token", "prompt") else ""

    for m in METRICS:
        for red in m.columns:
            name = m.column_name + ("_sd" if red == "sd" else "")
            yield Column(m.name, name, m.name, over(m), red)
    for s in NULLS:
        for m in METRICS:
            if s in m.null_columns:
                yield Column(m.name, m.column_name + s, m.name + s, over(m), "mean")
    for group in ("", "_null"):
        for m in METRICS:
            if group in m.other_columns:
                var = f"{m.name}{group}_{other}"
                yield Column(m.name, var, var, over(m), "mean", optional=True)


def panels(figure: str) -> list[tuple[Metric, Panel]]:
    """The metrics a figure draws, in their order, with their panels."""
    return [(m, m.panel) for m in METRICS if m.panel is not None and m.panel.figure == figure]


def _trend_cell(m: Metric) -> str:
    """What a metric's trend puts into training.nc and layers.csv, for the docs' table."""
    if m.trend is None:
        return ""
    t = m.trend
    names = m.trend_variables + ([f"{m.headline}_layer"] if t.per_layer else [])
    cell = ", ".join(f"`{n}`" for n in names) + f" (claim {t.claim})"
    return cell + (f"; `{m.headline}_<mode>`" if t.layer_column else "")


def doc_table() -> str:
    """The metric table of docs/results.md, one row per metric in table order (written
    by ``python -m specalign.transformers.metric_table``; a test holds them equal);
    ``<other>`` in a column's name is the other correlation, ``pearson`` or ``cosine``."""
    rows = ["| metric (propagation.nc) | one value per | nulls | propagation.csv | figure row "
            "| trend (training.nc; layers.csv) | what it is |",
            "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    columns: dict[str, list[str]] = {}
    for c in table_columns("<other>"):
        columns.setdefault(c.metric, []).append(f"`{c.name}`")
    for m in METRICS:
        per = {"token": "token", "prompt": "prompt (mean token)", "layer": "layer",
               "state": "prompt, at each state"}[m.per]  # fmt: skip
        nulls = ", ".join(f"`{m.name}{s}`" for s in NULLS) if m.nulls else ""
        figure = f"{m.panel.figure}: {m.panel.short}" if m.panel else ""
        text = m.description.replace("|", "\\|")  # a bar inside a cell ends it
        rows.append(f"| `{m.name}` | {per} | {nulls} | {', '.join(columns.get(m.name, []))} "
                    f"| {figure} | {_trend_cell(m)} | {text} |")  # fmt: skip
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    import sys
    from pathlib import Path

    from specalign.doctables import replace_table

    docs = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/results.md")
    docs.write_text(replace_table(docs.read_text(), doc_table()))
    print(f"{docs}: metric table written ({len(METRICS)} metrics)")
