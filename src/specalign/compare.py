"""Exact comparison of results: HDF5, netCDF and tables (determinism and resume checks).

Two runs of the same configuration on the CPU with the same thread count must give
bit-identical data; this module says where they do not, in readable lines::

    python -m specalign.compare RUN_A/results RUN_B/results     # exit 1 on differences
    python -m specalign.compare a/trajectories.h5 b/trajectories.h5
    python -m specalign.compare a/table1.csv b/table1.csv

What is compared
----------------
* **HDF5** (:func:`compare_h5`, read with h5py): every group and dataset by path;
  shape, dtype and every element of each dataset; the attributes of the file, of every
  group and of every dataset.
* **netCDF** (:func:`compare_netcdf`, read with h5netcdf, no CF decoding): dimensions and
  their sizes, every variable (coordinates included) with its dimensions, shape, dtype,
  stored values and attributes, the global attributes, recursively through groups.
  The bookkeeping that netCDF-4 keeps in HDF5 attributes (``_NCProperties``,
  ``DIMENSION_LIST``, ``_Netcdf4Dimid``, ...) is not compared: h5netcdf hides it, and
  its dimension references are addresses inside one file, not data.
* **tables and text** (:func:`compare_text`: ``.csv``, ``.md``, ``.txt``): byte for byte;
  a difference line names the first differing line (1-based) with both versions.

Values are compared **bitwise**: two elements are equal when their bytes are equal.
A NaN therefore equals the same NaN (as it must for a determinism check, unlike IEEE
``nan != nan``), while ``0.0`` and ``-0.0`` or two NaNs with different payloads differ.
Strings and other object elements are compared with ``==``. A difference line names
the element count that differs and the first differing index with both values.

Volatile attributes
-------------------
None of the workflow's outputs carries a timestamp, host name or absolute path in its
attributes, so :data:`VOLATILE_ATTRS` is empty and every attribute is compared; pass
``ignore_attrs`` (``--ignore-attr`` on the command line) to skip named attributes when
comparing files of another origin.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "VOLATILE_ATTRS",
    "compare_arrays",
    "compare_files",
    "compare_h5",
    "compare_netcdf",
    "compare_text",
    "compare_trees",
    "main",
]

#: Attribute names that legitimately differ between two runs (none in this workflow).
VOLATILE_ATTRS: frozenset[str] = frozenset()

DEFAULT_PATTERNS: tuple[str, ...] = ("**/*.h5", "**/*.nc", "**/*.csv", "**/*.md")

_NETCDF_SUFFIXES = (".nc", ".nc4", ".netcdf")
_TEXT_SUFFIXES = (".csv", ".md", ".txt", ".tsv", ".json")


# --------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, np.generic):
        value = value.item()
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def compare_arrays(a: Any, b: Any, what: str) -> list[str]:
    """Differences between two arrays (or scalars): dtype, shape, then bitwise values."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "USO" and b.dtype.kind in "USO" and a.dtype != b.dtype:
        # fixed-width strings of different widths, or str against bytes: by value
        a, b = a.astype(object), b.astype(object)
    if a.dtype != b.dtype:
        return [f"{what}: dtype differs ({a.dtype} vs {b.dtype})"]
    if a.shape != b.shape:
        return [f"{what}: shape differs ({a.shape} vs {b.shape})"]
    if a.size == 0:
        return []
    if a.dtype.hasobject:
        fa, fb = a.ravel(), b.ravel()
        differ = np.fromiter(
            (not _same_object(x, y) for x, y in zip(fa, fb, strict=True)), bool, fa.size
        )
    else:
        # Bitwise: view every element as its raw bytes (NaN == NaN, 0.0 != -0.0).
        ba = np.ascontiguousarray(a).reshape(-1).view(np.uint8).reshape(a.size, -1)
        bb = np.ascontiguousarray(b).reshape(-1).view(np.uint8).reshape(b.size, -1)
        differ = (ba != bb).any(axis=1)
    n = int(np.count_nonzero(differ))
    if not n:
        return []
    first = int(np.flatnonzero(differ)[0])
    idx = _index(first, a.shape)
    va, vb = a.reshape(-1)[first], b.reshape(-1)[first]
    sa, sb = _fmt(va), _fmt(vb)
    if sa == sb and not a.dtype.hasobject:  # e.g. NaNs with different payloads
        sa, sb = f"{sa} (0x{va.tobytes().hex()})", f"{sb} (0x{vb.tobytes().hex()})"
    where = f" at index {idx}" if idx else ""
    return [f"{what}: {n} of {a.size} element(s) differ; first{where}: {sa} vs {sb}"]


