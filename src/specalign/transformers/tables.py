"""Tables of the transformer study (Li & Altafini, arXiv:2605.25619) and the summaries
its reproduction report is built from.

Inputs are loaded ``spectra.nc``, ``propagation.nc``, ``steering.nc`` (one per model)
and ``sphere.nc`` (:mod:`specalign.transformers.contracts` describes every variable).
Tables are tidy pandas frames (one row per layer, per (mode, layer), per (method, c) or
per consensus point), written with :func:`specalign.output.write_table` (csv at full
precision + markdown). The summaries (:func:`tilt_summary`, :func:`rate_summary`,
:func:`gap_summary`, :func:`steer_verdict`) measure each claim of
:mod:`specalign.transformers.paper` and give a verdict under the rules below, fixed
before looking at the data.

Conventions:

* layers are 1-based (t = 1..T; ``spectra.nc`` stores 0-based layers and is shifted);
* "sd" is the population standard deviation (ddof 0) over tokens or prompts: the
  spread of the measured tokens, not an estimate for a larger population;
* NaN entries (a layer whose F has no real eigenvector, a non-causal model's
  next-token probability) are skipped by every mean, never read as 0;
* the random-weight twin of a model ``m`` is the random model whose ``like:`` names
  ``m`` (the first by name when several do), the chance level of every trained-model
  result; ``like`` maps each random model to the model it copies
  (:func:`specalign.config.random_likes`), never guessed from the names.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from specalign.output import nanmean as _nanmean
from specalign.output import nanstd as _nanstd
from specalign.output import write_table
from specalign.transformers.weights import shares_weights

__all__ = [
    "GAMMA_CONVERGED",
    "JACOBIAN_TOL",
    "MODEL_TABLES",
    "NO_CONVERGENCE_TOL",
    "RATE_TOL",
    "RESIDUAL_TOL",
    "SMALL_GAP",
    "STEER_MIN_GAIN",
    "TILT_MAJORITY",
    "TILT_MARGIN",
    "bipartite_outcomes",
    "eigenvalue_table",
    "gap_summary",
    "holds",
    "is_random_model",
    "layer_eigenvalues",
    "leading_vector_overlaps",
    "mode_view",
    "propagation_table",
    "random_twin",
    "random_unit_overlap",
    "rate_summary",
    "relative_gaps",
    "sphere_table",
    "steer_verdict",
    "steering_table",
    "tilt_summary",
    "write_model_tables",
    "write_sphere_table",
]

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
#: Claim (4): a residual |F'u - c r u| / |c r| below this means u is an eigenvector.
RESIDUAL_TOL = 1e-6
#: Claim (5): numeric vs closed-form Jacobian eigenvalue moduli agree within this.
JACOBIAN_TOL = 1e-8

_N_EIGS = 5


# --------------------------------------------------------------------------- helpers


def random_unit_overlap(d: int) -> float:
    """E|<u, v>| for independent uniform unit vectors in R^d (exact).

    ``Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2))``, which is ``sqrt(2/(pi d))`` to leading
    order (relative error ~1/(4d)); by rotation invariance it is also E|cos(x, r)| for
    any fixed x and uniform random r, i.e. the random-direction null of gamma.
    """
    if d < 1:
        raise ValueError("d must be >= 1")
    return float(math.exp(math.lgamma(d / 2) - math.lgamma((d + 1) / 2)) / math.sqrt(math.pi))


def _over(da: xr.DataArray, dim: str, fn: Any) -> np.ndarray:
    return fn(da.values, axis=da.get_axis_num(dim))


def is_random_model(name: str, like: Mapping[str, str]) -> bool:
    """Whether ``name`` is a random-weight model (a key of ``like``: random model ->
    the model whose configuration it copies)."""
    return name in like


def random_twin(name: str, like: Mapping[str, str], names: Any = None) -> str | None:
    """The random-weight twin of ``name``: the random model whose ``like:`` names it (the
    first by name when several do; only among ``names`` when given), or None."""
    twins = sorted(r for r, m in like.items() if m == name and (names is None or r in names))
    return twins[0] if twins else None


def mode_view(prop: xr.Dataset, mode: str) -> xr.Dataset | None:
    """``prop`` at one mode, cut to the layers that mode has; None if the mode is absent.

    Modes are NaN-padded to the longest (the prolonged run). A layer exists when its
    random-direction null is finite somewhere: the null is defined for every computed
    layer, whereas gamma is NaN at a real layer too when F_t has no real eigenvector.
    """
    if "mode" not in prop.dims or mode not in [str(m) for m in prop["mode"].values]:
        return None
    ds = prop.sel(mode=mode)
    ok = np.isfinite(ds["gamma_null"].values).any(axis=ds["gamma_null"].get_axis_num("token"))
    if not ok.any():
        return None
    last = int(np.flatnonzero(ok)[-1])
    cut = {"layer": slice(0, last + 1)}
    if "state" in ds.dims:
        cut["state"] = slice(0, last + 2)
    return ds.isel(cut)


def _per_layer_spectra(spectra: xr.Dataset) -> xr.Dataset:
    """The block variables of ``spectra`` per layer t = 1..L (each layer's block via
    ``layer_block``), with the coordinates ``layer`` and ``layer_block`` of the file."""
    lb = np.asarray(spectra["layer_block"].values, dtype=int)
    per = spectra.drop_dims("layer", errors="ignore").isel(block=xr.DataArray(lb, dims="layer"))
    per = per.drop_vars("block", errors="ignore")
    return per.assign_coords(layer=spectra["layer"].values, layer_block=("layer", lb))


def layer_eigenvalues(spectra: xr.Dataset, n: int = _N_EIGS) -> np.ndarray:
    """Complex (n_layers, n) array of lambda_1..n of each layer's F (NaN past ``n_eigs``).

    A factored (grouped-query) block lists only its nonzero eigenvalues; its exact zeros
    (``n_zero_eigenvalues`` of them) are put back at their rank in F's sort order.
    """
    per = _per_layer_spectra(spectra)
    lam = per["eigenvalues_real"].values + 1j * per["eigenvalues_imag"].values
    if "n_zero_eigenvalues" in per and int(per["n_zero_eigenvalues"].max()) > 0:
        where = np.asarray(per["zero_eigenvalues_index"].values, dtype=int)
        count = np.asarray(per["n_zero_eigenvalues"].values, dtype=int)
        stored = lam.shape[1]
        full = np.full((lam.shape[0], min(n, stored + int(count.max()))), np.nan + 0j)
        for t in range(lam.shape[0]):
            row = lam[t]
            if where[t] <= stored:  # zeros past a truncated list: their rank is unknown
                row = np.concatenate([row[: where[t]], np.zeros(count[t]), row[where[t] :]])
            full[t, : min(n, row.size)] = row[:n]
        lam = full
    out = np.full((lam.shape[0], n), np.nan + 0j)
    k = min(n, lam.shape[1])
    out[:, :k] = lam[:, :k]
    return out


def relative_gaps(spectra: xr.Dataset) -> np.ndarray:
    """gap / |lambda_1| per layer: the scale-free spectral gap (claim 3)."""
    per = _per_layer_spectra(spectra)
    lam1 = np.hypot(per["eigenvalues_real"].values[:, 0], per["eigenvalues_imag"].values[:, 0])
    if "n_zero_eigenvalues" in per and int(per["n_zero_eigenvalues"].max()) > 0:
        lam1 = np.abs(layer_eigenvalues(spectra, 1)[:, 0])  # lambda_1 may be an exact zero
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(per["gap"].values, dtype=float) / lam1


def leading_vector_overlaps(spectra: xr.Dataset) -> np.ndarray:
    """|<v1_t, v1_{t+1}>| for t = 1..T-1 between consecutive layers' leading real
    eigenvectors (``v1_leading_real``, the direction gamma uses), each renormalised.

    Shared blocks give exactly 1; a layer without a real eigenvector gives NaN.
    """
    V = np.asarray(_per_layer_spectra(spectra)["v1_leading_real"].values, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        V = V / np.linalg.norm(V, axis=1, keepdims=True)
    return np.abs(np.einsum("td,td->t", V[:-1], V[1:]))


# --------------------------------------------------------------------------- tables


def eigenvalue_table(spectra: xr.Dataset, model: str, n_eigs: int = _N_EIGS) -> pd.DataFrame:
    """One row per layer: block, Re/Im of lambda_1..n, gap (and gap/|lambda_1|), spectral
    radius, whether it is attained by a negative eigenvalue, whether lambda_1 is complex,
    the dominant eigenvalue 1 + eta lambda_k of I + eta F (and whether k = 1), and the
    paper's step-size bound eta < 2/|Re l1 + Re ld| (inf when it does not bind)."""
    per = _per_layer_spectra(spectra)
    lam = layer_eigenvalues(spectra, n_eigs)
    T = lam.shape[0]
    df = pd.DataFrame(
        {
            "model": [model] * T,
            "layer": np.asarray(per["layer"].values, dtype=int),
            "block": np.asarray(per["layer_block"].values, dtype=int),
        }
    )
    for i in range(n_eigs):
        df[f"re_lambda_{i + 1}"] = lam[:, i].real
    for i in range(n_eigs):
        df[f"im_lambda_{i + 1}"] = lam[:, i].imag
    df["gap"] = np.asarray(per["gap"].values, dtype=float)
    df["rel_gap"] = relative_gaps(spectra)
    df["spectral_radius"] = np.asarray(per["spectral_radius"].values, dtype=float)
    df["radius_is_negative"] = np.asarray(per["radius_is_negative"].values).astype(bool)
    df["lambda1_is_complex"] = np.asarray(per["lambda1_is_complex"].values).astype(bool)
    df["dominant_I_plus_etaF_real"] = np.asarray(per["lambda_I_plus_etaF_real"].values, float)
    df["dominant_I_plus_etaF_imag"] = np.asarray(per["lambda_I_plus_etaF_imag"].values, float)
    df["dominant_is_lambda1"] = np.asarray(per["dominant_is_lambda1"].values).astype(bool)
    df["eta"] = float(spectra.attrs.get("eta", np.nan))
    df["eta_bound"] = np.asarray(per["eta_bound"].values, dtype=float)
    return df


