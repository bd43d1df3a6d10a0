"""Kept facts (specalign/kept.py): read by their key, and the unused ones removed, never
a file the module did not name."""

from __future__ import annotations

import hashlib
import json
import os
import time

from specalign import kept as K

DAY = 86400.0


def _fact(folder, key, age_days):
    path = folder / f"{hashlib.sha256(key.encode()).hexdigest()}.json"
    path.write_text(json.dumps({"key": key}))
    then = time.time() - age_days * DAY
    os.utime(path, (then, then))
    return path


def test_a_fact_unread_for_long_is_removed_when_another_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECALIGN_CACHE", str(tmp_path))
    folder = tmp_path / "facts"
    folder.mkdir()
    old = _fact(folder, "old", K.UNUSED_DAYS + 10)
    recent = _fact(folder, "recent", K.UNUSED_DAYS - 10)
    read = _fact(folder, "read", K.UNUSED_DAYS + 10)
    # a person's files, and one of ours in form only by accident of its name's case
    notes, upper = folder / "notes.json", folder / ("A" * 64 + ".json")
    for p in (notes, upper):
        p.write_text("{}")
        os.utime(p, (0, 0))
    # read: marked used, so it stays
    assert K.kept("facts", "read", lambda: {"computed": True}) == {"key": "read"}
    assert time.time() - read.stat().st_mtime < 60
    made = K.kept("facts", "new", lambda: {"computed": True})
    assert made == {"computed": True}
    assert not old.exists()
    assert recent.exists() and read.exists() and notes.exists() and upper.exists()
    assert K.kept("facts", "new", lambda: {"computed": False}) == {"computed": True}


def test_a_fact_read_today_is_not_touched_again(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECALIGN_CACHE", str(tmp_path))
    folder = tmp_path / "facts"
    folder.mkdir()
    path = _fact(folder, "k", 0.5)
    before = path.stat().st_mtime
    assert K.kept("facts", "k", dict) == {"key": "k"}
    assert path.stat().st_mtime == before


def test_nothing_is_kept_or_removed_with_an_empty_cache_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECALIGN_CACHE", "")
    calls = []
    assert K.kept("facts", "k", lambda: calls.append(1) or {"n": len(calls)}) == {"n": 1}
    assert K.kept("facts", "k", lambda: calls.append(1) or {"n": len(calls)}) == {"n": 2}
