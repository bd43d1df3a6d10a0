"""Heavy libraries imported where they are first used, not where they are named.

Snakemake imports the figure modules when it parses the workflow, for the figure names
that its rules' outputs are derived from (rules/common.smk); matplotlib would add
about 1 s to every ``snakemake`` call, dry runs included, that draws
nothing. Likewise a job that reads one numpy function of a module that also runs torch
(the report job and ``sphere``) should not pay torch's import. A :class:`LazyModule`
stands for a module and imports it on the first attribute read.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class LazyModule:
    """``mpl = LazyModule("matplotlib")``: ``mpl.colormaps`` imports matplotlib then, once."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<LazyModule {self._name!r}, {state}>"
