"""The claim rules of the transformer study's reproduction (Li & Altafini,
arXiv:2605.25619): for each claim of :data:`specalign.transformers.report.paper.CLAIMS`, the
summary that measures it from the files, the verdict under rules fixed before looking
at the data, and the rows and verdict lines of its section of the reproduction report
(:mod:`specalign.transformers.report.reproduction` assembles the markdown).

Every threshold is a named constant below, each with the null level it is read against:
the random-direction null, the eigenvector of the most negative eigenvalue, and the
random-weight twin of a model (the random model whose ``like:`` names it; ``like`` maps
each random model to the model it copies, :func:`specalign.transformers.settings.random_likes`). The
rules of "(7) Over training" (:mod:`specalign.transformers.report.series`) apply the same
thresholds along the checkpoints of a series, with step 0 (the initialisation) as the
null.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from specalign.output import nanmean as _nanmean
from specalign.transformers.report.paper import FIG14_OUTCOMES
from specalign.transformers.report.tables import (
    bipartite_outcomes,
    is_random_model,
    layer_eigenvalues,
    mode_view,
    per_layer_spectra,
    random_twin,
    random_unit_overlap,
    reduce_dim,
    relative_gaps,
    sphere_table,
    steering_table,
)
from specalign.transformers.weights import shares_weights

#: Claim (1): rho_t must exceed its random-direction null by this much, averaged over
#: layers, for a plain "holds"; a smaller positive excess is "holds only above chance".
TILT_MARGIN = 0.10
#: Claim (1): the tilt must hold (mean psi_t > 0 and rho_t > 0.5) in at least this
#: fraction of the layers.
TILT_MAJORITY = 0.5
#: Claim (2): final mean gamma at or above this counts as gamma -> 1.
GAMMA_CONVERGED = 0.99
#: Claim (2): |measured - predicted| per-layer rate within this is agreement.
RATE_TOL = 0.02
#: Claim (2): a predicted rate within this of 1 predicts no convergence at all.
NO_CONVERGENCE_TOL = 1e-9
#: Claim (3): a layer's spectral gap is "small" when gap / |lambda_1| < SMALL_GAP.
SMALL_GAP = 0.10
#: Claim (4): steering must raise mean gamma_u by at least this (and put it this far
#: above the random-direction null) for a plain "holds".
STEER_MIN_GAIN = 0.05
#: Claim (4): a residual |F'u - c r u| / |c r| (/ r for c = 0) below this means u is an
#: eigenvector.
RESIDUAL_TOL = 1e-6
#: Claim (5): numeric vs closed-form Jacobian eigenvalue moduli agree within this.
JACOBIAN_TOL = 1e-8


# --------------------------------------------------------------------------- verdicts


def tilt_summary(prop: xr.Dataset, mode: str, suffix: str = "") -> dict[str, Any] | None:
    """Claim (1) for one mode: does passing through layer t tilt tokens towards v1_t?

    Per layer t the tilt holds when the token-mean psi_t > 0 and rho_t > 0.5. Returns the
    fraction of layers where it holds (``frac``), the means of psi, rho and the
    random-direction rho null over layers, ``excess`` = mean(rho_t - rho_null_t), the
    fraction of layers where the random-direction null itself passes the test
    (``null_frac``; NaN when psi's null is not stored, as for the other correlation),
    the same fraction and mean rho for the most-negative-eigenvector direction
    (``neg_frac``, ``rho_neg``: a direction F does *not* favour, so a tilt towards it
    says the test is not specific to v1), and the ``verdict``. ``suffix`` selects the
    other correlation (``"_pearson"``). None when the mode or the variables are absent.
    """
    ds = mode_view(prop, mode)
    need = [f"psi{suffix}", f"rho{suffix}", f"rho_null{suffix}"]
    if ds is None or any(v not in ds for v in need):
        return None
    psi_t = reduce_dim(ds[f"psi{suffix}"], "token", _nanmean)
    rho_t = ds[f"rho{suffix}"].values.astype(float)
    rho_null_t = ds[f"rho_null{suffix}"].values.astype(float)
    defined = np.isfinite(psi_t) & np.isfinite(rho_t)
    holds = (psi_t > 0) & (rho_t > 0.5)
    frac = float(holds[defined].mean()) if defined.any() else float("nan")
    null_frac = float("nan")
    if not suffix and "psi_null" in ds:
        psi_null_t = reduce_dim(ds["psi_null"], "token", _nanmean)
        null_frac = float(((psi_null_t > 0) & (rho_null_t > 0.5)).mean())
    neg_frac, rho_neg = float("nan"), float("nan")
    if not suffix and "psi_neg_null" in ds and "rho_neg_null" in ds:
        psi_neg_t = reduce_dim(ds["psi_neg_null"], "token", _nanmean)
        rho_neg_t = ds["rho_neg_null"].values.astype(float)
        ok = np.isfinite(psi_neg_t) & np.isfinite(rho_neg_t)
        if ok.any():
            neg_frac = float(((psi_neg_t > 0) & (rho_neg_t > 0.5))[ok].mean())
            rho_neg = _nanmean(rho_neg_t)
    out = {
        "n_layers": int(defined.sum()),
        "frac": frac,
        "psi": _nanmean(psi_t),
        "rho": _nanmean(rho_t),
        "rho_null": _nanmean(rho_null_t),
        "excess": _nanmean(rho_t - rho_null_t),
        "null_frac": null_frac,
        "neg_frac": neg_frac,
        "rho_neg": rho_neg,
        "gamma": _nanmean(ds[f"gamma{suffix}"]) if f"gamma{suffix}" in ds else float("nan"),
        "gamma_null": (
            _nanmean(ds[f"gamma_null{suffix}"]) if f"gamma_null{suffix}" in ds else float("nan")
        ),
    }
    out["verdict"] = tilt_verdict(out)
    return out


def tilt_verdict(s: Mapping[str, Any]) -> str:
    """The verdict on claim (1) from a :func:`tilt_summary`.

    A test that the eigenvector of the most negative eigenvalue passes as well (in at
    least as many layers as v1, with at least v1's mean rho minus ``TILT_MARGIN``) does not
    single out v1, so it is "not specific to v1" rather than "holds": the tokens move in a
    way the test reads as a tilt whatever direction of F it is given.
    """
    frac, excess = s["frac"], s["excess"]
    if not (np.isfinite(frac) and np.isfinite(excess)):
        return "not measured (no layer with a real v1)"
    if frac < TILT_MAJORITY:
        return f"does not hold (tilt in {frac:.0%} of layers)"
    if excess <= 0:
        return "does not hold beyond chance (rho at or below its random-direction null)"
    neg_frac, rho_neg = s.get("neg_frac", np.nan), s.get("rho_neg", np.nan)
    rho = s.get("rho", np.nan)
    if (
        np.isfinite(neg_frac)
        and neg_frac >= frac
        and not (np.isfinite(rho) and np.isfinite(rho_neg) and rho_neg < rho - TILT_MARGIN)
    ):
        return (
            f"not specific to v1 (tilt in {frac:.0%} of layers, but towards the most negative "
            f"eigenvector in {neg_frac:.0%}"
            + (f", mean rho {rho_neg:.2f} against v1's {rho:.2f}" if np.isfinite(rho_neg) else "")
            + ")"
        )
    if excess >= TILT_MARGIN:
        return f"holds (tilt in {frac:.0%} of layers)"
    return f"holds only above chance by {excess:.2f} in rho (tilt in {frac:.0%} of layers)"


def holds(verdict: str) -> bool:
    """Whether a verdict says the claim holds (plainly or only above chance)."""
    return verdict.startswith("holds")


def _predicted_rates(spectra: xr.Dataset) -> dict[str, Any]:
    """Power-method rates of the last layer's I + eta F (the prolonged layers repeat it):
    |mu_2/mu_1| and the n-token asymptotic max(|mu_2|, 1)/|mu_1|, mu = 1 + eta lambda in
    the order of lambda's real part (as specalign.transformers.measure.sphere)."""
    eta = float(spectra.attrs.get("eta", np.nan))
    lam = layer_eigenvalues(spectra, 2)[-1]
    mu = 1.0 + eta * lam
    per = per_layer_spectra(spectra).isel(layer=-1)
    return {
        "predicted": float(abs(mu[1]) / abs(mu[0])),
        "asymptotic": float(max(abs(mu[1]), 1.0) / abs(mu[0])),
        "lambda1_is_complex": bool(int(per["lambda1_is_complex"])),
        "dominant_is_lambda1": bool(int(per["dominant_is_lambda1"])),
    }


def rate_summary(
    prop: xr.Dataset, spectra: xr.Dataset | None, mode: str = "prolonged_full"
) -> dict[str, Any] | None:
    """Claim (2) for one prolonged mode: final gamma vs its null, and the measured
    per-layer rate of gamma -> 1 (``sphere.measured_convergence_rate`` on the layers that
    repeat the last block) vs the power-method prediction from ``spectra``.

    For a shared-weight model every layer repeats the block; otherwise only the layers
    past the original depth do, and only those enter the rate. None if the mode is absent.
    """
    from specalign.transformers.measure.sphere import measured_convergence_rate

    ds = mode_view(prop, mode)
    if ds is None:
        return None
    shared = shares_weights(spectra.attrs) if spectra is not None else False
    base = mode_view(prop, "simplified_real")
    depth = (
        int(spectra.attrs["n_layers"])
        if spectra is not None and "n_layers" in spectra.attrs
        else (base.sizes["layer"] if base is not None else 0)
    )
    gamma = ds["gamma"]
    tail = gamma if shared else gamma.isel(layer=slice(depth, None))
    out: dict[str, Any] = {
        "mode": mode,
        "shared": shared,
        "layers": int(ds.sizes["layer"]),
        "depth": depth,
        "gamma_final": _nanmean(gamma.isel(layer=-1)),
        "gamma_null_final": _nanmean(ds["gamma_null"].isel(layer=-1)),
        "measured": float("nan"),
        "note": "",
    }
    try:
        out["measured"] = measured_convergence_rate(tail.transpose("layer", "token").values)
    except ValueError as exc:
        out["note"] = f"rate not measurable: {exc}"
    if spectra is not None:
        out.update(_predicted_rates(spectra))
    else:
        out.update(
            predicted=float("nan"),
            asymptotic=float("nan"),
            lambda1_is_complex=False,
            dominant_is_lambda1=True,
        )
    out["verdict"] = rate_verdict(out)
    return out


def rate_verdict(s: Mapping[str, Any]) -> str:
    """The verdict on claim (2) from a :func:`rate_summary`: gamma -> 1 (final mean gamma
    at least ``GAMMA_CONVERGED``), and the measured rate against the closer of the two
    power-method predictions (within ``RATE_TOL``; a predicted rate of 1 predicts no
    convergence, see ``NO_CONVERGENCE_TOL``), with why no convergence is expected where
    lambda_1 is complex or eta is past the step-size bound."""
    if s["lambda1_is_complex"]:
        conv = (
            "not expected: lambda_1 of the repeated layer is complex, so the tokens rotate in "
            "the plane of the pair rather than converge to a real eigenvector; "
        )
    elif not s["dominant_is_lambda1"]:
        conv = (
            "not expected: eta is past the step-size bound, so another eigenvalue dominates "
            "I + eta F; "
        )
    else:
        conv = ""
    g = s["gamma_final"]
    conv += (
        f"gamma -> 1 holds (final {g:.4f})"
        if g >= GAMMA_CONVERGED
        else f"gamma -> 1 does not hold (final {g:.4f})"
    )
    m = s["measured"]
    if not np.isfinite(m):
        return conv + "; rate not measured"
    best = min(abs(m - s["predicted"]), abs(m - s["asymptotic"]))
    if not np.isfinite(best):
        return conv + f"; measured rate {m:.4f}, no prediction"
    if best > RATE_TOL:
        text = conv + f"; measured rate {m:.4f} does not match the power-method prediction"
    elif _closest_prediction(s, m) >= 1.0 - NO_CONVERGENCE_TOL:
        # a predicted rate of 1 (|mu_2| = |mu_1|: a complex pair, or |mu_1| <= 1 for the
        # n-token asymptotic) predicts that nothing converges; agreeing with it is no
        # evidence of a power method at work
        text = conv + (
            f"; measured rate {m:.4f}: no convergence predicted (the power-method rate is "
            f"{_closest_prediction(s, m):.4f}), and none measured"
        )
    else:
        text = conv + f"; measured rate {m:.4f} matches the power-method prediction"
    g_end = min(max(g, 0.0), 1.0)
    if g < GAMMA_CONVERGED and 0 < m < 1 and not s["lambda1_is_complex"]:
        # sin(theta) shrinks by m per layer; gamma >= GAMMA_CONVERGED needs
        # sin(theta) <= sqrt(1 - GAMMA_CONVERGED^2)
        need = math.log(math.sqrt(1 - GAMMA_CONVERGED**2) / math.sqrt(1 - g_end**2)) / math.log(m)
        text += (
            f"; at that rate gamma reaches {GAMMA_CONVERGED:g} after ~{math.ceil(need)} more layers"
        )
    return text


def _closest_prediction(s: Mapping[str, Any], measured: float) -> float:
    """Of the two predicted rates (|mu_2/mu_1| and the n-token asymptotic), the one
    closest to the ``measured`` rate."""
    preds = [float(s[k]) for k in ("predicted", "asymptotic") if np.isfinite(s[k])]
    return min(preds, key=lambda p: abs(measured - p))


def gap_summary(spectra: xr.Dataset) -> dict[str, Any]:
    """Claim (3): the fraction of layers whose relative gap gap/|lambda_1| is below
    ``SMALL_GAP`` (it holds in a majority of the layers), the median relative gap, the
    number of layers with a complex lambda_1, and the ``verdict``."""
    rel = relative_gaps(spectra)
    ok = np.isfinite(rel)
    frac = float(np.mean(rel[ok] < SMALL_GAP)) if ok.any() else float("nan")
    return {
        "layers": int(ok.sum()),
        "frac_small": frac,
        "median_rel_gap": float(np.median(rel[ok])) if ok.any() else float("nan"),
        "complex_lambda1": int(
            np.asarray(per_layer_spectra(spectra)["lambda1_is_complex"].values).sum()
        ),
        "verdict": (
            "not measured"
            if not np.isfinite(frac)
            else ("holds" if frac > 0.5 else "does not hold")
            + f" ({frac:.0%} of layers with gap/|lambda_1| < {SMALL_GAP:g})"
        ),
    }


def steer_verdict(row: Mapping[str, Any]) -> str:
    """The verdict on claim (4) for one row of the steering table
    (:func:`specalign.transformers.report.tables.steering_table`): u must be an eigenvector of
    the steered F (residual below ``RESIDUAL_TOL``) and mean gamma_u must rise by
    ``STEER_MIN_GAIN`` and end that far above its random-direction null; a smaller
    positive effect holds only above chance."""
    if not row["residual"] < RESIDUAL_TOL:
        return f"does not hold: u is not an eigenvector (residual {row['residual']:.2g})"
    gain = row["gamma_u_steered"] - row["gamma_u_original"]
    above = row["gamma_u_steered"] - row["gamma_u_null"]
    if gain >= STEER_MIN_GAIN and above >= STEER_MIN_GAIN:
        text = f"holds (gamma_u {gain:+.3f})"
    elif gain > 0 and above > 0:
        text = f"holds only above chance by {above:.3f} (gamma_u {gain:+.3f})"
    else:
        text = f"does not hold (gamma_u {gain:+.3f})"
    if not row["u_is_leading"]:
        text += "; c r is not the leading eigenvalue, so no tilt to u is predicted"
    return text


# --------------------------------------------------------------------------- report rows


def _twin_cell(name: str, like: Mapping[str, str], names: Any) -> str:
    """The null model of ``name`` for a table row: its twin, or why there is none."""
    if is_random_model(name, like):
        return f"(random, like {like[name]})"
    twin = random_twin(name, like, names)
    return twin if twin is not None else f"none (no random model has like: {name})"


def claim1_rows(
    prop_by_model: Mapping[str, xr.Dataset], like: Mapping[str, str], suffix: str = ""
) -> tuple[list[dict[str, Any]], list[str]]:
    """Claim (1), the tilt towards v1_t (Sec. 3, eq. (6)): one row per model and mode of
    :func:`tilt_summary` with its verdict, and notes on what the tilt of each model for
    which it holds says beside its nulls: the most negative eigenvector passing too, and
    the random-weight twin tilting as much (the architecture), less, or not at all."""
    rows, notes = [], []
    for name in sorted(prop_by_model):
        for mode in ("simplified_real", "simplified_full", "real_model"):
            s = tilt_summary(prop_by_model[name], mode, suffix)
            if s is None:
                continue
            rows.append(
                {
                    "model": name,
                    "random twin": _twin_cell(name, like, prop_by_model),
                    "mode": mode,
                    "layers": s["n_layers"],
                    "tilt layers": s["frac"],
                    "mean psi": s["psi"],
                    "mean rho": s["rho"],
                    "rho null": s["rho_null"],
                    "rho - null": s["excess"],
                    "null passes": s["null_frac"],
                    "rho neg-eigvec": s["rho_neg"],
                    "neg-eigvec passes": s["neg_frac"],
                    "mean gamma": s["gamma"],
                    "gamma null": s["gamma_null"],
                    "verdict": s["verdict"],
                }
            )
    by = {(r["model"], r["mode"]): r for r in rows}
    for (name, mode), r in by.items():
        if is_random_model(name, like) or not holds(r["verdict"]):
            continue
        if r["neg-eigvec passes"] >= TILT_MAJORITY:
            notes.append(
                f"- {name}, {mode}: the tokens tilt just as often towards the eigenvector of "
                f"the most negative eigenvalue (test passed in {r['neg-eigvec passes']:.0%} of "
                f"layers, mean rho {r['rho neg-eigvec']:.2f}): psi/rho do not single out v1 here."
            )
        twin = random_twin(name, like, prop_by_model)
        if twin is None or (twin, mode) not in by:
            notes.append(
                f"- {name}, {mode}: no random-weight twin in this run (no random model has "
                f"like: {name}), so its tilt is compared with the random-direction null only."
            )
            continue
        tw = by[(twin, mode)]
        ex, tex = r["rho - null"], tw["rho - null"]
        if not holds(tw["verdict"]):
            notes.append(
                f"- {name}, {mode}: the random-weight twin {twin} shows no such tilt "
                f"({tw['verdict']}): the trained weights make the difference."
            )
        elif tex >= ex:
            notes.append(
                f"- {name}, {mode}: the random-weight twin {twin} tilts as much (rho - null "
                f"{tex:.2f} vs {ex:.2f}): the tilt comes with the architecture (the "
                "power-method step itself), not with training."
            )
        else:
            notes.append(
                f"- {name}, {mode}: the random-weight twin {twin} tilts less (rho - null "
                f"{tex:.2f} vs {ex:.2f}): part of the tilt comes with the architecture, the "
                "rest with training."
            )
    return rows, notes


def claim2_rows(
    spectra_by_model: Mapping[str, xr.Dataset],
    prop_by_model: Mapping[str, xr.Dataset],
    like: Mapping[str, str],
) -> list[dict[str, Any]]:
    """Claim (2), shared weights as power-method steps (Sec. 4): one row per model and
    prolonged mode of :func:`rate_summary` with its verdict."""
    rows = []
    for name in sorted(prop_by_model):
        for mode in ("prolonged_full", "prolonged_real"):
            s = rate_summary(prop_by_model[name], spectra_by_model.get(name), mode)
            if s is None:
                continue
            rows.append(
                {
                    "model": name,
                    "random twin": _twin_cell(name, like, prop_by_model),
                    "shared": s["shared"],
                    "mode": mode,
                    "layers": s["layers"],
                    "final gamma": s["gamma_final"],
                    "gamma null": s["gamma_null_final"],
                    "measured rate": s["measured"],
                    "|mu2/mu1|": s["predicted"],
                    "max(|mu2|,1)/|mu1|": s["asymptotic"],
                    "verdict": s["verdict"] + (f" ({s['note']})" if s["note"] else ""),
                }
            )
    return rows


def claim3_rows(
    spectra_by_model: Mapping[str, xr.Dataset], like: Mapping[str, str]
) -> list[dict[str, Any]]:
    """Claim (3), small spectral gaps: one row per model of :func:`gap_summary`."""
    rows = []
    for name in sorted(spectra_by_model):
        s = gap_summary(spectra_by_model[name])
        rows.append(
            {
                "model": name,
                "random twin": _twin_cell(name, like, spectra_by_model),
                "layers": s["layers"],
                f"gap/|l1| < {SMALL_GAP:g}": s["frac_small"],
                "median gap/|l1|": s["median_rel_gap"],
                "complex lambda_1": s["complex_lambda1"],
                "verdict": s["verdict"],
            }
        )
    return rows


def claim4_rows(steer_by_model: Mapping[str, xr.Dataset]) -> tuple[list[dict[str, Any]], list[str]]:
    """Claim (4), steering W_O towards u (Sec. 5): one row per model, method and c with
    :func:`steer_verdict`, and a warning for every change of W_O larger than W_O itself
    (the layer is then replaced, not steered)."""
    rows, warns = [], []
    for name in sorted(steer_by_model):
        df = steering_table(steer_by_model[name], name)
        for rec in df.to_dict("records"):
            rows.append(
                {
                    "model": name,
                    "method": rec["method"],
                    "c": rec["c"],
                    "residual": rec["residual"],
                    "u leading": rec["u_is_leading"],
                    "gamma_u orig": rec["gamma_u_original"],
                    "gamma_u steered": rec["gamma_u_steered"],
                    "gamma_u null": rec["gamma_u_null"],
                    "|dW_O|/|W_O|": rec["relative_change"],
                    "p before": rec["p_before"],
                    "p after": rec["p_after"],
                    "verdict": steer_verdict(rec),
                }
            )
            if rec["relative_change"] > 1.0:
                warns.append(
                    f"- **Warning** ({name}, {rec['method']}, c = {rec['c']:g}): the change of "
                    f"W_O is {rec['relative_change']:.3g} times the norm of W_O itself. At that "
                    "size the last layer is replaced rather than nudged, so any turn towards u "
                    "is no longer a power-method effect of the trained layer."
                )
    return rows, warns


def claim5_rows(sphere: xr.Dataset) -> tuple[list[dict[str, Any]], list[str]]:
    """Claim (5), only v1 a stable consensus on the sphere (supplement): one row per
    consensus point, and the verdict lines on the Jacobians, the stable point, the rate
    and supplement Figs. 13 and 14."""
    df = sphere_table(sphere)
    rows = [
        {
            "k": int(r["k"]),
            "lambda_k": r["eigenvalue"],
            "radius (numeric)": r["jacobian_radius_numeric"],
            "radius (closed form)": r["jacobian_radius_closed_form"],
            "max |diff|": r["max_abs_diff"],
            "stable": bool(r["stable"]),
            "supplement radial value": r["supplement_radial_value"],
            "stable by supplement": bool(r["supplement_stable"]),
        }
        for r in df.to_dict("records")
    ]
    note = str(sphere.attrs.get("rate_note", ""))
    return rows, _stability_lines(df, note) + _figure13_lines(sphere) + _figure14_lines(sphere)


def _stability_lines(df: pd.DataFrame, rate_note: str = "") -> list[str]:
    """Verdicts on the Jacobians at consensus, the stable point and the rate
    (``rate_note``: why the run measured none, sphere.nc's attribute)."""
    lines = []
    maxdiff = float(df["max_abs_diff"].max())
    lines.append(
        f"- Closed-form tangent eigenvalues vs float64 autograd Jacobian: max |diff| = "
        f"{maxdiff:.2g} -> " + ("holds." if maxdiff < JACOBIAN_TOL else "does not hold.")
    )
    stable = df["stable"].to_numpy()
    only_v1 = bool(stable[0] and not stable[1:].any())
    lines.append(
        f"- Only the principal consensus v1 is stable (eta = {df['eta'].iloc[0]:g}, step-size "
        f"bound {df['stepsize_bound'].iloc[0]:g}): "
        + ("holds." if only_v1 else f"does not hold (stable flags {stable.astype(int).tolist()}).")
    )
    mismatch = (df["stable"] != df["supplement_stable"]).to_numpy()
    lines.append(
        "- The supplement also lists n radial values (1 - eta l + eta^2 l^2)/(1 + eta l) at "
        "each consensus. They belong to directions normal to the product of spheres, so they "
        "are not modes of the dynamics on the sphere (the ambient derivative is 0 there; "
        "see `specalign.transformers.measure.sphere`). Here they are "
        + ", ".join(f"{v:.3g}" for v in df["supplement_radial_value"])
        + (
            "; counted as eigenvalues they would change the stability verdict at k = "
            + ", ".join(str(int(k)) for k in df["k"][mismatch])
            + "."
            if mismatch.any()
            else "; in this configuration counting them would not change any stability "
            "verdict, but for eta lambda_1 >= 2 it would call the attracting v1 unstable."
        )
    )
    meas = float(df["rate_measured"].iloc[0])
    pred = float(df["rate_asymptotic"].iloc[0])
    if np.isnan(meas):  # the run gave no rate to compare (sphere.nc's rate_note)
        lines.append(
            f"- Convergence to v1 under full attention: predicted per-step rate {pred:.4f} "
            f"(|mu_2/mu_1| = {float(df['rate_predicted'].iloc[0]):.4f}); "
            f"{rate_note or 'rate not measured'} -> undecided."
        )
        return lines
    lines.append(
        f"- Convergence to v1 under full attention: measured per-step rate {meas:.4f} vs "
        f"predicted {pred:.4f} (|mu_2/mu_1| = {float(df['rate_predicted'].iloc[0]):.4f}) -> "
        + (
            "does not hold."
            if not abs(meas - pred) <= RATE_TOL
            else "no convergence predicted (rate 1), and none measured."
            if pred >= 1.0 - NO_CONVERGENCE_TOL
            else "holds."
        )
    )
    return lines


def _figure13_lines(sphere: xr.Dataset) -> list[str]:
    """Supplement Fig. 13: do the softmax dynamics reach consensus at +-v1?"""
    lines = []
    for key, label in (("single", "single head"), ("multi", "multi-head")):
        var = f"corr_v1_{key}"
        if var in sphere:
            final = np.abs(np.asarray(sphere[var].values, dtype=float)[-1])
            lines.append(
                f"- Fig. 13 ({label}, softmax attention): final min |corr(x_i, v1)| = "
                f"{final.min():.4f} (random-direction null "
                f"{random_unit_overlap(int(sphere.attrs['d'])):.3f}) -> "
                + (
                    "consensus at +-v1 holds."
                    if final.min() > GAMMA_CONVERGED
                    else "consensus at +-v1 does not hold."
                )
            )
    return lines


def _figure14_lines(sphere: xr.Dataset) -> list[str]:
    """Supplement Fig. 14: where each perturbed bipartite consensus ends."""
    lines: list[str] = []
    if "bipartite_distance" not in sphere:
        return lines
    n_tok = int(sphere.attrs["n"])
    outs = bipartite_outcomes(sphere)
    for i, o in enumerate(outs):
        # sizes between the smallest and the largest are reported without a verdict
        first, last = FIG14_OUTCOMES
        expected = first if i == 0 else last if i == len(outs) - 1 else None
        verdict = (
            ""
            if expected is None
            else " -> as in the paper."
            if o["outcome"] == expected
            else " -> differs from the paper, where it "
            + ("returns." if expected == "returns" else "escapes to consensus at +-v1.")
        )
        lines.append(
            f"- Fig. 14, perturbation {o['perturbation']:g}: distance to the bipartite "
            f"equilibrium {o['distance_start']:.3g} -> {o['distance_end']:.3g}: {o['text']} "
            f"(full consensus and random tokens both sit at sqrt(2n) = "
            f"{math.sqrt(2 * n_tok):.2f} for an even split){verdict}"
        )
    return lines


def claim6_rows(prop_by_model: Mapping[str, xr.Dataset]) -> list[dict[str, Any]]:
    """Claim (6), the choice of correlation: claim (1) in the simplified model under the
    configured correlation and under the other one, per model, and whether the
    conclusion (holds or not) ``changes`` with the choice."""
    rows = []
    for name in sorted(prop_by_model):
        prop = prop_by_model[name]
        other = str(prop.attrs.get("corr_other", ""))
        base = tilt_summary(prop, "simplified_real")
        alt = tilt_summary(prop, "simplified_real", f"_{other}") if other else None
        if base is None or alt is None:
            continue
        same = holds(base["verdict"]) == holds(alt["verdict"])
        rows.append(
            {
                "model": name,
                "corr": str(prop.attrs.get("corr", "cosine")),
                "verdict": base["verdict"],
                "other corr": other,
                "verdict (other)": alt["verdict"],
                "rho - null (other)": alt["excess"],
                "conclusion": "unchanged" if same else "changes",
            }
        )
    return rows


# --------------------------------------------------------------------------- series


def _first_lasting(steps: np.ndarray, ok: np.ndarray) -> int | None:
    """The first step from which ``ok`` holds at every later step, or None."""
    for i in range(len(steps)):
        if ok[i:].all():
            return int(steps[i])
    return None


def claim1_over_training(ds: xr.Dataset, mode: str) -> dict[str, Any]:
    """Rule fixed in advance: claim (1) has emerged at step s when, from s on, rho - null
    is at least TILT_MARGIN above its random-direction null AND at least TILT_MARGIN above
    its value at step 0 (the initialisation), and the tilt holds in a majority of layers."""
    steps = ds["step"].values
    ex = ds["rho_minus_null"].sel(mode=mode).values
    frac = ds["tilt_fraction"].sel(mode=mode).values
    at0 = float(ex[0]) if int(steps[0]) == 0 else float("nan")
    ok = (ex >= TILT_MARGIN) & (frac >= TILT_MAJORITY)
    if np.isfinite(at0):
        ok &= ex - at0 >= TILT_MARGIN
    return {
        "mode": mode,
        "step0": at0,
        "final": float(ex[-1]),
        "emerges": _first_lasting(steps, ok),
        "final_frac": float(frac[-1]),
    }


def claim2_over_training(ds: xr.Dataset, prolonged: str) -> dict[str, Any]:
    """Rule fixed in advance: claim (2) holds for the last checkpoint of a series when the
    prolonged run's final gamma is >= GAMMA_CONVERGED and its measured rate is within
    RATE_TOL of |mu2/mu1|. Returns the final gamma at the first and the last step, the
    measured and predicted rates at the last, both tests and the ``verdict``."""
    g = ds["final_gamma"].sel(prolonged=prolonged).values
    m = ds["measured_rate"].sel(prolonged=prolonged).values
    r = ds["predicted_rate"].sel(prolonged=prolonged).values
    converged = bool(g[-1] >= GAMMA_CONVERGED)
    rate_matches = bool(abs(m[-1] - r[-1]) <= RATE_TOL)
    return {
        "gamma_start": float(g[0]),
        "gamma_final": float(g[-1]),
        "measured": float(m[-1]),
        "predicted": float(r[-1]),
        "converged": converged,
        "rate_matches": rate_matches,
        "verdict": "holds" if converged and rate_matches else "does not hold",
    }
