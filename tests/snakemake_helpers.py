"""Running the real Snakefile from tests, in a working directory: a run in a subprocess
(bounded), a dry run or summary in this process."""

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

SNAKEMAKE = [sys.executable, "-m", "snakemake"]

#: The rules config/test.yaml does not run: a trained series' own. The jobs of the series
#: run of tests/transformers/test_pipeline_series.py record the modules they load, and
#: that module checks them against the fingerprint, so that no test trains a series a
#: second time for it.
SERIES_RULES = {"train_model", "trained_checkpoint", "series_training"}


def run_snakemake(
    repo: Path,
    workdir: Path,
    *args: str,
    check: bool = True,
    env: dict | None = None,
    timeout: float = 900,
) -> str:
    """Run snakemake on ``workdir/config.yaml``; raise with the output's tail on failure
    (``timeout`` seconds at most)."""
    return _finished([*SNAKEMAKE, *_run_args(repo, workdir, *args)], check, env, timeout)


def _run_args(repo: Path, workdir: Path, *args: str) -> list[str]:
    """Snakemake's arguments for the workflow in ``repo`` on ``workdir/config.yaml``."""
    return ["-s", str(repo / "Snakefile"), "-d", str(workdir),
            "--configfile", str(workdir / "config.yaml"), "--cores", "2", *args]  # fmt: skip


#: Options under which Snakemake only plans (or lists) and runs no job.
_PLANNING = frozenset(
    {"--dry-run", "-n", "--dryrun", "--summary", "-S", "--detailed-summary", "-D"}
)


def _finished(cmd: list[str], check: bool, env: dict | None, timeout: float) -> str:
    """Snakemake's output for ``cmd``; AssertionError with its tail where it failed.

    A dry run or summary under this process's environment runs in this process: its
    subprocess spent 1.7 of its 2 s on imports (Snakemake, its plugins, specalign), here
    paid once per pytest worker. The console is what the Snakefile prints and
    Snakemake logs, read from this process's stdout and stderr as the subprocess's are.
    A run (jobs, locks, signals, a timeout) or another environment (another PYTHONPATH)
    stays a subprocess."""
    if env is None and _PLANNING.intersection(cmd):
        code, out = _in_process(cmd[len(SNAKEMAKE) :])
    else:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        code, out = proc.returncode, proc.stdout + proc.stderr
    return _checked(code, out) if check else out


def _checked(code: int, out: str) -> str:
    """Snakemake's console ``out``; AssertionError with its tail where ``code`` is not 0."""
    if code != 0:
        raise AssertionError(f"snakemake failed ({code}):\n{out[-6000:]}")
    return out


def _in_process(args: list[str]) -> tuple[int, str]:
    """(exit status, console) of ``snakemake args`` run by Snakemake's own command line
    in this process; the working directory it changes to is changed back.

    Snakemake keeps each script's modification time for the life of its process (an
    lru_cache, ``snakemake.jobs.get_script_mtime``): right for one command, stale for the
    next one here, which would then see a script touched since as newer than it is."""
    from snakemake import jobs
    from snakemake.cli import main

    jobs.get_script_mtime.cache_clear()
    out = io.StringIO()
    cwd = os.getcwd()
    code: int = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                main(args)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        os.chdir(cwd)
    return code, out.getvalue()


def planned_jobs(repo: Path, workdir: Path, env: dict | None = None) -> dict[str, int]:
    """Rule -> number of jobs a dry run would execute (`all` left out)."""
    return job_stats(run_snakemake(repo, workdir, "--dry-run", env=env))


#: The planner's side of :class:`Planner`: one request (Snakemake's arguments) a line on
#: stdin, one reply (exit status and console) a line on the saved stdout. What Snakemake
#: or a Snakefile prints goes to stderr, never into a reply.
_PLANNER = """
import json, os, sys
reply = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.path.insert(0, {tests!r})
from snakemake_helpers import _in_process
for line in sys.stdin:
    reply.write(json.dumps(_in_process(json.loads(line))) + "\\n")
    reply.flush()
"""


class Planner:
    """Dry runs of a copy of the workflow under another environment (its own
    PYTHONPATH, so that the Snakefile imports the copy's ``specalign``), one after the
    other in one Python process started once: each plan pays Snakemake's DAG, not its
    imports (1.7 of a dry run's 3 s in a fresh process). The Snakefile is read and
    every fingerprint computed again for each plan (:mod:`specalign.fingerprint` keys
    what it keeps by each file's size and time), so a plan follows the files as they
    are when it is asked for, as a fresh ``snakemake -n`` would."""

    def __init__(self, repo: Path, env: dict) -> None:
        self.repo = repo
        code = _PLANNER.format(tests=str(Path(__file__).resolve().parent))
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )

    def planned_jobs(self, workdir: Path) -> dict[str, int]:
        """Rule -> number of jobs a dry run in ``workdir`` would execute, as
        :func:`planned_jobs`."""
        args = _run_args(self.repo, workdir, "--dry-run")
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(args) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise AssertionError(f"the planner stopped (exit status {self._proc.wait()})")
        return job_stats(_checked(*json.loads(line)))

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=60)


