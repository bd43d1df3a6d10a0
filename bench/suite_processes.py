#!/usr/bin/env python
"""Where a command's CPU time goes, process by process: the test suite by default.

A test run starts hundreds of Python processes (Snakemake, each job's script, the pytest
workers), and a job of a tiny model is mostly its interpreter's start-up. This runs a
command with every Python process of this environment recording, as it exits, its CPU
time, its command line, the test that started it (``PYTEST_CURRENT_TEST``, which every
job inherits) and whether it imported torch or transformers; then it prints

* the command's wall and CPU time, beside the CPU kind and a float32 GEMM rate measured
  in the same run (times move 3-4x between machine kinds), and issue 31's target of 15
  minutes on 2 AVX2 cores for the suite;
* the processes by kind: each rule's script jobs (Snakemake names a script job's file
  ``tmp<random>.<script>.py``), Snakemake's own processes, the pytest workers, the rest,
  with how many imported transformers;
* the tests whose processes took the most CPU.

The recording is a ``.pth`` file put into this environment's site-packages for the run
and removed after it (also on Ctrl-C); it acts only where the run's
``SPECALIGN_PROCESS_RECORD`` names a file, so one left behind by a killed run does
nothing. A process killed by a signal records nothing, and processes of other
environments (the hub tests' olah server) are not seen: the table covers most, not all,
of the command's CPU, and says how much.

    python bench/suite_processes.py                      # pytest -q -n 3
    python bench/suite_processes.py --top 15 -- pytest -q -n 3 tests/workflow
    python bench/suite_processes.py -- snakemake --cores 2   # the default study
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_training import cpu_name, gemm_rate  # noqa: E402

#: The suite's target (issue 31): the README's test command on 2 AVX2 cores.
TARGET_S = 15 * 60
PTH_NAME = "zz_specalign_process_record.pth"

#: Run at each Python start by the .pth file: registers the record written at exit.
HOOK = """
import atexit, json, os, resource, sys, time
def _record(path=os.environ["SPECALIGN_PROCESS_RECORD"], start=time.time()):
    use = resource.getrusage(resource.RUSAGE_SELF)
    row = {"pid": os.getpid(), "argv": sys.argv[:3], "cpu": use.ru_utime + use.ru_stime,
           "wall": time.time() - start, "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
           "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\\n")
# site reads the .pth once for each name of site-packages (lib and its lib64 link)
if not hasattr(sys, "_specalign_process_record"):
    sys._specalign_process_record = True
    atexit.register(_record)
"""


def _pth_line(hook: Path) -> str:
    # a line of a .pth file that starts with "import" is run at every start of Python
    return (
        f"import os; exec(open({str(hook)!r}).read(), {{}}) "
        "if os.environ.get('SPECALIGN_PROCESS_RECORD') else None\n"
    )


def kind(argv: list[str]) -> str:
    """What a recorded process was: ``job <script>``, ``snakemake``, ``pytest``,
    ``python -c`` or its program's name."""
    text = " ".join(argv)
    script = re.search(r"tmp\w+\.(\w+)\.py\b", text)
    if script:
        return f"job {script.group(1)}"
    if "snakemake" in text:
        return "snakemake"
    if "pytest" in text:
        return "pytest"
    if argv[:1] == ["-c"]:  # pytest-xdist's workers, the rerun matrix's planner
        return "python -c"
    return Path(argv[0]).name if argv else "?"


def summary(rows: list[dict], cpu: float, top: int) -> str:
    """The tables printed (see the module doc)."""
    total = sum(r["cpu"] for r in rows)
    by_kind: dict[str, list] = collections.defaultdict(lambda: [0, 0.0, 0])
    by_test: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        k = by_kind[kind(r["argv"])]
        k[0] += 1
        k[1] += r["cpu"]
        k[2] += bool(r["transformers"])
        test = r["test"].rsplit(" ", 1)[0] if r["test"] else ""
        if test:
            by_test[test][0] += 1
            by_test[test][1] += r["cpu"]
    out = [
        f"{len(rows)} processes recorded, {total:.0f} s of CPU: {total / cpu:.0%} of the "
        f"command's {cpu:.0f} s (processes killed by a signal and other environments' not "
        "seen)",
        "",
        f"{'kind':34s} {'processes':>9s} {'CPU s':>8s} {'share':>6s} {'s each':>7s} "
        f"{'import transformers':>20s}",
    ]
    for name, (n, c, tf) in sorted(by_kind.items(), key=lambda kv: -kv[1][1])[:top]:
        out.append(f"{name:34s} {n:9d} {c:8.1f} {c / total:6.1%} {c / n:7.2f} {tf:20d}")
    out += ["", f"{'test (the processes it started)':96s} {'processes':>9s} {'CPU s':>8s}"]
    for name, (n, c) in sorted(by_test.items(), key=lambda kv: -kv[1][1])[:top]:
        out.append(f"{name[:96]:96s} {n:9d} {c:8.1f}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=25, help="rows of each table")
    ap.add_argument("--json", type=Path, help="write every recorded process here")
    ap.add_argument("command", nargs="*", help="after --; default: pytest -q -n 3")
    args = ap.parse_args()
    command = args.command or [sys.executable, "-m", "pytest", "-q", "-n", "3"]
    rate = gemm_rate(2)
    site = Path(sysconfig.get_paths()["purelib"])
    with tempfile.TemporaryDirectory(prefix="specalign-processes-") as tmp:
        hook, record = Path(tmp) / "hook.py", Path(tmp) / "record.jsonl"
        hook.write_text(HOOK, encoding="utf-8")
        pth = site / PTH_NAME
        pth.write_text(_pth_line(hook), encoding="utf-8")
        env = dict(os.environ, SPECALIGN_PROCESS_RECORD=str(record))
        try:
            start = time.perf_counter()
            code = subprocess.call(command, env=env)
            wall = time.perf_counter() - start
        finally:
            pth.unlink(missing_ok=True)
        use = resource.getrusage(resource.RUSAGE_CHILDREN)
        lines = record.read_text().splitlines() if record.exists() else []
        rows = [json.loads(line) for line in lines]
    cpu = use.ru_utime + use.ru_stime
    print(f"\n{' '.join(map(str, command))}: exit status {code}")
    print(f"{cpu_name()}; float32 GEMM {rate:.0f} GFLOP/s on 2 threads (this run)")
    print(f"wall {wall:.1f} s ({wall / 60:.1f} min), CPU {cpu:.0f} s; the suite's target: "
          f"{TARGET_S / 60:.0f} min on 2 AVX2 cores (wall / target {wall / TARGET_S:.2f} "
          "here)")  # fmt: skip
    print(summary(rows, cpu, args.top))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    sys.exit(code)


if __name__ == "__main__":
    main()
