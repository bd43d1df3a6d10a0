#!/usr/bin/env python
"""The training configuration's projected time, from step times measured beside the
GEMM rate (issue 32: config/training.yaml within 45 minutes on 2 AVX2 cores).

For each series of the configuration (one per family), in one run:

* the float32 GEMM rate on the run's thread count (a d x d product, best of several);
* the seconds per optimiser step: two runs of the series' own settings that differ
  only in their number of steps (``--short`` and ``--short + --steps``), so that the
  tokenizer's training, the blocks and the checkpoints' held-out evaluation cancel;
* the step's FLOPs by the compute model (:func:`specalign.transformers.train.training.step_flops`)
  and the fraction of the GEMM rate the step reaches;
* the training tokens, and so the passes over the training text the configured steps
  make.

``--analysis DIR --run-cpu S``: the analysis of the checkpoints, from a finished run of
the configuration in DIR whose user CPU was S seconds (``/usr/bin/time``): S less the
train_model jobs' CPU (Snakemake's ``benchmark:`` files), per point.

Prints a table, and with ``--write`` stores the measured numbers in
bench/training_projection.json, which tests/transformers/test_training.py reads to keep
the configuration's projected wall time under the bound whenever its settings change.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PROJECTION = REPO / "bench" / "training_projection.json"


def cpu_name() -> str:
    """The CPU's model name and vector width (the rates differ by 3-4x between kinds)."""
    name, avx512 = platform.processor() or platform.machine(), False
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
        avx512 = " avx512f" in text
    return f"{name}, {'AVX-512' if avx512 else 'AVX2 only'}"


def gemm_rate(threads: int, d: int = 1024, repeats: int = 5) -> float:
    """float32 GFLOP/s of a d x d matrix product on ``threads`` torch threads."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(d, d), torch.randn(d, d)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * d**3 / best / 1e9


def series_runs(config: Path) -> dict[str, dict]:
    """The configuration's trained series, as the workflow's validation completes them."""
    from specalign.config import load_yaml, validate_config

    cfg = validate_config(load_yaml(config))
    return {
        name: spec
        for name, spec in cfg["transformers"]["series"].items()
        if spec["source"] == "trained"
    }


def seconds_per_step(
    run: dict, short: int, extra: int, device: str = "cpu"
) -> tuple[float, int, int]:
    """Seconds per step (the difference of two runs), training tokens, vocabulary."""
    from specalign.transformers.train import training

    times, result = [], None
    for steps in (short, short + extra):
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            result = training.train_run({**run, "steps": steps, "warmup": 1}, out, device=device)
            times.append(time.perf_counter() - t0)
    assert result is not None
    return (times[1] - times[0]) / extra, result.n_train_tokens, result.vocab_size


def analysis_seconds(run_dir: Path, run_cpu: float) -> dict[str, float]:
    """CPU seconds of everything a finished run did but training (``run_cpu``,
    the whole run's user CPU, less each train_model job's ``cpu_time`` from its
    ``benchmark:`` file), and the points analysed (the trained checkpoints' manifests)."""
    train = 0.0
    for tsv in (run_dir / "benchmarks" / "transformers" / "series").glob("*/train_model.tsv"):
        with tsv.open() as f:
            train += sum(float(row["cpu_time"]) for row in csv.DictReader(f, delimiter="\t"))
    points = len(list((run_dir / "resources" / "models").glob("*_step*/manifest.json")))
    # the machine that ran it (run this on that machine): the step times above and the
    # analysis may come from different kinds, and the projection should say so
    return {
        "cpu_seconds": round(run_cpu - train, 1),
        "points": points,
        "cpu": cpu_name(),
        "measured": time.strftime("%Y-%m-%d"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=REPO / "config" / "training.yaml")
    ap.add_argument("--short", type=int, default=8, help="steps of the shorter run")
    ap.add_argument("--steps", type=int, default=64, help="steps the longer run adds")
    ap.add_argument("--analysis", type=Path, help="a finished run of the configuration")
    ap.add_argument("--run-cpu", type=float, help="that run's user CPU seconds")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the step times only)")
    ap.add_argument(
        "--analysis-only",
        action="store_true",
        help="with --analysis: keep the step times already stored, add the analysis",
    )
    ap.add_argument("--write", action="store_true", help=f"store the numbers in {PROJECTION}")
    args = ap.parse_args()

    from specalign.transformers.train import training

    if args.analysis_only:
        if not args.analysis or not PROJECTION.is_file():
            raise SystemExit(f"--analysis-only needs --analysis DIR and {PROJECTION}")
        record = json.loads(PROJECTION.read_text())
        if args.run_cpu is None:
            raise SystemExit("--analysis needs --run-cpu")
        record["analysis"] = analysis_seconds(args.analysis, args.run_cpu)
        a = record["analysis"]
        print(f"analysis: {a['cpu_seconds']:.0f} CPU s over {a['points']} points")
        if args.write:
            PROJECTION.write_text(json.dumps(record, indent=2) + "\n")
        return 0
    runs = series_runs(args.config)
    threads = {int(r["threads"]) for r in runs.values()}
    rates = {t: gemm_rate(t) for t in sorted(threads)}
    gemm = ", ".join(f"float32 GEMM {r:.0f} GFLOP/s on {t} thread(s)" for t, r in rates.items())
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores; {gemm}")
    families = {}
    print(f"{'series':14s} {'family':7s} {'s/step':>8s} {'GFLOP/step':>11s} {'of GEMM':>8s} "
          f"{'tokens':>10s} {'passes':>7s} {'train s':>8s}")  # fmt: skip
    for name, run in runs.items():
        sec, tokens, vocab = seconds_per_step(run, args.short, args.steps, args.device)
        flops = training.step_flops(run, vocab)
        rate = rates[int(run["threads"])]
        frac = flops / sec / 1e9 / rate
        passes = run["steps"] * run["batch_size"] * run["seq_len"] / tokens
        print(f"{name:14s} {run['family']:7s} {sec:8.3f} {flops / 1e9:11.2f} {frac:8.2f} "
              f"{tokens:10,d} {passes:7.2f} {sec * run['steps']:8.0f}")  # fmt: skip
        families[run["family"]] = {
            "seconds_per_step": round(sec, 4),
            "gflop_per_step": round(flops / 1e9, 3),
            "fraction_of_gemm_rate": round(frac, 3),
            "train_tokens": tokens,
            "vocab_size": vocab,
        }
    record = {
        "measured": time.strftime("%Y-%m-%d"),
        "cpu": cpu_name(),
        "gemm_gflops": {str(t): round(r, 1) for t, r in rates.items()},
        "families": families,
    }
    if args.analysis:
        if args.run_cpu is None:
            raise SystemExit("--analysis needs --run-cpu")
        record["analysis"] = analysis_seconds(args.analysis, args.run_cpu)
        a = record["analysis"]
        print(f"analysis: {a['cpu_seconds']:.0f} CPU s over {a['points']} points "
              f"({a['cpu_seconds'] / max(a['points'], 1):.0f} s a point)")  # fmt: skip
    elif PROJECTION.is_file():  # keep the analysis measured from the last finished run
        old = json.loads(PROJECTION.read_text())
        if "analysis" in old:
            record["analysis"] = old["analysis"]
    if args.write and args.device != "cpu":
        raise SystemExit("--write stores the CPU projection; run it without --device")
    if args.write:
        PROJECTION.write_text(json.dumps(record, indent=2) + "\n")
        print(f"written: {PROJECTION}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    np.set_printoptions(precision=3)
    sys.exit(main())
