"""The rerun triggers the workflow relies on, as a matrix over the real DAG.

Snakemake does not track imported modules; every script rule passes the fingerprint of
its script and of the `specalign` modules it imports as a parameter
(specalign.fingerprint, rules/common.smk). Here the workflow and the package are copied,
the copy is put first on PYTHONPATH (so that jobs import it), and one module at a time
is edited: exactly the rules that reach it, and what reads their outputs, must rerun.
The finished run is config/test.yaml: both studies. The dry runs are asked of one
process started with that PYTHONPATH (snakemake_helpers.Planner), which reads the
Snakefile and the files afresh for each.
"""

import os
import shutil

import pytest
import yaml
from snakemake_helpers import Planner

pytestmark = pytest.mark.pipeline

COPIED = ("Snakefile", "rules", "scripts", "src", "config", "report", "envs", "profiles")

COMMUTATOR_SUMMARIES = {"commutator_tables", "commutator_figure", "reproduction"}
DIAGNOSE = {"diagnostics"} | COMMUTATOR_SUMMARIES
TRAIN = {"train_ensemble"} | DIAGNOSE
TRANSFORMER_FIGURES = {"transformer_model_figures", "transformer_overview"}
TRANSFORMER_SUMMARIES = TRANSFORMER_FIGURES | {
    "transformer_model_tables",
    "transformer_layers",
    "reproduction",
}
EVERY_RULE = (
    {
        "prepare_data",
        "fetch_model",
        "random_model",
        "extract_weights",
        "spectra",
        "propagate",
        "steer",
        "sphere_dynamics",
    }
    | TRAIN
    | TRANSFORMER_SUMMARIES
)


@pytest.fixture(scope="module")
def copied(repo, finished_run, tmp_path_factory):
    """(repo copy, the planner of dry runs that import it, folder of working dirs)."""
    root = tmp_path_factory.mktemp("reruns")
    code = root / "repo"
    code.mkdir()
    for name in COPIED:
        src = repo / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, code / name)
    env = dict(os.environ, PYTHONPATH=str(code / "src"))
    planner = Planner(code, env)
    yield code, planner, root
    planner.close()


def _fresh_workdir(finished_run, root, name):
    work = root / name
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(finished_run, work, symlinks=True)
    return work


def _touch_module(code, relpath):
    path = code / "src" / "specalign" / relpath
    original = path.read_text()
    # a statement: a comment is not code and reruns nothing (specalign.fingerprint)
    path.write_text(original + "\n_EDITED_BY_TEST_RERUNS = 1\n")
    return path, original


def test_copy_with_nothing_changed_does_nothing(copied, finished_run):
    code, planner, root = copied
    work = _fresh_workdir(finished_run, root, "unchanged")
    assert planner.planned_jobs(work) == {}


@pytest.mark.parametrize(
    "module, expected",
    [
        # the four-source recursion: every ensemble is re-diagnosed, training is kept
        ("commutators/measure/recursion.py", DIAGNOSE),
        # the trainer: every ensemble retrains, the data are kept
        ("commutators/train.py", TRAIN),
        # trajectories.h5 and diagnostics.nc read/write (was mlp/ensemble.py with the
        # experiment's seeds, whose edit reran nothing)
        ("commutators/contracts.py", TRAIN),
        # the data kernel: everything from the samples on
        ("commutators/data/synthetic.py", {"prepare_data"} | TRAIN),
        # the commutator figures: those only, no transformer job
        ("commutators/report/figures.py", {"commutator_figure"}),
        # run selection and seed statistics: every commutator table and figure
        ("commutators/report/runs.py", COMMUTATOR_SUMMARIES),
        # the materiality rule: the tables and the report, not the figures
        ("commutators/report/claims.py", {"commutator_tables", "reproduction"}),
        # the shared figure and table writers: every table and figure of both studies
        # (save_figure used to live in the commutator figures, whose edit missed the
        # transformer figures)
        ("output.py", COMMUTATOR_SUMMARIES | TRANSFORMER_SUMMARIES),
        # a module of the transformer study only: no commutator job
        # (the per-layer table reads no steering.nc)
        ("transformers/measure/steer.py",
         {"steer"} | TRANSFORMER_SUMMARIES - {"transformer_overview", "transformer_layers"}),
        ("transformers/report/tables.py", TRANSFORMER_SUMMARIES),
        # the claims' verdict rules: the report and the per-layer verdicts, no table or figure
        ("transformers/report/claims.py", {"transformer_layers", "reproduction"}),
        # the family adapters: the random models (built as causal LMs or not by family),
        # fetch_model (it checks a fetched model's positions through its adapter,
        # limits.model_problems), extraction and everything computed from weights.h5
        ("transformers/load/families/base.py", {"random_model", "fetch_model", "extract_weights",
                                      "spectra", "propagate", "steer"} | TRANSFORMER_SUMMARIES),
        # glue every script runs: every rule
        ("workflow.py", EVERY_RULE),
        ("runtime.py", EVERY_RULE),
    ],
)  # fmt: skip
def test_module_edit_reruns_the_rules_that_reach_it(copied, finished_run, module, expected):
    code, planner, root = copied
    work = _fresh_workdir(finished_run, root, module.replace("/", "_"))
    path, original = _touch_module(code, module)
    try:
        jobs = planner.planned_jobs(work)
    finally:
        path.write_text(original)
    assert set(jobs) == expected, jobs


@pytest.mark.parametrize(
    "path, expected",
    [
        # a script: Snakemake 9 reruns a script rule whose script file is newer than its
        # outputs (the script's mtime, not its content), and everything downstream
        ("scripts/commutators/prepare_data.py", {"prepare_data"} | TRAIN),
        ("scripts/commutators/commutator_figure.py", {"commutator_figure"}),
        # a module: its content is fingerprinted, its mtime is not looked at
        ("src/specalign/commutators/measure/recursion.py", set()),
    ],
)
def test_touching_a_file_without_changing_it(copied, finished_run, path, expected):
    """What the README says about touching (or checking out) a file unchanged."""
    code, planner, root = copied
    work = _fresh_workdir(finished_run, root, "touch_" + path.replace("/", "_"))
    target = code / path
    st = target.stat()
    os.utime(target)  # now: newer than every output
    try:
        jobs = planner.planned_jobs(work)
    finally:
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert set(jobs) == expected, jobs


def test_plot_setting_reruns_only_figures(copied, finished_run):
    code, planner, root = copied
    work = _fresh_workdir(finished_run, root, "plots")
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg.setdefault("plots", {})["context"] = "talk"
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert set(planner.planned_jobs(work)) == {"commutator_figure"} | TRANSFORMER_FIGURES


def test_one_experiment_setting_reruns_that_experiment(copied, finished_run):
    code, planner, root = copied
    work = _fresh_workdir(finished_run, root, "experiment")
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["commutators"]["experiments"]["tiny_synthetic"]["n_diag"] = 80
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planner.planned_jobs(work)
    # the diagnostic sample is data: prepare, train (its input changed), diagnose the one
    # experiment, then the summaries that read it; no transformer job
    assert jobs.get("prepare_data") == 1 and jobs.get("train_ensemble") == 1
    assert jobs.get("diagnostics") == 1
    assert set(jobs) == {"prepare_data"} | TRAIN
