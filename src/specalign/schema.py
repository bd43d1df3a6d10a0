"""The configuration's JSON schema (``config/schema.yaml``), readable without the rest of
``specalign.config``.

Kept apart so that a study-neutral module that needs one fact of the schema (the figure
formats, for ``output.save_figure``) does not pull ``config``'s cross-key checks, and
with them the transformer study's modules, into the import closure (and so the code
fingerprint) of the commutator study's rules.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "config" / "schema.yaml"


class ConfigError(ValueError):
    """The configuration breaks the schema or a cross-key rule; the message names the key."""


def load_schema(path: str | Path | None = None) -> dict[str, Any]:
    schema_path = Path(path) if path else SCHEMA_PATH
    if not schema_path.exists():
        raise ConfigError(f"schema not found at {schema_path}")
    with open(schema_path) as fh:
        return yaml.safe_load(fh)