def propagation_table(prop: xr.Dataset, model: str) -> pd.DataFrame:
    """One row per (mode, layer) of the layers each mode has.

    Columns: ``layer`` (1..L, more for the prolonged modes) and its ``block`` (empty for a
    file without ``layer_block``), ``gamma``/``gamma_sd`` (token mean and sd),
    ``gamma_meantok`` (the mean token of each prompt, averaged over prompts),
    ``psi``/``psi_sd``, ``rho``,
    ``rho_meantok``; the random-direction nulls ``gamma_null``, ``psi_null``,
    ``rho_null`` and the most-negative-eigenvector nulls ``gamma_neg_null``,
    ``rho_neg_null``; and, when present, ``gamma_<other>``, ``rho_<other>``,
    ``gamma_null_<other>``, ``rho_null_<other>`` under the other correlation (``corr``
    and ``corr_other`` name both).
    """
    corr = str(prop.attrs.get("corr", "cosine"))
    other = str(prop.attrs.get("corr_other", "pearson" if corr == "cosine" else "cosine"))
    frames = []
    for mode in [str(m) for m in prop["mode"].values]:
        ds = mode_view(prop, mode)
        if ds is None:
            continue
        T = ds.sizes["layer"]
        cols: dict[str, Any] = {
            "model": [model] * T,
            "mode": [mode] * T,
            "layer": ds["layer"].values.astype(int),
            # the block each layer uses (the repeated layer's past the model's depth)
            "block": pd.array(
                ds["layer_block"].values if "layer_block" in ds.coords else [pd.NA] * T,
                dtype="Int64",
            ),
            "corr": [corr] * T,
            "gamma": _over(ds["gamma"], "token", _nanmean),
            "gamma_sd": _over(ds["gamma"], "token", _nanstd),
            "gamma_meantok": _over(ds["gamma_mean"], "prompt", _nanmean),
            "psi": _over(ds["psi"], "token", _nanmean),
            "psi_sd": _over(ds["psi"], "token", _nanstd),
            "rho": ds["rho"].values.astype(float),
            "rho_meantok": ds["rho_mean"].values.astype(float),
            "gamma_null": _over(ds["gamma_null"], "token", _nanmean),
            "psi_null": _over(ds["psi_null"], "token", _nanmean),
            "rho_null": ds["rho_null"].values.astype(float),
            "gamma_neg_null": _over(ds["gamma_neg_null"], "token", _nanmean),
            "rho_neg_null": ds["rho_neg_null"].values.astype(float),
        }
        for base in ("gamma", "rho", "gamma_null", "rho_null"):
            var = f"{base}_{other}"
            if var in ds:
                da = ds[var]
                cols[var] = (
                    _over(da, "token", _nanmean) if "token" in da.dims else da.values.astype(float)
                )
        frames.append(pd.DataFrame(cols))
    if not frames:
        return pd.DataFrame(columns=["model", "mode", "layer"])
    return pd.concat(frames, ignore_index=True)


