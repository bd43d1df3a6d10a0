"""The commutator half of ``results/reproduction.md``: every published Section 10 number
of Nyström (arXiv:2608.22910) beside ours.

The rows come from :mod:`specalign.commutators.report.tables` (one :class:`Section` per paper
table, the identity residuals); this module renders them as one markdown document with
a plain sentence for every number where ours differs materially under the rule of
:func:`specalign.commutators.report.claims.differs`, stated in the document and fixed in
advance: nothing is tuned to agree.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from specalign import io
from specalign.commutators.report import paper as P
from specalign.commutators.report.claims import (
    MATERIAL_ABS_BOUNDED,
    MATERIAL_REL,
    MATERIAL_REL_SPREAD,
    RESIDUAL_ROUNDING,
)
from specalign.commutators.report.runs import Experiments, dataset_label
from specalign.commutators.report.tables import SECTIONS, Section, identity_residuals
from specalign.output import fmt_number

#: Numbers in the document: 4 significant digits, an empty cell where undefined.
_fmt = partial(fmt_number, missing="")


def _sentence(row: Mapping[str, Any]) -> str:
    """Plain-language statement of one material difference (or of a missing value)."""
    label, paper = row["_label"], P.format_value(row["paper"])
    ours = row["ours"]
    if ours is None or math.isnan(ours):
        return f"- {label}: ours is undefined (no seed entered), the paper reports {paper}."
    if row["quantity"] == "seeds":
        return f"- {label}: ours has {_fmt(ours, 'count')}, the paper {paper}; this differs."
    if row["_rule"] == "count":
        return (
            f"- {label}: ours is {_fmt(ours, 'count')} of {row['n']} non-diverged seeds, "
            f"the paper reports {paper}; this differs."
        )
    rel = "" if math.isnan(row["rel_diff"]) else f" ({row['rel_diff']:+.0%})"
    text = (
        f"- {label}: ours {_fmt(ours)} differs from the paper's {paper} by {row['diff']:+.3g}{rel}."
    )
    lo, hi = row["ci_low"], row["ci_high"]
    if not (math.isnan(lo) or math.isnan(hi)):
        inside = lo <= float(row["paper"]) <= hi
        where = "inside" if inside else "outside"
        text += (
            f" The paper value lies {where} our 95% bootstrap interval "
            f"[{lo:.4g}, {hi:.4g}] over {row['n']} seeds"
            + (", so the gap is within our seed-to-seed uncertainty." if inside else ".")
        )
    return text


def _section_markdown(section: Section) -> str:
    cols = section.descriptors + ["quantity", "statistic"]
    lines = [f"## {section.title}", "", section.caption, ""]
    runs = sorted({r["matched"] for r in section.rows if r["matched"] is not None})
    if runs:
        lines += [f"Matched runs: {', '.join(runs)}.", ""]
    else:
        lines += [f"Not run: this reproduction has no {section.needs}.", ""]
    header = cols + ["paper", "ours", "diff", "rel. diff", "ours sd", "95% CI", "n", "n div."]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for r in section.rows:
        present = r["matched"] is not None
        count = r["_rule"] == "count"
        ours = _fmt(r["ours"], "count" if count else ".4g") if present else "not run"
        ci = (
            f"[{r['ci_low']:.4g}, {r['ci_high']:.4g}]"
            if present and not math.isnan(r["ci_low"])
            else ""
        )
        cells = [str(r.get(c, "")) for c in cols] + [
            P.format_value(r["paper"]),
            ours or "undefined",
            _fmt(r["diff"], "+.3g") if present else "",
            _fmt(r["rel_diff"], "+.1%") if present else "",
            _fmt(r["ours_sd"]) if present else "",
            ci,
            str(r["n"]) if present else "",
            str(r["n_diverged"]) if present else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    flagged = [r for r in section.rows if r["matched"] is not None and r["differs"] is not False]
    if runs:
        if flagged:
            lines += ["Where ours differs materially from the paper:", ""]
            lines += [_sentence(r) for r in flagged]
        else:
            lines.append("No material difference under the rule stated above.")
        shaky = [r for r in section.rows if r.get("_unreliable", 0)]
        if shaky:
            lines += [
                "",
                "Spectral reliability (the paper states every displayed boundary passes):",
            ]
            lines += [
                f"- {r['_label']}: {r['_unreliable']} of {r['n']} entered seeds fail the "
                "spectral reliability test of their projector boundary, so this mean is not "
                "like-for-like with the paper's."
                for r in shaky
            ]
        absent = [r for r in section.rows if r["matched"] is None]
        if absent:
            lines += ["", f"{len(absent)} published numbers of this table have no run here."]
    lines.append("")
    return "\n".join(lines)


def _residual_markdown(experiments: Experiments) -> str:
    lines = ["## Identity residuals (Sec. 10.7)", ""]
    lines.append(
        "Maximum normalised residual Res(A, B) = |A - B|_F / (|A|_F + |B|_F + eps) of the "
        "four-source recursion and of the feature-transport identity over every non-NaN "
        "entry (one entry = one evaluation)."
    )
    lines.append("")
    df = identity_residuals(experiments)
    header = ["identity", "paper max", "paper evaluations", "ours max", "ours evaluations"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    sentences = []
    for var, (paper_max, paper_n) in P.TEXT_RESIDUALS.items():
        row = None
        if df is not None:
            sel = df[(df["identity"] == var) & (df["run"] == "all")]
            row = sel.iloc[0] if len(sel) else None
        if row is None or row["evaluations"] == 0:
            cells = [var, P.format_value(paper_max), str(paper_n), "not run", ""]
            lines.append("| " + " | ".join(cells) + " |")
            continue
        ours_max, ours_n = float(row["ours_max"]), int(row["evaluations"])
        cells = [var, P.format_value(paper_max), str(paper_n), f"{ours_max:.3g}", str(ours_n)]
        lines.append("| " + " | ".join(cells) + " |")
        alive_max = float(row["ours_max_nondiverged"])
        alive_n = int(row["evaluations_nondiverged"])
        if ours_max <= RESIDUAL_ROUNDING:
            sentences.append(
                f"- {var}: ours {ours_max:.3g} over {ours_n} evaluations, the paper's "
                f"{P.format_value(paper_max)} over {paper_n}; both are floating-point "
                "rounding, so the identity holds in both implementations."
            )
        elif alive_max <= RESIDUAL_ROUNDING:
            sentences.append(
                f"- {var}: ours {ours_max:.3g} over all {ours_n} evaluations differs from the "
                f"paper's {P.format_value(paper_max)}, but only through diverged seeds: "
                f"without them the maximum is {alive_max:.3g} over {alive_n} evaluations, "
                "floating-point rounding. The excess is overflow in diverged runs, not an "
                "implementation error."
            )
        else:
            sentences.append(
                f"- {var}: ours {ours_max:.3g} differs from the paper's "
                f"{P.format_value(paper_max)}: even without diverged seeds it is "
                f"{alive_max:.3g}, far above float64 rounding ({RESIDUAL_ROUNDING:g}), "
                "which points to an implementation error."
            )
        if ours_n != paper_n:
            sentences.append(
                f"- {var}: our evaluation count {ours_n} differs from the paper's {paper_n}; "
                "counts follow from how many seeds, checkpoints and layers are evaluated, "
                "so this is bookkeeping, not accuracy."
            )
    lines.append("")
    lines += sentences
    lines.append("")
    return "\n".join(lines)


def reproduction_markdown(experiments: Experiments, n_boot: int = 2000) -> str:
    """One markdown document with every published Section 10 number beside ours.

    Each table lists all its published numbers, ours and the difference ("not run"
    where the run lacks the experiment), then a plain sentence for each number where
    ours differs materially under :func:`differs`. The rule is stated in the document
    and is fixed: nothing is tuned to agree.
    """
    runs = ", ".join(
        f"{name} ({experiments[name].attrs.get('kind', '?')}, "
        f"H={experiments[name].attrs.get('hidden', '?')}, "
        f"width={experiments[name].attrs.get('width', '?')}, "
        f"{dataset_label(experiments[name])}, seeds={experiments[name].sizes.get('seed', 0)}"
        + (
            f", c={float(experiments[name].attrs['rescale_c']):g}"
            if float(experiments[name].attrs.get("rescale_c", 1.0)) != 1.0
            else ""
        )
        + ")"
        for name in sorted(experiments)
    )
    parts = [
        "# Reproduction of Nyström (arXiv:2608.22910), Section 10",
        "",
        f"Runs in this reproduction: {runs or 'none'}.",
        "",
        "Conventions. `ours` is the mean over active seeds: diverged seeds are excluded "
        "(counted in `n div.`), seeds that did not reach a checkpoint do not enter it, and "
        "undefined (NaN) values are omitted, never read as 0; `n` counts the seeds that "
        "entered. The 95% CI is a percentile bootstrap over those seeds. Runs are matched "
        "to paper rows by their attributes, never by name. The paper used other random "
        "seeds, so agreement is expected only to within seed-to-seed variation.",
        "",
        "Materiality rule (fixed in advance): a difference is material when "
        f"|ours - paper| exceeds {MATERIAL_REL:.0%} of |paper| and the paper's rounding; "
        f"for fractions, correlations, chi and I the tolerance is at least "
        f"{MATERIAL_ABS_BOUNDED:g}; for seed standard deviations it is "
        f"{MATERIAL_REL_SPREAD:.0%}; counts must agree exactly.",
        "",
    ]
    for build in SECTIONS.values():
        parts.append(_section_markdown(build(experiments, n_boot=n_boot)))
    parts.append(_residual_markdown(experiments))
    return "\n".join(parts)


def write_reproduction(
    experiments: Experiments, path: str | os.PathLike[str], n_boot: int = 2000
) -> Path:
    """Write :func:`reproduction_markdown` to ``path`` atomically."""
    io.write_text(path, reproduction_markdown(experiments, n_boot))
    return Path(path)
