"""Writing what a reader sees, for both studies: figures, tables, numbers in text.

Study-neutral on purpose: each study's ``tables`` and ``figures`` modules build their
content and leave the files to these helpers, so that every figure and table of the
workflow is written the same way (atomically, reproducibly) and no study imports the
other.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from specalign import io

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

log = logging.getLogger("specalign")


def figure_formats() -> tuple[str, ...]:
    """Every figure format the workflow can write (``plots.formats`` of the schema)."""
    from specalign.config import load_schema

    plots = load_schema()["properties"]["plots"]["properties"]
    return tuple(plots["formats"]["items"]["enum"])


def save_figure(
    fig: Figure,
    stem: str | os.PathLike[str],
    formats: Sequence[str] = ("png", "pdf"),
    dpi: int = 150,
) -> list[Path]:
    """Write ``{stem}.{fmt}`` for each format atomically; return the paths.

    The PDF creation date is dropped so that rerunning the workflow on the same data
    gives byte-identical files (and Snakemake sees no spurious change). The same figure
    in a format not asked for now (a ``{stem}.pdf`` of an earlier run beside a new
    ``{stem}.png``) is removed, with a warning: it would be read as this run's figure.
    """
    stem = Path(stem)
    for fmt in sorted(set(figure_formats()) - set(formats)):
        old = stem.with_name(f"{stem.name}.{fmt}")
        if old.is_file():
            old.unlink()
            log.warning("removed %s: an earlier run's figure in a format not configured now", old)
    paths = []
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        metadata = {"CreationDate": None} if fmt == "pdf" else None

        def writer(tmp: Path, fmt: str = fmt, metadata: dict | None = metadata) -> None:
            fig.savefig(tmp, format=fmt, dpi=dpi, metadata=metadata)

        io.write_with(path, writer)
        paths.append(path)
    return paths


def placeholder_figure(text: str, caption: str) -> tuple[Figure, str]:
    """A figure that only says ``text``: for a workflow output whose data this run does
    not have (a paper figure whose runs are not configured, a mode a model lacks), so
    that a reader of the fixed output file sees why it is empty."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 2.0), layout="constrained")
    ax = fig.subplots()
    ax.set_axis_off()
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    return fig, caption


def to_markdown(df: pd.DataFrame, caption: str) -> str:
    """A caption line followed by the table as GitHub markdown (4 significant digits)."""
    return f"{caption}\n\n{df.to_markdown(index=False, floatfmt='.4g')}\n"


def write_table(df: pd.DataFrame, stem: str | os.PathLike[str], caption: str) -> list[Path]:
    """Write ``{stem}.csv`` (full precision) and ``{stem}.md`` atomically; return both."""
    stem = Path(stem)
    csv_path = stem.with_name(stem.name + ".csv")
    md_path = stem.with_name(stem.name + ".md")
    io.write_with(csv_path, lambda p: df.to_csv(p, index=False))
    io.write_text(md_path, to_markdown(df, caption))
    return [csv_path, md_path]


def fmt_number(x: Any, spec: str = ".4g", missing: str = "") -> str:
    """``x`` formatted with ``spec`` for running text; ``missing`` for None and NaN.

    ``spec="count"`` prints a whole number without decimals; a value that is not a
    number is printed as it is.
    """
    if x is None:
        return missing
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(xf):
        return missing
    return f"{xf:g}" if spec == "count" else format(xf, spec)


def nanmean(x: Any, axis: int | None = None) -> Any:
    """NaN-skipping mean without the all-NaN RuntimeWarning (NaN marks 'undefined', and
    a slice with no defined value stays NaN)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = np.nanmean(np.asarray(x, dtype=float), axis=axis)
    return float(out) if axis is None else out


def nanstd(x: Any, axis: int | None = None) -> Any:
    """NaN-skipping population standard deviation (ddof 0), warning-free like
    :func:`nanmean`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = np.nanstd(np.asarray(x, dtype=float), axis=axis)
    return float(out) if axis is None else out