def steering_table(steer: xr.Dataset, model: str) -> pd.DataFrame:
    """One row per (method, c): the size of the W_O change, whether u became an
    eigenvector (residual), gamma_u after the last layer original vs steered with the
    random-direction null, the steered model's last-layer gamma and rho, the mean
    next-token probability of the target before/after (NaN for non-causal models), the
    target token and ``target_warning`` (non-empty when target_text encodes to several
    tokens, of which the target is the first)."""
    target = str(steer.attrs.get("target_id", ""))
    if "target_tokens" in steer.attrs:
        target = " ".join(json.loads(str(steer.attrs["target_tokens"])))
    warning = str(steer.attrs.get("target_warning", ""))
    rows = []
    for method in [str(m) for m in steer["method"].values]:
        for c in [float(c) for c in steer["c"].values]:
            sub = steer.sel({"method": method, "c": c})
            g = sub["gamma_u"]
            gm = sub["gamma_u_mean"]
            rows.append(
                {
                    "model": model,
                    "method": method,
                    "c": c,
                    "relative_change": float(sub["relative_change"]),
                    "residual": float(sub["residual"]),
                    "target_eigenvalue": float(sub["target_eigenvalue"]),
                    "u_is_leading": bool(float(sub["u_is_leading"]) > 0.5),
                    "gamma_u_original": _nanmean(g.sel(variant="original")),
                    "gamma_u_steered": _nanmean(g.sel(variant="steered")),
                    "gamma_u_sd_original": _nanstd(g.sel(variant="original")),
                    "gamma_u_sd_steered": _nanstd(g.sel(variant="steered")),
                    "gamma_u_meantok_original": _nanmean(gm.sel(variant="original")),
                    "gamma_u_meantok_steered": _nanmean(gm.sel(variant="steered")),
                    "gamma_u_null": _nanmean(sub["gamma_u_null"]),
                    "gamma_last_layer_steered": _nanmean(sub["gamma_layers"].isel(layer=-1)),
                    "rho_last_layer_steered": float(sub["rho_layers"].isel(layer=-1)),
                    "p_before": _nanmean(sub["p_before"]),
                    "p_after": _nanmean(sub["p_after"]),
                    "target_tokens": target,
                    "target_warning": warning,
                }
            )
    return pd.DataFrame(rows)