def _same_object(x: Any, y: Any) -> bool:
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return not compare_arrays(x, y, "")
    if isinstance(x, bytes) and isinstance(y, str):
        x = x.decode(errors="replace")
    if isinstance(y, bytes) and isinstance(x, str):
        y = y.decode(errors="replace")
    if isinstance(x, float) and isinstance(y, float):
        return not compare_arrays(np.float64(x), np.float64(y), "")
    return type(x) is type(y) and bool(x == y)


def _compare_attrs(
    a: Mapping[str, Any], b: Mapping[str, Any], what: str, ignore: frozenset[str]
) -> list[str]:
    out = []
    keys_a = {k for k in a if k not in ignore}
    keys_b = {k for k in b if k not in ignore}
    for key in sorted(keys_a - keys_b):
        out.append(f"{what}: attribute {key!r} only in the first file")
    for key in sorted(keys_b - keys_a):
        out.append(f"{what}: attribute {key!r} only in the second file")
    for key in sorted(keys_a & keys_b):
        va, vb = a[key], b[key]
        if isinstance(va, np.ndarray | np.generic) or isinstance(vb, np.ndarray | np.generic):
            diff = compare_arrays(va, vb, f"{what}: attribute {key!r}")
            scalar = np.ndim(va) == 0 and np.ndim(vb) == 0
            if diff and scalar and np.asarray(va).dtype == np.asarray(vb).dtype:
                diff = [f"{what}: attribute {key!r} differs: {_fmt(va)} vs {_fmt(vb)}"]
            out += diff
        elif not _same_object(va, vb):
            out.append(f"{what}: attribute {key!r} differs: {_fmt(va)} vs {_fmt(vb)}")
    return out


# --------------------------------------------------------------------------------------
# HDF5
# --------------------------------------------------------------------------------------


def _h5_items(f: Any) -> dict[str, Any]:
    import h5py

    items: dict[str, Any] = {"/": f}

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Group | h5py.Dataset):
            items["/" + name] = obj

    f.visititems(visit)
    return items


def _h5_kind(obj: Any) -> str:
    import h5py

    return "group" if isinstance(obj, h5py.Group) else "dataset"


def _h5_attrs(obj: Any) -> dict[str, Any]:
    out = {}
    for key in obj.attrs:
        try:
            out[key] = obj.attrs[key]
        except (OSError, TypeError) as exc:  # unreadable attribute types (references...)
            out[key] = f"<unreadable: {exc}>"
    return out


def _h5_values(ds: Any) -> np.ndarray:
    import h5py

    if h5py.check_string_dtype(ds.dtype) is not None and ds.dtype.kind == "O":
        return np.asarray(ds.asstr()[()], dtype=object)
    return np.asarray(ds[()])


def compare_h5(
    a: str | Path, b: str | Path, *, ignore_attrs: Iterable[str] = VOLATILE_ATTRS
) -> list[str]:
    """Differences between two HDF5 files: groups, datasets (bitwise) and attributes.

    An empty list means identical content. A file that cannot be opened is reported as
    a difference line rather than raised.
    """
    import h5py

    ignore = frozenset(ignore_attrs)
    try:
        fa = h5py.File(a, "r")
    except OSError as exc:
        return [f"{a}: cannot read as HDF5 ({exc})"]
    try:
        try:
            fb = h5py.File(b, "r")
        except OSError as exc:
            return [f"{b}: cannot read as HDF5 ({exc})"]
        with fb:
            return _compare_h5_open(fa, fb, ignore)
    finally:
        fa.close()


