"""Results of each configuration in their own folder, and no stale file shown as a result
(issue 17): the `results` key, stale files named in the log, stale formats removed."""

from __future__ import annotations

import logging

import pytest

from specalign.config import ConfigError, load_yaml, validate_config
from specalign.layout import results_folder
from specalign.workflow import stale_files, stale_message


@pytest.mark.parametrize(
    ("given", "folder"),
    [("results/", "results"), ("results", "results"), ("results/paper/", "results/paper"),
     ("./out//paper", "out/paper"), ("/scratch/me/run1", "/scratch/me/run1")],
)  # fmt: skip
def test_results_folder_normalised(given, folder):
    assert results_folder({"results": given}) == folder


@pytest.mark.parametrize("given", [".", "./", "..", "../elsewhere", "a/../.."])
def test_results_folder_of_its_own(repo, given):
    cfg = load_yaml(repo / "config" / "test.yaml") | {"results": given}
    with pytest.raises(ConfigError, match="results: .* not a folder of its own"):
        validate_config(cfg)


def test_results_default_is_results(repo):
    assert results_folder(validate_config(load_yaml(repo / "config" / "test.yaml"))) == "results"


def test_stale_files_are_those_no_job_produces(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    made = ["results/transformers/m/spectra.nc", "results/figures/transformers/figure13.png"]
    stale = ["results/transformers/gone/spectra.nc", "results/figures/transformers/figure13.pdf"]
    for p in made + stale:
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p).write_text("x")
    found = stale_files("results", made + ["results/never/written.txt"])
    assert [str(p) for p in found] == sorted(stale)
    msg = stale_message("results", found)
    assert "2 file(s) in results/" in msg and all(s in msg for s in stale)
    assert stale_files("absent", made) == []


@pytest.mark.parametrize("fmt", ["pdf", "svg", "png"])
def test_save_figure_removes_a_stale_format_it_wrote_and_keeps_a_persons(tmp_path, caplog, fmt):
    """figure13.<fmt> of an earlier run is never left beside this run's figure in another
    format; a file of that name that a person made (no writer's metadata) is kept and
    named."""
    from matplotlib.figure import Figure

    from specalign.output import save_figure, written_here

    fig = Figure()
    fig.add_subplot().plot([0, 1])
    other = "svg" if fmt == "png" else "png"
    (old,) = save_figure(fig, tmp_path / "figure13", formats=[fmt], dpi=20)
    assert written_here(old)
    (tmp_path / f"other.{fmt}").write_text("not this figure's")
    with caplog.at_level(logging.WARNING, logger="specalign"):
        paths = save_figure(fig, tmp_path / "figure13", formats=[other], dpi=20)
    assert [p.name for p in paths] == [f"figure13.{other}"] and written_here(paths[0])
    assert not old.exists() and (tmp_path / f"other.{fmt}").exists()
    assert "removed" in caplog.text and f"figure13.{fmt}" in caplog.text
    # a person's figure13.<fmt>, drawn by hand (or by matplotlib outside the workflow)
    mine = tmp_path / f"figure13.{fmt}"
    fig.savefig(mine, format=fmt, dpi=20)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specalign"):
        save_figure(fig, tmp_path / "figure13", formats=[other], dpi=20)
    assert mine.is_file() and not written_here(mine)
    assert "kept" in caplog.text and f"figure13.{fmt}" in caplog.text


def test_another_configurations_nested_results_folder_is_not_stale(tmp_path, monkeypatch):
    """The README's recipe: `results: results/paper` beside the default `results`. Each
    run marks its folder; the default's stale check leaves the nested one out, and still
    names a file nobody's configuration made."""
    from specalign.workflow import RESULTS_MARKER, mark_results_folder

    monkeypatch.chdir(tmp_path)
    mark_results_folder("results", ["config/config.yaml"])
    mark_results_folder("results/paper", ["config/paper.yaml"])
    made = ["results/transformers/m/spectra.nc"]
    theirs = ["results/paper/transformers/m/spectra.nc", "results/paper/logs/x.log"]
    loose = ["results/notes/todo.txt"]
    for p in made + theirs + loose:
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p).write_text("x")
    assert [str(p) for p in stale_files("results", made)] == loose
    assert stale_files("results/paper", theirs) == []
    assert (tmp_path / "results" / RESULTS_MARKER).is_file()


@pytest.mark.pipeline  # a Snakemake dry run
def test_results_key_moves_every_result_and_log(repo, tmp_path):
    """With `results: out/test` every output, log and benchmark of the run is inside
    out/test; the default `results/` keeps logs/ and benchmarks/ at the top."""
    import re

    from snakemake_helpers import dry_run

    test = str(repo / "config" / "test.yaml")
    out = dry_run(repo, tmp_path, "--configfile", test, "--config", "results=out/test")
    paths = re.findall(r"^\s+(?:output|log|benchmark): (.+)$", out, flags=re.M)
    files = [f.strip() for line in paths for f in line.split(",")]
    ours = [f for f in files if not f.startswith("resources/")]  # the shared model cache
    assert ours and all(f.startswith("out/test/") for f in ours), ours
    assert any(f.startswith("out/test/logs/") for f in ours)
    default = dry_run(repo, tmp_path, "--configfile", test)
    assert "results/transformers/minilm/spectra.nc" in default
    assert "log: logs/transformers/minilm/spectra.log" in default


@pytest.mark.pipeline  # a Snakemake dry run
def test_cross_model_outputs_list_only_configured_models(repo, tmp_path):
    """A model folder of another configuration in results/ is never an input of the
    cross-model figures or of the reproduction report."""
    from snakemake_helpers import dry_run

    stale = tmp_path / "results" / "transformers" / "gpt2_other"
    stale.mkdir(parents=True)
    (stale / "spectra.nc").write_text("another configuration's")
    out = dry_run(repo, tmp_path, "--configfile", str(repo / "config" / "test.yaml"))
    assert "gpt2_other" not in out
    overview = out.split("rule transformer_overview:")[1].split("rule ")[0]
    assert "minilm/spectra.nc" in overview and "minilm_random/spectra.nc" in overview
