"""The data contracts of the commutator study: what each experiment's files hold.

Every experiment produces (``results/commutators/{experiment}/``):

* ``data.h5``: the training and diagnostic (synthetic) or test (benchmark) samples,
  written by the ``prepare_data`` rule from :func:`specalign.commutators.data.prepare.
  experiment_data`;

* ``trajectories.h5``: the samples, the weights at every checkpoint
  (``weights/W{l}`` of shape (seed, checkpoint, m_{l+1}, m_l), NaN where a checkpoint
  was not reached), ``checkpoints/iteration`` (-1 where not reached),
  ``checkpoints/label``, ``risk/train`` (seed, iteration) and the resolved experiment
  config as a JSON attribute;
* ``diagnostics.nc``: every diagnostic over dims (seed, checkpoint, layer) (and ``kb``
  for the localised energies), NaN where undefined, built by
  :func:`specalign.commutators.measure.diagnostics.diagnostics_dataset`; :func:`load_experiments`
  reads a run's files back for the tables, figures and the reproduction report.

This module reads and writes; the kernels that compute what goes in live beside it
(``train``, ``diagnostics``), so that a rule that only reads a file does not depend on
the code that made it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from specalign.io import InputFileError, read_h5, read_netcdf, require, write_h5


def widths_of(exp: Mapping[str, Any], d_in: int) -> list[int]:
    """Layer widths [m_0, m_1, ..., m_H, 1] of an experiment's networks."""
    return [d_in] + [int(exp["width"])] * int(exp["hidden"]) + [1]


def seeds_of(exp: Mapping[str, Any]) -> list[int]:
    """The seeds of an experiment's ensemble: ``seeds`` consecutive from ``seed_start``."""
    start = int(exp.get("seed_start", 0))
    return list(range(start, start + int(exp["seeds"])))


def write_trajectories(
    path: str | Path,
    exp: Mapping[str, Any],
    data: Mapping[str, np.ndarray],
    result: Any,
    *,
    eval_name: str,
    data_attrs: Mapping[str, Any] | None = None,
) -> None:
    datasets: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in data.items()}
    for layer, W in enumerate(result.checkpoint_weights):
        datasets[f"weights/W{layer}"] = np.asarray(W, dtype=np.float64)
    datasets["checkpoints/iteration"] = np.asarray(result.checkpoint_iteration, dtype=np.int64)
    datasets["checkpoints/label"] = np.asarray(result.checkpoint_labels, dtype=object)
    datasets["risk/train"] = np.asarray(result.risk, dtype=np.float64)
    datasets["risk/diverged"] = np.asarray(result.diverged, dtype=bool)
    datasets["risk/diverged_at"] = np.asarray(result.diverged_at, dtype=np.int64)
    datasets["seeds"] = np.asarray(seeds_of(exp), dtype=np.int64)
    attrs = {
        "config": json.dumps(dict(exp), sort_keys=True),
        "eval_sample": eval_name,
        "lr": float(exp["training"]["lr"]),
    }
    if data_attrs:
        attrs["data"] = json.dumps(
            {k: v for k, v in data_attrs.items() if k != "experiment"}, default=str
        )
    write_h5(path, datasets, attrs=attrs)


def read_trajectories(path: str | Path) -> dict[str, Any]:
    """Read ``trajectories.h5`` and check its contract; errors name the file."""
    data, attrs = read_h5(path)
    require(
        data,
        ["X_train", "y_train", "checkpoints/iteration", "checkpoints/label", "risk/train", "seeds"],
        path,
    )
    layers = sorted(
        (int(k.split("/W")[1]) for k in data if k.startswith("weights/W")),
    )
    if not layers or layers != list(range(len(layers))):
        raise InputFileError(f"{path}: weights/W0..W(L-1) are missing or not contiguous")
    eval_name = attrs.get("eval_sample")
    if eval_name not in ("diag", "test"):
        raise InputFileError(f"{path}: attribute eval_sample must be 'diag' or 'test'")
    try:
        config = json.loads(attrs["config"])
    except (KeyError, json.JSONDecodeError) as exc:
        raise InputFileError(f"{path}: missing or unreadable 'config' attribute") from exc
    S, C = data["checkpoints/iteration"].shape
    weights = [data[f"weights/W{layer}"] for layer in layers]
    for layer, W in enumerate(weights):
        if W.ndim != 4 or W.shape[:2] != (S, C):
            raise InputFileError(
                f"{path}: weights/W{layer} has shape {W.shape}, expected ({S}, {C}, m, m')"
            )
    return {
        "path": str(path),
        "config": config,
        "weights": weights,
        "iteration": data["checkpoints/iteration"],
        "labels": [str(s) for s in data["checkpoints/label"]],
        "risk": data["risk/train"],
        "diverged": data.get("risk/diverged", np.zeros(S, dtype=bool)),
        "seeds": data["seeds"],
        "X_train": data["X_train"],
        "y_train": data["y_train"],
        "X_eval": data[f"X_{eval_name}"],
        "y_eval": data.get(f"y_{eval_name}"),
        "eval_name": eval_name,
        "lr": float(attrs.get("lr", config["training"]["lr"])),
    }


def check_trajectories_config(traj: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """Refuse trajectories trained under other settings than ``expected`` (the training
    settings the configuration asks for, as ``train_ensemble`` received them), naming
    the file and each setting that differs with both values: a diagnostics job must not
    report another ensemble (another depth, width, seeds or schedule) as this one."""
    got = traj["config"]
    differ = sorted(k for k in set(got) | set(expected) if got.get(k) != expected.get(k))
    if differ:
        name = expected.get("name", got.get("name", "?"))
        what = "; ".join(
            f"{k} {json.dumps(got.get(k))} (the configuration: {json.dumps(expected.get(k))})"
            for k in differ
        )
        raise InputFileError(
            f"{traj['path']}: trained for other settings than experiment {name!r} asks for: "
            f"{what}; fix: remove the file to train it anew, or restore the settings it "
            "was made with"
        )


def load_experiments(paths: Iterable[str | os.PathLike[str]]) -> dict[str, Any]:
    """Load diagnostics files into ``{attrs['experiment']: dataset}``."""
    out: dict[str, Any] = {}
    for path in paths:
        ds = read_netcdf(path)
        name = str(ds.attrs.get("experiment", Path(path).parent.name))
        if name in out:
            raise InputFileError(f"{path}: experiment {name!r} loaded twice")
        out[name] = ds
    return out
