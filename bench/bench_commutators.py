#!/usr/bin/env python
"""Benchmark the training stage of the ReLU commutator study (paper Sec. 10).

What it reports, per experiment of the full study and in total:

(a) the floating-point operations of training (matmul FLOPs only: forward ``2 N m' m`` per
    layer, weight gradient ``2 N m' m`` per layer, input gradient ``2 N m' m`` per layer
    except the first; element-wise work is O(N m) per layer and left out),
(b) the machine's float64 GEMM rate with torch at the same thread count, and the ideal time
    FLOPs / rate,
(c) the measured time of :func:`specalign.commutators.train.train_ensemble` (all seeds batched),
    and its ratio to the ideal,
(d) the time of :func:`specalign.commutators.train.reference_train_loop` (one ``nn.Module`` per
    seed, autograd + SGD) on the same work, timed on a fraction of the iterations (and,
    with ``--quick``, of the seeds) and extrapolated linearly, and the speed-up.

The data are synthetic stand-ins of the right shape (the cost of dense training does not
depend on the values), so the benchmark needs neither network nor the UCI files.

Examples::

    python bench/bench_commutators.py --quick          # ~1 min, extrapolated
    python bench/bench_commutators.py                  # full 10^4 iterations per experiment
    python bench/bench_commutators.py --iters 1000 --json bench.json
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

try:
    import specalign  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from specalign.runtime import pin_threads  # noqa: E402

STUDY_ITERS = 10_000
LR = 1e-2
TARGET_STUDY_S = 600.0
TARGET_SPEEDUP = 10.0
TARGET_CORES = 2


@dataclass(frozen=True)
class Experiment:
    name: str
    hidden: int
    width: int
    seeds: int
    n_train: int
    input_dim: int
    rescale_c: tuple[float, ...] = ()  # paired seeds x c values, one batched ensemble

    @property
    def widths(self) -> list[int]:
        return [self.input_dim] + [self.width] * self.hidden + [1]

    @property
    def ensemble(self) -> int:
        return self.seeds * max(1, len(self.rescale_c))


STUDY = (
    Experiment("synthetic depth H=2", 2, 32, 20, 160, 2),
    Experiment("synthetic depth H=4", 4, 32, 20, 160, 2),
    Experiment("synthetic depth H=6", 6, 32, 20, 160, 2),
    Experiment("capacity w=16", 4, 16, 10, 160, 2),
    Experiment("capacity w=64", 4, 64, 10, 160, 2),
    Experiment("Concrete", 4, 32, 20, 824, 8),
    Experiment("Energy", 4, 32, 20, 614, 8),
    Experiment("rescaling c=1/2,1,2", 3, 32, 10, 160, 2, rescale_c=(0.5, 1.0, 2.0)),
)


def flops_per_iteration(widths: list[int], n: int, seeds: int) -> int:
    """Matmul FLOPs of one full-batch gradient step (forward + backward) for ``seeds``
    networks, counted as 2 per multiply-add."""
    total = 0
    for l in range(len(widths) - 1):
        mm = 2 * n * widths[l + 1] * widths[l]
        total += 2 * mm  # forward z_l = W_l a_l and weight gradient delta_l a_l^T
        if l > 0:
            total += mm  # input gradient W_l^T delta_l (not needed for the data layer)
    return seeds * total


def forward_flops(widths: list[int], n: int, seeds: int) -> int:
    return seeds * sum(2 * n * widths[l + 1] * widths[l] for l in range(len(widths) - 1))


def study_flops(e: Experiment, n_iter: int = STUDY_ITERS) -> int:
    # n_iter steps plus the forward pass that gives the risk after the last step
    return n_iter * flops_per_iteration(e.widths, e.n_train, e.ensemble) + forward_flops(
        e.widths, e.n_train, e.ensemble
    )


def gemm_rate(n: int = 512, repeats: int = 7, min_time: float = 0.2) -> float:
    """Best-of float64 GEMM rate (FLOP/s) of torch on an ``n x n`` product: the machine's
    practical peak at the current thread count."""
    import torch

    a = torch.randn(n, n, dtype=torch.float64)
    b = torch.randn(n, n, dtype=torch.float64)
    torch.mm(a, b)
    best = math.inf
    for _ in range(repeats):
        k, t0 = 0, time.perf_counter()
        while True:
            torch.mm(a, b)
            k += 1
            dt = time.perf_counter() - t0
            if dt >= min_time / repeats:
                break
        best = min(best, dt / k)
    return 2 * n**3 / best


def bmm_rate(seeds: int, width: int, n: int, repeats: int = 5) -> float:
    """Best-of rate of the trainer's dominant kernel, ``(S, m, m) @ (S, m, N)``."""
    import torch

    w = torch.randn(seeds, width, width, dtype=torch.float64)
    a = torch.randn(seeds, width, n, dtype=torch.float64)
    torch.bmm(w, a)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(20):
            torch.bmm(w, a)
        best = min(best, (time.perf_counter() - t0) / 20)
    return 2 * seeds * width * width * n / best


