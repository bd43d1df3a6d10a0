"""`snakemake --report` of a tiny run of both studies (conftest.gpt2_run): the tables and
the reproduction text are shown in the page (HTML, not download links), every figure's
caption carries the caption its job wrote, and the introduction describes the
configuration that ran."""

import base64
import html
import json
import re

import pytest

pytestmark = pytest.mark.pipeline


@pytest.fixture(scope="module")
def report(gpt2_report):
    """The report of the session's tiny run of both studies (conftest.gpt2_run)."""
    return gpt2_report


def _results(page: str) -> dict[str, dict]:
    """The report's result entries (path -> its JSON record: caption, mime, data)."""
    found = {}
    for m in re.finditer(r'"(results/[^"]+)": (\{"name": .*?"data_uri": "[^"]*"\})', page):
        found[m.group(1)] = json.loads(m.group(2))
    return found


def _decoded(entry: dict) -> str:
    return base64.b64decode(entry["data_uri"].split("base64,", 1)[1]).decode()


def test_tables_and_reproduction_are_pages_not_downloads(report):
    work, page = report
    results = _results(page)
    assert results, "no results found in the report"
    # every output the report shows has its caption (the rules' report() flags)
    assert [p for p, entry in results.items() if not entry.get("caption", "").strip()] == []
    assert not [p for p in results if p.endswith((".csv", ".md"))]
    repro = results["results/reproduction.html"]
    assert repro["mime_type"] == "text/html"
    body = _decoded(repro)
    assert "<h1>Reproduction report</h1>" in body and "<table>" in body
    md = (work / "results" / "reproduction.md").read_text()
    assert md.splitlines()[2].split()[0] in body  # the same text
    for table in ("commutators/table1", "transformers/tiny_gpt2/eigenvalues",
                  "transformers/sphere"):  # fmt: skip
        entry = results[f"results/tables/{table}.html"]
        assert entry["mime_type"] == "text/html"
        rows = (work / "results" / "tables" / f"{table}.csv").read_text().count("\n")
        page_table = _decoded(entry)
        assert page_table.count("<tr") == rows  # header + every row
        assert ">None<" not in page_table and ">nan<" not in page_table


def test_figure_captions_are_the_jobs_captions(report):
    work, page = report
    results = _results(page)
    figures = [p for p in results if p.endswith(".png")]
    assert len(figures) >= 20
    for path in figures:
        written = (work / path).with_suffix("").as_posix() + ".caption.rst"
        text = open(written).read().replace("\\", "").split()
        caption = html.unescape(re.sub(r"<[^>]+>", " ", results[path]["caption"])).split()
        assert " ".join(text) in " ".join(caption), path
    prolonged = results["results/figures/transformers/tiny_gpt2/prolonged.png"]["caption"]
    assert "Final gamma" in prolonged and "Model <strong>tiny_gpt2</strong>" in prolonged
    steering = results["results/figures/transformers/tiny_gpt2/steering.png"]["caption"]
    assert "(id 37)" in steering


def test_introduction_describes_this_configuration(report):
    _, page = report
    desc = re.search(r'var workflow_desc = ("(?:[^"\\]|\\.)*");', page).group(1)
    intro = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", json.loads(desc))).split())
    assert "tiny_synthetic" in intro and "tiny_gpt2_random" in intro
    assert "Energy" not in intro and "Concrete" not in intro  # neither ran
    assert "Figures 1, 3 and 4" in intro and "no chance level" in intro
    assert "token id 37" in intro
