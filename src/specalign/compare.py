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

Tolerances
----------
A faster exact method may change a result in its last bits (issue 33). Given a
:class:`Tolerance` (``--rtol``, ``--atol``, ``--rtol-float32``, ``--atol-float32``),
floating-point elements and attributes are equal when bitwise equal, when both are NaN,
or when ``|a - b| <= atol + rtol * max(|a|, |b|)`` with the float32 pair for float32
data (the real-model states are float32; their round-off is about 6e-8 of a value).
Infinities must match exactly, integers, strings and booleans bitwise. In a table or
text file each line is split into numbers and the text between them: the text must be
equal, and each number equal within the tolerance or, since a table prints a rounded
value, within one unit of its last printed digit (the finer of the two). A difference
line then also gives the largest absolute and relative difference, so a tolerant
comparison says how far apart the runs are, not only whether.

Volatile attributes
-------------------
None of the workflow's outputs carries a timestamp, host name or absolute path in its
attributes, so :data:`VOLATILE_ATTRS` is empty and every attribute is compared; pass
``ignore_attrs`` (``--ignore-attr`` on the command line) to skip named attributes when
comparing files of another origin.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "VOLATILE_ATTRS",
    "Tolerance",
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


@dataclass(frozen=True)
class Tolerance:
    """How far two floating-point values may be apart and still be equal: ``atol +
    rtol * max(|a|, |b|)``, with ``rtol_float32``/``atol_float32`` for float32 and
    float16 data (defaults: the float64 pair)."""

    rtol: float = 0.0
    atol: float = 0.0
    rtol_float32: float | None = None
    atol_float32: float | None = None

    def __post_init__(self) -> None:
        for name in ("rtol", "atol", "rtol_float32", "atol_float32"):
            value = getattr(self, name)
            if value is not None and not (np.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def pair(self, dtype: np.dtype) -> tuple[float, float]:
        """(rtol, atol) for data of ``dtype``."""
        if np.dtype(dtype).itemsize <= 4 and np.dtype(dtype).kind in "fc":
            return (
                self.rtol if self.rtol_float32 is None else self.rtol_float32,
                self.atol if self.atol_float32 is None else self.atol_float32,
            )
        return self.rtol, self.atol

    def __str__(self) -> str:
        f32 = ""
        if self.rtol_float32 is not None or self.atol_float32 is not None:
            r, a = self.pair(np.dtype(np.float32))
            f32 = f"; float32 rtol {r:g}, atol {a:g}"
        return f"rtol {self.rtol:g}, atol {self.atol:g}{f32}"


def _wide(x: np.ndarray) -> np.ndarray:
    """x in float64 (complex128 for complex data), where differences are exact enough."""
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)


def _close(a: np.ndarray, b: np.ndarray, tol: Tolerance) -> np.ndarray:
    """Elementwise: equal within ``tol`` (NaN with NaN, an infinity with itself)."""
    rtol, atol = tol.pair(a.dtype)
    a64, b64 = _wide(a), _wide(b)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a64 - b64)
        bound = atol + rtol * np.maximum(np.abs(a64), np.abs(b64))
        close = (diff <= bound) & np.isfinite(a64) & np.isfinite(b64)
    both_nan = np.isnan(a64) & np.isnan(b64)
    same_inf = np.isinf(a64) & (a64 == b64)
    return close | both_nan | same_inf


def _spread(a: np.ndarray, b: np.ndarray) -> str:
    """', max |diff| X (relative Y)' over the elements finite in both."""
    a64, b64 = _wide(a).ravel(), _wide(b).ravel()
    finite = np.isfinite(a64) & np.isfinite(b64)
    if not finite.any():
        return ""
    diff = np.abs(a64[finite] - b64[finite])
    scale = np.maximum(np.abs(a64[finite]), np.abs(b64[finite]))
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(scale > 0, diff / np.where(scale > 0, scale, 1.0), 0.0)
    return f"; max |diff| {diff.max():.3g} (relative {rel.max():.3g})"


