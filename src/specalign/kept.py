"""Facts computed once and kept on disk, keyed by the content they follow.

Every ``snakemake`` call, dry runs included, validates the configuration, and some of
its checks need a fact that is slow to compute and never changes for the same inputs: a
``transformers`` configuration object's values (imports transformers and torch, 3 s;
:func:`specalign.transformers.load.families.config_facts`), the vocabulary a training corpus
can fill (a tokenizer trained on 4.5 M characters, 6-10 s;
:func:`specalign.transformers.settings._vocabulary_limit`). Such a fact is kept as a small JSON file
named by the sha256 of everything it depends on (the caller's key text: contents and
library versions, never a path or a time), so a changed input is a new key.

Old keys are never read again, so a fact not read for :data:`UNUSED_DAYS` days is
removed when a new fact of its kind is kept (a read marks a fact used). Only the
files this module names (64 hex digits and ``.json``) are removed: anything else in
the folder is left as it is.

The folder: ``$SPECALIGN_CACHE`` (empty: keep nothing), else ``$XDG_CACHE_HOME/specalign``
or ``~/.cache/specalign``, with one subfolder per kind of fact. A file that cannot be
read is computed again and rewritten; a folder that cannot be written keeps nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: A kept fact not read for this many days is removed when another of its kind is kept.
UNUSED_DAYS = 90

_NAME = re.compile(r"[0-9a-f]{64}\.json")


def cache_folder(kind: str) -> Path | None:
    """The folder of kept facts of ``kind``, or None when nothing is kept."""
    root = os.environ.get("SPECALIGN_CACHE")
    if root == "":
        return None
    if root is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "specalign")
    return Path(root) / kind


def kept(kind: str, key: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The fact of ``key`` (any text naming every input), read from the folder of
    ``kind`` when kept there, else ``compute()`` (a JSON-able dict), kept for next time."""
    folder = cache_folder(kind)
    path = folder / f"{hashlib.sha256(key.encode()).hexdigest()}.json" if folder else None
    if path is not None and path.is_file():
        try:
            fact = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pass  # unreadable: computed again, and rewritten
        else:
            _mark_used(path)
            return fact
    fact = compute()
    if path is not None:
        _keep(path, fact)
        _forget_unused(path.parent, keep=path)
    return fact


def _mark_used(path: Path) -> None:
    """A fact read now is in use: its modification time says when it was last read
    (a day's resolution is enough, so a file read today is not touched again)."""
    try:
        if time.time() - path.stat().st_mtime > 86400:
            os.utime(path)
    except OSError:
        pass  # a folder that cannot be written keeps its times


def _forget_unused(folder: Path, keep: Path) -> None:
    """Remove the facts of ``folder`` not read for :data:`UNUSED_DAYS` days (its own
    file names only; ``keep``, just written, in any case)."""
    cutoff = time.time() - UNUSED_DAYS * 86400
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if not _NAME.fullmatch(entry.name) or entry.name == keep.name:
            continue
        try:
            if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < cutoff:
                os.unlink(entry.path)
        except OSError:
            pass  # gone already, or not ours to remove


def _keep(path: Path, fact: dict[str, Any]) -> None:
    """Write ``fact`` to ``path`` atomically; a folder that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(fact, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
