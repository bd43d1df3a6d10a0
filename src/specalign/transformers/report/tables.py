"""Tables of the transformer study (Li & Altafini, arXiv:2605.25619) and the per-layer
views of its files that the tables, the figures and the claims share.

Inputs are loaded ``spectra.nc``, ``propagation.nc``, ``steering.nc`` (one per model)
and ``sphere.nc`` (:mod:`specalign.transformers.load.contracts` describes every variable).
Tables are tidy pandas frames (one row per layer, per (mode, layer), per (method, c) or
per consensus point), written with :func:`specalign.output.write_table` (csv at full
precision + markdown). The summaries that measure each claim of
:mod:`specalign.transformers.report.paper` and the verdict rules, fixed before looking at the
data, are in :mod:`specalign.transformers.report.claims`.

Conventions:

* layers are 1-based (t = 1..T; ``spectra.nc`` stores 0-based layers and is shifted);
* "sd" is the population standard deviation (ddof 0) over tokens or prompts: the
  spread of the measured tokens, not an estimate for a larger population;
* NaN entries (a layer whose F has no real eigenvector, a non-causal model's
  next-token probability) are skipped by every mean, never read as 0;
* the random-weight twin of a model ``m`` is the random model whose ``like:`` names
  ``m`` (the first by name when several do), the chance level of every trained-model
  result; ``like`` maps each random model to the model it copies
  (:func:`specalign.transformers.settings.random_likes`), never guessed from the names.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from specalign.lazy import LazyModule
from specalign.output import nanmean as _nanmean
from specalign.output import nanstd as _nanstd
from specalign.output import write_table
from specalign.transformers import metric_table

# imported when first used (specalign.lazy): the rule files import these modules for
# their names, and every snakemake call would pay these imports
pd = LazyModule("pandas")
xr = LazyModule("xarray")

__all__ = [
    "MODEL_TABLES",
    "bipartite_outcomes",
    "eigenvalue_table",
    "is_random_model",
    "layer_eigenvalues",
    "leading_vector_overlaps",
    "mode_view",
    "per_layer_spectra",
    "propagation_table",
    "random_twin",
    "random_unit_overlap",
    "reduce_dim",
    "relative_gaps",
    "sphere_table",
    "steering_table",
    "write_model_tables",
    "write_sphere_table",
]

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


def reduce_dim(da: xr.DataArray, dim: str, fn: Any) -> np.ndarray:
    """``fn(values, axis=...)`` of ``da`` over its dimension ``dim`` (a NaN-aware mean over
    tokens, say)."""
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


def per_layer_spectra(spectra: xr.Dataset) -> xr.Dataset:
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
    per = per_layer_spectra(spectra)
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
    per = per_layer_spectra(spectra)
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
    V = np.asarray(per_layer_spectra(spectra)["v1_leading_real"].values, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        V = V / np.linalg.norm(V, axis=1, keepdims=True)
    return np.abs(np.einsum("td,td->t", V[:-1], V[1:]))


# --------------------------------------------------------------------------- tables


def eigenvalue_table(spectra: xr.Dataset, model: str, n_eigs: int = _N_EIGS) -> pd.DataFrame:
    """One row per layer: block, Re/Im of lambda_1..n, gap (and gap/|lambda_1|), spectral
    radius, whether it is attained by a negative eigenvalue, whether lambda_1 is complex,
    the dominant eigenvalue 1 + eta lambda_k of I + eta F (and whether k = 1), and the
    paper's step-size bound eta < 2/|Re l1 + Re ld| (inf when it does not bind)."""
    per = per_layer_spectra(spectra)
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

    Columns (the metrics' from :func:`specalign.transformers.metric_table.table_columns`):
    ``layer`` (1..L, more for the prolonged modes) and its ``block`` (empty for a
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
        }
        # the metric table's columns; the other correlation's only where the file has them
        for c in metric_table.table_columns(other):
            if c.optional and c.variable not in ds:
                continue
            da = ds[c.variable]
            if c.over:
                cols[c.name] = reduce_dim(da, c.over, _nanstd if c.reduction == "sd" else _nanmean)
            else:
                cols[c.name] = da.values.astype(float)
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
    with multiplicity n, or n - 1 when 1 + a < 0); see specalign.transformers.measure.sphere."""
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
    warnings = [str(steer.attrs.get(k, "")) for k in ("target_warning", "probs_warning")]
    return (
        f"Steering the last layer towards '{steer.attrs.get('target_text', '?')}', "
        f"{model}: per method and c, the relative W_O change, the eigenvector residual, "
        "gamma_u original/steered with its random-direction null, and the next-token "
        "probability (NaN for non-causal models and checkpoints without their output "
        "head)." + "".join(f" Warning: {w}." for w in warnings if w)
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