def _radial_value(a: float) -> float:
    """The supplement's radial 'eigenvalue' at a consensus, a = eta lambda_k (the value
    with multiplicity n, or n - 1 when 1 + a < 0); see specalign.transformers.sphere."""
    if 1.0 + a > 0:
        return (1.0 - a + a * a) / (1.0 + a)
    return (-1.0 - a + a * a) / (1.0 + a)


def sphere_table(sphere: xr.Dataset) -> pd.DataFrame:
    """One row per consensus point x_i = v_k (k = 1..d, by decreasing eigenvalue).

    Columns: eigenvalue, the numeric tangent-Jacobian spectral radius, the closed form's,
    max |numeric - closed form| over the sorted moduli, the stable flag (radius < 1), the
    supplement's radial value (1 - eta l + eta^2 l^2)/(1 + eta l) (not a mode on the
    sphere) and the verdict one would draw from it; then, the same on every row, eta, the
    step-size bound, and the measured vs predicted per-step convergence rate at v1.
    """
    eta = float(sphere.attrs["eta"])
    lam = np.asarray(sphere["eigenvalues"].values, dtype=float)
    numeric = np.asarray(sphere["jacobian_numeric"].values, dtype=float)
    closed = np.asarray(sphere["jacobian_closed_form"].values, dtype=float)
    radial = np.array([_radial_value(eta * lk) for lk in lam])
    supp_radius = np.maximum(np.abs(radial), closed[:, 0])
    return pd.DataFrame(
        {
            "k": np.arange(1, lam.size + 1),
            "eigenvalue": lam,
            "jacobian_radius_numeric": numeric[:, 0],
            "jacobian_radius_closed_form": closed[:, 0],
            "max_abs_diff": np.asarray(sphere["jacobian_max_abs_diff"].values, dtype=float),
            "stable": np.asarray(sphere["stable"].values).astype(bool),
            "supplement_radial_value": radial,
            "supplement_stable": supp_radius < 1.0,
            "eta": eta,
            "stepsize_bound": float(sphere.attrs["stepsize_bound"]),
            "eta_within_bound": bool(int(sphere.attrs["eta_within_bound"])),
            "rate_predicted": float(sphere.attrs["rate_predicted"]),
            "rate_asymptotic": float(sphere.attrs["rate_asymptotic"]),
            "rate_measured": float(sphere.attrs["rate_measured"]),
        }
    )


