"""A metric is declared once (specalign/transformers/metric_table.py), and every reader
takes it from there: the stream that computes it, the descriptions in propagation.nc,
the other correlation's copies, propagation.csv's columns, the correlations figure and
the table in docs/results.md. Each test runs over every metric of the table, so a metric
added there is checked here without a line of its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_shortcuts import ETA, MODELS

from specalign.doctables import replace_table
from specalign.transformers import metric_table
from specalign.transformers.measure import metrics
from specalign.transformers.measure import propagate as prop
from specalign.transformers.report import tables
from specalign.transformers.report.figures import propagation as figures
from specalign.transformers.variables import PROPAGATION, undescribed

#: propagation.csv's columns: a contract (files written before read the same), which
#: the table's order must keep; a new metric's columns take their place in it
CSV_COLUMNS = [
    "model", "mode", "layer", "block", "corr", "gamma", "gamma_sd", "gamma_meantok", "psi",
    "psi_sd", "rho", "rho_meantok", "corr_step", "gamma_null", "psi_null", "rho_null",
    "gamma_neg_null", "rho_neg_null", "gamma_pearson", "rho_pearson", "gamma_null_pearson",
    "rho_null_pearson",
]  # fmt: skip


@pytest.fixture(scope="module")
def run():
    mw = MODELS["distinct_causal"]()
    hidden = np.random.default_rng(3).standard_normal((mw.n_layers + 1, 2, 5, mw.d_model))
    cfg = {"prolonged_layers": mw.n_layers + 2, "corr": "cosine", "null_draws": 3}
    states = prop.propagation_states(mw, hidden, ETA, cfg)
    return states, prop.propagation_dataset(mw, states, cfg, seed=1)


def test_every_metric_is_computed_with_its_dims_nulls_and_description(run):
    _, ds = run
    for m in metric_table.METRICS:
        names = [m.name] + ([m.name + s for s in metric_table.NULLS] if m.nulls else [])
        for name in names:
            assert name in ds, f"{name} is declared but not computed"
            assert ds[name].dims == m.dims, name
            assert ds[name].attrs["description"] == PROPAGATION[name], name
            assert PROPAGATION[name].startswith(m.description), name
        for suffix in m.other_corr:
            assert f"{m.name}{suffix}_pearson" in ds, (m.name, suffix)
    copies = {f"{v}_pearson" for v in metric_table.other_variables()}
    computed = {str(v) for v in ds.data_vars if not str(v).startswith("lambda")} - copies
    assert computed == set(metric_table.dims()), "a variable of propagation.nc is not declared"
    assert not undescribed(ds)


def test_each_layer_metric_has_a_value_per_layer_of_every_mode(run):
    states, ds = run
    for mode, S in states.items():
        T = S.shape[0] - 1
        sub = ds.sel(mode=mode)
        for m in metric_table.METRICS:
            values = sub[m.name].values
            if m.per == "state":
                assert np.isfinite(values[: T + 1]).all(), (mode, m.name)
            else:
                assert np.isfinite(values[:T]).all(), (mode, m.name)
                assert np.isnan(values[T:]).all(), (mode, m.name)  # past its depth


def test_propagation_csv_columns_are_the_tables_in_order(run):
    _, ds = run
    df = tables.propagation_table(ds, "m")
    assert list(df.columns) == CSV_COLUMNS
    want = [c.name for c in metric_table.table_columns("pearson")]
    assert list(df.columns)[5:] == want
    # each column is its reduction of its variable
    first = ds.sel(mode="simplified_real")
    row = df[df["mode"] == "simplified_real"].iloc[0]
    for c in metric_table.table_columns("pearson"):
        values = first[c.variable].isel(layer=0).values
        want = (np.nanstd if c.reduction == "sd" else np.nanmean)(values)
        assert row[c.name] == pytest.approx(float(want), rel=1e-12, abs=1e-15), c.name


def test_a_file_without_the_other_correlation_has_no_such_columns(run):
    _, ds = run
    lean = ds.drop_vars([f"{v}_pearson" for v in metric_table.other_variables()])
    df = tables.propagation_table(lean, "m")
    assert [c for c in df.columns if c.endswith("_pearson")] == []
    with pytest.raises(KeyError):  # a metric of its own is never left out silently
        tables.propagation_table(ds.drop_vars("psi"), "m")


def test_the_correlations_figure_has_a_row_per_declared_panel(run):
    _, ds = run
    fig, caption = figures.correlations_figure(ds, "m")
    panels = metric_table.panels("correlations")
    assert len(fig.axes) == len(panels) >= 4
    assert [ax.get_title() for ax in fig.axes] == [p.title for _, p in panels]
    sub = ds.sel(mode="simplified_real")
    for m, panel in panels:
        mean = float(np.nanmean(sub[m.name].mean("token", skipna=True)))
        assert f"{panel.short} {mean:.3f}" in caption, m.name
    assert caption.count("Top: ") == 1 and "bottom: " in caption


def test_corr_step_is_one_where_a_layer_leaves_the_tokens_and_the_cosine_otherwise():
    """corr_step against its definition: a layer that only rescales the tokens turns
    none (1 to round-off); otherwise |cos| of each token before and after."""
    rng = np.random.default_rng(5)
    d = 16
    X, Y = rng.standard_normal((2, 2, 3, d))
    kernel = metric_table.by_name("corr_step").kernel
    np.testing.assert_allclose(kernel(_reading(X, 3.0 * X)), 1.0, rtol=0, atol=1e-15)
    want = [abs(x @ y) / np.linalg.norm(x) / np.linalg.norm(y) for x, y in
            zip(X.reshape(-1, d), Y.reshape(-1, d), strict=True)]  # fmt: skip
    np.testing.assert_allclose(kernel(_reading(X, Y)), want, rtol=1e-13)


def _reading(before: np.ndarray, after: np.ndarray) -> metric_table.LayerReading:
    """A reading with only the unit rows (cosine) of the states before and after."""
    empty = np.zeros((1, *before.shape[:2]))
    return metric_table.LayerReading(
        empty, empty, empty[:, :, 0], empty[:, :, 0], 0.0,
        rows_before=metrics._unit_rows(before, "cosine"),
        rows_after=metrics._unit_rows(after, "cosine"),
    )  # fmt: skip


def test_the_docs_table_is_the_metric_table_s(repo: Path) -> None:
    text = (repo / "docs" / "results.md").read_text()
    assert replace_table(text, metric_table.doc_table()) == text, (
        "docs/results.md's metric table differs from the code's: "
        "run python -m specalign.transformers.metric_table"
    )
    rows = metric_table.doc_table().splitlines()[2:]
    assert [r.split("`")[1] for r in rows] == [m.name for m in metric_table.METRICS]


def test_a_name_not_in_the_table_is_refused_naming_the_known_ones():
    with pytest.raises(KeyError, match="gamma"):
        metric_table.by_name("gama")


def test_the_trends_have_one_order():
    """Their rank orders the columns of training.csv and layers.csv and the bands'
    draws: two trends of one rank would leave that order to the table's."""
    ranks = [m.trend.rank for m in metric_table.trends()]
    assert len(ranks) == len(set(ranks)) and ranks == sorted(ranks)
    names = [v for m in metric_table.trends() for v in m.trend_variables]
    assert len(names) == len(set(names)), "two trends write one variable of training.nc"