def _compare_h5_open(fa: Any, fb: Any, ignore: frozenset[str]) -> list[str]:
    out: list[str] = []
    ia, ib = _h5_items(fa), _h5_items(fb)
    for name in sorted(set(ia) - set(ib)):
        out.append(f"{name}: {_h5_kind(ia[name])} only in the first file")
    for name in sorted(set(ib) - set(ia)):
        out.append(f"{name}: {_h5_kind(ib[name])} only in the second file")
    for name in sorted(set(ia) & set(ib)):
        oa, ob = ia[name], ib[name]
        ka, kb = _h5_kind(oa), _h5_kind(ob)
        if ka != kb:
            out.append(f"{name}: {ka} in the first file, {kb} in the second")
            continue
        if ka == "dataset":
            try:
                out += compare_arrays(_h5_values(oa), _h5_values(ob), name)
            except (OSError, ValueError, TypeError) as exc:
                out.append(f"{name}: cannot read ({exc})")
        out += _compare_attrs(_h5_attrs(oa), _h5_attrs(ob), name, ignore)
    return out


# --------------------------------------------------------------------------------------
# netCDF
# --------------------------------------------------------------------------------------


def compare_netcdf(
    a: str | Path, b: str | Path, *, ignore_attrs: Iterable[str] = VOLATILE_ATTRS
) -> list[str]:
    """Differences between two netCDF-4 files: dimensions, variables (bitwise stored
    values, no CF decoding), variable and global attributes, groups.

    An empty list means identical content. A file that cannot be opened is reported as
    a difference line rather than raised.
    """
    import h5netcdf

    ignore = frozenset(ignore_attrs)
    try:
        fa = h5netcdf.File(a, "r")
    except (OSError, ValueError) as exc:
        return [f"{a}: cannot read as netCDF-4 ({exc})"]
    try:
        try:
            fb = h5netcdf.File(b, "r")
        except (OSError, ValueError) as exc:
            return [f"{b}: cannot read as netCDF-4 ({exc})"]
        with fb:
            return _compare_nc_group(fa, fb, "/", ignore)
    finally:
        fa.close()


def _nc_values(var: Any) -> np.ndarray:
    return np.asarray(var[...]) if var.shape else np.asarray(var[()])


def _only_in(a: Any, b: Any, prefix: str, kind: str) -> list[str]:
    """Lines for the names present in only one of two name collections."""
    return [
        f"{prefix}{name}: {kind} only in the first file" for name in sorted(set(a) - set(b))
    ] + [f"{prefix}{name}: {kind} only in the second file" for name in sorted(set(b) - set(a))]


def _compare_nc_group(ga: Any, gb: Any, where: str, ignore: frozenset[str]) -> list[str]:
    out: list[str] = []
    prefix = where if where.endswith("/") else where + "/"
    da = {k: len(v) for k, v in ga.dimensions.items()}
    db = {k: len(v) for k, v in gb.dimensions.items()}
    out += _only_in(da, db, prefix, "dimension")
    for dim in sorted(set(da) & set(db)):
        if da[dim] != db[dim]:
            out.append(f"{prefix}{dim}: dimension size differs ({da[dim]} vs {db[dim]})")
    out += _compare_attrs(dict(ga.attrs), dict(gb.attrs), where, ignore)
    va, vb = ga.variables, gb.variables
    out += _only_in(va, vb, prefix, "variable")
    for name in sorted(set(va) & set(vb)):
        xa, xb = va[name], vb[name]
        what = f"{prefix}{name}"
        if tuple(xa.dimensions) != tuple(xb.dimensions):
            out.append(
                f"{what}: dimensions differ ({tuple(xa.dimensions)} vs {tuple(xb.dimensions)})"
            )
        else:
            try:
                out += compare_arrays(_nc_values(xa), _nc_values(xb), what)
            except (OSError, ValueError, TypeError) as exc:
                out.append(f"{what}: cannot read ({exc})")
        out += _compare_attrs(dict(xa.attrs), dict(xb.attrs), what, ignore)
    sa, sb = ga.groups, gb.groups
    out += _only_in(sa, sb, prefix, "group")
    for name in sorted(set(sa) & set(sb)):
        out += _compare_nc_group(sa[name], sb[name], f"{prefix}{name}", ignore)
    return out


# --------------------------------------------------------------------------------------
# Files and trees
# --------------------------------------------------------------------------------------