def bipartite_outcomes(sphere: xr.Dataset) -> list[dict[str, Any]]:
    """Where each perturbed bipartite consensus of supplement Fig. 14 ends.

    ``outcome`` is "returns" (final distance to the bipartite state below a tenth of the
    initial one), "consensus" (every token at the same one of +-v1: the escape the paper
    describes), "bipartite" (every token at +-v1 but split differently, ``n_plus`` at
    +v1), or "elsewhere" (not on the line of v1 at the last step).
    """
    v1 = np.asarray(sphere["eigenvectors"].values, dtype=float)[:, 0]
    dist = np.asarray(sphere["bipartite_distance"].values, dtype=float)
    out = []
    for k, p in enumerate(np.asarray(sphere["perturbation"].values, dtype=float)):
        final = np.asarray(sphere["traj_bipartite"].isel(perturbation=k).values)[-1] @ v1
        on_line = bool(np.all(np.abs(final) > 1.0 - 1e-3))
        n_plus = int(np.sum(final > 0))
        if dist[k, -1] < 0.1 * dist[k, 0]:
            outcome = "returns"
        elif on_line and n_plus in (0, final.size):
            outcome = "consensus"
        elif on_line:
            outcome = "bipartite"
        else:
            outcome = "elsewhere"
        text = {
            "returns": "returns to the bipartite equilibrium",
            "consensus": "escapes to consensus at one of +-v1",
            "bipartite": f"escapes to another bipartite split ({n_plus} at +v1, "
            f"{final.size - n_plus} at -v1)",
            "elsewhere": "escapes and is not on the line of v1 at the last step",
        }[outcome]
        out.append(
            {
                "perturbation": float(p),
                "distance_start": float(dist[k, 0]),
                "distance_end": float(dist[k, -1]),
                "outcome": outcome,
                "n_plus": n_plus,
                "text": text,
            }
        )
    return out


# --------------------------------------------------------------------------- claims


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
    psi_t = _over(ds[f"psi{suffix}"], "token", _nanmean)
    rho_t = ds[f"rho{suffix}"].values.astype(float)
    rho_null_t = ds[f"rho_null{suffix}"].values.astype(float)
    defined = np.isfinite(psi_t) & np.isfinite(rho_t)
    holds = (psi_t > 0) & (rho_t > 0.5)
    frac = float(holds[defined].mean()) if defined.any() else float("nan")
    null_frac = float("nan")
    if not suffix and "psi_null" in ds:
        psi_null_t = _over(ds["psi_null"], "token", _nanmean)
        null_frac = float(((psi_null_t > 0) & (rho_null_t > 0.5)).mean())
    neg_frac, rho_neg = float("nan"), float("nan")
    if not suffix and "psi_neg_null" in ds and "rho_neg_null" in ds:
        psi_neg_t = _over(ds["psi_neg_null"], "token", _nanmean)
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
    out["verdict"] = _tilt_verdict(out)
    return out


def _tilt_verdict(s: Mapping[str, Any]) -> str:
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
    return verdict.startswith("holds")