def make_problem(e: Experiment) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    from specalign.commutators.data.synthetic import f_star, sample
    from specalign.commutators.train import he_init, rescale

    if e.input_dim == 2:
        X, y = sample(e.n_train, seed=0)
    else:  # stand-in for a standardised benchmark: same shape, Gaussian inputs
        rng = np.random.Generator(np.random.PCG64(0))
        X = rng.standard_normal((e.n_train, e.input_dim))
        y = f_star(X[:, :2]) + 0.1 * X[:, 2:].sum(axis=1)
        y = (y - y.mean()) / y.std()
    Ws = he_init(e.widths, range(e.seeds))
    if e.rescale_c:
        parts = [rescale(Ws, 1, c) for c in e.rescale_c]
        Ws = [np.concatenate([p[l] for p in parts]) for l in range(len(Ws))]
    return Ws, X, y


def time_batched(e: Experiment, n_iter: int, device: str) -> tuple[float, int]:
    """Seconds for ``n_iter`` batched steps with the study's checkpoint settings, and the
    number of seeds that diverged (expected 0)."""
    from specalign.commutators.train import train_ensemble

    Ws, X, y = make_problem(e)
    train_ensemble(Ws, X, y, lr=LR, n_iter=3, device=device)  # warm-up: allocator, MKL init
    t_end = n_iter * LR
    t0 = time.perf_counter()
    res = train_ensemble(
        Ws,
        X,
        y,
        lr=LR,
        n_iter=n_iter,
        risk_levels=(1e-1, 1e-2, 1e-3, 1e-4),
        times=(0.0, t_end / 2, t_end),
        device=device,
    )
    if device != "cpu":
        import torch

        torch.cuda.synchronize()
    return time.perf_counter() - t0, int(res.diverged.sum())


def time_reference(e: Experiment, n_iter: int, n_seeds: int) -> float:
    """Seconds of the per-seed autograd baseline on ``n_seeds`` seeds x ``n_iter`` steps."""
    from specalign.commutators.train import reference_train_loop

    Ws, X, y = make_problem(e)
    sub = [W[:n_seeds] for W in Ws]
    reference_train_loop([W[:1] for W in Ws], X, y, lr=LR, n_iter=3)  # warm-up
    t0 = time.perf_counter()
    reference_train_loop(sub, X, y, lr=LR, n_iter=n_iter)
    return time.perf_counter() - t0


def lpt_makespan(durations: list[float], workers: int) -> float:
    """Wall time of independent jobs on ``workers`` slots, longest job first."""
    loads = [0.0] * workers
    for d in sorted(durations, reverse=True):
        loads[loads.index(min(loads))] += d
    return max(loads)


