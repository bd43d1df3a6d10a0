"""Where every result lies: the results folder's layout, in one place.

A configuration writes its results to its own folder (key ``results``,
:func:`results_folder`); inside it, each study has its folder of data files, and
``tables/`` and ``figures/`` one folder a study. The paths below are relative to the
results folder; their ``{name}`` parts may be Snakemake wildcards (``"{model}"``) or
values. The rules (``results_path`` in ``rules/common.smk``), the console script and
the Python API all take their paths from here, so the layout is written once.

Logs and benchmarks go beside the results folder (:func:`log_folder`), except for the
default folder ``results``, whose stay at the top (``logs/``, ``benchmarks/``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specalign.schema import ConfigError

#: The results folder when the configuration names none.
DEFAULT_RESULTS = "results"


def results_folder(cfg: Mapping[str, Any]) -> str:
    """The configuration's results folder (key ``results``) as a clean relative or
    absolute path without a trailing slash, "results" by default."""
    folder = posixpath.normpath(str(cfg.get("results", f"{DEFAULT_RESULTS}/")).strip())
    if folder in (".", "") or folder.startswith(".."):
        raise ConfigError(
            f"results: {cfg.get('results')!r} is not a folder of its own (the working "
            "directory or outside it); fix: a folder name such as results/paper"
        )
    return folder


def log_folder(results: str) -> str:
    """The prefix of the logs and benchmarks of the results folder ``results``: "" for
    the default folder (``logs/`` at the top), else the results folder itself."""
    return "" if results == DEFAULT_RESULTS else f"{results}/"


def results_dir(out: str | Path, cfg: Mapping[str, Any]) -> Path:
    """The results folder of ``cfg`` inside the working directory ``out``."""
    return Path(out) / results_folder(cfg)


# ----------------------------------------------------------- the transformer study


def model_file(model: str, name: str) -> str:
    """A file of one model: ``weights.h5``, ``spectra.nc``, ``propagation.nc``,
    ``steering.nc``."""
    return f"transformers/{model}/{name}"


def series_file(series: str, name: str) -> str:
    """A file of one checkpoint series: ``run.nc`` (a run trained here) and
    ``training.nc`` (every point side by side)."""
    return f"transformers/series/{series}/{name}"


#: The supplement's dynamics on the sphere.
SPHERE = "transformers/sphere/sphere.nc"


def series_table(series: str, name: str) -> str:
    """A table of one checkpoint series, with its extension."""
    return f"tables/transformers/series/{series}/{name}"


def series_figure(series: str, name: str) -> str:
    """A figure of one checkpoint series, with its extension."""
    return f"figures/transformers/series/{series}/{name}"


def model_table(model: str, name: str) -> str:
    """A table of one model, with its extension."""
    return f"tables/transformers/{model}/{name}"


def model_figure(model: str, name: str) -> str:
    """A figure of one model, with its extension."""
    return f"figures/transformers/{model}/{name}"


# ------------------------------------------------------------ the commutator study


def experiment_file(experiment: str, name: str) -> str:
    """A file of one experiment: ``data.h5``, ``trajectories.h5``, ``diagnostics.nc``."""
    return f"commutators/{experiment}/{name}"


# ------------------------------------------------------------------- both studies


def table(study: str, name: str) -> str:
    """A table of a whole study (``transformers`` or ``commutators``), with its
    extension; the per-layer table of every model is ``table("transformers",
    "layers.csv")``."""
    return f"tables/{study}/{name}"


def figure(study: str, name: str) -> str:
    """A figure of a whole study, with its extension."""
    return f"figures/{study}/{name}"


#: The reproduction report's stem (the files are ``.md`` and ``.html``).
REPORT = "reproduction"
