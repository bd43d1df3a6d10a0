"""Readers and writers for the data contracts, all atomic.

Every writer produces its file under a temporary name in the destination folder and
renames it into place only after the file is complete and closed, so an interrupted
job never leaves a file that looks finished (a rename within one filesystem is atomic
on POSIX). A job whose Snakemake process is gone publishes nothing
(:func:`specalign.runtime.check_snakemake_alive`), and a published file gets the mode
the umask gives any new file (the temporary file is private while it is written). Every
reader turns a missing, truncated or corrupt file into an ``InputFileError`` that names
the file.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specalign.runtime import (
    WRITER_TAG_RE,
    check_snakemake_alive,
    pinned_threads,
    writer_gone,
    writer_tag,
)


class InputFileError(RuntimeError):
    """An input file is missing, truncated, corrupt or breaks its data contract."""


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` on success.

    On any exception the temporary file is removed and ``path`` is left untouched
    (it is neither created nor truncated); so it is when the job's Snakemake process is
    gone (``OrphanedJobError``). mkstemp creates the temporary file 0600; before the
    rename it gets the mode the umask gives a new file, so that collaborators read
    published results as they read any other file of the user's. A SIGKILL leaves the
    temporary file behind (nothing runs); the next writer of ``path`` removes it
    (:func:`new_partial`).
    """
    final = Path(path)
    tmp_path = new_partial(final)
    try:
        yield tmp_path
        if tmp_path.is_file():  # a writer may also have replaced it by a folder or nothing
            os.chmod(tmp_path, new_file_mode())
        check_snakemake_alive(final)
        os.replace(tmp_path, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


#: A partial file or folder whose writer cannot be checked (it ran on another host, or
#: its name predates the writer tag) counts as abandoned after this many seconds: no
#: single write of the workflow's takes that long.
STALE_AFTER_S = 6 * 3600


def new_partial(
    final: Path, folder: bool = False, ours: Callable[[Path], bool] | None = None
) -> Path:
    """Create the temporary file (or folder) in which ``final`` is written:
    ``.<name>.<writer>.<random>.part`` beside it, ``<writer>`` naming this process
    (:func:`specalign.runtime.writer_tag`). The partials that an earlier writer of
    ``final`` left when it was killed (SIGKILL, the OOM killer, a lost node: no
    ``except`` ran) are removed first (:func:`remove_stale_partials`, with ``ours``)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(final, ours)
    prefix = f".{final.name}.{writer_tag()}."
    if folder:
        return Path(tempfile.mkdtemp(prefix=prefix, suffix=".part", dir=final.parent))
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".part", dir=final.parent)
    os.close(fd)
    return Path(tmp)


#: The file that marks a folder as made by the workflow: only such folders (and files it
#: wrote) are ever removed or replaced; a folder of a person's, even under a name the
#: workflow uses, keeps everything in it.
OWNER_MARKER = ".specalign-owned.json"


def mark_owned(folder: Path, what: str) -> None:
    """Write the ownership marker: who writes ``folder`` (host, pid), and what it is."""
    import socket

    info = {"created_by": "specalign", "what": what, "host": socket.gethostname()}
    (folder / OWNER_MARKER).write_text(json.dumps({**info, "pid": os.getpid()}) + "\n")


def is_owned(folder: Path) -> bool:
    """Whether the workflow created ``folder`` (a real folder holding the marker)."""
    return folder.is_dir() and not folder.is_symlink() and (folder / OWNER_MARKER).is_file()


def swap_folder(tmp: Path, final: Path) -> None:
    """Put the finished folder ``tmp`` at ``final``, replacing the folder there. Two
    renames, never a moment without one or the other: the old folder is first renamed
    to a partial of ``final`` in this process's name, so that a kill between the renames
    leaves it for the next writer to remove (:func:`remove_stale_partials`), not a
    missing ``final`` beside a half-deleted one.

    mkdtemp made ``tmp`` 0700 and some writers (safetensors) make their files 0600:
    published, the folder and everything in it get what the umask gives any new folder
    and file."""
    os.chmod(tmp, new_file_mode(folder=True))
    for path in tmp.rglob("*"):
        if not path.is_symlink():
            os.chmod(path, new_file_mode(folder=path.is_dir()))
    trash = None
    if final.exists():
        trash = final.with_name(f".{final.name}.{writer_tag()}.{secrets.token_hex(4)}.old.part")
        os.replace(final, trash)
    os.replace(tmp, final)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def remove_stale_partials(final: Path, ours: Callable[[Path], bool] | None = None) -> list[Path]:
    """Delete the partials of ``final`` whose writer is gone; return them.

    A partial is stale when the process its name records has ended on this host
    (:func:`specalign.runtime.writer_gone`), or, when that cannot be told (another host,
    or a name without a writer tag), once it is older than :data:`STALE_AFTER_S`. A
    live writer's partial is never touched: two runs may write the same file. Where
    the folder may hold the user's files too (the model cache), ``ours`` says which
    entries the workflow made; the others are never touched."""
    tagged = re.compile(rf"^\.{re.escape(final.name)}\.{WRITER_TAG_RE}\..+\.part$")
    removed = []
    for entry in sorted(final.parent.glob(f".{glob.escape(final.name)}.*.part")):
        if entry.is_symlink() or (ours is not None and not ours(entry)):
            continue
        m = tagged.match(entry.name)
        gone = writer_gone(m["host"], int(m["pid"]), m["start"]) if m else None
        if gone is None:
            try:
                gone = time.time() - entry.stat().st_mtime > STALE_AFTER_S
            except OSError:
                continue
        if not gone:
            continue
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
        removed.append(entry)
    return removed


def umask() -> int:
    """The process umask, read without changing it where Linux reports it (changing it
    to read it back is not thread-safe)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def new_file_mode(folder: bool = False) -> int:
    """The permission bits the umask gives a new file (0666 & ~umask) or folder (0777)."""
    return (0o777 if folder else 0o666) & ~umask()


def provenance_attrs() -> dict[str, Any]:
    """Root attributes every numerical output records: ``threads``, the job's effective
    BLAS/torch thread count (``min(threads, --cores)``; results are bit-identical only
    between equal counts). Empty outside a pinned job."""
    threads = pinned_threads()
    return {} if threads is None else {"threads": int(threads)}


def write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def write_with(path: str | os.PathLike[str], writer: Callable[[Path], None]) -> None:
    """Atomically write ``path`` with ``writer(tmp_path)`` (for library writers such as
    ``DataFrame.to_csv`` or ``Figure.savefig`` that want a path of their own)."""
    with atomic_path(path) as tmp:
        writer(tmp)


def write_h5(
    path: str | os.PathLike[str],
    datasets: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any] | None = None,
    dataset_attrs: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Write an HDF5 file whose datasets are named by slash-separated paths.

    ``attrs`` go on the root group; a dict or list value is stored as a JSON string,
    since HDF5 attributes have no nested types.
    """
    import h5py

    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            for name, value in datasets.items():
                arr = np.asarray(value)
                if arr.dtype.kind == "U":
                    arr = arr.astype(object)
                    f.create_dataset(name, data=arr, dtype=h5py.string_dtype())
                else:
                    f.create_dataset(name, data=arr, **checksummed(arr))
                for key, val in (dataset_attrs or {}).get(name, {}).items():
                    f[name].attrs[key] = _attr_value(val)
            for key, val in {**provenance_attrs(), **(attrs or {})}.items():
                f.attrs[key] = _attr_value(val)


#: The size a checksummed dataset's chunks aim at (bytes). HDF5's Fletcher-32 filter runs
#: per chunk, and so does its bookkeeping: h5py's own guess (64 KB, e.g. 64 x 128 of a
#: 4096-wide float64 matrix) wrote such a matrix at 0.86 GB/s of CPU and read it at 1.25;
#: whole rows in 256 KB - 1 MB chunks at 1.37-1.45 and 1.56-1.85 (issue 33, item 3).
CHUNK_BYTES = 1 << 19


def chunk_shape(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Chunks of at most :data:`CHUNK_BYTES`, of whole trailing rows where they fit:
    the trailing axes are kept whole while a chunk still fits, the next one is cut to
    what fits, the leading ones are 1 (an array of one block per leading index, such as
    ``F`` (block, d, d), is then read or written a block at a time)."""
    chunk = [1] * len(shape)
    step = int(itemsize)  # bytes of one index of the axis below, its trailing axes whole
    for axis in range(len(shape) - 1, -1, -1):
        fit = max(1, CHUNK_BYTES // step)
        if fit < shape[axis]:
            chunk[axis] = fit
            break
        chunk[axis] = int(shape[axis])
        step *= int(shape[axis])
    return tuple(max(1, c) for c in chunk)


def checksummed(arr: np.ndarray) -> dict[str, Any]:
    """h5py dataset options that store a Fletcher-32 checksum with the data, in chunks of
    :func:`chunk_shape`.

    HDF5 keeps no checksum of a plain dataset: a flipped bit inside a weight array would
    be read back without error, and every identity checked downstream holds for any
    weights. With a checksum (which needs chunked storage) the read fails instead.
    Scalars and empty arrays cannot be chunked and are left as they are.
    """
    return checksum_options(arr.shape, arr.dtype)


def checksum_options(shape: tuple[int, ...], dtype: Any) -> dict[str, Any]:
    """:func:`checksummed`'s options for a dataset of ``shape`` and ``dtype`` made before
    its data (one written a block at a time)."""
    dtype = np.dtype(dtype)
    if len(shape) == 0 or 0 in shape or dtype.kind not in "biufc":
        return {}
    return {"fletcher32": True, "chunks": chunk_shape(tuple(shape), dtype.itemsize)}


def _attr_value(val: Any) -> Any:
    if isinstance(val, dict | list | tuple):
        return json.dumps(val, default=_json_default)
    if val is None:
        return "null"
    return val


def read_h5(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read every dataset (by slash path) and the root attributes of an HDF5 file."""
    import h5py

    path = Path(path)
    if not path.exists():
        raise InputFileError(f"{path}: file does not exist")
    out: dict[str, np.ndarray] = {}
    try:
        with h5py.File(path, "r") as f:

            def visit(name: str, obj: Any) -> None:
                if isinstance(obj, h5py.Dataset):
                    data = obj[()]
                    if obj.dtype.kind == "O" or h5py.check_string_dtype(obj.dtype):
                        data = np.asarray(obj.asstr()[()], dtype=object)
                    out[name] = data

            f.visititems(visit)
            attrs = {k: _decode_attr(v) for k, v in f.attrs.items()}
    except (OSError, KeyError, ValueError) as exc:
        raise InputFileError(f"{path}: not a readable HDF5 file ({exc})") from exc
    return out, attrs


def _decode_attr(val: Any) -> Any:
    if isinstance(val, bytes):
        val = val.decode()
    if isinstance(val, np.generic):
        return val.item()
    return val


class EmptyResultError(RuntimeError):
    """Every headline output of a step is NaN: written, it would pass for a result."""


def write_netcdf(
    path: str | os.PathLike[str], ds: Any, headline: Iterable[str] = (), hint: str = ""
) -> None:
    """Write an ``xarray.Dataset`` as netCDF-4, atomically, with a Fletcher-32 checksum on
    every numeric array (see :func:`checksummed`).

    The file is written by the netCDF-C library (xarray's netcdf4 engine), the reference
    implementation of the format, rather than by h5netcdf, whose pure-Python dimension
    bookkeeping made writing cost five to seven times reading: MiniLM's propagation.nc
    took 0.468 s to write that way, 0.071 s now, 0.085 s to read, on 2 AVX2 cores
    (bench/bench_netcdf.py). What is read back is the same Dataset either way
    (tests/workflow/test_io.py).

    ``headline`` names the variables the step exists to compute; when every one of them
    is NaN (or inf) everywhere, nothing is written and ``EmptyResultError`` names the
    file, the variables and ``hint`` (the likely cause).
    """
    headline = list(headline)
    if headline and not any(np.isfinite(np.asarray(ds[v].values)).any() for v in headline):
        raise EmptyResultError(
            f"{path}: {', '.join(headline)} are NaN everywhere, so it would hold no result; "
            "not written" + (f": {hint}" if hint else "")
        )
    encoding = {
        name: {"fletcher32": True}
        for name, var in {**ds.data_vars, **ds.coords}.items()
        if var.ndim > 0 and var.size > 0 and var.dtype.kind in "biuf"
    }
    extra = provenance_attrs()
    if extra:
        ds = ds.copy(deep=False)
        ds.attrs = {**extra, **ds.attrs}
    with atomic_path(path) as tmp:
        ds.to_netcdf(tmp, engine="netcdf4", encoding=encoding)


def read_netcdf(path: str | os.PathLike[str]) -> Any:
    """Load an ``xarray.Dataset`` fully into memory (the file is closed on return).

    The same Dataset as ``xr.open_dataset(path, engine="h5netcdf").load()``: values,
    dtypes, dimensions, coordinates and attributes (tests/workflow/test_io.py compares
    the two on every netCDF file of the session's workflow runs). Files as
    :func:`write_netcdf` writes them are read with h5py directly, about ten times faster
    than through h5netcdf, whose per-variable dimension lookups dominate every reading
    job (0.5 s for one diagnostics file of 46 variables, against 0.04 s); anything else
    (groups, unlimited or unlabelled dimensions, character arrays, compound or enum
    types, empty attributes) goes through xarray's h5netcdf backend.
    """
    import xarray as xr

    path = Path(path)
    if not path.exists():
        raise InputFileError(f"{path}: file does not exist")
    try:
        fast = _read_plain_netcdf(path)
        if fast is not None:
            return fast
        with xr.open_dataset(path, engine="h5netcdf") as ds:
            return ds.load()
    except (OSError, ValueError, KeyError) as exc:
        raise InputFileError(f"{path}: not a readable netCDF/HDF5 file ({exc})") from exc


class _NotPlain(Exception):
    """A netCDF feature :func:`_read_plain_netcdf` leaves to xarray's backend."""


#: Attributes of the netCDF-4 and HDF5 dimension-scale conventions, not the data's own
#: (the ones h5netcdf hides).
_NETCDF_INTERNAL_ATTRS = frozenset(
    {"REFERENCE_LIST", "CLASS", "DIMENSION_LIST", "NAME", "_Netcdf4Dimid",
     "_Netcdf4Coordinates", "_nc3_strict", "_NCProperties"}
)  # fmt: skip
#: How netCDF-4 marks a dimension that is not also a variable.
_PHONY_DIMENSION = b"This is a netCDF dimension but not a netCDF variable"


def _read_plain_netcdf(path: Path) -> Any:
    """The Dataset of a flat netCDF-4 file of numbers and strings, or None when the file
    uses anything else. The raw variables and attributes are read as h5netcdf presents
    them; the decoding (fill values, booleans, the ``coordinates`` attribute, times) is
    xarray's own, with open_dataset's defaults."""
    import h5py
    import xarray as xr
    from xarray import conventions

    try:
        with h5py.File(path, "r") as f:
            variables = {}
            for name, item in f.items():
                if not isinstance(item, h5py.Dataset):
                    raise _NotPlain(name)
                attrs = item.attrs
                is_scale = attrs.get("CLASS") == b"DIMENSION_SCALE"
                if is_scale and bytes(attrs.get("NAME", b"")).startswith(_PHONY_DIMENSION):
                    continue
                variables[name] = xr.Variable(
                    _dimensions(f, name, item, is_scale), _values(item), _attributes(attrs)
                )
            root = _attributes(f.attrs)
    except _NotPlain:
        return None
    decoded, root, coord_names = conventions.decode_cf_variables(variables, root)
    # as xarray's store backend and open_dataset assemble it: data variables first, then
    # coordinates, each in the file's order; indexes for the dimension coordinates
    coords = {n: v for n, v in decoded.items() if n in coord_names or v.dims == (n,)}
    data = {n: v for n, v in decoded.items() if n not in coords}
    ds = xr.Dataset(data, coords=xr.Coordinates(coords, indexes={}), attrs=root)
    dimension_coords = {n: c.variable for n, c in ds.coords.items() if c.dims == (n,)}
    return ds.assign_coords(xr.Coordinates(dimension_coords)).load()


def _dimensions(f: Any, name: str, item: Any, is_scale: bool) -> tuple[str, ...]:
    if item.maxshape != item.shape or name.startswith("_nc4_non_coord_"):
        raise _NotPlain(name)  # unlimited, or a dimension renamed around a variable
    if is_scale:
        if item.ndim != 1:
            raise _NotPlain(name)
        return (name,)
    if item.ndim == 0:
        return ()
    refs = item.attrs.get("DIMENSION_LIST")
    if refs is None or len(refs) != item.ndim:
        raise _NotPlain(name)
    dims = []
    for axis in refs:
        if len(axis) != 1:  # unlabelled, or several scales on one axis
            raise _NotPlain(name)
        dims.append(f[axis[0]].name.rsplit("/", 1)[-1])
    return tuple(dims)


def _values(item: Any) -> np.ndarray:
    import h5py

    if item.dtype.kind in "biuf":
        return np.asarray(item[()])
    info = h5py.check_string_dtype(item.dtype)
    if info is not None and info.encoding == "utf-8" and info.length is None:
        # xarray's backend gives vlen strings numpy's fixed-width dtype once loaded
        return np.asarray(item.asstr()[()], dtype=object).astype(str)
    raise _NotPlain(item.name)


def _attributes(h5attrs: Any) -> dict[str, Any]:
    """Attributes as h5netcdf's ``Attributes`` and xarray's backend turn them into Python
    values: strings decoded, one-element arrays unwrapped, string arrays as lists."""
    import h5py

    out = {}
    for key in h5attrs:
        if key in _NETCDF_INTERNAL_ATTRS:
            continue
        value = h5attrs[key]
        if isinstance(value, h5py.Empty):
            raise _NotPlain(key)
        info = h5py.check_string_dtype(value.dtype) if hasattr(value, "dtype") else None
        if info is not None:
            if info.length is not None and info.length > 1:
                if np.isscalar(value):
                    value = value.decode(info.encoding, "surrogateescape")
                else:
                    value = [b.decode(info.encoding, "surrogateescape") for b in value.flat]
            elif not np.isscalar(value):
                value = value.tolist()
        elif hasattr(value, "dtype") and value.dtype.kind not in "biuf":
            raise _NotPlain(key)
        if isinstance(value, (np.ndarray, list)) and len(value) == 1:
            value = value[0]
        if key not in ("_FillValue", "missing_value") and isinstance(value, bytes):
            value = value.decode("utf-8")
        out[key] = value
    return out


def require(mapping: Mapping[str, Any], names: list[str] | tuple[str, ...], path: Any) -> None:
    """Raise ``InputFileError`` naming ``path`` when any of ``names`` is missing."""
    missing = [n for n in names if n not in mapping]
    if missing:
        raise InputFileError(f"{path}: missing {', '.join(missing)} (data contract)")


class DiskStack(Sequence[np.ndarray]):
    """Arrays of one shape and dtype kept in a temporary file and read back one at a
    time: a stack a job needs in turn but not at once (a model's token states layer by
    layer, steering's W_O variants), off its memory. Plain writes and reads: nothing is
    mapped, so only the array read is resident. ``shape`` and ``dtype`` are those of the
    whole stack; a context manager, the file removed on exit (or by :meth:`close`)."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        fd, name = tempfile.mkstemp(prefix="specalign-stack-", suffix=".bin", dir=folder)
        self.path = Path(name)
        self._file = os.fdopen(fd, "w+b", buffering=0)  # arrays are written whole
        self._n = 0
        self._item: tuple[int, ...] | None = None
        self.dtype: np.dtype | None = None

    def __enter__(self) -> DiskStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)

    def append(self, X: np.ndarray) -> None:
        X = np.ascontiguousarray(X)
        if self._item is None:
            self._item, self.dtype = X.shape, X.dtype
        elif (X.shape, X.dtype) != (self._item, self.dtype):
            raise ValueError(f"array {self._n} is {X.shape} {X.dtype}, the first was "
                             f"{self._item} {self.dtype}")  # fmt: skip
        self._file.seek(0, os.SEEK_END)
        view = memoryview(X).cast("B")
        done = 0
        while done < len(view):  # a raw write may take part of it
            done += self._file.write(view[done:])
        self._n += 1

    @property
    def shape(self) -> tuple[int, ...]:
        return (self._n, *(self._item or ()))

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, t: Any) -> Any:
        if isinstance(t, slice):
            return [self[i] for i in range(*t.indices(self._n))]
        t = int(t)
        if not -self._n <= t < self._n:
            raise IndexError(f"array {t} of {self._n}")
        assert self._item is not None and self.dtype is not None
        X = np.empty(self._item, self.dtype)
        self._file.seek((t % self._n) * X.nbytes)
        view, done = memoryview(X).cast("B"), 0
        while done < len(view):  # a raw read may return part of it
            got = self._file.readinto(view[done:])
            if not got:
                raise OSError(f"{self.path}: array {t} is cut short")
            done += got
        return X
