"""Atomic writes and clear errors for corrupt inputs (the data contracts' I/O layer)."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr
from reading import assert_read_as_xarray_reads

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


def test_a_killed_writers_partial_is_removed_by_the_next_writer(tmp_path):
    """SIGKILL runs no ``except``: the partial stays until the next writer of the same
    file removes it, and only when its writer is provably gone (or it is old)."""
    from specalign.runtime import writer_tag

    target = tmp_path / "trajectories.h5"
    code = (
        "import os, signal, sys; from specalign import io\n"
        "with io.atomic_path(sys.argv[1]) as tmp:\n"
        "    tmp.write_bytes(b'half')\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(target)])
    assert proc.wait(timeout=120) == -signal.SIGKILL
    (killed,) = tmp_path.glob(".trajectories.h5.*.part")
    assert f"p{proc.pid}s" in killed.name and not target.exists()

    tag = writer_tag()  # this process: alive
    host, rest = tag[1:9], tag[9:]
    pid = rest[1:].split("s")[0]
    old = time.time() - 7 * 3600
    cases = {
        f".trajectories.h5.{tag}.abc.part": (None, True),  # a live writer (this one)
        f".trajectories.h5.h{host}p{pid}s1.abc.part": (None, False),  # PID reused later
        ".trajectories.h5.h00000000p1s1.abc.part": (None, True),  # another host, recent
        ".trajectories.h5.h00000000p1s2.abc.part": (old, False),  # another host, old
        ".trajectories.h5.untagged.part": (None, True),  # no writer named, recent
        ".trajectories.h5.untagged2.part": (old, False),  # no writer named, old
        ".other.h5.h00000000p1s1.abc.part": (old, True),  # another file's
    }
    for name, (mtime, _kept) in cases.items():
        (tmp_path / name).write_bytes(b"x")
        if mtime is not None:
            os.utime(tmp_path / name, (mtime, mtime))
    os.symlink(tmp_path / "nowhere", tmp_path / ".trajectories.h5.link.part")
    folder = tmp_path / f".trajectories.h5.h{host}p{pid}s1.dir.part"
    folder.mkdir()
    (folder / "inside").write_bytes(b"x")

    io.write_text(target, "complete\n")
    assert target.read_text() == "complete\n"
    assert not killed.exists() and not folder.exists()
    for name, (_mtime, kept) in cases.items():
        assert (tmp_path / name).exists() == kept, name
    assert (tmp_path / ".trajectories.h5.link.part").is_symlink()


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


def _every_kind_of_variable() -> xr.Dataset:
    """What the workflow's files hold, each kind once: numbers of several widths, NaN,
    booleans, strings (index, coordinate, data, 2-D, scalar), coordinates that are not
    dimensions, a dimension without a coordinate, attributes of every type we write."""
    return xr.Dataset(
        {
            "f64": (("layer", "mode"), np.arange(6.0).reshape(3, 2), {
                "long_name": "x", "ints": [1, 2, 3], "floats": [0.5, 1.5],
                "strings": ["a", "bc"], "one": [7], "i32": np.int32(3), "f": 2.5,
            }),
            "f32": ("layer", np.array([1, np.nan, 3], dtype=np.float32)),
            "i64": ("layer", np.array([1, 2, 3])),
            "u16": (("free", "layer"), np.ones((4, 3), dtype=np.uint16)),
            "i8": ((), np.int8(4)),
            "flag": ("layer", np.array([True, False, True])),
            "name": ("layer", np.array(["ab", "c", "d\u00e9f"], dtype=object)),
            "grid": (("layer", "mode"), np.array([["a", "b"], ["c", "d"], ["e", "f"]])),
            "text": ((), "hello"),
            "number": ((), 1.25),
            "free_axis": ("free", np.arange(4.0)),
        },
        coords={
            "layer": [1, 2, 3],
            "mode": ["alpha", "beta"],
            "label": ("layer", ["x", "y", "z"]),
            "depth": ("layer", [0.1, 0.2, 0.3]),
        },
        attrs={"title": "t", "n": 3, "values": [1.0, 2.0], "names": ["p", "q"],
               "single": ["only"], "accents": "\u00fcn\u00ef"},
    )  # fmt: skip


def test_netcdf_read_as_xarray_reads_it(tmp_path):
    """The direct reader (the workflow's own files) and xarray's backend agree."""
    path = tmp_path / "every_kind.nc"
    io.write_netcdf(path, _every_kind_of_variable())
    assert io._read_plain_netcdf(path) is not None  # read directly, not by the fallback
    assert_read_as_xarray_reads(path)


def test_netcdf_reads_back_as_the_h5netcdf_engine_wrote_it(tmp_path):
    """write_netcdf goes through netCDF-C; what comes back, by either reader, is what the
    h5netcdf engine's file of the same Dataset gives, and every numeric array carries its
    Fletcher-32 checksum."""
    import h5py

    ds = _every_kind_of_variable()
    ours, theirs = tmp_path / "ours.nc", tmp_path / "theirs.nc"
    io.write_netcdf(ours, ds)
    ds.to_netcdf(theirs, engine="h5netcdf")
    xr.testing.assert_identical(io.read_netcdf(ours), io.read_netcdf(theirs))
    with (
        xr.open_dataset(ours, engine="h5netcdf") as a,
        xr.open_dataset(theirs, engine="h5netcdf") as b,
    ):
        xr.testing.assert_identical(a.load(), b.load())
    with h5py.File(ours, "r") as f:
        numeric = [n for n, v in ds.variables.items() if v.ndim and v.dtype.kind in "biuf"]
        assert numeric and all(f[n].fletcher32 for n in numeric)


@pytest.mark.parametrize(
    ("change", "direct"),
    [("fixed_width_attributes", True), ("empty_attribute", False), ("compound_attribute", False),
     ("dimension_with_two_scales", False)],
)  # fmt: skip
def test_netcdf_attributes_and_dimensions_as_xarray_reads_them(tmp_path, change, direct):
    """Attributes of fixed-width strings (as other netCDF writers make them) are decoded
    as h5netcdf decodes them; anything the direct reader does not decode itself is left
    to xarray's backend: the same Dataset either way."""
    import h5py

    path = tmp_path / f"{change}.nc"
    io.write_netcdf(path, _every_kind_of_variable())
    with h5py.File(path, "a") as f:
        attrs = f["f64"].attrs
        if change == "fixed_width_attributes":
            attrs["fixed"] = np.bytes_(b"abc")
            attrs["fixed_list"] = np.array([b"ab", b"cd"], dtype="S2")
            attrs["fixed_one"] = np.array([b"only"], dtype="S4")
            f.attrs["fixed_root"] = np.bytes_(b"root")
        elif change == "empty_attribute":
            attrs["nothing"] = h5py.Empty("f8")
        elif change == "compound_attribute":
            attrs["pair"] = np.array((1, 2.0), dtype=[("a", "i4"), ("b", "f8")])
        else:  # a second scale on the layer axis of f64
            f["other"] = np.arange(3.0)
            f["other"].make_scale("other")
            f["f64"].dims[0].attach_scale(f["other"])
    assert (io._read_plain_netcdf(path) is not None) == direct
    assert_read_as_xarray_reads(path)


def test_an_hdf5_file_without_netcdf_dimensions_is_read_as_xarray_reads_it(tmp_path):
    """Unlabelled axes (an HDF5 file no netCDF writer made) are xarray's to name."""
    import h5py

    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f["values"] = np.arange(3.0)  # no dimension scale
    assert io._read_plain_netcdf(path) is None
    assert_read_as_xarray_reads(path)


@pytest.mark.parametrize("feature", ["empty_dimension", "group", "characters", "time"])
def test_netcdf_features_outside_the_direct_reader_go_through_xarray(tmp_path, feature):
    """What the direct reader does not decode itself is read by xarray's backend: the
    same Dataset either way."""
    import h5netcdf

    path = tmp_path / f"{feature}.nc"
    ds = _every_kind_of_variable()
    if feature == "empty_dimension":  # netCDF-4 makes a zero-length dimension unlimited
        io.write_netcdf(path, ds.assign(nothing=("none", np.zeros(0))))
    elif feature == "group":
        io.write_netcdf(path, ds)
        with h5netcdf.File(path, "a") as f:
            f.create_group("inner")
    elif feature == "characters":
        chars = xr.Variable(("layer", "nchar"), np.array([[b"a", b"b"]] * 3, dtype="S1"))
        ds["chars"] = chars
        ds.to_netcdf(path, engine="h5netcdf", encoding={"chars": {"dtype": "S1"}})
    else:
        ds["when"] = ("layer", np.array(["2026-01-01", "2026-01-02", "2026-01-03"],
                                        dtype="datetime64[ns]"))  # fmt: skip
        io.write_netcdf(path, ds)
    if feature != "time":  # times are decoded by xarray's own rules on either path
        assert io._read_plain_netcdf(path) is None
    assert_read_as_xarray_reads(path)


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_published_files_take_the_umask_mode(tmp_path, umask):
    """Issue 10, item 10: mkstemp makes the temporary file 0600; the published file gets
    the mode the umask gives any new file."""
    import os
    import stat

    old = os.umask(umask)
    try:
        assert io.umask() == umask
        io.write_text(tmp_path / "a.txt", "x")
        io.write_h5(tmp_path / "b.h5", {"x": np.zeros(3)})
        io.write_netcdf(tmp_path / "c.nc", xr.Dataset({"x": (("i",), np.ones(2))}))
    finally:
        os.umask(old)
    for name in ("a.txt", "b.h5", "c.nc"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name


def test_all_nan_headline_is_not_written(tmp_path):
    ds = xr.Dataset({"gamma": (("t",), [np.nan, np.inf]), "rho": (("t",), [np.nan, np.nan])})
    with pytest.raises(io.EmptyResultError) as err:
        io.write_netcdf(tmp_path / "p.nc", ds, headline=("gamma", "rho"), hint="NaN embeddings")
    assert str(tmp_path / "p.nc") in str(err.value) and "gamma, rho are NaN everywhere" in str(
        err.value
    )
    assert "NaN embeddings" in str(err.value) and list(tmp_path.iterdir()) == []
    ds["rho"][0] = 0.5  # one finite headline value: a result
    io.write_netcdf(tmp_path / "p.nc", ds, headline=("gamma", "rho"))
    assert (tmp_path / "p.nc").exists()


_FAKE_SNAKEMAKE = """
import subprocess, sys
subprocess.run([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
"""
_JOB = """
import sys, time
from pathlib import Path
from specalign import io, runtime
watched = runtime.watch_snakemake()
print("watching", watched, flush=True)
out = Path(sys.argv[1])
try:
    with io.atomic_path(out) as tmp:
        tmp.write_text("result")
        for _ in range(600):  # a long computation, stopped by the watchdog
            time.sleep(0.05)
    print("published", flush=True)
except runtime.OrphanedJobError as exc:
    print("stopped:", exc, flush=True)
"""


def test_orphaned_job_is_stopped_and_publishes_nothing(tmp_path):
    """Issue 10, item 3, in miniature: a job whose parent Snakemake (here a stand-in run
    as `python .../snakemake`) is killed stops within seconds and renames nothing."""
    import signal
    import subprocess
    import sys
    import time

    fake = tmp_path / "bin" / "snakemake"
    fake.parent.mkdir()
    fake.write_text(_FAKE_SNAKEMAKE)
    log = tmp_path / "job.txt"
    out = tmp_path / "out.txt"
    with open(log, "w") as fh:
        parent = subprocess.Popen(
            [sys.executable, str(fake), _JOB, str(out)], stdout=fh, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while "watching" not in log.read_text():
            assert time.monotonic() < deadline and parent.poll() is None
            time.sleep(0.05)
        assert f"[{parent.pid}]" in log.read_text()  # the stand-in is recognised
        parent.kill()  # SIGKILL of the parent alone: the job is orphaned
        parent.wait(timeout=30)
        while "stopped:" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        import contextlib

        with contextlib.suppress(ProcessLookupError):
            os.killpg(parent.pid, signal.SIGKILL)
    text = log.read_text()
    assert "is gone" in text and "published" not in text.splitlines()
    assert not out.exists() and list(tmp_path.glob(".out.txt.*")) == []


@pytest.mark.parametrize("layout", ["empty", "dense", "hole_first", "hole_between", "hole_last"])
def test_sha256_of_a_sparse_file_is_that_of_its_bytes(tmp_path, layout):
    """Holes are hashed as the zeros they read as, without being read."""
    import hashlib

    from specalign.contents import sha256_file

    path = tmp_path / "f.bin"
    rng = np.random.default_rng(0)
    data = rng.bytes((3 << 20) + 12345)
    with open(path, "wb") as f:
        if layout == "dense":
            f.write(data)
        elif layout == "hole_first":
            f.seek(5 << 20)
            f.write(data)
        elif layout == "hole_between":
            f.write(data)
            f.seek(9 << 20, os.SEEK_CUR)
            f.write(data)
        elif layout == "hole_last":
            f.write(data)
            f.truncate(len(data) + (7 << 20) + 3)
    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_digests_are_cached_in_each_working_directorys_own_file(tmp_path, monkeypatch):
    """One process planning in two working directories (Snakemake's API, the tests'
    in-process dry runs) keeps each one's digests in that directory's cache file, and a
    digest read from the cache is the file's."""
    import hashlib

    from specalign import contents

    data = tmp_path / "data.bin"
    data.write_bytes(b"abc")
    want = f"sha256:{hashlib.sha256(b'abc').hexdigest()}"
    files = {}
    for name in ("one", "two"):
        work = tmp_path / name
        work.mkdir()
        monkeypatch.chdir(work)
        own = work / name
        own.write_bytes(name.encode())
        assert contents.file_digest(own) == f"sha256:{hashlib.sha256(name.encode()).hexdigest()}"
        assert contents.file_digest(data) == want
        files[name] = json.loads((work / contents.CACHE).read_text())
    assert set(files["one"]) == {str(tmp_path / "one" / "one"), str(data)}
    assert set(files["two"]) == {str(tmp_path / "two" / "two"), str(data)}
    # read back from the cache, unchanged
    monkeypatch.chdir(tmp_path / "one")
    assert contents.file_digest(data) == want


@pytest.mark.parametrize("torch_first", [False, True])
def test_pinned_threads_reach_torch_whenever_it_is_imported(torch_first):
    """pin_threads does not import torch (a second per job that never uses it); torch
    imported later gets the pinned intra-op count and one inter-op thread all the same,
    and a CPU job's torch_device does not load it either."""
    code = f"""
import sys
if {torch_first}:
    import torch
from specalign.runtime import pin_threads, torch_device
pin_threads(1)
assert torch_device(0) == "cpu"
loaded = "torch" in sys.modules
import torch
print(loaded, torch.get_num_threads(), torch.get_num_interop_threads())
pin_threads(2)
print(torch.get_num_threads())
"""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120, check=True).stdout.split()  # fmt: skip
    assert out == [str(torch_first), "1", "1", "2"]


def test_swap_folder_replaces_the_old_folder_and_leaves_no_partial(tmp_path):
    final = tmp_path / "step8"
    for content in ("first", "second"):
        tmp = io.new_partial(final, folder=True)
        (tmp / "model.safetensors").write_text(content)
        io.swap_folder(tmp, final)
        assert (final / "model.safetensors").read_text() == content
        assert sorted(p.name for p in tmp_path.iterdir()) == ["step8"]


def test_heap_set_aside_collects_what_is_made_inside_and_gives_the_rest_back():
    """runtime.heap_set_aside: a collection inside scans only what was made since, so it
    is fast with torch loaded, yet still frees the reference cycles made inside (the
    streamed units' tensors); a nested block (a streamed model built inside a decorated
    function) sets aside what was made since, after collecting the garbage among it; the
    objects set aside return to the collector when the outermost block ends, by an
    exception too."""
    import gc
    import weakref

    from specalign import runtime

    class Node:
        pass

    def cycle() -> weakref.ref:
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    assert gc.get_freeze_count() == 0
    before = cycle()  # garbage before: collected first, not set aside
    with runtime.heap_set_aside():
        assert before() is None
        assert gc.get_freeze_count() > 0
        inside = cycle()
        made_inside = [[] for _ in range(1000)]
        # Objects set aside can still be freed by their reference counts (another
        # thread's, such as pytest-xdist's channel): counts are bounds from below
        with runtime.heap_set_aside():  # nested: what was made since is set aside too
            assert inside() is None  # garbage among it: collected, not set aside
            assert gc.get_freeze_count() >= len(made_inside)
            late = cycle()
            gc.collect()
            assert late() is None  # made inside the nested block: collected as before
        assert gc.get_freeze_count() >= len(made_inside)  # back only when the outermost ends
        del made_inside
    assert gc.get_freeze_count() == 0

    @runtime.heap_set_aside()
    def fails() -> None:
        assert gc.get_freeze_count() > 0
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        fails()
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize(
    "shape",
    [(4096, 4096), (1024, 4096), (24, 1024, 1024), (10,), (100000,), (3, 5, 7),
     (1, 200000), (128256, 8192), (2, 3, 70000)],
)  # fmt: skip
@pytest.mark.parametrize("itemsize", [4, 8])
def test_chunks_are_whole_trailing_rows_within_the_target_size(shape, itemsize):
    """Issue 33: checksummed datasets in chunks of at most io.CHUNK_BYTES, trailing axes
    whole while they fit, the axis that does not fit cut, the leading ones 1."""
    from specalign.io import CHUNK_BYTES, chunk_shape

    chunk = chunk_shape(shape, itemsize)
    assert len(chunk) == len(shape)
    assert all(1 <= c <= s for c, s in zip(chunk, shape, strict=True))
    assert int(np.prod(chunk)) * itemsize <= max(CHUNK_BYTES, itemsize)
    cut = [i for i, (c, s) in enumerate(zip(chunk, shape, strict=True)) if c < s]
    if cut:  # after the last cut axis everything is whole, before it everything is 1
        first = cut[-1]
        assert all(c == s for c, s in zip(chunk[first + 1 :], shape[first + 1 :], strict=True))
        assert all(c == 1 for c in chunk[:first])
        # and the cut axis takes as many as fit
        row = itemsize * int(np.prod(shape[first + 1 :]))
        assert chunk[first] == max(1, CHUNK_BYTES // row)
    else:
        assert int(np.prod(shape)) * itemsize <= CHUNK_BYTES


def test_a_flipped_bit_in_any_chunk_fails_the_read(tmp_path):
    """The Fletcher-32 checksum is per chunk: a flip in the last chunk of a matrix in
    several chunks is caught as well as one in the first."""
    import h5py

    from specalign.io import InputFileError, read_h5, write_h5

    arr = np.random.default_rng(0).standard_normal((300, 1024))  # 2.4 MB: 5 chunks
    path = tmp_path / "w.h5"
    write_h5(path, {"W": arr})
    with h5py.File(path, "r") as f:
        ds = f["W"]
        assert ds.fletcher32 and ds.id.get_num_chunks() == 5
        offset = ds.id.get_chunk_info(4).byte_offset
    np.testing.assert_array_equal(read_h5(path)[0]["W"], arr)
    raw = bytearray(path.read_bytes())
    raw[offset + 11] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(InputFileError, match=str(path)):
        read_h5(path)


def test_disk_stack_gives_back_what_was_appended_one_array_at_a_time(tmp_path):
    """io.DiskStack (issue 33: the real model's states and steering's W_O variants kept
    off memory): each array read back bit for bit, by index from either end and in
    order, with the stack's shape and dtype; another shape or dtype is refused naming
    both; the file is gone after the block."""
    from specalign.io import DiskStack

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((3, 4, 5)).astype(np.float32) for _ in range(4)]
    with DiskStack(tmp_path) as stack:
        assert len(stack) == 0 and stack.shape == (0,)
        for a in arrays:
            stack.append(a)
        path = stack.path
        assert path.parent == tmp_path and path.stat().st_size == 4 * arrays[0].nbytes
        assert stack.shape == (4, 3, 4, 5) and stack.dtype == np.float32
        assert np.shape(stack) == (4, 3, 4, 5)
        for got, want in zip(stack, arrays, strict=True):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(stack[-1], arrays[-1])
        np.testing.assert_array_equal(stack[1:3][1], arrays[2])
        stack.append(arrays[0].T.copy().T)  # any memory layout of the same shape
        np.testing.assert_array_equal(stack[4], arrays[0])
        with pytest.raises(IndexError):
            stack[5]
        with pytest.raises(ValueError, match=r"\(3, 4, 6\) float32.*\(3, 4, 5\) float32"):
            stack.append(np.zeros((3, 4, 6), np.float32))
        with pytest.raises(ValueError, match="float64"):
            stack.append(np.zeros((3, 4, 5)))
    assert not path.exists()