def _fmt(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if isinstance(value, np.generic):
        value = value.item()
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def compare_arrays(a: Any, b: Any, what: str, tol: Tolerance | None = None) -> list[str]:
    """Differences between two arrays (or scalars): dtype, shape, then the values:
    bitwise, or floating-point values within ``tol`` when one is given."""
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
        if tol is not None and a.dtype.kind in "fc" and differ.any():
            differ &= ~_close(a, b, tol).reshape(-1)
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
    spread = _spread(a, b) if tol is not None and a.dtype.kind in "fc" else ""
    return [f"{what}: {n} of {a.size} element(s) differ; first{where}: {sa} vs {sb}{spread}"]


def _same_object(x: Any, y: Any, tol: Tolerance | None = None) -> bool:
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return not compare_arrays(x, y, "", tol)
    if isinstance(x, bytes) and isinstance(y, str):
        x = x.decode(errors="replace")
    if isinstance(y, bytes) and isinstance(x, str):
        y = y.decode(errors="replace")
    if isinstance(x, float) and isinstance(y, float):
        return not compare_arrays(np.float64(x), np.float64(y), "", tol)
    return type(x) is type(y) and bool(x == y)


def _compare_attrs(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    what: str,
    ignore: frozenset[str],
    tol: Tolerance | None = None,
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
            diff = compare_arrays(va, vb, f"{what}: attribute {key!r}", tol)
            scalar = np.ndim(va) == 0 and np.ndim(vb) == 0
            if diff and scalar and np.asarray(va).dtype == np.asarray(vb).dtype:
                diff = [f"{what}: attribute {key!r} differs: {_fmt(va)} vs {_fmt(vb)}"]
            out += diff
        elif not _same_object(va, vb, tol):
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
    a: str | Path,
    b: str | Path,
    *,
    ignore_attrs: Iterable[str] = VOLATILE_ATTRS,
    tol: Tolerance | None = None,
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
            return _compare_h5_open(fa, fb, ignore, tol)
    finally:
        fa.close()


def _compare_h5_open(
    fa: Any, fb: Any, ignore: frozenset[str], tol: Tolerance | None = None
) -> list[str]:
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
                out += compare_arrays(_h5_values(oa), _h5_values(ob), name, tol)
            except (OSError, ValueError, TypeError) as exc:
                out.append(f"{name}: cannot read ({exc})")
        out += _compare_attrs(_h5_attrs(oa), _h5_attrs(ob), name, ignore, tol)
    return out


# --------------------------------------------------------------------------------------
# netCDF
# --------------------------------------------------------------------------------------


def compare_netcdf(
    a: str | Path,
    b: str | Path,
    *,
    ignore_attrs: Iterable[str] = VOLATILE_ATTRS,
    tol: Tolerance | None = None,
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
            return _compare_nc_group(fa, fb, "/", ignore, tol)
    finally:
        fa.close()


def _nc_values(var: Any) -> np.ndarray:
    return np.asarray(var[...]) if var.shape else np.asarray(var[()])


def _only_in(a: Any, b: Any, prefix: str, kind: str) -> list[str]:
    """Lines for the names present in only one of two name collections."""
    return [
        f"{prefix}{name}: {kind} only in the first file" for name in sorted(set(a) - set(b))
    ] + [f"{prefix}{name}: {kind} only in the second file" for name in sorted(set(b) - set(a))]


def _compare_nc_group(
    ga: Any, gb: Any, where: str, ignore: frozenset[str], tol: Tolerance | None = None
) -> list[str]:
    out: list[str] = []
    prefix = where if where.endswith("/") else where + "/"
    da = {k: len(v) for k, v in ga.dimensions.items()}
    db = {k: len(v) for k, v in gb.dimensions.items()}
    out += _only_in(da, db, prefix, "dimension")
    for dim in sorted(set(da) & set(db)):
        if da[dim] != db[dim]:
            out.append(f"{prefix}{dim}: dimension size differs ({da[dim]} vs {db[dim]})")
    out += _compare_attrs(dict(ga.attrs), dict(gb.attrs), where, ignore, tol)
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
                out += compare_arrays(_nc_values(xa), _nc_values(xb), what, tol)
            except (OSError, ValueError, TypeError) as exc:
                out.append(f"{what}: cannot read ({exc})")
        out += _compare_attrs(dict(xa.attrs), dict(xb.attrs), what, ignore, tol)
    sa, sb = ga.groups, gb.groups
    out += _only_in(sa, sb, prefix, "group")
    for name in sorted(set(sa) & set(sb)):
        out += _compare_nc_group(sa[name], sb[name], f"{prefix}{name}", ignore, tol)
    return out


# --------------------------------------------------------------------------------------
# Files and trees
# --------------------------------------------------------------------------------------


#: A number as a table prints it: sign, digits, point, exponent; or nan/inf.
_NUMBER = re.compile(rb"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)", re.IGNORECASE)


def _last_digit(token: bytes) -> float:
    """One unit in the last printed digit of a number token (1 for an integer)."""
    text = token.decode().lower().lstrip("+-")
    mantissa, _, exponent = text.partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals)


def _lines_close(x: bytes, y: bytes, tol: Tolerance) -> bool:
    """Two lines with equal text between their numbers and each pair of numbers
    within ``tol`` or one unit of the last printed digit."""
    if _NUMBER.split(x) != _NUMBER.split(y):
        return False
    nx, ny = _NUMBER.findall(x), _NUMBER.findall(y)
    for p, q in zip(nx, ny, strict=True):
        if p == q:
            continue
        a, b = float(p), float(q)
        if np.isnan(a) and np.isnan(b):
            continue
        if not (np.isfinite(a) and np.isfinite(b)):
            return False
        # a rounded value moves by up to one unit of its last digit; the finer of the
        # two printings bounds it (both come from the same format)
        last = min(_last_digit(p), _last_digit(q))
        slack = max(tol.atol + tol.rtol * max(abs(a), abs(b)), last)
        if abs(a - b) > slack * (1 + 1e-9):
            return False
    return True


def compare_text(a: str | Path, b: str | Path, tol: Tolerance | None = None) -> list[str]:
    """Compare two text files (tables) byte for byte, or line by line with their numbers
    within ``tol``; one line naming the first differing line, or the file that cannot be
    read."""
    try:
        ba, bb = Path(a).read_bytes(), Path(b).read_bytes()
    except OSError as exc:
        return [f"cannot read ({exc})"]
    if ba == bb:
        return []
    la, lb = ba.splitlines(), bb.splitlines()
    for i, (x, y) in enumerate(zip(la, lb, strict=False)):
        if x != y and not (tol is not None and _lines_close(x, y, tol)):
            return [f"line {i + 1} differs: {_fmt(x)} vs {_fmt(y)}"]
    if len(la) != len(lb):
        return [f"{len(la)} vs {len(lb)} lines"]
    if tol is not None:
        return []
    return ["bytes differ (line endings or trailing newline)"]


def compare_files(
    a: str | Path,
    b: str | Path,
    *,
    ignore_attrs: Iterable[str] = VOLATILE_ATTRS,
    tol: Tolerance | None = None,
) -> list[str]:
    """Compare two files by the first one's suffix: netCDF, tables and text (byte for
    byte), else HDF5; floating-point values within ``tol`` when one is given."""
    suffix = Path(a).suffix.lower()
    if suffix in _NETCDF_SUFFIXES:
        return compare_netcdf(a, b, ignore_attrs=ignore_attrs, tol=tol)
    if suffix in _TEXT_SUFFIXES:
        return compare_text(a, b, tol)
    return compare_h5(a, b, ignore_attrs=ignore_attrs, tol=tol)


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
    tol: Tolerance | None = None,
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
            diffs = compare_files(dir_a / rel, dir_b / rel, ignore_attrs=ignore_attrs, tol=tol)
            out += [f"{rel}: {line}" for line in diffs]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specalign.compare",
        description="Compare the HDF5 and netCDF files (bitwise) and the tables (byte for "
        "byte) of two result folders, or two files; exit status 1 when they differ. With a "
        "tolerance, floating-point values (and the numbers of tables) within it are equal.",
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
    for name, what in (
        ("rtol", "relative tolerance of floating-point values"),
        ("atol", "absolute tolerance of floating-point values"),
        ("rtol-float32", "relative tolerance of float32 data (default: --rtol)"),
        ("atol-float32", "absolute tolerance of float32 data (default: --atol)"),
    ):
        parser.add_argument(f"--{name}", type=float, default=None, help=what)
    args = parser.parse_args(argv)
    a, b = Path(args.a), Path(args.b)
    ignore = VOLATILE_ATTRS | set(args.ignore_attr)
    values = (args.rtol, args.atol, args.rtol_float32, args.atol_float32)
    try:
        tol = (
            None
            if all(v is None for v in values)
            else Tolerance(args.rtol or 0.0, args.atol or 0.0, args.rtol_float32, args.atol_float32)
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.is_file() and b.is_file():
        diffs = compare_files(a, b, ignore_attrs=ignore, tol=tol)
        n_files = 1
    elif a.is_dir() and b.is_dir():
        patterns = tuple(args.pattern or DEFAULT_PATTERNS)
        diffs = compare_trees(a, b, patterns, ignore_attrs=ignore, tol=tol)
        n_files = len(_matching(a, patterns) | _matching(b, patterns))
    else:
        print(f"error: {a} and {b} must be two existing folders or two files", file=sys.stderr)
        return 2
    for line in diffs:
        print(line)
    if diffs:
        print(f"{len(diffs)} difference(s) in {n_files} file(s) compared", file=sys.stderr)
        return 1
    same = f"equal within {tol}" if tol is not None else "identical"
    print(f"{same}: {n_files} file(s) compared", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
