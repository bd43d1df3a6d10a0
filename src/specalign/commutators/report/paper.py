"""Published numbers of Nyström, arXiv:2608.22910, Section 10, as plain data.

Every constant below is copied by hand from the paper (the rendering in
``shared/papers/003_c5b6abead6930cc2.txt``, lines ~504-640) and ``SOURCES`` names the
table or section it comes from. Values are written exactly as printed, so ``repr`` of a
float gives back the printed digits (minus trailing zeros); :func:`iter_numbers`
flattens all of them for the reproduction document and its test.

Variable names inside the keys are those of the ``diagnostics.nc`` contract
(``G_D``, ``G_Q``, ``G_S``, ``chi``, ``rho_tr_imb``, ``I_tr_imb``, ``e_tr`` ...), and
checkpoint names are its checkpoint labels (``"r<=1e-3"``, ``"t=100"``), so a table
builder can look a paper value up with the same key it uses to read the data.

Nothing here is computed or adjusted: where the paper looks internally inconsistent
or ambiguous, the comment says so, and the number is left as printed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

# --- conventions shared by the tables ---------------------------------------------

#: Principal matched-risk checkpoint of the synthetic experiments (Sec. 10.1: "All
#: synthetic seeds reach 1e-3, which is therefore the principal matched-risk level").
MATCHED_RISK = "r<=1e-3"
#: Earlier matched-risk checkpoint of Tables 2 and 4.
EARLY_RISK = "r<=1e-1"
#: Common final time of the benchmark and rescaling comparisons (Sec. 10.1, 10.6).
FINAL_TIME = "t=100"

#: Synthetic depth experiment (Sec. 10.1, Table 1): hidden layers, width 32, 20 seeds.
DEPTHS: tuple[int, ...] = (2, 4, 6)
DEPTH_WIDTH = 32
#: Synthetic capacity experiment (Sec. 10.4, Tables 3-4): four hidden layers; the
#: width-32 row reuses the 20-seed depth ensemble, widths 16 and 64 have 10 seeds.
CAPACITY_HIDDEN = 4
WIDTHS: tuple[int, ...] = (16, 32, 64)
#: Benchmarks (Sec. 10.1, 10.5): four hidden layers, width 32, 20 seeds, t = 100.
BENCHMARK_HIDDEN = 4
BENCHMARK_WIDTH = 32
BENCHMARK_DATASETS: tuple[str, ...] = ("concrete", "energy")
#: Function-preserving rescaling (Sec. 10.6): three hidden layers, width 32, ten
#: paired seeds, W1 -> c W1 and W2 -> W2 / c at initialisation.
RESCALE_HIDDEN = 3
RESCALE_WIDTH = 32
RESCALE_CS: tuple[float, ...] = (0.5, 1.0, 2.0)
#: The "middle layer" of the rescaling experiment (Table 6, Figure 5).
RESCALE_LAYER = 1

# --- Table 1: seeds reaching each relative-risk level ------------------------------

TABLE1_LEVELS: tuple[str, ...] = ("r<=1e-2", "r<=1e-3", "r<=1e-4")
#: (experiment, dataset, H, width) -> (seeds, n(r<=1e-2), n(r<=1e-3), n(r<=1e-4)).
#: The "synthetic capacity" width-32 ensemble is the "synthetic depth" H=4 row.
TABLE1: dict[tuple[str, str, int, int], tuple[int, int, int, int]] = {
    ("synthetic depth", "synthetic", 2, 32): (20, 20, 20, 13),
    ("synthetic depth", "synthetic", 4, 32): (20, 20, 20, 20),
    ("synthetic depth", "synthetic", 6, 32): (20, 20, 20, 19),
    ("synthetic capacity", "synthetic", 4, 16): (10, 10, 10, 4),
    ("synthetic capacity", "synthetic", 4, 64): (10, 10, 10, 10),
    ("Concrete", "concrete", 4, 32): (20, 7, 0, 0),
    ("Energy", "energy", 4, 32): (20, 15, 0, 0),
}

# --- Table 2: H=4, width 32, normalised defects at two matched risks ----------------

#: (quantity, layer, checkpoint) -> seed mean on the diagnostic sample.
TABLE2: dict[tuple[str, int, str], float] = {
    ("G_D", 0, "r<=1e-1"): 0.4486,
    ("G_D", 0, "r<=1e-3"): 0.4486,
    ("G_D", 1, "r<=1e-1"): 0.2418,
    ("G_D", 1, "r<=1e-3"): 0.2418,
    ("G_D", 2, "r<=1e-1"): 0.2378,
    ("G_D", 2, "r<=1e-3"): 0.2381,
    ("G_D", 3, "r<=1e-1"): 0.2368,
    ("G_D", 3, "r<=1e-3"): 0.2362,
    ("G_Q", 0, "r<=1e-1"): 0.0446,
    ("G_Q", 0, "r<=1e-3"): 0.0805,
    ("G_Q", 1, "r<=1e-1"): 0.0362,
    ("G_Q", 1, "r<=1e-3"): 0.0347,
    ("G_Q", 2, "r<=1e-1"): 0.0327,
    ("G_Q", 2, "r<=1e-3"): 0.0318,
    ("G_Q", 3, "r<=1e-1"): 0.0332,
    ("G_Q", 3, "r<=1e-3"): 0.0331,
    ("G_S", 0, "r<=1e-1"): 0.0134,
    ("G_S", 0, "r<=1e-3"): 0.0199,
    ("G_S", 1, "r<=1e-1"): 0.0306,
    ("G_S", 1, "r<=1e-3"): 0.0306,
    ("G_S", 2, "r<=1e-1"): 0.0329,
    ("G_S", 2, "r<=1e-3"): 0.0329,
    ("G_S", 3, "r<=1e-1"): 0.0278,
    ("G_S", 3, "r<=1e-3"): 0.0275,
}

# --- Table 3: width dependence at r <= 1e-3 (H = 4) ---------------------------------

#: width -> {(quantity, layer): seed mean}. The width-32 row equals Table 2 at 1e-3
#: (same 20-seed ensemble); widths 16 and 64 are 10-seed ensembles.
TABLE3: dict[int, dict[tuple[str, int], float]] = {
    16: {
        ("G_D", 0): 0.3610,
        ("G_Q", 1): 0.0635,
        ("G_S", 1): 0.0555,
        ("chi", 1): 0.352,
        ("chi", 2): 0.348,
        ("rho_tr_imb", 1): -0.663,
    },
    32: {
        ("G_D", 0): 0.4486,
        ("G_Q", 1): 0.0347,
        ("G_S", 1): 0.0306,
        ("chi", 1): 0.296,
        ("chi", 2): 0.290,
        ("rho_tr_imb", 1): -0.712,
    },
    64: {
        ("G_D", 0): 0.4685,
        ("G_Q", 1): 0.0185,
        ("G_S", 1): 0.0170,
        ("chi", 1): 0.314,
        ("chi", 2): 0.270,
        ("rho_tr_imb", 1): -0.649,
    },
}

# --- Table 4: localised input-layer behaviour (H = 4, layer 0, k = 1, beta = 0) -----

TABLE4_LAYER = 0
TABLE4_KB: tuple[int, int] = (1, 0)
#: Key of the "median paired factor" column: per-seed q(r<=1e-3) / q(r<=1e-1).
TABLE4_FACTOR = ("q_Q_av", "r<=1e-3 / r<=1e-1")
#: width -> {(quantity, checkpoint): value}; seed means, except the median factor.
TABLE4: dict[int, dict[tuple[str, str], float]] = {
    16: {
        ("q_Q_av", "r<=1e-1"): 4.61e-3,
        ("q_Q_av", "r<=1e-3"): 9.15e-3,
        TABLE4_FACTOR: 2.09,
        ("q_D", "r<=1e-1"): 0.1949,
        ("q_D", "r<=1e-3"): 0.1960,
    },
    32: {
        ("q_Q_av", "r<=1e-1"): 1.88e-3,
        ("q_Q_av", "r<=1e-3"): 3.41e-3,
        TABLE4_FACTOR: 2.03,
        ("q_D", "r<=1e-1"): 0.2287,
        ("q_D", "r<=1e-3"): 0.2287,
    },
    64: {
        ("q_Q_av", "r<=1e-1"): 7.63e-4,
        ("q_Q_av", "r<=1e-3"): 1.24e-3,
        TABLE4_FACTOR: 1.79,
        ("q_D", "r<=1e-1"): 0.2395,
        ("q_D", "r<=1e-3"): 0.2395,
    },
}

# --- Table 5: benchmarks at t = 100 -------------------------------------------------

#: dataset -> {(quantity, layer): twenty-seed mean}; sources on the training sample.
TABLE5: dict[str, dict[tuple[str, int], float]] = {
    "concrete": {
        ("chi", 1): 0.327,
        ("rho_tr_imb", 1): -0.722,
        ("chi", 2): 0.347,
        ("rho_tr_imb", 2): -0.689,
        ("e_imb", 1): 0.517,
        ("e_imb", 2): 0.539,
    },
    "energy": {
        ("chi", 1): 0.310,
        ("rho_tr_imb", 1): -0.678,
        ("chi", 2): 0.289,
        ("rho_tr_imb", 2): -0.713,
        ("e_imb", 1): 0.480,
        ("e_imb", 2): 0.516,
    },
}

# --- Table 6: function-preserving rescaling, layer 1 at t = 100 (H = 3) -------------

#: c -> {(quantity, layer): ten-seed mean}. The four energy fractions of each row sum
#: to 1 within rounding (1.0003, 1.0000, 0.9991).
TABLE6: dict[float, dict[tuple[str, int], float]] = {
    0.5: {
        ("rho_tr_imb", 1): -0.997,
        ("I_tr_imb", 1): -0.994,
        ("chi", 1): 0.037,
        ("e_tr", 1): 0.4970,
        ("e_imb", 1): 0.5000,
        ("e_fluc", 1): 0.0007,
        ("e_gate", 1): 0.0026,
    },
    1.0: {
        ("rho_tr_imb", 1): -0.704,
        ("I_tr_imb", 1): -0.492,
        ("chi", 1): 0.296,
        ("e_tr", 1): 0.2410,
        ("e_imb", 1): 0.4920,
        ("e_fluc", 1): 0.0580,
        ("e_gate", 1): 0.2090,
    },
    2.0: {
        ("rho_tr_imb", 1): -0.091,
        ("I_tr_imb", 1): -0.005,
        ("chi", 1): 0.477,
        ("e_tr", 1): 0.0021,
        ("e_imb", 1): 0.5010,
        ("e_fluc", 1): 0.1070,
        ("e_gate", 1): 0.3890,
    },
}

# --- numbers quoted in the text -----------------------------------------------------

#: Sec. 10.2: input-layer (layer 0) seed means at r<=1e-3, by depth H (width 32).
TEXT_INPUT_LAYER: dict[int, dict[str, float]] = {
    2: {"G_D": 0.4486, "G_Q": 0.0646, "G_S": 0.0211},
    4: {"G_D": 0.4486, "G_Q": 0.0805, "G_S": 0.0199},
    6: {"G_D": 0.4487, "G_Q": 0.0793, "G_S": 0.0201},
}
#: Sec. 10.2: H = 4 input-layer means at the deeper level r<=1e-4.
TEXT_INPUT_LAYER_H4_DEEP_CHECKPOINT = "r<=1e-4"
TEXT_INPUT_LAYER_H4_DEEP: dict[str, float] = {"G_D": 0.4487, "G_Q": 0.0791, "G_S": 0.0211}
#: Sec. 10.3: range of the seed-mean rho_tr_imb over the two interior layers (1, 2)
#: of H = 4. The checkpoint is not stated; its lower end equals Table 3's rho_1 at
#: r<=1e-3, so r<=1e-3 is assumed.
TEXT_RHO_INTERIOR_H4: tuple[float, float] = (-0.712, -0.703)
#: Sec. 10.5: final-time risks "mean +/- spread" (spread not stated as sd or s.e.),
#: dataset -> {"E_train" | "E_test": (mean, spread)}.
TEXT_BENCHMARK_RISK: dict[str, dict[str, tuple[float, float]]] = {
    "concrete": {"E_train": (0.0183, 0.0018), "E_test": (0.0780, 0.0117)},
    "energy": {"E_train": (0.0061, 0.0024), "E_test": (0.0181, 0.0049)},
}
#: Sec. 10.5: layer-1 normalised defects on the test sample at t = 100.
TEXT_BENCHMARK_LAYER1: dict[str, dict[str, float]] = {
    "concrete": {"G_D": 0.2365, "G_Q": 0.0320, "G_S": 0.0281},
    "energy": {"G_D": 0.2397, "G_Q": 0.0327, "G_S": 0.0302},
}
#: Sec. 10.5: fluctuation energy fraction e_fluc at t = 100, dataset -> {layer: value}.
TEXT_BENCHMARK_E_FLUC: dict[str, dict[int, float]] = {
    "concrete": {1: 0.0345, 2: 0.0116},
    "energy": {1: 0.0599, 2: 0.0227},
}
#: Sec. 10.7: identity residual maxima, variable -> (max residual, evaluations).
TEXT_RESIDUALS: dict[str, tuple[float, int]] = {
    "res_recursion": (1.25e-15, 12452),
    "res_transport": (6.54e-13, 24904),
}

#: Where each constant comes from.
SOURCES: dict[str, str] = {
    "TABLE1": "Table 1 (Sec. 10.1)",
    "TABLE2": "Table 2 (Sec. 10.2)",
    "TABLE3": "Table 3 (Sec. 10.4)",
    "TABLE4": "Table 4 (Sec. 10.4)",
    "TABLE5": "Table 5 (Sec. 10.5)",
    "TABLE6": "Table 6 (Sec. 10.6)",
    "TEXT_INPUT_LAYER": "Sec. 10.2, text",
    "TEXT_INPUT_LAYER_H4_DEEP": "Sec. 10.2, text",
    "TEXT_RHO_INTERIOR_H4": "Sec. 10.3, display",
    "TEXT_BENCHMARK_RISK": "Sec. 10.5, display",
    "TEXT_BENCHMARK_LAYER1": "Sec. 10.5, text",
    "TEXT_BENCHMARK_E_FLUC": "Sec. 10.5, text",
    "TEXT_RESIDUALS": "Sec. 10.7, text",
}


class PaperNumber(NamedTuple):
    """One printed number: where it is, what it is, and its value."""

    source: str
    label: str
    value: float | int


def iter_numbers() -> Iterator[PaperNumber]:
    """Yield every published number held in this module, one at a time.

    Descriptor columns (H, width, c) are not yielded: they identify rows and are not
    results. Table 1's "seeds" column is yielded, since it is a reported count.
    """
    src = SOURCES
    for (exp, _ds, h, w), values in TABLE1.items():
        for name, v in zip(("seeds",) + TABLE1_LEVELS, values, strict=True):
            yield PaperNumber(src["TABLE1"], f"{exp} H={h} width={w}: {name}", v)
    for (q, layer, ck), v in TABLE2.items():
        yield PaperNumber(src["TABLE2"], f"{q} layer {layer} at {ck}", v)
    for w, row in TABLE3.items():
        for (q, layer), v in row.items():
            yield PaperNumber(src["TABLE3"], f"width {w}: {q} layer {layer}", v)
    for w, row in TABLE4.items():
        for (q, ck), v in row.items():
            yield PaperNumber(src["TABLE4"], f"width {w}: {q} at {ck}", v)
    for ds, row in TABLE5.items():
        for (q, layer), v in row.items():
            yield PaperNumber(src["TABLE5"], f"{ds}: {q} layer {layer}", v)
    for c, row in TABLE6.items():
        for (q, layer), v in row.items():
            yield PaperNumber(src["TABLE6"], f"c={c}: {q} layer {layer}", v)
    for h, row in TEXT_INPUT_LAYER.items():
        for q, v in row.items():
            yield PaperNumber(src["TEXT_INPUT_LAYER"], f"H={h}: {q} layer 0 at r<=1e-3", v)
    for q, v in TEXT_INPUT_LAYER_H4_DEEP.items():
        yield PaperNumber(src["TEXT_INPUT_LAYER_H4_DEEP"], f"H=4: {q} layer 0 at r<=1e-4", v)
    for end, v in zip(("min", "max"), TEXT_RHO_INTERIOR_H4, strict=True):
        yield PaperNumber(src["TEXT_RHO_INTERIOR_H4"], f"H=4 interior rho_tr_imb {end}", v)
    for ds, row in TEXT_BENCHMARK_RISK.items():
        for q, (mean, spread) in row.items():
            yield PaperNumber(src["TEXT_BENCHMARK_RISK"], f"{ds}: {q} mean", mean)
            yield PaperNumber(src["TEXT_BENCHMARK_RISK"], f"{ds}: {q} spread", spread)
    for ds, row in TEXT_BENCHMARK_LAYER1.items():
        for q, v in row.items():
            yield PaperNumber(src["TEXT_BENCHMARK_LAYER1"], f"{ds}: {q} layer 1 (test)", v)
    for ds, row in TEXT_BENCHMARK_E_FLUC.items():
        for layer, v in row.items():
            yield PaperNumber(src["TEXT_BENCHMARK_E_FLUC"], f"{ds}: e_fluc layer {layer}", v)
    for var, (res, count) in TEXT_RESIDUALS.items():
        yield PaperNumber(src["TEXT_RESIDUALS"], f"{var}: max residual", res)
        yield PaperNumber(src["TEXT_RESIDUALS"], f"{var}: evaluations", count)


def format_value(value: float | int) -> str:
    """The printed form of a paper number: the shortest decimal that reads back to it.

    For a value typed in as printed this is the printed text without trailing zeros
    (``0.2410`` -> ``'0.241'``, ``4.61e-3`` -> ``'0.00461'``, ``1.25e-15`` ->
    ``'1.25e-15'``); integers print as integers.
    """
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return repr(float(value))
