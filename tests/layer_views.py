"""Every per-layer view of one model's files, for the one-numbering checks (issue 17).

Each view is a DataFrame with a row per layer t = 1..L it holds: ``layer``, ``block``
(the block that layer uses) and values that another view holds too, under a shared
name, so that two views merged on ``layer`` can be checked row by row.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np
import pandas as pd
import xarray as xr

from specalign.transformers.report import tables as tt


def _token_mean(da: xr.DataArray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.asarray(np.nanmean(da.values, axis=da.get_axis_num("token")), dtype=float)


def layer_views(
    spectra: xr.Dataset,
    prop: xr.Dataset,
    steer: xr.Dataset | None = None,
    tables: Mapping[str, pd.DataFrame] | None = None,
    same_prompts: bool = True,
) -> dict[str, pd.DataFrame]:
    """The views of spectra.nc, propagation.nc (its simplified_real mode), steering.nc
    and, given ``tables`` ({"eigenvalues": df, "propagation": df}), the two tables.

    ``same_prompts``: steering.nc and propagation.nc ran the same prompts (a pipeline
    run), so the steered model's unchanged layers have propagation's gamma."""
    per = tt.per_layer_spectra(spectra)
    views = {
        "spectra.nc": pd.DataFrame(
            {
                "layer": per["layer"].values.astype(int),
                "block": per["layer_block"].values.astype(int),
                "lambda_v1": per["lambda_v1"].values,
                "re_lambda_1": per["eigenvalues_real"].values[:, 0],
            }
        )
    }
    real = prop.sel(mode="simplified_real")
    depth = int(spectra.sizes["layer"])
    views["propagation.nc"] = pd.DataFrame(
        {
            "layer": prop["layer"].values.astype(int),
            "block": prop["layer_block"].values.astype(int),
            "lambda_v1": prop["lambda_v1"].values,
            # past the model's depth the simplified mode has no layer
            "gamma": np.where(prop["layer"].values <= depth, _token_mean(real["gamma"]), np.nan),
        }
    )
    if steer is not None:
        gamma = _token_mean(steer["gamma_layers"].isel(method=0, c=0))
        gamma[-1] = np.nan  # the steered layer differs from the original model's
        views["steering.nc"] = pd.DataFrame(
            {
                "layer": steer["layer"].values.astype(int),
                "block": steer["layer_block"].values.astype(int),
                "gamma" if same_prompts else "gamma_steering": gamma,
            }
        )
    if tables is not None:
        eig = tables["eigenvalues"]
        views["eigenvalues.csv"] = eig[["layer", "block", "re_lambda_1"]].copy()
        p = tables["propagation"]
        p = p[p["mode"] == "simplified_real"]
        views["propagation.csv"] = pd.DataFrame(
            {"layer": p["layer"].astype(int).values, "block": p["block"].astype(int).values,
             "gamma": p["gamma"].values}
        )  # fmt: skip
    return views


def check_layers_line_up(
    views: Mapping[str, pd.DataFrame], layer_block: np.ndarray, n_layers: int
) -> int:
    """Merge every pair of ``views`` on ``layer`` and check the rows line up: each view
    holds layers 1..L (more for a prolonged run), every ``block`` is the layer -> block
    map (``layer_block[t - 1]``; the last block past the depth), and every value two views
    share is equal at every common layer. Returns the number of pairs checked."""
    expected = np.asarray(layer_block, dtype=int)
    for name, v in views.items():
        layers = v["layer"].to_numpy()
        assert layers[:n_layers].tolist() == list(range(1, n_layers + 1)), (name, layers)
        if "block" in v:
            want = expected[np.minimum(layers, n_layers) - 1]
            assert v["block"].tolist() == want.tolist(), (name, v["block"].tolist())
    pairs = 0
    for (na, a), (nb, b) in itertools.combinations(views.items(), 2):
        m = a.merge(b, on="layer", suffixes=("_a", "_b"), how="inner")
        assert len(m) >= n_layers, f"{na} x {nb}: layers dropped by the merge ({len(m)})"
        shared = (set(a.columns) & set(b.columns)) - {"layer"}
        for col in shared:
            x, y = m[f"{col}_a"].to_numpy(float), m[f"{col}_b"].to_numpy(float)
            both = np.isfinite(x) & np.isfinite(y)
            assert both.any(), f"{na} x {nb}: no layer where both have {col}"
            np.testing.assert_allclose(
                x[both], y[both], rtol=1e-12, atol=0, err_msg=f"{na} x {nb}: {col}"
            )
        pairs += 1
    return pairs
