"""Every output the report shows has its caption template under report/, and every
template there belongs to an output.

The rules name a template either literally (``caption="../report/....rst"``) or by the
stem of each output of a registry of the package (``MODEL_TABLES``, ``MODEL_FIGURES``,
``OVERVIEW_FIGURES``, the commutator ``TABLES``; the commutator figures share one
template with a branch per stem), so the expected files are derived from those, not
listed here. Runs without Snakemake or results: a missing template is otherwise found
only when ``snakemake --report`` is built at the end of a run.
"""

from __future__ import annotations

import re
from pathlib import Path

from specalign.commutators.figures import FIGURES
from specalign.commutators.tables import TABLES
from specalign.transformers.figures import MODEL_FIGURES, OVERVIEW_FIGURES
from specalign.transformers.tables import MODEL_TABLES

#: report/-relative template of each stem, as the rules' caption functions name them.
PER_STEM = {
    "commutators/{}.rst": TABLES,
    "transformers/table_{}.rst": MODEL_TABLES,
    "transformers/{}.rst": (*MODEL_FIGURES, *OVERVIEW_FIGURES),
}
LITERAL = re.compile(r"""caption=["']\.\./report/([^"']+\.rst)["']""")
PATTERN = re.compile(r"""caption=lambda stem: f["']\.\./report/([^"']+\.rst)["']""")


def _rule_texts(repo: Path) -> str:
    return "\n".join(p.read_text() for p in sorted((repo / "rules").glob("*.smk")))


def test_the_rules_name_their_captions_as_this_test_derives_them(repo: Path) -> None:
    patterns = {m.replace("{stem}", "{}") for m in PATTERN.findall(_rule_texts(repo))}
    assert patterns == set(PER_STEM)


def test_every_report_output_has_a_caption_and_every_caption_an_output(repo: Path) -> None:
    report = repo / "report"
    expected = {tpl.format(stem) for tpl, stems in PER_STEM.items() for stem in stems}
    expected |= set(LITERAL.findall(_rule_texts(repo)))
    # the report's introduction, named by the Snakefile's `report:` directive
    expected |= {
        str(Path(m).relative_to("report"))
        for m in re.findall(
            r"""^report:\s*["']([^"']+)["']""", (repo / "Snakefile").read_text(), re.M
        )
    }
    present = {str(p.relative_to(report)) for p in report.rglob("*.rst")}
    assert sorted(expected - present) == [], "outputs without a caption template"
    assert sorted(present - expected) == [], "caption templates of no output"


def test_every_commutator_figure_has_its_branch_of_the_shared_template(repo: Path) -> None:
    text = (repo / "report" / "commutators" / "figure.rst").read_text()
    branches = re.findall(r"""snakemake\.wildcards\.figure == ["'](\w+)["']""", text)
    assert sorted(branches) == sorted(FIGURES)
