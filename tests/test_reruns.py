"""The rerun triggers the workflow relies on, as a matrix over the real DAG.

Snakemake does not track imported modules; every rule passes a hash of the `specalign`
modules it calls as a parameter (rules/common.smk: KERNELS). Here the workflow and the
package are copied, the copy is put first on PYTHONPATH (so that jobs import it), and one
kernel at a time is edited: exactly the rules that use it must rerun.
"""

import os
import shutil

import pytest
import yaml
from snakemake_helpers import planned_jobs

pytestmark = pytest.mark.pipeline

COPIED = ("Snakefile", "rules", "scripts", "src", "config", "report", "envs", "profiles")


@pytest.fixture(scope="module")
def copied(repo, finished_run, tmp_path_factory):
    """(repo copy, env using it, working dir copy of the finished run)."""
    root = tmp_path_factory.mktemp("reruns")
    code = root / "repo"
    code.mkdir()
    for name in COPIED:
        src = repo / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, code / name)
    env = dict(os.environ, PYTHONPATH=str(code / "src"))
    return code, env, root


def _fresh_workdir(finished_run, root, name):
    work = root / name
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(finished_run, work, symlinks=True)
    return work


def _touch_kernel(code, relpath):
    path = code / "src" / "specalign" / relpath
    original = path.read_text()
    path.write_text(original + "\n# edited by test_reruns\n")
    return path, original


def test_copy_with_nothing_changed_does_nothing(copied, finished_run):
    code, env, root = copied
    work = _fresh_workdir(finished_run, root, "unchanged")
    assert planned_jobs(code, work, env=env) == {}


@pytest.mark.parametrize(
    "kernel, expected",
    [
        # the diagnostics kernel: every experiment is re-diagnosed, training is kept
        ("mlp/sources.py", {"commutators", "commutator_tables", "commutator_figure",
                            "reproduction"}),
        # the trainer: every ensemble retrains, the data are kept
        ("mlp/train.py", {"train_ensemble", "commutators", "commutator_tables",
                          "commutator_figure", "reproduction"}),
        # the plotting kernel: figures only
        ("plots/commutators.py", {"commutator_figure"}),
        # the data kernel: everything from the samples on
        ("data/synthetic.py", {"prepare_data", "train_ensemble", "commutators",
                               "commutator_tables", "commutator_figure", "reproduction"}),
    ],
)  # fmt: skip
def test_kernel_edit_reruns_its_rules(copied, finished_run, kernel, expected):
    code, env, root = copied
    work = _fresh_workdir(finished_run, root, kernel.replace("/", "_"))
    path, original = _touch_kernel(code, kernel)
    try:
        jobs = planned_jobs(code, work, env=env)
    finally:
        path.write_text(original)
    assert set(jobs) == expected, jobs


def test_plot_setting_reruns_only_plots(copied, finished_run):
    code, env, root = copied
    work = _fresh_workdir(finished_run, root, "plots")
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg.setdefault("plots", {})["context"] = "talk"
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert set(planned_jobs(code, work, env=env)) == {"commutator_figure"}


def test_one_experiment_setting_reruns_that_experiment(copied, finished_run):
    code, env, root = copied
    work = _fresh_workdir(finished_run, root, "experiment")
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["commutators"]["experiments"]["tiny_synthetic"]["n_diag"] = 80
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(code, work, env=env)
    # the diagnostic sample is data: prepare, train (its input changed), diagnose the one
    # experiment, then the summaries that read it
    assert jobs.get("prepare_data") == 1 and jobs.get("train_ensemble") == 1
    assert jobs.get("commutators") == 1
    assert set(jobs) == {"prepare_data", "train_ensemble", "commutators", "commutator_tables",
                         "commutator_figure", "reproduction"}  # fmt: skip