def dry_run(repo: Path, workdir: Path, *args: str, check: bool = True) -> str:
    """The output of a dry run with exactly ``args`` (no --configfile added)."""
    cmd = [*SNAKEMAKE, "-s", str(repo / "Snakefile"), "-d", str(workdir), "--cores", "2",
           "--dry-run", *args]  # fmt: skip
    return _finished(cmd, check, None, 300)


def job_stats(out: str) -> dict[str, int]:
    """Rule -> number of jobs in a run's "Job stats" (`all` left out)."""
    if "Nothing to be done" in out:
        return {}
    stats = out.split("Job stats:")[1]
    jobs = {}
    for line in stats.splitlines():
        m = re.match(r"^(\w+)\s+(\d+)\s*$", line.strip())
        # `all` is the target pseudo-rule: it "runs" whenever anything does
        if m and m.group(1) not in ("total", "all"):
            jobs[m.group(1)] = int(m.group(2))
    return jobs


def recording_env(workdir: Path) -> dict:
    """The environment under which every Python process (each rule's script job among
    them) records the specalign modules it loaded into ``workdir/module_log/``
    (tests/module_recorder)."""
    import os

    log = workdir / "module_log"
    log.mkdir(exist_ok=True)
    recorder = str(Path(__file__).resolve().parent / "module_recorder")
    pythonpath = os.pathsep.join(p for p in (recorder, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=pythonpath, SPECALIGN_MODULE_LOG=str(log))


def undeclared_results(repo: Path, workdir: Path, folder: str = "results") -> list[str]:
    """Files under ``workdir/folder`` that no job of the configuration declares (its
    outputs as ``snakemake --summary`` lists them; a file inside a declared folder
    counts as declared). A file a script writes beside its declared outputs is not
    tracked: not rerun, not in the report, and named as another configuration's by
    every later run's stale-file check."""
    out = run_snakemake(repo, workdir, "--summary")
    declared = {
        line.split("\t")[0]
        for line in out.splitlines()
        if "\t" in line and not line.startswith("output_file\t")
    }
    root = workdir / folder
    found = []
    from specalign.workflow import RESULTS_MARKER

    # the results folder's marker is written when a run starts, outside the DAG
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != RESULTS_MARKER):
        rel = path.relative_to(workdir)
        if not any(str(part) in declared for part in (rel, *rel.parents)):
            found.append(str(rel))
    return found


def rule_scripts(repo: Path) -> dict[str, Path]:
    """rule name -> script, read from rules/*.smk (scripts are relative to rules/);
    a Snakemake ``checkpoint`` (train_model) is a rule too."""
    out = {}
    for smk in sorted((repo / "rules").glob("*.smk")):
        for name, body in re.findall(
            r"^(?:rule|checkpoint) (\w+):\n((?:[ \t]+.*\n|\n)*)", smk.read_text(), re.M
        ):
            hit = re.search(r"script:\s*\n\s*\"([^\"]+)\"", body)
            if hit:
                out[name] = (repo / "rules" / hit.group(1)).resolve()
    return out


def recorded_jobs(workdir: Path) -> dict[str, set[str]]:
    """script file name -> modules loaded, over every recorded script job."""
    jobs: dict[str, set[str]] = {}
    for path in (workdir / "module_log").glob("*.json"):
        rec = json.loads(path.read_text())
        argv0 = Path(rec["argv0"])
        if ".snakemake/scripts" not in argv0.as_posix():
            continue  # snakemake itself, not a rule's script
        # Snakemake runs a copy named tmp<random>.<script name>
        name = argv0.name.split(".", 1)[1]
        jobs.setdefault(name, set()).update(rec["modules"])
    return jobs


def opened_files(workdir: Path) -> dict[str, set[str]]:
    """script file name -> the files its recorded jobs opened from Python (absolute
    paths; tests/module_recorder)."""
    opened: dict[str, set[str]] = {}
    for path in (workdir / "module_log").glob("*.json"):
        rec = json.loads(path.read_text())
        argv0 = Path(rec["argv0"])
        if ".snakemake/scripts" in argv0.as_posix():
            opened.setdefault(argv0.name.split(".", 1)[1], set()).update(rec.get("opened", []))
    return opened


def not_in_fingerprint(scripts: dict[str, Path], jobs: dict[str, set[str]]) -> dict[str, list]:
    """rule -> the specalign modules its recorded jobs (``jobs``, by script file name)
    loaded that the static closure of its script (the rerun fingerprint) misses."""
    from specalign.fingerprint import module_closure

    by_name = {p.name: (rule, p) for rule, p in scripts.items()}
    missed = {}
    for name, loaded in jobs.items():
        rule, script = by_name[name]
        unseen = loaded - set(module_closure(script))
        if unseen:
            missed[rule] = sorted(unseen)
    return missed
