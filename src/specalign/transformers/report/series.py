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

from specalign.output import nanmean
from specalign.transformers.metric_table import layer_values, trends
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


_PROLONGED = ("final_gamma", "final_gamma_null", "measured_rate", "predicted_rate")
_GAPS = ("frac_small_gap", "frac_complex_lambda1", "median_relative_gap")


def _var(dims: tuple[str, ...], data: Any, text: str, **attrs: Any) -> tuple:
    return (dims, data, {"description": text, **attrs})


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
    tilt = {k: _nan([S, len(modes)]) for m in trends() for k in m.trend_variables}
    tilt["tilt_fraction"] = _nan([S, len(modes)])
    for m in trends():
        if m.trend.per_layer:
            tilt[f"{m.headline}_layer"] = _nan([S, len(modes), n_layers])
    pro = {k: _nan([S, len(pmodes)]) for k in _PROLONGED}
    spec = {k: _nan([S]) for k in _GAPS}
    spec["spectral_radius"], spec["radius_is_negative"] = (_nan([S, n_layers]) for _ in range(2))
    spec["shared"] = np.zeros(S, dtype=np.int8)
    methods = [str(m) for m in steering[0]["method"].values]
    cs = [float(c) for c in steering[0]["c"].values]
    gain = {k: _nan([S, len(methods), len(cs)]) for k in ("steer_gain", "lo", "hi")}

    # one loop over the steps, in this order within each: the bootstrap bands draw from
    # one generator, so the order of the draws is the bands' identity
    for s in range(S):
        _tilt_at(tilt, s, propagation[s], modes, n_layers, rng, n_boot)
        _rates_at(pro, s, propagation[s], spectra[s], pmodes)
        _spectra_at(spec, s, spectra[s], n_layers)
        gain["steer_gain"][s], gain["lo"][s], gain["hi"][s] = _steer_gain(steering[s], rng, n_boot)

    band = f"bootstrap {BAND[0]:g}-{BAND[1]:g} % band over prompts ({n_boot} draws)"
    data = {
        **_tilt_variables(tilt, band),
        **_spectra_variables(spec),
        **_steer_variables(gain, band),
    }
    if pmodes:
        data.update(_prolonged_variables(pro))
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
        data.update(_run_variables(run, steps))
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


def _tilt_at(
    v: dict[str, np.ndarray],
    s: int,
    prop: xr.Dataset,
    modes: Sequence[str],
    n_layers: int,
    rng: np.random.Generator,
    n_boot: int,
) -> None:
    """Step index ``s``, every mode where claim (1) is measured: its tilt fraction, and
    every trend of the metric table (the value, its null, the headline per layer, and
    the bands, drawn in the trends' rank order)."""
    for m, mode in enumerate(modes):
        t = tilt_summary(prop, mode)
        if t is None:
            continue
        v["tilt_fraction"][s, m] = t["frac"]
        ds = mode_view(prop, mode)
        prompts = np.asarray(ds["token_prompt"].values)
        for metric in trends():
            trend = metric.trend
            value = head = layer_values(ds, metric)
            v[metric.name][s, m] = nanmean(value)
            if trend.null:
                null = layer_values(ds, metric, "_null")
                v[f"{metric.name}_null"][s, m] = nanmean(null)
                if trend.null == "excess":
                    head = value - null
                    v[metric.headline][s, m] = nanmean(head)
            if trend.band:
                v[f"{metric.name}_lo"][s, m], v[f"{metric.name}_hi"][s, m] = _prompt_bootstrap(
                    ds[metric.name].transpose(..., "token").values, prompts, rng, n_boot
                )
            if trend.per_layer:
                k = min(n_layers, len(head))
                v[f"{metric.headline}_layer"][s, m, :k] = head[:k]


def _rates_at(
    pro: dict[str, np.ndarray], s: int, prop: xr.Dataset, spec: xr.Dataset, pmodes: Sequence[str]
) -> None:
    """Claim (2) at step index ``s``, every prolonged run."""
    for p, mode in enumerate(pmodes):
        r = rate_summary(prop, spec, mode)
        if r is None:
            continue
        pro["final_gamma"][s, p], pro["final_gamma_null"][s, p] = (
            r["gamma_final"],
            r["gamma_null_final"],
        )
        pro["measured_rate"][s, p], pro["predicted_rate"][s, p] = r["measured"], r["predicted"]


def _spectra_at(v: dict[str, np.ndarray], s: int, spec: xr.Dataset, n_layers: int) -> None:
    """Claim (3) at step index ``s``: the gaps, the spectral radius per layer and its
    sign, and whether the layers share one block."""
    v["shared"][s] = shares_weights(spec.attrs)
    g = gap_summary(spec)
    v["frac_small_gap"][s] = g["frac_small"]
    v["median_relative_gap"][s] = g["median_rel_gap"]
    v["frac_complex_lambda1"][s] = g["complex_lambda1"] / max(len(relative_gaps(spec)), 1)
    lb = np.asarray(spec["layer_block"].values, dtype=int)
    rad = np.asarray(spec["spectral_radius"].values, dtype=float)[lb]
    neg = np.asarray(spec["radius_is_negative"].values, dtype=float)[lb]
    v["spectral_radius"][s, : len(rad)] = rad[:n_layers]
    v["radius_is_negative"][s, : len(neg)] = neg[:n_layers]


