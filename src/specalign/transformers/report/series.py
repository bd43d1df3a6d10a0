"""Alignment over training: every claim's metric against the checkpoint step.

A *series* is the list of checkpoints of one model (hub revisions ``step{N}``, or the
checkpoints of a run of :mod:`specalign.transformers.train.training`); each point went
through the per-model rules. :func:`series_dataset` sets their results side by side along
``step`` in ``results/transformers/series/{series}/training.nc``:

* claim (1), the tilt towards v1_t (Li & Altafini, Section 3, eq. (6)): per mode the
  layer-mean psi and rho, rho minus its random-direction null, the fraction of layers
  where the tilt holds, and gamma = |cos(x, v1)| beside its null;
* claim (2), shared weights as power-method steps (Section 4): along each prolonged run
  the final gamma and the measured per-layer rate of gamma -> 1 beside the power-method
  rate |mu2/mu1| of the repeated layer (mu = 1 + eta lambda);
* claim (3), gaps and spectra: the fraction of layers whose relative gap
  (lambda_1 - lambda_2)/|lambda_1| is below ``claims.SMALL_GAP``, the fraction whose
  lambda_1 is complex, the spectral radius and whether its eigenvalue is negative;
* claim (4), steering: the gain of gamma_u (steered minus original) per method and c;
* for runs made here, the train and held-out loss and the held-out unigram entropy.

Step 0, the initialisation, is the null of every curve. Bands are bootstrap
percentiles over prompts (prompts resampled with replacement, ``n_boot`` draws from a
fixed seed), for the token means (psi, gamma, gamma_u gain).

Read by :func:`series_table` (beside it), the figure
(:mod:`specalign.transformers.report.figures.training`) and the report's section "(7)
Over training" (:func:`specalign.transformers.report.reproduction.training_section`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from specalign.transformers.report.claims import (
    GAMMA_CONVERGED,
    RATE_TOL,
    SMALL_GAP,
    TILT_MARGIN,
    gap_summary,
    rate_summary,
    tilt_summary,
)
from specalign.transformers.report.tables import mode_view, relative_gaps
from specalign.transformers.weights import shares_weights

BASE_MODES = ("simplified_real", "simplified_full", "real_model")
PROLONGED_MODES = ("prolonged_full", "prolonged_real")
#: Bootstrap draws over prompts and the percentiles of the band.
N_BOOT = 200
BAND = (5.0, 95.0)


def _nan(shape: Sequence[int]) -> np.ndarray:
    return np.full(tuple(shape), np.nan)


def _prompt_bootstrap(
    values: np.ndarray, prompts: np.ndarray, rng: np.random.Generator, n_boot: int
) -> tuple[float, float]:
    """Percentile band of the mean of ``values`` (..., token) when the prompts that the
    tokens belong to (``prompts``, per token) are resampled with replacement."""
    ids = np.unique(prompts)
    per_prompt = np.stack(
        [np.nanmean(values[..., prompts == p]) for p in ids]
    )  # the mean over a prompt's tokens (and the leading axes)
    if len(ids) < 2 or not np.isfinite(per_prompt).any():
        return float("nan"), float("nan")
    draws = rng.integers(0, len(ids), size=(n_boot, len(ids)))
    means = np.nanmean(per_prompt[draws], axis=1)
    lo, hi = np.nanpercentile(means, BAND)
    return float(lo), float(hi)


def _per_layer_mode(prop: xr.Dataset, mode: str, n_layers: int) -> dict[str, np.ndarray]:
    """psi (token mean) and rho - rho_null per layer 1..n_layers of one mode."""
    out = {"psi": _nan([n_layers]), "excess": _nan([n_layers])}
    ds = mode_view(prop, mode)
    if ds is None:
        return out
    psi = ds["psi"]
    psi_t = np.nanmean(psi.values, axis=psi.get_axis_num("token"))
    excess = ds["rho"].values.astype(float) - ds["rho_null"].values.astype(float)
    k = min(n_layers, len(psi_t))
    out["psi"][:k] = psi_t[:k]
    out["excess"][:k] = excess[:k]
    return out


def _steer_gain(
    steer: xr.Dataset, rng: np.random.Generator, n_boot: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """gamma_u gain (steered minus original, token mean) per (method, c), with a band."""
    methods, cs = steer["method"].values, steer["c"].values
    gain, lo, hi = (_nan([len(methods), len(cs)]) for _ in range(3))
    prompts = np.asarray(steer["token_prompt"].values) if "token_prompt" in steer.coords else None
    for i, m in enumerate(methods):
        for j, c in enumerate(cs):
            g = steer["gamma_u"].sel({"method": m, "c": c})
            diff = (g.sel(variant="steered") - g.sel(variant="original")).values
            gain[i, j] = float(np.nanmean(diff))
            if prompts is not None and prompts.shape[-1] == diff.shape[-1]:
                lo[i, j], hi[i, j] = _prompt_bootstrap(diff, prompts, rng, n_boot)
    return gain, lo, hi


def series_dataset(
    series: str,
    steps: Sequence[int],
    spectra: Sequence[xr.Dataset],
    propagation: Sequence[xr.Dataset],
    steering: Sequence[xr.Dataset],
    run: xr.Dataset | None = None,
    source: str = "",
    n_boot: int = N_BOOT,
    seed: int = 0,
    unused_steps: Sequence[int] = (),
) -> xr.Dataset:
    """``training.nc`` of one series: every claim's metric against ``step`` (see the
    module docstring). ``run`` is the record of a run made here (``run.nc``);
    ``unused_steps`` the configured points left out because the run diverged before them
    (recorded in the attribute of that name beside ``diverged_step``)."""
    order = np.argsort(np.asarray(steps))
    steps = [int(steps[i]) for i in order]
    spectra = [spectra[i] for i in order]
    propagation = [propagation[i] for i in order]
    steering = [steering[i] for i in order]
    S = len(steps)
    rng = np.random.default_rng(seed)
    modes = [m for m in BASE_MODES if any(mode_view(p, m) is not None for p in propagation)]
    pmodes = [m for m in PROLONGED_MODES if any(mode_view(p, m) is not None for p in propagation)]
    n_layers = max(int(s.attrs.get("n_layers", 0)) or len(relative_gaps(s)) for s in spectra)
    M = len(modes)
    v: dict[str, np.ndarray] = {
        k: _nan([S, M])
        for k in (
            "psi",
            "psi_lo",
            "psi_hi",
            "rho",
            "rho_null",
            "rho_minus_null",
            "tilt_fraction",
            "gamma",
            "gamma_lo",
            "gamma_hi",
            "gamma_null",
        )
    }
    psi_layer, excess_layer = _nan([S, M, n_layers]), _nan([S, M, n_layers])
    P = len(pmodes)
    pro = {
        k: _nan([S, P])
        for k in ("final_gamma", "final_gamma_null", "measured_rate", "predicted_rate")
    }
    shared = np.zeros(S, dtype=bool)
    gaps = {k: _nan([S]) for k in ("frac_small_gap", "frac_complex_lambda1", "median_relative_gap")}
    radius, negative = _nan([S, n_layers]), _nan([S, n_layers])
    methods = [str(m) for m in steering[0]["method"].values]
    cs = [float(c) for c in steering[0]["c"].values]
    gain, gain_lo, gain_hi = (_nan([S, len(methods), len(cs)]) for _ in range(3))

    for s, (spec, prop, steer) in enumerate(zip(spectra, propagation, steering, strict=True)):
        for m, mode in enumerate(modes):
            t = tilt_summary(prop, mode)
            if t is None:
                continue
            v["psi"][s, m], v["rho"][s, m] = t["psi"], t["rho"]
            v["rho_null"][s, m], v["rho_minus_null"][s, m] = t["rho_null"], t["excess"]
            v["tilt_fraction"][s, m] = t["frac"]
            v["gamma"][s, m], v["gamma_null"][s, m] = t["gamma"], t["gamma_null"]
            ds = mode_view(prop, mode)
            prompts = np.asarray(ds["token_prompt"].values)
            tok_axis = "token"
            v["psi_lo"][s, m], v["psi_hi"][s, m] = _prompt_bootstrap(
                ds["psi"].transpose(..., tok_axis).values, prompts, rng, n_boot
            )
            v["gamma_lo"][s, m], v["gamma_hi"][s, m] = _prompt_bootstrap(
                ds["gamma"].transpose(..., tok_axis).values, prompts, rng, n_boot
            )
            per = _per_layer_mode(prop, mode, n_layers)
            psi_layer[s, m], excess_layer[s, m] = per["psi"], per["excess"]
        for p, mode in enumerate(pmodes):
            r = rate_summary(prop, spec, mode)
            if r is None:
                continue
            pro["final_gamma"][s, p], pro["final_gamma_null"][s, p] = (
                r["gamma_final"],
                r["gamma_null_final"],
            )
            pro["measured_rate"][s, p], pro["predicted_rate"][s, p] = (
                r["measured"],
                r["predicted"],
            )
        shared[s] = shares_weights(spec.attrs)
        g = gap_summary(spec)
        rel = relative_gaps(spec)
        gaps["frac_small_gap"][s] = g["frac_small"]
        gaps["median_relative_gap"][s] = g["median_rel_gap"]
        gaps["frac_complex_lambda1"][s] = g["complex_lambda1"] / max(len(rel), 1)
        lb = np.asarray(spec["layer_block"].values, dtype=int)
        rad = np.asarray(spec["spectral_radius"].values, dtype=float)[lb]
        neg = np.asarray(spec["radius_is_negative"].values, dtype=float)[lb]
        radius[s, : len(rad)], negative[s, : len(neg)] = rad[:n_layers], neg[:n_layers]
        gain[s], gain_lo[s], gain_hi[s] = _steer_gain(steer, rng, n_boot)

    def var(dims: tuple[str, ...], data: np.ndarray, text: str, **attrs: Any) -> tuple:
        return (dims, data, {"description": text, **attrs})

    band = f"bootstrap {BAND[0]:g}-{BAND[1]:g} % band over prompts ({n_boot} draws)"
    data = {
        "psi": var(("step", "mode"), v["psi"], "claim (1): layer mean of the token-mean psi_t"),
        "psi_lo": var(("step", "mode"), v["psi_lo"], f"psi: lower end of the {band}"),
        "psi_hi": var(("step", "mode"), v["psi_hi"], f"psi: upper end of the {band}"),
        "rho": var(("step", "mode"), v["rho"], "claim (1): layer mean of rho_t"),
        "rho_null": var(
            ("step", "mode"), v["rho_null"], "layer mean of rho_t's random-direction null"
        ),
        "rho_minus_null": var(
            ("step", "mode"),
            v["rho_minus_null"],
            "claim (1): layer mean of rho_t minus its random-direction null",
        ),
        "tilt_fraction": var(
            ("step", "mode"),
            v["tilt_fraction"],
            "claim (1): fraction of layers with psi_t > 0 and rho_t > 0.5",
        ),
        "gamma": var(
            ("step", "mode"), v["gamma"], "mean gamma = |cos(x, v1_t)| over layers, tokens"
        ),
        "gamma_lo": var(("step", "mode"), v["gamma_lo"], f"gamma: lower end of the {band}"),
        "gamma_hi": var(("step", "mode"), v["gamma_hi"], f"gamma: upper end of the {band}"),
        "gamma_null": var(("step", "mode"), v["gamma_null"], "gamma's random-direction null"),
        "psi_layer": var(("step", "mode", "layer"), psi_layer, "token-mean psi_t per layer"),
        "rho_minus_null_layer": var(
            ("step", "mode", "layer"),
            excess_layer,
            "rho_t minus its random-direction null, per layer",
        ),
        "frac_small_gap": var(
            ("step",),
            gaps["frac_small_gap"],
            f"claim (3): fraction of layers with relative gap < {SMALL_GAP:g}",
        ),
        "median_relative_gap": var(
            ("step",),
            gaps["median_relative_gap"],
            "median over layers of (lambda_1 - lambda_2)/|lambda_1|",
        ),
        "frac_complex_lambda1": var(
            ("step",), gaps["frac_complex_lambda1"], "fraction of layers whose lambda_1 is complex"
        ),
        "spectral_radius": var(("step", "layer"), radius, "max |lambda| of F_t per layer"),
        "radius_is_negative": var(
            ("step", "layer"),
            negative,
            "1 where the eigenvalue of largest modulus of F_t is real and negative, else 0",
        ),
        "shared": var(("step",), shared.astype(np.int8), "1: the layers share one block"),
        "steer_gain": var(
            ("step", "method", "c"),
            gain,
            "claim (4): mean gamma_u after the last layer, steered minus original",
        ),
        "steer_gain_lo": var(
            ("step", "method", "c"), gain_lo, f"steer_gain: lower end of the {band}"
        ),
        "steer_gain_hi": var(
            ("step", "method", "c"), gain_hi, f"steer_gain: upper end of the {band}"
        ),
    }
    if pmodes:
        data.update(
            final_gamma=var(
                ("step", "prolonged"),
                pro["final_gamma"],
                "claim (2): mean gamma after the last prolonged layer",
            ),
            final_gamma_null=var(
                ("step", "prolonged"),
                pro["final_gamma_null"],
                "final_gamma's random-direction null",
            ),
            measured_rate=var(
                ("step", "prolonged"),
                pro["measured_rate"],
                "claim (2): measured per-layer rate of sin(theta) -> 0 on the "
                "layers that repeat one block",
            ),
            predicted_rate=var(
                ("step", "prolonged"),
                pro["predicted_rate"],
                "|mu2/mu1| of the repeated layer's I + eta F (power method)",
            ),
        )
    attrs: dict[str, Any] = {
        "series": series,
        "source": source,
        "description": "Every claim's metric against the checkpoint step; step 0 is the null",
        "small_gap": SMALL_GAP,
        "tilt_margin": TILT_MARGIN,
        "gamma_converged": GAMMA_CONVERGED,
        "rate_tol": RATE_TOL,
        "diverged_step": -1,
        # a comma-separated list: netCDF attributes hold no empty arrays
        "unused_steps": ", ".join(str(int(u)) for u in sorted(unused_steps)),
    }
    if run is not None:
        ck = [int(c) for c in run["checkpoint"].values]
        train = np.array(
            [
                float(run["train_loss_at_checkpoint"].values[ck.index(s)]) if s in ck else np.nan
                for s in steps
            ]
        )
        held = np.array(
            [float(run["heldout_loss"].values[ck.index(s)]) if s in ck else np.nan for s in steps]
        )
        data.update(
            train_loss=var(
                ("step",),
                train,
                "training loss of the step's batch (nats/token)",
                units="nats/token",
            ),
            heldout_loss=var(("step",), held, "held-out loss (nats/token)", units="nats/token"),
            heldout_unigram_entropy=var(
                (),
                float(run["heldout_unigram_entropy"]),
                "unigram entropy of the held-out tokens (nats/token): "
                "the loss of the best context-free predictor",
                units="nats/token",
            ),
        )
        attrs["diverged_step"] = int(run.attrs.get("diverged_step", -1))
        attrs["family"] = str(run.attrs.get("family", ""))
        attrs["run"] = str(run.attrs.get("run", ""))
    coords = {
        "step": ("step", np.asarray(steps, dtype=np.int64), {"description": "training step"}),
        "mode": ("mode", modes, {"description": "propagation mode"}),
        "layer": ("layer", np.arange(1, n_layers + 1), {"description": "layer 1..L"}),
        "method": ("method", methods, {"description": "steering construction"}),
        "c": ("c", np.asarray(cs), {"description": "steered eigenvalue / old spectral radius"}),
    }
    if pmodes:
        coords["prolonged"] = ("prolonged", pmodes, {"description": "prolonged run"})
    return xr.Dataset(data, coords=coords, attrs=attrs)


# --------------------------------------------------------------------------- table


def series_table(ds: xr.Dataset) -> Any:
    """One row per step: the headline metric of every claim (first mode's tilt)."""
    import pandas as pd

    rows = []
    for i, step in enumerate(ds["step"].values):
        row: dict[str, Any] = {"series": ds.attrs["series"], "step": int(step)}
        for mode in ds["mode"].values:
            sub = ds.sel(mode=mode).isel(step=i)
            row[f"rho - null ({mode})"] = float(sub["rho_minus_null"])
            row[f"psi ({mode})"] = float(sub["psi"])
            row[f"gamma ({mode})"] = float(sub["gamma"])
        row["small-gap layers"] = float(ds["frac_small_gap"][i])
        row["complex lambda_1 layers"] = float(ds["frac_complex_lambda1"][i])
        row["mean spectral radius"] = float(np.nanmean(ds["spectral_radius"][i]))
        row["negative-radius layers"] = float(np.nanmean(ds["radius_is_negative"][i]))
        row["max steer gain"] = (
            float(np.nanmax(ds["steer_gain"][i]))
            if np.isfinite(ds["steer_gain"][i]).any()
            else float("nan")
        )
        if "final_gamma" in ds:
            for p in ds["prolonged"].values:
                sub = ds.sel(prolonged=p).isel(step=i)
                row[f"final gamma ({p})"] = float(sub["final_gamma"])
                row[f"measured rate ({p})"] = float(sub["measured_rate"])
                row[f"|mu2/mu1| ({p})"] = float(sub["predicted_rate"])
        if "heldout_loss" in ds:
            row["train loss"] = float(ds["train_loss"][i])
            row["held-out loss"] = float(ds["heldout_loss"][i])
            row["unigram entropy"] = float(ds["heldout_unigram_entropy"])
        rows.append(row)
    return pd.DataFrame(rows)
