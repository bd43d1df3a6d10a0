"""Atomic writes and clear errors for corrupt inputs (the data contracts' I/O layer)."""

import numpy as np
import pytest
import xarray as xr

from specalign import io
from specalign.commutators.contracts import read_trajectories


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.h5"
    with pytest.raises(RuntimeError), io.atomic_path(target) as tmp:
        tmp.write_bytes(b"half a file")
        raise RuntimeError("killed halfway")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary file either


def test_atomic_path_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("complete old result")
    with pytest.raises(RuntimeError), io.atomic_path(target) as tmp:
        tmp.write_text("partial")
        raise RuntimeError
    assert target.read_text() == "complete old result"


def test_h5_round_trip_with_strings_and_attrs(tmp_path):
    path = tmp_path / "x.h5"
    io.write_h5(
        path,
        {"a/b": np.arange(6.0).reshape(2, 3), "labels": np.array(["r<=1e-3", "t=100"])},
        attrs={"config": {"k": [1, 2]}, "n": 3},
    )
    data, attrs = io.read_h5(path)
    np.testing.assert_array_equal(data["a/b"], np.arange(6.0).reshape(2, 3))
    assert list(data["labels"]) == ["r<=1e-3", "t=100"]
    assert attrs["config"] == '{"k": [1, 2]}' and attrs["n"] == 3


@pytest.mark.parametrize("damage", ["truncate", "garbage", "missing"])
def test_corrupt_hdf5_names_the_file(tmp_path, damage):
    path = tmp_path / "trajectories.h5"
    io.write_h5(path, {"X_train": np.zeros((3, 2))})
    if damage == "truncate":
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 3])
    elif damage == "garbage":
        path.write_bytes(b"\x00not hdf5" * 100)
    else:
        path.unlink()
    with pytest.raises(io.InputFileError) as err:
        io.read_h5(path)
    assert str(path) in str(err.value)


def test_trajectories_missing_datasets_named(tmp_path):
    path = tmp_path / "trajectories.h5"
    io.write_h5(path, {"X_train": np.zeros((3, 2)), "y_train": np.zeros(3)})
    with pytest.raises(io.InputFileError) as err:
        read_trajectories(path)
    assert str(path) in str(err.value) and "checkpoints/iteration" in str(err.value)


def test_corrupt_netcdf_names_the_file(tmp_path):
    path = tmp_path / "diagnostics.nc"
    io.write_netcdf(path, xr.Dataset({"G_D": (("seed",), np.ones(3))}))
    np.testing.assert_array_equal(io.read_netcdf(path)["G_D"].values, np.ones(3))
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(io.InputFileError) as err:
        io.read_netcdf(path)
    assert str(path) in str(err.value)
