"""Glue between Snakemake's ``script:`` directive and the kernels (no maths here).

``run_script(snakemake, main)`` gives every script the same behaviour: the log file of
the rule receives Python logging and any traceback, thread pools are pinned to the
job's ``threads`` before numerical libraries do any work, an exception fails the job
with one line on the console (rule, wildcards, error, where the log is) and its
traceback in the log (Snakemake then deletes the job's incomplete outputs), and
a job whose Snakemake process is gone stops without publishing anything
(:func:`specalign.runtime.watch_snakemake`).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specalign.runtime import pin_threads, snakemake_gone, watch_snakemake

log = logging.getLogger("specalign")


_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _NoTracebackFormatter(logging.Formatter):
    """The console's formatter: the message without the traceback or stack, which go
    to the job's log only (a failed job prints one line, not pages)."""

    def format(self, record: logging.LogRecord) -> str:
        record = logging.makeLogRecord(record.__dict__)
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return super().format(record)


def setup_logging(logfile: str | Path | None, level: int = logging.INFO) -> None:
    console = logging.StreamHandler(sys.__stderr__)
    console.setFormatter(_NoTracebackFormatter(_FORMAT))
    handlers: list[logging.Handler] = [console]
    if logfile:
        Path(logfile).parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(logfile, mode="w")
        file_handler.setFormatter(logging.Formatter(_FORMAT))
        handlers.append(file_handler)
    logging.basicConfig(level=level, handlers=handlers, force=True)


def failure_line(smk: Any, exc: BaseException, logfile: str | Path | None) -> str:
    """The one line a failed job prints: the rule and its wildcards, the error's type and
    message (on one line), and where the traceback is."""
    rule = getattr(smk, "rule", "?")
    wildcards = getattr(smk, "wildcards", None)
    items = wildcards.items() if hasattr(wildcards, "items") else []
    where = ", ".join(f"{k}={v}" for k, v in items)
    message = " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = f"rule {rule}" + (f" ({where})" if where else "") + " failed: "
    text += f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text + (f" [traceback in {logfile}]" if logfile else "")


class _Tee:
    """A text stream writing to two streams: progress bars that libraries print to
    stderr (huggingface_hub's downloads, tqdm) also reach the rule's log file, so a user
    following a SLURM job's log sees them."""

    def __init__(self, first: Any, second: Any) -> None:
        self.first, self.second = first, second

    def write(self, text: str) -> int:
        self.first.write(text)
        self.second.write(text)
        return len(text)

    def flush(self) -> None:
        self.first.flush()
        self.second.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.first, name)


def run_script(smk: Any, main: Callable[[Any], None]) -> None:
    """Run ``main(smk)`` with logging to the rule's log and pinned threads."""
    logfile = smk.log[0] if len(smk.log) else None
    setup_logging(logfile)
    if logfile:
        # line-buffered so that a log followed with `tail -f` is current
        sys.stderr = _Tee(sys.__stderr__, open(logfile, "a", buffering=1))  # noqa: SIM115
    threads = pin_threads(getattr(smk, "threads", 1) or 1)
    log.info("rule %s: %d thread(s)", getattr(smk, "rule", "?"), threads)
    # Orphaned (its Snakemake killed alone), the job must not go on to publish: the
    # watchdog stops the main thread, atomic writes refuse to rename.
    watch_snakemake()
    start = time.perf_counter()
    try:
        main(smk)
    except BaseException as exc:
        gone = snakemake_gone()
        if gone:
            log.error(
                "rule %s stopped without publishing its outputs: %s",
                getattr(smk, "rule", "?"),
                gone,
            )
            raise SystemExit(1) from None
        if isinstance(exc, Exception):
            # one line on the console (the formatter drops the traceback there), the
            # traceback in the log; SystemExit, so that Python prints no second copy
            log.exception("%s", failure_line(smk, exc, logfile))
            raise SystemExit(1) from None
        raise
    log.info("rule %s done in %.2f s", getattr(smk, "rule", "?"), time.perf_counter() - start)


