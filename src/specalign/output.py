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
    from specalign.schema import load_schema

    plots = load_schema()["properties"]["plots"]["properties"]
    return tuple(plots["formats"]["items"]["enum"])


#: How a figure file says the workflow wrote it (metadata of its format), and the bytes
#: that say so: only such a file is ever removed as an earlier run's.
_WRITER = "specalign"
_WRITER_METADATA = {
    "png": ({"Software": _WRITER}, b"tEXtSoftware\x00" + _WRITER.encode()),
    "pdf": ({"Creator": _WRITER}, b"/Creator (" + _WRITER.encode() + b")"),
    "svg": ({"Creator": _WRITER}, b"<dc:title>" + _WRITER.encode() + b"</dc:title>"),
}


def written_here(path: str | os.PathLike[str]) -> bool:
    """Whether a figure file was written by :func:`save_figure` (its metadata says so)."""
    path = Path(path)
    mark = _WRITER_METADATA.get(path.suffix.lstrip("."))
    try:
        return mark is not None and path.is_file() and mark[1] in path.read_bytes()
    except OSError:
        return False


def save_figure(
    fig: Figure,
    stem: str | os.PathLike[str],
    formats: Sequence[str] = ("png", "pdf"),
    dpi: int = 150,
) -> list[Path]:
    """Write ``{stem}.{fmt}`` for each format atomically; return the paths.

    The PDF creation date is dropped so that rerunning the workflow on the same data
    gives byte-identical files (and Snakemake sees no spurious change); each file's
    metadata names the workflow as its writer. The same figure in a format not asked for
    now (a ``{stem}.pdf`` of an earlier run beside a new ``{stem}.png``) would be read as
    this run's figure: removed with a warning when the workflow wrote it
    (:func:`written_here`), named in a warning and kept when a person did.
    """
    stem = Path(stem)
    for fmt in sorted(set(figure_formats()) - set(formats)):
        old = stem.with_name(f"{stem.name}.{fmt}")
        if written_here(old):
            old.unlink()
            log.warning("removed %s: an earlier run's figure in a format not configured now", old)
        elif old.exists():
            log.warning(
                "kept %s: not written by this workflow, and not this run's figure (formats "
                "configured: %s)",
                old,
                ", ".join(formats),
            )
    paths = []
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        metadata = dict(_WRITER_METADATA[fmt][0])
        if fmt == "pdf":
            metadata["CreationDate"] = None

        def writer(tmp: Path, fmt: str = fmt, metadata: dict = metadata) -> None:
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


#: The data-driven caption a figure job writes beside ``{stem}.{fmt}``: ``{stem}`` +
#: this suffix, reStructuredText that the `snakemake --report` caption of the figure
#: reads (report/*.rst), so the report says what the job measured.
CAPTION_SUFFIX = ".caption.rst"

_RST_SPECIAL = str.maketrans({c: "\\" + c for c in "\\*`_|[]"})


def rst_escape(text: str) -> str:
    """``text`` as literal reStructuredText: the characters rst would read as markup
    (emphasis, references, substitutions) escaped, so a caption such as ``W_O`` or
    ``|corr|`` reads as written."""
    return text.translate(_RST_SPECIAL)


def write_caption(stem: str | os.PathLike[str], caption: str) -> Path:
    """Write ``caption`` to ``{stem}.caption.rst`` atomically (escaped rst, one
    paragraph); return the path."""
    stem = Path(stem)
    path = stem.with_name(stem.name + CAPTION_SUFFIX)
    io.write_text(path, rst_escape(" ".join(caption.split())) + "\n")
    return path


_HTML_STYLE = """
body { font-family: system-ui, sans-serif; font-size: 14px; margin: 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
th { background: #f2f2f2; position: sticky; top: 0; }
td:first-child, th:first-child { text-align: left; }
code { background: #f4f4f4; padding: 0 0.2em; }
p.caption { max-width: 60em; }
"""


def html_page(title: str, body: str) -> str:
    """A self-contained HTML page (inline style, no scripts), as the report embeds it."""
    from html import escape

    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_HTML_STYLE}</style></head>\n"
        f"<body>\n{body}\n</body></html>\n"
    )


def to_html(df: pd.DataFrame, caption: str) -> str:
    """The table as an HTML page: its caption, then every row (4 significant digits, as
    the Markdown twin; the CSV keeps full precision)."""
    from html import escape

    # undefined cells (NaN, and None in text columns) are empty, as in the Markdown twin
    shown = df.astype(object).where(df.notna(), None).map(lambda v: "" if v is None else v)
    table = shown.to_html(index=False, float_format=lambda x: f"{x:.4g}", border=0)
    return html_page(caption, f'<p class="caption">{escape(caption)}</p>\n{table}')


def markdown_html(text: str, title: str) -> str:
    """Markdown ``text`` (GitHub tables) as an HTML page, for the report's page view."""
    from markdown_it import MarkdownIt

    return html_page(title, MarkdownIt("commonmark").enable("table").render(text))


def to_markdown(df: pd.DataFrame, caption: str) -> str:
    """A caption line followed by the table as GitHub markdown (4 significant digits)."""
    return f"{caption}\n\n{df.to_markdown(index=False, floatfmt='.4g')}\n"


#: The files :func:`write_table` writes for a table, by extension: the rules declare
#: their outputs from this, so that none is written undeclared.
TABLE_FORMATS = ("csv", "md", "html")


def write_table(df: pd.DataFrame, stem: str | os.PathLike[str], caption: str) -> list[Path]:
    """Write ``{stem}.csv`` (full precision), ``{stem}.md`` and ``{stem}.html`` (the page
    the report shows) atomically (:data:`TABLE_FORMATS`); return the paths."""
    stem = Path(stem)
    writers = {
        "csv": lambda path: io.write_with(path, lambda p: df.to_csv(p, index=False)),
        "md": lambda path: io.write_text(path, to_markdown(df, caption)),
        "html": lambda path: io.write_text(path, to_html(df, caption)),
    }
    paths = []
    for ext in TABLE_FORMATS:
        path = stem.with_name(f"{stem.name}.{ext}")
        writers[ext](path)
        paths.append(path)
    return paths


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