def fmt_s(x: float) -> str:
    return f"{x:9.1f}" if x >= 10 else f"{x:9.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="time 200 batched and 20 baseline iterations (2 seeds) per experiment and extrapolate",
    )
    ap.add_argument(
        "--iters",
        type=int,
        default=None,
        help=f"batched iterations actually timed (default {STUDY_ITERS}, quick 200)",
    )
    ap.add_argument(
        "--ref-iters",
        type=int,
        default=None,
        help="baseline iterations actually timed (default 200, quick 20)",
    )
    ap.add_argument(
        "--ref-seeds",
        type=int,
        default=None,
        help="baseline seeds actually timed (default all, quick 2)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch/BLAS threads per job (default 1: the workflow runs one "
        "single-threaded job per core)",
    )
    ap.add_argument("--device", default="cpu", help="device for the batched trainer")
    ap.add_argument(
        "--only", nargs="*", default=None, help="substrings selecting experiments (default: all)"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)

    iters = args.iters or (200 if args.quick else STUDY_ITERS)
    ref_iters = args.ref_iters or (20 if args.quick else 200)
    threads = pin_threads(args.threads)
    import torch

    exps = [e for e in STUDY if not args.only or any(s in e.name for s in args.only)]
    if not exps:
        ap.error(f"--only {args.only} matches none of {[e.name for e in STUDY]}")

    print(
        f"# specalign training benchmark  ({platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, {threads} thread(s), device {args.device})"
    )
    rate = gemm_rate()
    brate = bmm_rate(20, 32, 160)
    print(
        f"(b) float64 GEMM rate, torch 512x512, {threads} thread(s): {rate / 1e9:.1f} GFLOP/s "
        f"(batched (20,32,32)@(20,32,160): {brate / 1e9:.1f} GFLOP/s)"
    )
    scale_b = STUDY_ITERS / iters
    print(
        f"(c) batched trainer timed on {iters} of {STUDY_ITERS} iterations"
        + (f", scaled x{scale_b:g}" if scale_b != 1 else " (full run)")
    )
    print(
        f"(d) baseline timed on {ref_iters} of {STUDY_ITERS} iterations and "
        f"{'all' if not (args.ref_seeds or args.quick) else (args.ref_seeds or 2)} seed(s), "
        f"extrapolated linearly in iterations and seeds"
    )
    print()

    rows = []
    for e in exps:
        fl = study_flops(e)
        ideal = fl / rate
        t_b, n_div = time_batched(e, iters, args.device)
        est_b = t_b * scale_b
        n_ref_seeds = min(e.ensemble, args.ref_seeds or (2 if args.quick else e.ensemble))
        t_r = time_reference(e, ref_iters, n_ref_seeds)
        est_r = t_r * (STUDY_ITERS / ref_iters) * (e.ensemble / n_ref_seeds)
        rows.append(
            dict(
                asdict(e),
                ensemble=e.ensemble,
                gflop=fl / 1e9,
                ideal_s=ideal,
                batched_timed_s=t_b,
                batched_iters=iters,
                batched_s=est_b,
                baseline_timed_s=t_r,
                baseline_iters=ref_iters,
                baseline_seeds=n_ref_seeds,
                baseline_s=est_r,
                diverged=n_div,
            )
        )
        print(
            f"  ... {e.name}: batched {t_b:.2f} s for {iters} it, "
            f"baseline {t_r:.2f} s for {ref_iters} it x {n_ref_seeds} seeds",
            flush=True,
        )

    head = (
        f"{'experiment':22s} {'H':>2s} {'w':>3s} {'S':>3s} {'N':>4s} {'d':>2s} "
        f"{'GFLOP':>8s} {'ideal s':>9s} {'batched s':>9s} {'x ideal':>7s} "
        f"{'baseline s':>10s} {'speed-up':>8s}"
    )
    print()
    print(
        "(a) FLOPs and times for the full study (10^4 iterations, lr 1e-2); "
        "'batched s' and 'baseline s' are extrapolated as stated above"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['name']:22s} {r['hidden']:2d} {r['width']:3d} {r['ensemble']:3d} "
            f"{r['n_train']:4d} {r['input_dim']:2d} {r['gflop']:8.0f} {fmt_s(r['ideal_s'])} "
            f"{fmt_s(r['batched_s'])} {r['batched_s'] / r['ideal_s']:7.2f} "
            f"{r['baseline_s']:10.1f} {r['baseline_s'] / r['batched_s']:8.2f}"
        )
    tot = {k: sum(r[k] for r in rows) for k in ("gflop", "ideal_s", "batched_s", "baseline_s")}
    print("-" * len(head))
    print(
        f"{'total':22s} {'':2s} {'':3s} {'':3s} {'':4s} {'':2s} {tot['gflop']:8.0f} "
        f"{fmt_s(tot['ideal_s'])} {fmt_s(tot['batched_s'])} "
        f"{tot['batched_s'] / tot['ideal_s']:7.2f} {tot['baseline_s']:10.1f} "
        f"{tot['baseline_s'] / tot['batched_s']:8.2f}"
    )

    workers = max(1, TARGET_CORES // threads)
    wall = lpt_makespan([r["batched_s"] for r in rows], workers)
    wall_ideal = lpt_makespan([r["ideal_s"] for r in rows], workers)
    speedup = tot["baseline_s"] / tot["batched_s"]
    bound = tot["baseline_s"] / tot["ideal_s"]
    print()
    print(
        f"projected training wall time on {TARGET_CORES} cores ({workers} parallel "
        f"{threads}-thread job(s), longest first): {wall:.0f} s (ideal {wall_ideal:.0f} s)"
        + ("" if len(exps) == len(STUDY) else "  [subset of the study only]")
    )
    print(
        f"target: whole study < {TARGET_STUDY_S:.0f} s on {TARGET_CORES} cores -> "
        + (
            f"{'MET' if wall < TARGET_STUDY_S else 'NOT MET'} ({wall:.0f} s)"
            if len(exps) == len(STUDY)
            else "not assessed (--only selected a subset)"
        )
    )
    print(
        f"target: batched >= {TARGET_SPEEDUP:.0f}x faster than the baseline -> "
        f"{'MET' if speedup >= TARGET_SPEEDUP else 'NOT MET'} ({speedup:.1f}x); "
        f"no implementation doing these FLOPs at the measured GEMM rate could exceed "
        f"{bound:.1f}x on this machine"
    )
    if any(r["diverged"] for r in rows):
        print(
            "warning: some seeds diverged during timing:",
            {r["name"]: r["diverged"] for r in rows if r["diverged"]},
        )
    if args.json:
        from specalign.io import write_json

        write_json(
            args.json,
            {
                "threads": threads,
                "device": args.device,
                "gemm_flops_per_s": rate,
                "bmm_flops_per_s": brate,
                "experiments": rows,
                "totals": tot,
                "projected_wall_s": wall,
                "speedup": speedup,
                "speedup_bound": bound,
            },
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
