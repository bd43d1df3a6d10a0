"""Tables of the docs that are written from the code (the family table, the metric
table), so that they cannot drift from it: a module builds its table as markdown, a
command writes it into its document with :func:`replace_table`, and a test holds the
document equal to what the command would write."""

from __future__ import annotations

__all__ = ["replace_table"]


def replace_table(text: str, table: str) -> str:
    """``text`` (a markdown document) with the table whose header starts with the same
    first cell as ``table``'s replaced by ``table``; a ValueError when it has none."""
    head = "|" + table.split("\n", 1)[0].split("|")[1] + "|"
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith(head)), None)
    if start is None:
        raise ValueError(f"no table (a line starting {head!r}) to replace")
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join([*lines[:start], *table.rstrip("\n").split("\n"), *lines[end:]])