def _tilt_variables(v: dict[str, np.ndarray], band: str) -> dict[str, tuple]:
    """Claim (1)'s tilt fraction and the variables of every trend of the metric table."""
    sm = ("step", "mode")
    out = {}
    for m in trends():
        trend = m.trend
        claim = f"claim ({trend.claim}): "
        out[m.name] = _var(sm, v[m.name], f"{claim}layer mean of {trend.text}")
        if trend.null:
            out[f"{m.name}_null"] = _var(
                sm, v[f"{m.name}_null"], f"layer mean of {trend.text}'s random-direction null"
            )
        if trend.null == "excess":
            out[m.headline] = _var(sm, v[m.headline], f"{claim}layer mean of {m.headline_text}")
        if trend.band:
            for end, word in (("lo", "lower"), ("hi", "upper")):
                out[f"{m.name}_{end}"] = _var(
                    sm, v[f"{m.name}_{end}"], f"{m.name}: {word} end of the {band}"
                )
        if trend.per_layer:
            out[f"{m.headline}_layer"] = _var(
                (*sm, "layer"), v[f"{m.headline}_layer"], f"{m.headline_text}, per layer"
            )
    out["tilt_fraction"] = _var(
        sm, v["tilt_fraction"], "claim (1): fraction of layers with psi_t > 0 and rho_t > 0.5"
    )
    return out


def _spectra_variables(v: dict[str, np.ndarray]) -> dict[str, tuple]:
    sl = ("step", "layer")
    return {
        "frac_small_gap": _var(
            ("step",),
            v["frac_small_gap"],
            f"claim (3): fraction of layers with relative gap < {SMALL_GAP:g}",
        ),
        "median_relative_gap": _var(
            ("step",),
            v["median_relative_gap"],
            "median over layers of (lambda_1 - lambda_2)/|lambda_1|",
        ),
        "frac_complex_lambda1": _var(
            ("step",), v["frac_complex_lambda1"], "fraction of layers whose lambda_1 is complex"
        ),
        "spectral_radius": _var(sl, v["spectral_radius"], "max |lambda| of F_t per layer"),
        "radius_is_negative": _var(
            sl,
            v["radius_is_negative"],
            "1 where the eigenvalue of largest modulus of F_t is real and negative, else 0",
        ),
        "shared": _var(("step",), v["shared"], "1: the layers share one block"),
    }


def _steer_variables(v: dict[str, np.ndarray], band: str) -> dict[str, tuple]:
    smc = ("step", "method", "c")
    return {
        "steer_gain": _var(
            smc,
            v["steer_gain"],
            "claim (4): mean gamma_u after the last layer, steered minus original",
        ),
        "steer_gain_lo": _var(smc, v["lo"], f"steer_gain: lower end of the {band}"),
        "steer_gain_hi": _var(smc, v["hi"], f"steer_gain: upper end of the {band}"),
    }


def _prolonged_variables(v: dict[str, np.ndarray]) -> dict[str, tuple]:
    sp = ("step", "prolonged")
    return {
        "final_gamma": _var(
            sp, v["final_gamma"], "claim (2): mean gamma after the last prolonged layer"
        ),
        "final_gamma_null": _var(sp, v["final_gamma_null"], "final_gamma's random-direction null"),
        "measured_rate": _var(
            sp,
            v["measured_rate"],
            "claim (2): measured per-layer rate of sin(theta) -> 0 on the "
            "layers that repeat one block",
        ),
        "predicted_rate": _var(
            sp, v["predicted_rate"], "|mu2/mu1| of the repeated layer's I + eta F (power method)"
        ),
    }


def _run_variables(run: xr.Dataset, steps: Sequence[int]) -> dict[str, tuple]:
    """The losses of a run made here at each step (NaN at a step it did not save)."""
    ck = [int(c) for c in run["checkpoint"].values]

    def at_steps(name: str) -> np.ndarray:
        values = run[name].values
        return np.array([float(values[ck.index(s)]) if s in ck else np.nan for s in steps])

    return {
        "train_loss": _var(
            ("step",),
            at_steps("train_loss_at_checkpoint"),
            "training loss of the step's batch (nats/token; a masked-LM's targets as it "
            "trains on them, a tenth of them left in view)",
            units="nats/token",
        ),
        "heldout_loss": _var(
            ("step",),
            at_steps("heldout_loss"),
            "held-out loss (nats/token) at tokens the model cannot see: a masked-LM's "
            "held-out targets all [MASK], a causal-LM's next tokens",
            units="nats/token",
        ),
        "heldout_unigram_entropy": _var(
            (),
            float(run["heldout_unigram_entropy"]),
            "unigram entropy of the held-out tokens (nats/token): "
            "the loss of the best context-free predictor",
            units="nats/token",
        ),
    }


# --------------------------------------------------------------------------- table


def series_table(ds: xr.Dataset) -> Any:
    """One row per step: the headline of every claim's metric, each trend of the metric
    table per mode first."""
    import pandas as pd

    rows = []
    for i, step in enumerate(ds["step"].values):
        row: dict[str, Any] = {"series": ds.attrs["series"], "step": int(step)}
        for mode in ds["mode"].values:
            sub = ds.sel(mode=mode).isel(step=i)
            for m in trends():
                row[f"{m.label} ({mode})"] = float(sub[m.headline])
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
