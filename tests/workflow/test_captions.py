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

from specalign.commutators.report.figures import FIGURES
from specalign.commutators.report.tables import TABLES
from specalign.transformers.report.figures import MODEL_FIGURES, OVERVIEW_FIGURES
from specalign.transformers.report.tables import MODEL_TABLES

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


def _figure_templates(block: str) -> list[str]:
    """The report/-relative caption templates of a rule's ``figures=reported(...)``
    output (its first caption after the keyword), the per-stem ones expanded."""
    start = block.index("figures=reported(")
    literal = LITERAL.search(block, start)
    pattern = PATTERN.search(block, start)
    first = min((m for m in (literal, pattern) if m), key=lambda m: m.start())
    if first is literal:
        return [first.group(1)]
    tpl = first.group(1).replace("{stem}", "{}")
    return [tpl.format(stem) for stem in PER_STEM[tpl]]


def test_every_figure_caption_includes_the_caption_its_job_wrote(repo: Path) -> None:
    """A figure job computes its caption from the data (numbers, the null level) and
    writes it beside the figure (``<stem>.caption.rst``); the report's template includes
    it, or those numbers reach only the job's log. Every rule that reports figures
    (``figures=reported(...)``) declares that file an output and its templates read it."""
    blocks = re.split(r"^(?:rule|checkpoint) ", _rule_texts(repo), flags=re.M)[1:]
    figure_rules = {b.split(":")[0]: b for b in blocks if "figures=reported(" in b}
    assert {"transformer_model_figures", "transformer_overview", "commutator_figure",
            "series_training"} <= set(figure_rules)  # fmt: skip
    for name, block in figure_rules.items():
        assert "CAPTION_SUFFIX" in block, f"rule {name} writes no caption beside its figures"
        for tpl in _figure_templates(block):
            text = (repo / "report" / tpl).read_text()
            assert '~ ".caption.rst"' in text and ".read_text()" in text, (
                f"report/{tpl} (rule {name}) does not include the caption its job wrote"
            )