def param_json(smk: Any, name: str) -> Any:
    """Decode a params value that the rule passed as canonical JSON."""
    return json.loads(getattr(smk.params, name))


class LogProgress:
    """Progress for long loops written to the log: percentage, rate and time left.

    tqdm's carriage-return bar is unreadable in a log file followed with ``tail -f``
    on a cluster; this writes one line every ``every`` fraction of the work instead.
    """

    def __init__(self, total: int, label: str, every: float = 0.05) -> None:
        self.total = max(1, int(total))
        self.label = label
        self.every = every
        self.step = max(1, int(self.total * every))  # every=0: a line per unit of work
        self.start = time.perf_counter()
        self.next = self.step

    def __call__(self, done: int, total: int | None = None) -> None:
        if total and total != self.total:  # a total the caller learns as it goes
            self.total = total
            self.step = max(1, int(self.total * self.every))
            self.next = min(self.next, self.step)
        if done < self.next and done < self.total:
            return
        self.next = done + self.step
        elapsed = time.perf_counter() - self.start
        rate = done / elapsed if elapsed > 0 else float("inf")
        left = (self.total - done) / rate if rate > 0 else float("nan")
        log.info(
            "%s: %d/%d (%.0f%%), %.1f it/s, %.0f s elapsed, %.0f s left",
            self.label,
            done,
            self.total,
            100.0 * done / self.total,
            rate,
            elapsed,
            left,
        )


#: The file that marks a folder as a configuration's results folder (key ``results``),
#: written when a run starts: another configuration's folder nested inside this one's
#: (``results/`` and ``results/paper/``, the README's recipe) is theirs, not stale.
RESULTS_MARKER = ".specalign-results.json"


def mark_results_folder(folder: str | Path, configfiles: list[str]) -> None:
    """Mark ``folder`` as the results folder of the configuration read from
    ``configfiles`` (:data:`RESULTS_MARKER`), creating it if needed."""
    from specalign.io import write_json

    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    cwd = Path.cwd().resolve()
    # relative to the working directory where inside it: the same configuration run in
    # two working directories writes the same bytes (runs are compared file for file)
    files = [
        str(p.relative_to(cwd)) if p.is_relative_to(cwd) else str(p)
        for p in (Path(f).resolve() for f in configfiles)
    ]
    write_json(root / RESULTS_MARKER, {"results": str(folder), "configfiles": files})


def stale_files(folder: str | Path, produced: Any) -> list[Path]:
    """Files under ``folder`` that no job of this run produces (``produced``: paths of
    every output, log and benchmark of the run's jobs, relative to the working directory
    or absolute): results of another configuration or of an earlier version of this one,
    which a reader would otherwise take for this run's. Another configuration's results
    folder inside this one (it holds :data:`RESULTS_MARKER`) is left out, whole. Sorted;
    none when the folder does not exist."""
    root = Path(folder)
    if not root.is_dir():
        return []
    made = {Path(p).resolve() for p in produced}
    nested = {m.parent for m in root.rglob(RESULTS_MARKER) if m.parent != root}
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and p.resolve() not in made
        and p != root / RESULTS_MARKER
        and not any(n in p.parents for n in nested)
    )


def stale_message(folder: str | Path, stale: list[Path], shown: int = 20) -> str:
    """The warning naming stale files (the first ``shown`` of them)."""
    names = "\n  ".join(str(p) for p in stale[:shown])
    more = f"\n  ... and {len(stale) - shown} more" if len(stale) > shown else ""
    return (
        f"{len(stale)} file(s) in {folder}/ are not results of this configuration (another "
        "configuration's models or experiments, or formats no longer configured); they are "
        "not part of this run, its tables, figures or report. Delete them, or give each "
        f"configuration its own folder (config key `results`):\n  {names}{more}"
    )
