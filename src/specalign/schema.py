"""The configuration's JSON schema (``config/schema.yaml``), readable without the rest of
``specalign.config``.

Kept apart so that a study-neutral module that needs one fact of the schema (the figure
formats, for ``output.save_figure``) does not pull ``config``'s cross-key checks, and
with them the transformer study's modules, into the import closure (and so the code
fingerprint) of the commutator study's rules.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "config" / "schema.yaml"


class ConfigError(ValueError):
    """The configuration breaks the schema or a cross-key rule; the message names the key."""


#: (path, modification time, size) -> the parsed schema: a figure job asks once per
#: figure (0.22 s a parse with the pure-Python loader, 2.7 s of a 12-figure job).
_PARSED: dict[tuple[str, int, int], dict[str, Any]] = {}


def load_schema(path: str | Path | None = None) -> dict[str, Any]:
    """The schema at ``path`` (default: the package's), parsed once per version of the
    file in a process; each call gets its own copy, free to change."""
    schema_path = Path(path) if path else SCHEMA_PATH
    try:
        stat = schema_path.stat()
    except FileNotFoundError:
        raise ConfigError(f"schema not found at {schema_path}") from None
    key = (str(schema_path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _PARSED:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        with open(schema_path, encoding="utf-8") as fh:
            _PARSED[key] = yaml.load(fh, Loader=loader)
    return copy.deepcopy(_PARSED[key])
