"""The comparison tool (specalign.compare): bitwise, NaN-aware, attributes included."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import xarray as xr

from specalign.compare import (
    Tolerance,
    compare_arrays,
    compare_h5,
    compare_netcdf,
    compare_text,
    compare_trees,
    main,
)


def _h5(path: Path, **overrides) -> Path:
    data = {
        "risk/train": np.array([[1.0, 0.5, np.nan], [2.0, np.inf, np.nan]]),
        "weights/W0": np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 7.0,
        "seeds": np.array([0, 1], dtype=np.int64),
    }
    data.update({k: v for k, v in overrides.items() if not k.startswith("_")})
    with h5py.File(path, "w") as f:
        for name, arr in data.items():
            if arr is not None:
                f.create_dataset(name, data=arr)
        f.create_dataset(
            "checkpoints/label",
            data=np.array(["r<=1e-1", "t=15"], dtype=object),
            dtype=h5py.string_dtype(),
        )
        f.attrs["config"] = overrides.get("_config", '{"lr": 0.05}')
        f["seeds"].attrs["unit"] = "seed"
    return path


def _nc(path: Path, drop: str | None = None, attrs: dict | None = None, **vals) -> Path:
    g = np.array([[0.25, np.nan], [np.nan, 1.0 / 3.0]])
    ds = xr.Dataset(
        {
            "G_Q": (("seed", "layer"), vals.get("G_Q", g), {"description": "internal defect"}),
            "diverged": (("seed",), np.array([False, True])),
        },
        coords={"seed": [0, 1], "layer": [0, 1], "checkpoint": ("seed", ["a", "b"])},
        attrs={"experiment": "x", "width": 8, **(attrs or {})},
    )
    if drop:
        ds = ds.drop_vars(drop)
    ds.to_netcdf(path, engine="h5netcdf")
    return path


def test_identical_files_with_nan_and_inf_are_equal(tmp_path):
    assert compare_h5(_h5(tmp_path / "a.h5"), _h5(tmp_path / "b.h5")) == []
    assert compare_netcdf(_nc(tmp_path / "a.nc"), _nc(tmp_path / "b.nc")) == []


def test_nan_equals_nan_but_signed_zero_differs():
    a = np.array([np.nan, 0.0, 1.0])
    assert compare_arrays(a, a.copy(), "x") == []
    assert not np.array_equal(a, a.copy())  # what plain IEEE comparison would say
    b = a.copy()
    b[1] = -0.0
    (line,) = compare_arrays(a, b, "x")
    assert "1 of 3" in line and "index (1,)" in line
    c = a.copy()
    c.view(np.uint64)[0] |= np.uint64(1)  # another NaN payload: bitwise different
    (line,) = compare_arrays(a, c, "x")
    assert "nan (0x" in line


def test_flipped_bit_in_a_dataset(tmp_path):
    W = np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 7.0
    flipped = W.copy()
    flipped.view(np.uint64)[1, 2, 3] ^= np.uint64(1)  # lowest mantissa bit
    diffs = compare_h5(_h5(tmp_path / "a.h5"), _h5(tmp_path / "b.h5", **{"weights/W0": flipped}))
    assert len(diffs) == 1, diffs
    assert diffs[0].startswith("/weights/W0: 1 of 24 element(s) differ")
    assert "(1, 2, 3)" in diffs[0]
    assert f"{float(W[1, 2, 3])!r} vs {float(flipped[1, 2, 3])!r}" in diffs[0]


def test_flipped_bit_in_the_file_bytes(tmp_path):
    a = _h5(tmp_path / "a.h5")
    b = tmp_path / "b.h5"
    shutil.copy(a, b)
    with h5py.File(b, "r") as f:
        offset = f["weights/W0"].id.get_offset()  # contiguous storage: raw bytes here
    raw = bytearray(b.read_bytes())
    raw[offset + 8 * 5] ^= 0x10  # one bit of element 5 = index (0, 1, 1)
    b.write_bytes(bytes(raw))
    diffs = compare_h5(a, b)
    assert len(diffs) == 1 and "/weights/W0" in diffs[0] and "(0, 1, 1)" in diffs[0], diffs
    assert compare_trees(tmp_path, tmp_path) == []


def test_h5_structure_dtype_shape_and_strings(tmp_path):
    a = _h5(tmp_path / "a.h5")
    b = _h5(
        tmp_path / "b.h5",
        seeds=np.array([0, 1], dtype=np.int32),
        **{"risk/train": np.zeros((2, 4)), "extra/thing": np.ones(1), "weights/W0": None},
    )
    diffs = "\n".join(compare_h5(a, b))
    assert "/weights/W0: dataset only in the first file" in diffs
    assert "/extra: group only in the second file" in diffs
    assert "/extra/thing: dataset only in the second file" in diffs
    assert "/seeds: dtype differs (int64 vs int32)" in diffs
    assert "/risk/train: shape differs ((2, 3) vs (2, 4))" in diffs
    with h5py.File(b, "a") as f:
        f["checkpoints/label"][1] = "t=16"
    assert "'t=15' vs 't=16'" in "\n".join(compare_h5(a, b))


def test_h5_attribute_changes(tmp_path):
    a = _h5(tmp_path / "a.h5")
    b = _h5(tmp_path / "b.h5", _config='{"lr": 0.5}')
    (line,) = compare_h5(a, b)
    assert line.startswith("/: attribute 'config' differs")
    with h5py.File(b, "a") as f:
        f.attrs["config"] = '{"lr": 0.05}'
        f["seeds"].attrs["unit"] = "seeds"
        f["seeds"].attrs["new"] = 1.5
    diffs = compare_h5(a, b)
    assert "/seeds: attribute 'new' only in the second file" in diffs
    assert any(d.startswith("/seeds: attribute 'unit' differs") for d in diffs)
    assert compare_h5(a, b, ignore_attrs={"unit", "new"}) == []


def test_netcdf_missing_variable_and_attributes(tmp_path):
    a = _nc(tmp_path / "a.nc")
    assert compare_netcdf(a, _nc(tmp_path / "b.nc", drop="G_Q")) == [
        "/G_Q: variable only in the first file"
    ]
    diffs = compare_netcdf(a, _nc(tmp_path / "c.nc", attrs={"width": 9}))
    assert diffs == ["/: attribute 'width' differs: 8 vs 9"]
    c = tmp_path / "c.nc"
    with xr.open_dataset(a, engine="h5netcdf") as ds:
        ds = ds.load()
    ds["G_Q"].attrs["description"] = "something else"
    ds.to_netcdf(c, engine="h5netcdf")
    (line,) = compare_netcdf(a, c)
    assert line.startswith("/G_Q: attribute 'description' differs")


def test_netcdf_values_dims_and_unreadable(tmp_path):
    a = _nc(tmp_path / "a.nc")
    g = np.array([[0.25, np.nan], [np.nan, 1.0 / 3.0]])
    g2 = g.copy()
    g2[0, 1] = 0.0  # NaN replaced by 0: exactly the confusion the tool must catch
    (line,) = compare_netcdf(a, _nc(tmp_path / "b.nc", G_Q=g2))
    assert line.startswith("/G_Q: 1 of 4 element(s) differ; first at index (0, 1): nan vs 0.0")
    # a dimension of another size
    ds = xr.Dataset({"G_Q": (("seed", "layer"), np.zeros((3, 2)))})
    ds.to_netcdf(tmp_path / "c.nc", engine="h5netcdf")
    diffs = "\n".join(compare_netcdf(a, tmp_path / "c.nc"))
    assert "/seed: dimension size differs (2 vs 3)" in diffs
    assert "/G_Q: shape differs ((2, 2) vs (3, 2))" in diffs
    bad = tmp_path / "bad.nc"
    bad.write_bytes(a.read_bytes()[:200])
    (line,) = compare_netcdf(a, bad)
    assert line.startswith(f"{bad}: cannot read as netCDF-4")


def test_compare_trees_and_cli(tmp_path, capsys):
    for side in ("A", "B"):
        (tmp_path / side / "results" / "x").mkdir(parents=True)
        _h5(tmp_path / side / "results" / "x" / "t.h5")
        _nc(tmp_path / side / "results" / "x" / "d.nc")
        (tmp_path / side / "results" / "x" / "note.txt").write_text(side)  # not compared
    A, B = tmp_path / "A" / "results", tmp_path / "B" / "results"
    assert compare_trees(A, B) == []
    assert main([str(A), str(B)]) == 0
    _nc(B / "x" / "d.nc", attrs={"width": 9})
    _h5(B / "y.h5")
    diffs = compare_trees(A, B)
    assert diffs == [
        "x/d.nc: /: attribute 'width' differs: 8 vs 9",
        f"y.h5: only in {B}",
    ]
    assert compare_trees(A, B, patterns=("**/*.h5",)) == [f"y.h5: only in {B}"]
    capsys.readouterr()
    assert main([str(A), str(B)]) == 1
    assert capsys.readouterr().out.splitlines() == diffs
    assert main([str(A / "x" / "t.h5"), str(B / "x" / "t.h5")]) == 0
    assert main([str(A), str(B / "x" / "t.h5")]) == 2
    proc = subprocess.run(
        [sys.executable, "-m", "specalign.compare", str(A), str(B)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == diffs
    assert "2 difference(s)" in proc.stderr


@pytest.mark.parametrize(
    "x,y,same",
    [
        (np.array(["a", "bb"]), np.array(["a", "bb"], dtype=object), True),
        (np.array([b"a"], dtype=object), np.array(["a"], dtype=object), True),
        (np.array([1, 2], dtype=np.int64), np.array([1, 2], dtype=np.int64), True),
        (np.float64(np.nan), np.float64(np.nan), True),
        (np.array([True]), np.array([False]), False),
    ],
)
def test_compare_arrays_cases(x, y, same):
    assert (compare_arrays(x, y, "v") == []) is same


def test_tables_are_compared_byte_for_byte(tmp_path, capsys):
    """Issue 10, item 11: the README documents `python -m specalign.compare` for tables
    too; two CSV (or Markdown) files, and the tables inside two result folders."""
    for side in ("A", "B"):
        (tmp_path / side / "tables").mkdir(parents=True)
        (tmp_path / side / "tables" / "t.csv").write_text("a,b\n1,0.5\n2,nan\n")
        (tmp_path / side / "tables" / "t.md").write_text("| a |\n| --- |\n| 1 |\n")
    A, B = tmp_path / "A", tmp_path / "B"
    assert main([str(A / "tables" / "t.csv"), str(B / "tables" / "t.csv")]) == 0
    assert compare_trees(A, B) == []
    (B / "tables" / "t.csv").write_text("a,b\n1,0.50000001\n2,nan\n")
    capsys.readouterr()
    assert main([str(A / "tables" / "t.csv"), str(B / "tables" / "t.csv")]) == 1
    assert capsys.readouterr().out.splitlines() == ["line 2 differs: '1,0.5' vs '1,0.50000001'"]
    assert compare_trees(A, B) == ["tables/t.csv: line 2 differs: '1,0.5' vs '1,0.50000001'"]
    (B / "tables" / "t.md").write_text("| a |\n| --- |\n| 1 |\n| 2 |\n")
    assert compare_trees(A, B, patterns=("**/*.md",)) == ["tables/t.md: 3 vs 4 lines"]


# --------------------------------------------------------------------------------------
# Tolerances (issue 33: a faster exact method may change the last bits)
# --------------------------------------------------------------------------------------


def test_tolerance_accepts_last_bit_changes_and_refuses_larger_ones():
    a = np.array([1.0, -2.5e-3, np.nan, np.inf, 0.0])
    near = a * (1 + 3e-16)
    near[4] = 1e-20
    tol = Tolerance(rtol=1e-12, atol=1e-14)
    assert compare_arrays(a, near, "x") != []  # bitwise, they differ
    assert compare_arrays(a, near, "x", tol) == []
    far = a.copy()
    far[1] *= 1 + 1e-9
    (line,) = compare_arrays(a, far, "x", tol)
    assert "1 of 5 element(s) differ; first at index (1,)" in line
    assert "relative 1e-09" in line  # how far, not only whether
    # an infinity is equal only to itself, a NaN to a NaN, never to a number
    for other in (np.array([1.0, -2.5e-3, 0.0, np.inf, 0.0]), a * [1, 1, 1, -1, 1]):
        assert compare_arrays(a, other, "x", tol) != []
    # integers stay exact: a tolerance is about round-off
    assert compare_arrays(np.array([3]), np.array([4]), "n", Tolerance(rtol=1.0)) != []


def test_float32_data_has_its_own_tolerance():
    a = np.array([1.0, 3.0], dtype=np.float32)
    b = np.nextafter(a, np.float32(np.inf)) * np.float32(1.0)
    b = np.nextafter(b, np.float32(np.inf))  # two float32 ulps: ~2.4e-7 relative
    assert compare_arrays(a, b, "s", Tolerance(rtol=1e-12)) != []
    assert compare_arrays(a, b, "s", Tolerance(rtol=1e-12, rtol_float32=1e-6)) == []
    assert Tolerance(rtol=1e-12).pair(np.dtype(np.float32)) == (1e-12, 0.0)
    with pytest.raises(ValueError, match="rtol must be a finite number"):
        Tolerance(rtol=float("nan"))


def test_tolerance_reaches_attributes_and_netcdf_values(tmp_path):
    g = np.array([[0.25, np.nan], [np.nan, 1.0 / 3.0]])
    a = _nc(tmp_path / "a.nc", attrs={"radius": 2.0})
    b = _nc(tmp_path / "b.nc", attrs={"radius": 2.0 * (1 + 1e-15)}, G_Q=g * (1 + 1e-15))
    assert len(compare_netcdf(a, b)) == 2
    assert compare_netcdf(a, b, tol=Tolerance(rtol=1e-12)) == []
    h = _h5(tmp_path / "a.h5")
    w = np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 7.0
    k = _h5(tmp_path / "b.h5", **{"weights/W0": w * (1 + 2e-16)})
    assert compare_h5(h, k) != [] and compare_h5(h, k, tol=Tolerance(rtol=1e-12)) == []


def test_tables_compare_numbers_within_tolerance_or_their_last_digit(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("layer,gamma,rho,name\n1,0.123456789012,0.25,albert\n2,nan,1e-3,bert\n")
    b.write_text("layer,gamma,rho,name\n1,0.123456789013,0.25,albert\n2,nan,1.1e-3,bert\n")
    tol = Tolerance(rtol=1e-10)
    assert compare_text(a, b) == [
        "line 2 differs: '1,0.123456789012,0.25,albert' vs '1,0.123456789013,0.25,albert'"
    ]
    # 1e-3 against 1.1e-3: 1e-4 apart, one unit of the last digit of "1.1e-3"
    assert compare_text(a, b, tol) == []
    b.write_text("layer,gamma,rho,name\n1,0.123456789013,0.25,albert\n2,nan,1.3e-3,bert\n")
    assert compare_text(a, b, tol) == ["line 3 differs: '2,nan,1e-3,bert' vs '2,nan,1.3e-3,bert'"]
    b.write_text("layer,gamma,rho,name\n1,0.123456789013,0.25,albertx\n2,nan,1e-3,bert\n")
    assert compare_text(a, b, tol) != []  # the text between the numbers is exact
    b.write_text("layer,gamma,rho,name\n1,0.123456789012,0.25,albert\n")
    assert compare_text(a, b, tol) == ["3 vs 2 lines"]


def test_command_line_tolerances(tmp_path, capsys):
    a = _nc(tmp_path / "a.nc")
    g = np.array([[0.25, np.nan], [np.nan, 1.0 / 3.0]])
    b = _nc(tmp_path / "b.nc", G_Q=g * (1 + 1e-15))
    assert main([str(a), str(b)]) == 1
    assert main([str(a), str(b), "--rtol", "1e-12", "--rtol-float32", "1e-6"]) == 0
    assert "equal within rtol 1e-12, atol 0; float32 rtol 1e-06" in capsys.readouterr().err
    assert main([str(a), str(b), "--rtol", "-1"]) == 2
    assert "rtol must be a finite number >= 0" in capsys.readouterr().err
