#!/usr/bin/env python
"""Does a streamed job's peak memory grow with depth? Peak RSS of ``random_model`` (the
twin, drawn and written a unit at a time) and ``steer_real`` against the number of layers.

``steer_real`` (see ``bench_streamed.py``) is steering's embedding output and the streamed
causal LM's next-token probabilities of the unchanged model and 6 W_O variants in
lockstep: the job whose peak grew with depth before glibc was told to map large blocks
apart from its heap while a model streams (``streaming.STREAM_MMAP_THRESHOLD``). Only a
layer's weights are resident, so the peak should not depend on the depth. The shape is a
narrow Llama (d 2048, 16 heads, 4 key/value heads, vocabulary 32000, bf16), so that the
run takes about a minute; each depth is written by ``random_model`` and measured in a
child process of its own, which inherits the environment (to compare allocator settings,
run it with ``MALLOC_MMAP_THRESHOLD_=...`` set, say).

The twin's peak grew by 32 MiB a layer at Mistral-7B's width until its freed heap pages
were handed back after each unit (``twin.write_random_weights``); it is measured here too.

Reported: each job's peak at each depth, and its growth per layer in float32 token
states (1000 tokens x d x 4 bytes: 8.2 MB). Target: under 0.25 states per layer (steer_real
grew by about 2 before the fix, the twin by about 2 at this width).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_streamed as bs  # noqa: E402

SHAPE = {**bs.SHAPES["llama-3-8b"], "hidden_size": 2048, "intermediate_size": 5632,
         "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000}  # fmt: skip
TARGET_STATES_PER_LAYER = 0.25


def child(layers: int, folder: Path, job: str, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--job", job, "--layers", str(layers),
           "--folder", str(folder), "--threads", str(threads)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{job} at {layers} layers failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 16])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tmp", type=Path, default=None)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        cfg = {**SHAPE, "num_hidden_layers": args.layers}
        print(json.dumps(bs.run_job(args.job, args.folder, cfg, args.threads)))
        return 0
    root = Path(tempfile.mkdtemp(prefix="stream-depth-", dir=args.tmp))
    state = bs.N_PROMPTS * bs.N_TOKENS * SHAPE["hidden_size"] * 4.0
    jobs = ("random_model", "steer_real")  # the twin writes the checkpoint steer_real reads
    peaks: dict[str, dict[int, int]] = {job: {} for job in jobs}
    try:
        print(f"d {SHAPE['hidden_size']}, {args.threads} threads, "
              f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        for L in args.depths:
            folder = root / f"L{L}"
            folder.mkdir()
            for job in jobs:
                m = child(L, folder, job, args.threads)
                peaks[job][L] = m["max_rss"]
                print(f"{job:<13}{L:>4} layers: peak {m['max_rss'] / 2**30:.3f} GiB, "
                      f"wall {m['wall_s']:.1f} s")  # fmt: skip
            shutil.rmtree(folder)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    failed = 0
    for job, by_depth in peaks.items():
        lo, hi = min(by_depth), max(by_depth)
        growth = (by_depth[hi] - by_depth[lo]) / (hi - lo) / state
        met = growth < TARGET_STATES_PER_LAYER
        failed += not met
        print(f"{job}: growth {growth:.2f} float32 token states per layer "
              f"(target < {TARGET_STATES_PER_LAYER}): {'met' if met else 'NOT MET'}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
