"""One row per model and layer: the tidy table of the transformer study
(``results/tables/transformers/layers.csv``, the CLI's ``summary.csv``), and each
claim's verdict of one model in one line (what ``specalign analyze`` prints).

Li & Altafini (arXiv:2605.25619) read each layer t of a transformer as one step of the
power method on F_t = W_O W_V (Section 2). The table puts, per layer, what their claims
are about side by side: the leading eigenvalue lambda_1 of F_t (sorted by real part,
as :func:`specalign.transformers.report.tables.eigenvalue_table`) and whether it is real or
complex, the scale-free gap gap/|lambda_1| (claim 3), the spectral radius and the sign
of the eigenvalue attaining it, and, per propagation mode that runs the model's own
layers, the headline of each trend of the metric table
(:mod:`specalign.transformers.metric_table`: the excess of rho_t over its
random-direction null and the token-mean alignment gamma_t, claim 1). The same
columns of the model's random-weight twin sit beside them (``twin_*``), the chance
level of every trained-model value.

Everything is read from ``spectra.nc`` and ``propagation.nc`` through the table
builders of :mod:`specalign.transformers.report.tables`, which own the layer numbering
(layers 1..L, blocks 0-based): no value is computed twice.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import xarray as xr

from specalign.transformers.lineage import DESCRIPTION_ATTR
from specalign.transformers.load.contracts import MODES
from specalign.transformers.metric_table import Metric, trends
from specalign.transformers.report.claims import (
    gap_summary,
    rate_summary,
    steer_verdict,
    tilt_summary,
)
from specalign.transformers.report.paper import CLAIMS
from specalign.transformers.report.tables import (
    eigenvalue_table,
    propagation_table,
    random_twin,
    steering_table,
)

__all__ = [
    "LAYER_MODES",
    "claim_lines",
    "claim_verdicts",
    "describe_column",
    "layer_table_caption",
    "layer_table",
    "model_layer_table",
    "value_columns",
]

#: The propagation modes that run the model's own layers (one value per layer t = 1..L);
#: the prolonged ones run past the model's depth and have no row of their own here.
LAYER_MODES: tuple[str, ...] = tuple(m for m in MODES if not m.startswith("prolonged"))

#: Mode of the one-line verdicts of claims (1) and (2).
_TILT_MODE = "simplified_real"
_RATE_MODE = "prolonged_full"

_KEYS = ["model", "family", "random", "twin", "weights", "layer", "block"]


def _spectra_columns(spectra: xr.Dataset) -> pd.DataFrame:
    """Layer, block and the eigenvalue columns of one model, from ``spectra.nc``."""
    eig = eigenvalue_table(spectra, "", n_eigs=1)
    return pd.DataFrame(
        {
            "layer": eig["layer"].astype(int),
            "block": eig["block"].astype(int),
            "lambda1_real": eig["re_lambda_1"].astype(float),
            "lambda1_imag": eig["im_lambda_1"].astype(float),
            "lambda1_kind": np.where(eig["lambda1_is_complex"], "complex", "real"),
            "rel_gap": eig["rel_gap"].astype(float),
            "spectral_radius": eig["spectral_radius"].astype(float),
            "radius_sign": np.where(eig["radius_is_negative"], -1, 1),
        }
    )


def _layer_trends() -> list[Metric]:
    """The trends of the metric table that have a column per mode here, in rank order."""
    return [m for m in trends() if m.trend.layer_column]


def _propagation_columns(prop: xr.Dataset) -> pd.DataFrame:
    """Per layer and mode of :data:`LAYER_MODES`: each trend's headline (a metric's
    layer value, or that minus its random-direction null), read from
    ``propagation.csv``'s columns."""
    table = propagation_table(prop, "")
    out: pd.DataFrame | None = None
    for mode in LAYER_MODES:
        sub = table[table["mode"] == mode]
        if sub.empty:
            continue
        columns = {"layer": sub["layer"].astype(int).to_numpy()}
        for m in _layer_trends():
            value = sub[m.column_name]
            if m.trend.null == "excess":
                value = value - sub[m.column_name + "_null"]
            columns[f"{m.headline}_{mode}"] = value.to_numpy(float)
        cols = pd.DataFrame(columns)
        out = cols if out is None else out.merge(cols, on="layer", how="outer")
    return out if out is not None else pd.DataFrame({"layer": pd.Series([], dtype=int)})


def model_layer_table(
    model: str, spectra: xr.Dataset, prop: xr.Dataset | None = None
) -> pd.DataFrame:
    """One model's rows: layers 1..L with their block, the spectrum of F_t and, when
    ``prop`` is given, rho - null and gamma per mode (no twin columns)."""
    df = _spectra_columns(spectra)
    if prop is not None:
        df = df.merge(_propagation_columns(prop), on="layer", how="left")
    df.insert(0, "model", model)
    df.insert(1, "family", str(spectra.attrs.get("family", "")))
    # a file written before results described their model has no description: ""
    df.insert(2, "weights", str(spectra.attrs.get(DESCRIPTION_ATTR, "")))
    return df


