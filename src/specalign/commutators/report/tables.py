"""Reproduction tables: the paper's Section 10 numbers beside ours.

Input is ``experiments: dict[str, xr.Dataset]``, each a loaded
``results/commutators/{experiment}/diagnostics.nc``. A paper row is matched to a run
by the run's attributes, never by its name, and summarised over the active seeds of
that run (paper Sec. 10.1: diverged, unreached and undefined entries left out and
counted): both in :mod:`specalign.commutators.report.runs`. Whether ours differs from the
paper's number is decided by the rules of :mod:`specalign.commutators.report.claims`.

Every table is tidy: one row per published number, with columns ``quantity``,
``statistic``, the row's descriptors (layer, width, dataset, c, ...), ``ours``,
``ours_sd``, ``ci_low``/``ci_high`` (percentile bootstrap over seeds, 95 %), ``n``
(the seeds that entered), ``n_diverged``, ``n_unreached``, ``paper``, ``diff``
(ours - paper), ``rel_diff``, ``differs`` (the stated materiality rule,
:func:`specalign.commutators.report.claims.differs`) and ``matched`` (the run's experiment
name). A table none of whose experiments is in the run is ``None``; a row whose
experiment is absent is left out of the table (it is listed as "not run" in
:func:`specalign.commutators.report.reproduction.reproduction_markdown`, which shows every
published number).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from specalign.commutators.report import paper as P
from specalign.commutators.report.claims import at_rounding_level, differs, rule_for
from specalign.commutators.report.runs import (
    DATASET_NAMES,
    Experiments,
    Run,
    SeedValues,
    benchmark_runs,
    diverged_seeds,
    seed_summary,
    seed_values,
    synthetic_run,
)
from specalign.lazy import LazyModule

# imported when first used (specalign.lazy): the rule files import these modules for
# their names, and every snakemake call would pay these imports
pd = LazyModule("pandas")
xr = LazyModule("xarray")

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


# --- rows ---------------------------------------------------------------------------


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
        stats = seed_summary(sv, statistic, n_boot)
        n, n_div, n_unr = int(sv.values.size), sv.n_diverged, sv.n_unreached
    if ours is not None:
        stats["ours"] = float(ours)
    row.update(stats)
    row.update(n=n, n_diverged=n_div, n_unreached=n_unr, paper=paper)
    present = matched is not None
    row["diff"] = row["ours"] - paper if present else math.nan
    row["rel_diff"] = row["diff"] / abs(paper) if present and paper != 0 else math.nan
    rule = rule_for(quantity, statistic)
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
            div = diverged_seeds(ds) if ds is not None else np.zeros(0, bool)
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
    alive = int((~diverged_seeds(ds)).sum())
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
    return [(DATASET_NAMES[dataset], None)]


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
        da = da.isel(seed=~diverged_seeds(ds))
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
                    "at_rounding_level": at_rounding_level(every),
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
