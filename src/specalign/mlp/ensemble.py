"""One experiment of the commutator study, from samples to the data contracts.

This module connects the kernels (``train``, ``diagnostics``) with the two files every
experiment produces:

* ``trajectories.h5``: the samples, the weights at every checkpoint
  (``weights/W{l}`` of shape (seed, checkpoint, m_{l+1}, m_l), NaN where a checkpoint
  was not reached), ``checkpoints/iteration`` (-1 where not reached),
  ``checkpoints/label``, ``risk/train`` (seed, iteration) and the resolved experiment
  config as a JSON attribute;
* ``diagnostics.nc``: every diagnostic over dims (seed, checkpoint, layer) (and ``kb``
  for the localised energies), NaN where undefined.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from specalign.io import InputFileError, read_h5, require, write_h5


def widths_of(exp: Mapping[str, Any], d_in: int) -> list[int]:
    """Layer widths [m_0, m_1, ..., m_H, 1] of an experiment's networks."""
    return [d_in] + [int(exp["width"])] * int(exp["hidden"]) + [1]


def seeds_of(exp: Mapping[str, Any]) -> list[int]:
    start = int(exp.get("seed_start", 0))
    return list(range(start, start + int(exp["seeds"])))


def initial_weights(exp: Mapping[str, Any], d_in: int) -> list[np.ndarray]:
    """He initialisation of every seed, then the experiment's rescaling (Section 10.6)."""
    from specalign.mlp import train

    Ws = train.he_init(widths_of(exp, d_in), seeds_of(exp))
    c = float(exp.get("rescale", {}).get("c", 1.0))
    if c != 1.0:
        Ws = train.rescale(Ws, int(exp["rescale"]["layer"]), c)
    return Ws


def train_experiment(
    exp: Mapping[str, Any],
    X: np.ndarray,
    y: np.ndarray,
    device: str = "cpu",
    progress: Callable[[int, int], None] | None = None,
) -> Any:
    """Train every seed of ``exp`` at once on (X, y); returns ``train.TrainResult``."""
    from specalign.mlp import train

    t = exp["training"]
    return train.train_ensemble(
        initial_weights(exp, X.shape[1]),
        X,
        y,
        lr=float(t["lr"]),
        n_iter=int(t["iterations"]),
        risk_levels=list(t["risk_levels"]),
        times=list(t["times"]),
        device=device,
        progress=progress,
    )


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


def _half_mse(F: np.ndarray, y: np.ndarray) -> np.ndarray:
    return 0.5 * np.mean((F - y) ** 2, axis=-1)


def diagnostics_dataset(
    traj: Mapping[str, Any],
    settings: Mapping[str, Any],
    progress: Callable[..., None] | None = None,
) -> Any:
    """Evaluate every (seed, checkpoint) network of a trajectory into an xarray Dataset.

    Global defects G_* use the evaluation sample (diagnostic for synthetic experiments,
    test for benchmarks); the source decomposition and localised energies use the
    training sample (Section 10.1). Unreached checkpoints and diverged seeds are NaN.
    """
    import xarray as xr

    from specalign.mlp import diagnostics
    from specalign.mlp.network import forward

    weights = traj["weights"]
    S, C = traj["iteration"].shape
    H = len(weights) - 1
    kbeta = [tuple(int(v) for v in kb) for kb in settings["localize"]]
    flat = [W.reshape(S * C, *W.shape[2:]) for W in weights]
    if progress:
        progress(f"evaluating {S} seeds x {C} checkpoints x {H} layers")
    out = diagnostics.evaluate(
        flat,
        traj["X_train"],
        traj["X_eval"],
        kbeta=kbeta,
        gap_threshold=float(settings["gap_threshold"]),
        eps=float(settings["eps"]),
    )

    risk_train = _half_mse(forward(flat, traj["X_train"]).F, traj["y_train"]).reshape(S, C)
    risk0 = traj["risk"][:, 0]
    coords = {
        "seed": np.asarray(traj["seeds"], dtype=np.int64),
        "checkpoint": np.asarray(traj["labels"], dtype=object).astype(str),
        "layer": np.arange(H),
        "kb": [f"k{k}b{b}" for k, b in kbeta],
    }
    data_vars: dict[str, Any] = {}
    for name, arr in out.items():
        arr = np.asarray(arr)
        if arr.ndim == 2:
            data_vars[name] = (("seed", "checkpoint", "layer"), arr.reshape(S, C, H))
        elif arr.ndim == 3:
            data_vars[name] = (
                ("seed", "checkpoint", "layer", "kb"),
                arr.reshape(S, C, H, len(kbeta)),
            )
        else:  # pragma: no cover - the kernel's contract
            raise ValueError(f"diagnostic {name} has unexpected shape {arr.shape}")
    iteration = np.asarray(traj["iteration"], dtype=np.int64)
    reached = iteration >= 0
    data_vars["iteration"] = (("seed", "checkpoint"), iteration)
    data_vars["time"] = (("seed", "checkpoint"), np.where(reached, iteration * traj["lr"], np.nan))
    data_vars["reached"] = (("seed", "checkpoint"), reached)
    data_vars["risk_train"] = (("seed", "checkpoint"), risk_train)
    data_vars["risk_rel"] = (("seed", "checkpoint"), risk_train / risk0[:, None])
    if traj["y_eval"] is not None:
        risk_eval = _half_mse(forward(flat, traj["X_eval"]).F, traj["y_eval"]).reshape(S, C)
        data_vars["risk_eval"] = (("seed", "checkpoint"), risk_eval)
    data_vars["diverged"] = (("seed",), np.asarray(traj["diverged"], dtype=bool))
    ds = xr.Dataset(data_vars, coords=coords)
    ds = ds.assign_coords(k=("kb", [k for k, _ in kbeta]), beta=("kb", [b for _, b in kbeta]))
    descriptions = dict(getattr(diagnostics, "VARIABLES", ()))
    for name, text in descriptions.items():
        if name in ds:
            ds[name].attrs["description"] = text if isinstance(text, str) else str(text)
    exp = traj["config"]
    ds.attrs.update(
        experiment=exp.get("name", ""),
        kind=exp["kind"],
        hidden=int(exp["hidden"]),
        width=int(exp["width"]),
        seeds=int(exp["seeds"]),
        dataset=exp.get("dataset", "synthetic"),
        data_source=exp.get("source", "synthetic"),
        rescale_c=float(exp.get("rescale", {}).get("c", 1.0)),
        eval_sample=traj["eval_name"],
        config=json.dumps(exp, sort_keys=True),
        diagnostics=json.dumps(dict(settings), sort_keys=True),
    )
    return ds