def compare_text(a: str | Path, b: str | Path) -> list[str]:
    """Compare two text files (tables) byte for byte; one line naming the first
    differing line, or the file that cannot be read."""
    try:
        ba, bb = Path(a).read_bytes(), Path(b).read_bytes()
    except OSError as exc:
        return [f"cannot read ({exc})"]
    if ba == bb:
        return []
    la, lb = ba.splitlines(), bb.splitlines()
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x != y:
            return [f"line {i + 1} differs: {_fmt(x)} vs {_fmt(y)}"]
    if len(la) != len(lb):
        return [f"{len(la)} vs {len(lb)} lines"]
    return ["bytes differ (line endings or trailing newline)"]


def compare_files(
    a: str | Path, b: str | Path, *, ignore_attrs: Iterable[str] = VOLATILE_ATTRS
) -> list[str]:
    """Compare two files by the first one's suffix: netCDF, tables and text (byte for
    byte), else HDF5."""
    suffix = Path(a).suffix.lower()
    if suffix in _NETCDF_SUFFIXES:
        return compare_netcdf(a, b, ignore_attrs=ignore_attrs)
    if suffix in _TEXT_SUFFIXES:
        return compare_text(a, b)
    return compare_h5(a, b, ignore_attrs=ignore_attrs)


def _matching(root: Path, patterns: Iterable[str]) -> set[str]:
    found: set[str] = set()
    for pattern in patterns:
        for path in root.glob(pattern):
            if path.is_file():
                found.add(path.relative_to(root).as_posix())
    return found


def compare_trees(
    dir_a: str | Path,
    dir_b: str | Path,
    patterns: Iterable[str] = DEFAULT_PATTERNS,
    *,
    ignore_attrs: Iterable[str] = VOLATILE_ATTRS,
) -> list[str]:
    """Compare every file matching ``patterns`` (globs relative to each folder) that
    either folder holds; a file present on one side only is a difference. Each line
    starts with the file's relative path."""
    dir_a, dir_b = Path(dir_a), Path(dir_b)
    out: list[str] = []
    for root in (dir_a, dir_b):
        if not root.is_dir():
            out.append(f"{root}: not a folder")
    if out:
        return out
    patterns = tuple(patterns)
    in_a, in_b = _matching(dir_a, patterns), _matching(dir_b, patterns)
    for rel in sorted(in_a | in_b):
        if rel not in in_b:
            out.append(f"{rel}: only in {dir_a}")
        elif rel not in in_a:
            out.append(f"{rel}: only in {dir_b}")
        else:
            diffs = compare_files(dir_a / rel, dir_b / rel, ignore_attrs=ignore_attrs)
            out += [f"{rel}: {line}" for line in diffs]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specalign.compare",
        description="Compare the HDF5 and netCDF files (bitwise) and the tables (byte for "
        "byte) of two result folders, or two files; exit status 1 when they differ.",
    )
    parser.add_argument("a", help="first folder or file")
    parser.add_argument("b", help="second folder or file")
    parser.add_argument(
        "--pattern",
        action="append",
        help=f"glob of files to compare inside the folders (repeatable; default "
        f"{' '.join(DEFAULT_PATTERNS)})",
    )
    parser.add_argument(
        "--ignore-attr", action="append", default=[], help="attribute name to skip (repeatable)"
    )
    args = parser.parse_args(argv)
    a, b = Path(args.a), Path(args.b)
    ignore = VOLATILE_ATTRS | set(args.ignore_attr)
    if a.is_file() and b.is_file():
        diffs = compare_files(a, b, ignore_attrs=ignore)
        n_files = 1
    elif a.is_dir() and b.is_dir():
        patterns = tuple(args.pattern or DEFAULT_PATTERNS)
        diffs = compare_trees(a, b, patterns, ignore_attrs=ignore)
        n_files = len(_matching(a, patterns) | _matching(b, patterns))
    else:
        print(f"error: {a} and {b} must be two existing folders or two files", file=sys.stderr)
        return 2
    for line in diffs:
        print(line)
    if diffs:
        print(f"{len(diffs)} difference(s) in {n_files} file(s) compared", file=sys.stderr)
        return 1
    print(f"identical: {n_files} file(s) compared", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