#: What each fixed column holds (the per-mode and twin columns are described by
#: :func:`describe_column` from these).
_DESCRIPTIONS: dict[str, str] = {
    "model": "model name in the configuration",
    "family": "model family (config.json model_type)",
    "random": "whether the model has random weights (a random-weight twin)",
    "twin": "the model's random-weight twin (the random model whose like: names it), or empty",
    "weights": "what the model is, from its manifest: hub id and commit, package, local "
    "folder, random weights with whose configuration, or trained here with the series, "
    "family and step of the checkpoint",
    "layer": "layer t, 1..L as the paper counts them",
    "block": "block (distinct set of weights, 0-based) that layer t uses",
    "lambda1_real": "Re lambda_1 of F_t = W_O W_V (eigenvalues sorted by real part)",
    "lambda1_imag": "Im lambda_1 of F_t",
    "lambda1_kind": "whether lambda_1 is real or complex",
    "rel_gap": "spectral gap / |lambda_1| (gap = Re l1 - Re l2, or Re l1 - Re l3 for a "
    "complex l1; claim 3)",
    "spectral_radius": "spectral radius max |lambda| of F_t",
    "radius_sign": "sign of the real part of the eigenvalue attaining the spectral radius "
    "(-1: a negative eigenvalue dominates |lambda|)",
}


def describe_column(name: str) -> str:
    """What a column of :func:`layer_table` holds."""
    if name.startswith("twin_"):
        return "the random-weight twin's " + describe_column(name[len("twin_") :])
    for mode in LAYER_MODES:
        for m in _layer_trends():
            if name == f"{m.headline}_{mode}":
                return (
                    f"{m.headline_text} at layer t, mode {mode} ({m.description}; "
                    f"claim {m.trend.claim})"
                )
    return _DESCRIPTIONS.get(name, name)


def layer_table_caption() -> str:
    """The caption of ``layers.csv``/``layers.md``."""
    labels = " and ".join(m.label for m in _layer_trends())
    return (
        "Every model and layer (layers 1..L, blocks 0-based): lambda_1 of F_t = W_O W_V and "
        f"its kind, gap/|lambda_1|, the spectral radius and its sign, {labels} per "
        "propagation mode, and the random-weight twin's values beside them (twin_*)."
    )


def value_columns(df: pd.DataFrame) -> list[str]:
    """The per-layer value columns of a table (everything but keys and twin columns)."""
    return [c for c in df.columns if c not in _KEYS and not c.startswith("twin_")]


def layer_table(
    spectra_by_model: Mapping[str, xr.Dataset],
    prop_by_model: Mapping[str, xr.Dataset | None],
    like: Mapping[str, str],
) -> pd.DataFrame:
    """Every model's rows (sorted by model, then layer), with its random-weight twin's
    values beside them as ``twin_<column>`` (NaN when it has none, and on the rows of
    random models, which are twins themselves).

    ``like`` maps each random model to the model it copies
    (:func:`specalign.transformers.settings.random_likes`); the twin of ``m`` is the random
    model whose ``like:`` names it (:func:`specalign.transformers.report.tables.random_twin`).
    """
    names = sorted(spectra_by_model)
    own = {m: model_layer_table(m, spectra_by_model[m], prop_by_model.get(m)) for m in names}
    frames = []
    for m in names:
        df = own[m]
        values = value_columns(df)
        twin = random_twin(m, like, names) if m not in like else None
        df.insert(2, "random", m in like)
        df.insert(3, "twin", twin or "")
        if twin is not None:
            tw = own[twin][["layer", *[c for c in values if c in own[twin]]]]
            df = df.merge(
                tw.add_prefix("twin_").rename(columns={"twin_layer": "layer"}),
                on="layer",
                how="left",
            )
        for c in values:
            if f"twin_{c}" not in df:
                df[f"twin_{c}"] = "" if df[c].dtype == object else np.nan
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=_KEYS)
    return pd.concat(frames, ignore_index=True)


def claim_verdicts(
    spectra: xr.Dataset,
    prop: xr.Dataset | None,
    steer: xr.Dataset | None,
    twin_prop: xr.Dataset | None = None,
) -> dict[int, str]:
    """Claims (1)-(4) of :data:`specalign.transformers.report.paper.CLAIMS` for one model, each
    verdict in one line, under the rules of :mod:`specalign.transformers.report.claims`.

    (1) the tilt in the simplified model with the real attention (beside the twin's
    rho - null when ``twin_prop`` is given), (2) gamma -> 1 in the prolonged run under
    full attention, (3) the spectral gaps, (4) steering with the first method at the
    largest c.
    """
    out: dict[int, str] = {}
    s = tilt_summary(prop, _TILT_MODE) if prop is not None else None
    if s is None:
        out[1] = f"not measured (no {_TILT_MODE} mode in propagation.nc)"
    else:
        text = f"{_TILT_MODE}: {s['verdict']}; rho - null {s['excess']:.3f}"
        t = tilt_summary(twin_prop, _TILT_MODE) if twin_prop is not None else None
        text += f" (random twin {t['excess']:.3f})" if t is not None else " (no random twin)"
        out[1] = text
    r = rate_summary(prop, spectra, _RATE_MODE) if prop is not None else None
    out[2] = (
        f"{_RATE_MODE}: {r['verdict']}" + (f" ({r['note']})" if r["note"] else "")
        if r is not None
        else "not measured (no prolonged run: propagation.prolonged_layers does not exceed "
        "the depth)"
    )
    out[3] = gap_summary(spectra)["verdict"]
    rows = steering_table(steer, "").to_dict("records") if steer is not None else []
    if rows:
        method = rows[0]["method"]
        row = max((x for x in rows if x["method"] == method), key=lambda x: x["c"])
        out[4] = f"{method}, c = {row['c']:g}: {steer_verdict(row)}"
    else:
        out[4] = "not measured (no steering.nc)"
    return out


def claim_lines(verdicts: Mapping[int, str]) -> list[str]:
    """``claim k (heading): verdict`` per claim, in claim order."""
    return [f"claim {k} ({CLAIMS[k].heading}): {v}" for k, v in sorted(verdicts.items())]
