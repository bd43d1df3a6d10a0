"""Inputs tracked by their content: digests of the files a rule reads.

Snakemake reruns a job when an input is newer than its outputs, or when a ``params``
value changes; a file replaced in place with its old modification time (``cp -p``,
``rsync -t``, a restored backup), or a folder read through a path recorded once (a
local model's manifest), escapes both. Every rule that reads such a file therefore
passes its content digest as a ``params`` value (rules/common.smk), so that other bytes
under the same name rerun the job and what follows it.

* :func:`file_digest`: the SHA-256 of a file. Exact; it costs one read of the file, so
  digests are cached (:data:`CACHE`) under the file's identity (absolute path, size,
  modification and change times in ns, inode): a write in place changes the change
  time, which no user tool can set back, so a cached digest is never stale. A file in
  a Hugging Face cache is a link into ``blobs/``, named by the hash the hub gave it:
  the digest is of the bytes the link leads to, never of the name (a blob overwritten
  in place keeps its name). Reading a downloaded checkpoint once costs a fraction of
  downloading it; later plans hit the cache.
* :func:`digest_of`: one digest over (name, digest) pairs, for an input made of several
  files (a model folder: :func:`specalign.transformers.load.checkpoint.model_digest`).

A digest names what was read; it is recorded in the files made from it, which their
readers check.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

#: The digest cache of the working directory (beside Snakemake's own metadata).
CACHE = Path(".snakemake") / "specalign" / "digests.json"
#: Each working directory's digest cache as read, by the cache file's absolute path: a
#: process that plans in several working directories (Snakemake's API, tests) reads and
#: writes each one's own file.
_caches: dict[Path, dict[str, list]] = {}


def _cache_path() -> Path:
    return Path.cwd() / CACHE


def _load_cache() -> dict[str, list]:
    path = _cache_path()
    cache = _caches.get(path)
    if cache is None:
        try:
            loaded = json.loads(path.read_text())
            cache = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            cache = {}
        _caches[path] = cache
    return cache


def _save_cache(cache: dict[str, list]) -> None:
    path = _cache_path()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, sort_keys=True))
        os.replace(tmp, path)  # concurrent writers lose entries, never corrupt the file


_PIECE = 1 << 20
_ZEROS = memoryview(bytes(_PIECE))


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB pieces. A hole of a sparse file is
    hashed as the zeros it reads as, without reading it (SEEK_DATA/SEEK_HOLE, where the
    filesystem reports them): reading a hole costs the kernel as much as reading data
    (a test's 10 GB header-only checkpoint took 30 s of system time)."""
    h = hashlib.sha256()
    buf = bytearray(_PIECE)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        pos = 0
        for start, end in _data_extents(fd, size):
            _update_zeros(h, start - pos)
            f.seek(start)
            pos = start
            while pos < end:
                n = f.readinto(view[: min(_PIECE, end - pos)])
                if not n:  # the file shrank while read: hash what it holds
                    return h.hexdigest()
                h.update(view[:n])
                pos += n
        _update_zeros(h, size - pos)
    return h.hexdigest()


def _update_zeros(h: Any, n: int) -> None:
    while n > 0:
        k = min(n, _PIECE)
        h.update(_ZEROS[:k])
        n -= k


def _data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each stretch of ``fd`` that holds data; the whole file where the
    system cannot tell data from holes."""
    seek_data, seek_hole = getattr(os, "SEEK_DATA", None), getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        yield 0, size
        return
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, seek_data)
        except OSError as err:
            if err.errno == errno.ENXIO:  # no data after pos: the rest is a hole
                return
            if pos == 0:  # not supported here
                yield 0, size
                return
            raise
        end = min(os.lseek(fd, start, seek_hole), size)
        yield start, end
        pos = end


def file_digest(path: str | os.PathLike[str]) -> str:
    """``sha256:<hex>`` of the file's bytes (through links), cached under the file's
    identity (see the module doc)."""
    real = Path(path).resolve()
    st = real.stat()
    key = str(real)
    ident = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    cache = _load_cache()
    hit = cache.get(key)
    if isinstance(hit, list) and hit[:4] == ident and len(hit) == 5:
        return str(hit[4])
    digest = f"sha256:{sha256_file(real)}"
    cache[key] = [*ident, digest]
    _save_cache(cache)
    return digest


def digest_of(entries: Iterable[tuple[str, str]]) -> str:
    """One SHA-256 over (name, digest) pairs, order-independent."""
    h = hashlib.sha256()
    for name, digest in sorted(entries):
        h.update(f"{name}\0{digest}\n".encode())
    return h.hexdigest()