def _predicted_rates(spectra: xr.Dataset) -> dict[str, Any]:
    """Power-method rates of the last layer's I + eta F (the prolonged layers repeat it):
    |mu_2/mu_1| and the n-token asymptotic max(|mu_2|, 1)/|mu_1|, mu = 1 + eta lambda in
    the order of lambda's real part (as specalign.transformers.sphere)."""
    eta = float(spectra.attrs.get("eta", np.nan))
    lam = layer_eigenvalues(spectra, 2)[-1]
    mu = 1.0 + eta * lam
    per = _per_layer_spectra(spectra).isel(layer=-1)
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
    past the original depth do, and only those enter the rate. Whether the weights are
    shared is what ``spectra.nc`` records (:func:`~specalign.transformers.weights.
    shares_weights`); without ``spectra`` the model counts as unshared. None if the mode
    is absent.
    """
    from specalign.transformers.sphere import measured_convergence_rate

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
    out["verdict"] = _rate_verdict(out)
    return out


def _rate_verdict(s: Mapping[str, Any]) -> str:
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
    rel = relative_gaps(spectra)
    ok = np.isfinite(rel)
    frac = float(np.mean(rel[ok] < SMALL_GAP)) if ok.any() else float("nan")
    return {
        "layers": int(ok.sum()),
        "frac_small": frac,
        "median_rel_gap": float(np.median(rel[ok])) if ok.any() else float("nan"),
        "complex_lambda1": int(
            np.asarray(_per_layer_spectra(spectra)["lambda1_is_complex"].values).sum()
        ),
        "verdict": (
            "not measured"
            if not np.isfinite(frac)
            else ("holds" if frac > 0.5 else "does not hold")
            + f" ({frac:.0%} of layers with gap/|lambda_1| < {SMALL_GAP:g})"
        ),
    }


def steer_verdict(row: Mapping[str, Any]) -> str:
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


# --------------------------------------------------------------------------- writers


def _eigenvalue_caption(model: str, spectra: xr.Dataset) -> str:
    return (
        f"Eigenvalues of F_t = W_O W_V per layer, {model} (lambda sorted by real part; "
        "gap = Re l1 - Re l2, or Re l1 - Re l3 for a complex l1; dominant eigenvalue of "
        "I + eta F and the step-size bound 2/|Re l1 + Re ld|)."
    )


def _propagation_caption(model: str, prop: xr.Dataset) -> str:
    return (
        f"Token alignment per mode and layer, {model}: gamma, psi (token mean, sd), rho, "
        "the mean-token variants, random-direction (_null) and most-negative-eigenvector "
        f"(_neg_null) nulls; correlation {prop.attrs.get('corr', 'cosine')}, with "
        "gamma/rho under the other correlation."
    )


def _steering_caption(model: str, steer: xr.Dataset) -> str:
    warning = str(steer.attrs.get("target_warning", ""))
    return (
        f"Steering the last layer towards '{steer.attrs.get('target_text', '?')}', "
        f"{model}: per method and c, the relative W_O change, the eigenvector residual, "
        "gamma_u original/steered with its random-direction null, and the next-token "
        "probability (NaN for non-causal models)." + (f" Warning: {warning}." if warning else "")
    )


#: The per-model tables the workflow writes: stem -> (input file it reads, table
#: builder, caption builder), each builder called as ``f(model, dataset)``.
MODEL_TABLES: dict[str, tuple[str, Any, Any]] = {
    "eigenvalues": ("spectra", lambda m, ds: eigenvalue_table(ds, m), _eigenvalue_caption),
    "propagation": ("propagation", lambda m, ds: propagation_table(ds, m), _propagation_caption),
    "steering": ("steering", lambda m, ds: steering_table(ds, m), _steering_caption),
}


def write_model_tables(
    outdir: str | os.PathLike[str], model: str, inputs: Mapping[str, xr.Dataset | None]
) -> list[Path]:
    """Write the :data:`MODEL_TABLES` (csv + md) of one model into ``outdir`` for the
    inputs given (``{"spectra": ds, "propagation": ds, "steering": ds}``, any may be
    absent); return the paths written."""
    paths: list[Path] = []
    for stem, (key, build, caption) in MODEL_TABLES.items():
        ds = inputs.get(key)
        if ds is not None:
            paths += write_table(build(model, ds), Path(outdir) / stem, caption(model, ds))
    return paths


def write_sphere_table(stem: str | os.PathLike[str], sphere: xr.Dataset) -> list[Path]:
    """Write :func:`sphere_table` as ``{stem}.csv`` and ``{stem}.md``."""
    return write_table(
        sphere_table(sphere),
        stem,
        "Consensus points of the sphere dynamics (supplement): tangent-Jacobian spectral "
        "radius numeric vs closed form, stability, the supplement's radial value (not a mode "
        "on the sphere), the step-size bound and the measured vs predicted rate at v1.",
    )
