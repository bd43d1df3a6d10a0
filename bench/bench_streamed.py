#!/usr/bin/env python
"""Today's large checkpoints through the streamed rules: work, ideal time, peak RSS.

For a checkpoint of a published shape (``SHAPES``: Mistral-7B, Llama-3-8B, Llama-3-70B;
random weights in bf16 as published, optionally with fewer layers at the published width
and vocabulary, ``--layers``), each rule's kernel runs as a job of its own (a child
process, so that its peak RSS is its own) with config/paper.yaml's workload (100 prompts
of 10 tokens, 6 steering variants):

* ``random_model``: ``sources.make_random_model`` (the twin, drawn and written one unit
  at a time; its output is the checkpoint the other jobs read);
* ``propagate_real``: the real model's states of propagation (``real_model`` mode,
  streamed: ``hf.real_forward_hidden_states``);
* ``steer_real``: steering's embedding output (``steer.model_inputs``) and the causal
  LM's next-token probabilities of the unchanged model and 6 variants of the last
  layer's W_O (``steer.next_token_probs`` on the streamed causal LM);
* ``extract_weights``, ``spectra`` (``--rules``): the workflow's kernels as the rules run
  them: ``extract.extract_to_h5`` (a block at a time from the checkpoint into weights.h5)
  and ``spectra.spectra_dataset`` on ``read_weights_h5(lazy=True)`` (a block at a time
  from weights.h5, ``--threads`` blocks at once; a grouped-query block through its r x r
  product). Their ideal: the float64 work at the float64 GEMM rate or the bytes read and
  written at the disk's rates, whichever is larger.

Per job it prints the work (flops of the products, bytes read from the checkpoint or
written), the ideal time from the rates measured in the same run (float32 and float64
GEMM on ``--threads`` cores, the disk's read and write rates with the page cache
dropped, torch's normal draws per second), the measured wall and CPU time, the ratio
wall/ideal, the peak RSS and what ``resources.job_resources`` requests for it. The ideal
of a job is the larger of its compute time and its I/O time (the two can overlap). The
checkpoint's pages are dropped from the page cache before every job, so each job reads
from disk. A reduced-layer run is projected to the published depth at the ratio
measured/ideal it measured (``projected_s`` = wall x ideal(published) / ideal(measured)).

Everything is written under ``--tmp`` and deleted at the end. Examples::

    python bench/bench_streamed.py --shape mistral-7b                 # full depth
    python bench/bench_streamed.py --shape llama-3-70b --layers 2     # projected to 80
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

try:
    import specalign  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

GIB = 2**30
N_PROMPTS, N_TOKENS, N_VARIANTS, TARGET_ID = 100, 10, 6, 1000
_LLAMA3 = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
           "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "dtype": "bfloat16"}  # fmt: skip
#: Published config.json sizes (the hub files of mistralai/Mistral-7B-v0.1 and
#: meta-llama/Meta-Llama-3-8B / -70B), bf16 as published.
SHAPES: dict[str, dict[str, Any]] = {
    "mistral-7b": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                   "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "vocab_size": 32000,
                   "max_position_embeddings": 32768, "rope_theta": 10000.0,
                   "sliding_window": 4096, "rms_norm_eps": 1e-5,
                   "tie_word_embeddings": False, "dtype": "bfloat16"},
    "llama-3-8b": _LLAMA3,
    "llama-3-70b": {**_LLAMA3, "hidden_size": 8192, "intermediate_size": 28672,
                    "num_hidden_layers": 80, "num_attention_heads": 64},
}  # fmt: skip
JOBS = ("random_model", "propagate_real", "steer_real", "extract_weights", "spectra",
        "propagate", "steer")
#: config/paper.yaml's transformer settings (schema defaults filled in) that the rules'
#: kernels take; the random checkpoints have no tokenizer, so the target is a token id
PAPER_ETA = 1.0
PAPER_PROMPTS = {"kind": "random", "n_prompts": N_PROMPTS, "n_tokens": N_TOKENS, "seed": 0}
PAPER_PROPAGATION = {"prolonged_layers": 48, "corr": "cosine", "null_draws": 16,
                     "real_dtype": "float32"}  # fmt: skip
PAPER_STEERING = {"target_text": "the", "target_id": TARGET_ID, "c": [0.5, 1.0, 2.0],
                  "methods": ["min_norm", "lstsq"]}  # fmt: skip


# ----------------------------------------------------------------------------- rates


def rates(threads: int, folder: Path) -> dict[str, float]:
    """FLOP/s of float32 and float64 GEMM (best of 3 2048^3 products), normal draws/s,
    and the disk's write and read bytes/s (1 GiB file, fsync'd, cache dropped)."""
    import torch

    torch.set_num_threads(threads)
    out: dict[str, float] = {}
    n = 2048
    for dtype in (torch.float32, torch.float64):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        best = min(_timed(lambda a=a, b=b: a @ b) for _ in range(3))
        out[f"gemm_{str(dtype)[6:]}"] = 2.0 * n**3 / best
        # per CPU second of the threads: what an idle machine gives (on shared cores
        # the wall rate moves with the other sessions' load)
        best = min(_timed(lambda a=a, b=b: a @ b, cpu=True) for _ in range(3))
        out[f"gemm_{str(dtype)[6:]}_cpu"] = 2.0 * n**3 / best * threads
    # the floor of a non-symmetric eigen-decomposition: LAPACK geev with vectors of a
    # random n x n float64 matrix on one BLAS thread (as the spectra rule runs each
    # block), n = the r of the grouped-query shapes, in 25 n^3 "flops" per second
    from threadpoolctl import threadpool_limits

    m = np.random.default_rng(0).standard_normal((1024, 1024))
    with threadpool_limits(1):
        out["geev_1024"] = 25.0 * 1024**3 / _timed(lambda: np.linalg.eig(m))
        out["geev_1024_cpu"] = 25.0 * 1024**3 / _timed(lambda: np.linalg.eig(m), cpu=True)
        # issue 33's floor: geev without vectors (eigenvalues only), in the same unit
        best = min(_timed(lambda: np.linalg.eigvals(m)) for _ in range(2))
        out["eigvals_1024"] = 25.0 * 1024**3 / best
        best = min(_timed(lambda: np.linalg.eigvals(m), cpu=True) for _ in range(2))
        out["eigvals_1024_cpu"] = 25.0 * 1024**3 / best
    t = torch.empty(2**26)
    out["normal"] = t.numel() / min(_timed(t.normal_) for _ in range(2))
    path = folder / "rate.bin"
    data = np.random.default_rng(0).bytes(GIB)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    del data
    out["write"] = GIB / (time.perf_counter() - t0)
    drop_cache(path)
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(64 * 2**20):
            pass
    out["read"] = GIB / (time.perf_counter() - t0)
    path.unlink()
    return out


def _timed(fn: Any, cpu: bool = False) -> float:
    clock = time.process_time if cpu else time.perf_counter
    t0 = clock()
    fn()
    return clock() - t0


def drop_cache(path: Path) -> None:
    """Evict a file's (or a folder's files') pages from the page cache."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# ----------------------------------------------------------------------------- work


def work(cfg: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per job: flops of its products and bytes it reads / writes, from the shape."""
    d, f, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    H, kv, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    dh = d // H
    layer = d * (H * dh) * 2 + 2 * d * kv * dh + 3 * d * f + 2 * d  # q, o, k, v, FFN, norms
    embed = head = V * d
    tokens = N_PROMPTS * N_TOKENS
    attn = L * N_PROMPTS * 4 * N_TOKENS**2 * H * dh  # scores and mixing, per layer
    b = 2  # bf16
    n_params = L * layer + embed + head + d
    r = kv * dh
    attn_read = b * L * (2 * d * H * dh + 2 * d * r + 2 * d)  # Q, O, K, V and the norm
    # weights.h5 per block: W_Q, W_O, W_K, W_V, W_O' (factored) or F (dense), biases, norms
    h5 = 8.0 * L * (2 * d * H * dh + 2 * d * r + (d * r if r < d else d * d) + 4 * d)
    n = r if r < d else d
    # per block: the n x n eigen-decomposition (25 n^3), M = W_V' W_O' (2 d r^2), the
    # per-head products and their eigenvalues, F = W_O W_V where it is dense (extract)
    eig64 = L * (25.0 * n**3 + 2.0 * d * r * r * (r < d) + 2.0 * d * H * dh * dh
                 + 10.0 * H * dh**3)  # fmt: skip
    # the simplified model in float64 (Section 3), per layer and token: real attention
    # reads Q, K, V (2 d (H dh + 2 r)) and applies W_O to the mixed heads (2 d H dh), plus
    # the scores and mixing; full attention applies W_O'(W_V' x) (4 d r); T prolonged layers
    T = max(48, L)
    simp_layer = tokens * 2.0 * d * (2 * H * dh + 2 * r) + N_PROMPTS * 4 * N_TOKENS**2 * H * dh
    simplified = T * (simp_layer + tokens * 4.0 * d * r)
    # the metrics of 5 modes against 2 + 16 directions, in two correlations (dot products)
    metrics = 2 * 5 * (T + 1) * tokens * d * 2.0 * 20
    forward32 = 2.0 * L * layer * tokens + attn
    return {
        "propagate": {"flops32": forward32, "flops64": simplified + metrics,
                      "read": b * (L * layer + embed + d) + 2 * h5},  # two simplified runs
        # the embedding output, the simplified run of every layer (float64) and per
        # variant the steered last layer and one r x r decomposition, then the causal LM
        # as steer_real
        "steer": {"flops32": forward32 + 2.0 * head * N_PROMPTS
                  + N_VARIANTS * 2.0 * (layer * tokens + head * N_PROMPTS),
                  "flops64": L * simp_layer + N_VARIANTS * (simp_layer + 25.0 * n**3),
                  "read": b * (2 * embed + n_params + N_VARIANTS * (layer + head + embed + d))
                  + h5},
        "extract_weights": {"flops64": L * 2.0 * d * d * H * dh * (r >= d),
                            "read": attn_read, "written": h5},
        # a factored block's spectra read W_O, W_V' and W_O' only (the dense ones the block)
        "spectra": {"flops64": eig64, "geev_flops": L * 25.0 * n**3,
                    "read": 8.0 * L * (d * H * dh + 2 * d * r) if r < d else h5},
        "random_model": {"draws": 2.0 * n_params, "written": b * n_params},
        "propagate_real": {"flops32": 2.0 * L * layer * tokens + attn,
                           "read": b * (L * layer + embed + d)},
        # the embeddings for state 0, one full pass of the LM, then per variant the
        # last layer, the final norm and the head (the earlier layers replayed; the head
        # on the last position of each prompt only); the variants advance with the
        # unchanged pass, so the LM's units are read once for all of them
        "steer_real": {
            "flops32": (2.0 * L * layer * tokens + attn + 2.0 * head * N_PROMPTS)
            + N_VARIANTS * 2.0 * (layer * tokens + head * N_PROMPTS),
            "read": b * (embed + n_params),
        },
    }  # fmt: skip


def ideal(job: str, w: dict[str, float], r: dict[str, float], threads: int) -> float:
    if job == "random_model":
        return max(w["draws"] / r["normal"], w["written"] / r["write"])
    io = w["read"] / r["read"] + w.get("written", 0.0) / r["write"]
    compute = w.get("flops64", 0.0) / r["gemm_float64"] + w.get("flops32", 0.0) / r["gemm_float32"]
    return max(compute, io)


# ----------------------------------------------------------------------------- jobs


def run_job(
    job: str, folder: Path, cfg: dict[str, Any], threads: int, device: str = "cpu"
) -> dict[str, Any]:
    """Run one job in this process (the child); return what it measured."""
    import torch

    from specalign.runtime import pin_threads

    pin_threads(threads)
    torch.set_num_threads(threads)
    ckpt = folder / "checkpoint"
    t0, c0 = time.perf_counter(), time.process_time()
    info: dict[str, Any] = {}
    from specalign.transformers.load import hf

    ids = hf.random_prompts(cfg["vocab_size"], N_PROMPTS, N_TOKENS, seed=0)
    if job == "random_model":
        from specalign.transformers.load.sources import make_random_model

        make_random_model(dict(cfg), ckpt, seed=0)
        info["bytes"] = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    elif job == "propagate_real":
        states = hf.real_forward_hidden_states(ckpt, ids, device=device)
        info["states"] = list(states.shape)
        info["finite"] = bool(np.isfinite(states).all())
    elif job == "steer_real":
        from specalign.io import DiskStack
        from specalign.transformers.load import streaming
        from specalign.transformers.measure import steer

        X0, e = steer.model_inputs(ckpt, ids, TARGET_ID, device)
        lm = streaming.streamed_model(ckpt, "causal_lm", device)
        stream = lm.specalign_stream
        name = f"model.layers.{cfg['num_hidden_layers'] - 1}.self_attn.o_proj.weight"
        W = stream.ckpt.tensor(stream.keys[name]).double().numpy()
        rng = np.random.default_rng(0)
        # in the compute dtype and on disk, as the steer rule hands them over
        # (steer.steering_dataset)
        variants = DiskStack()
        for i in range(N_VARIANTS):
            new = W + 0.01 * (i + 1) * rng.standard_normal(W.shape)
            variants.append(new.astype(streaming.COMPUTE_DTYPE))
        del W, new
        before, after = steer.next_token_probs(lm, ids, TARGET_ID, variants)
        variants.close()
        info["loads"] = stream.loads
        info["gib_read"] = stream.bytes_read / GIB
        info["p_finite"] = bool(np.isfinite(before).all() and np.isfinite(after).all())
        streaming.close_stream(lm)
    elif job == "extract_weights":
        from specalign.transformers.load.extract import extract_to_h5

        extract_to_h5(ckpt, folder / "weights.h5", threads=threads)
        info["h5_bytes"] = (folder / "weights.h5").stat().st_size
    elif job == "spectra":
        from specalign.transformers.load import contracts
        from specalign.transformers.measure import spectra

        mw = contracts.read_weights_h5(folder / "weights.h5", lazy=True)  # as the rule does
        ds = spectra.spectra_dataset(mw, eta=1.0, device="cpu", threads=threads)
        info["eigenpair_residual_max"] = float(ds["eigenpair_residual"].max())
        info["factored"] = int(ds.attrs["factored"])
        from specalign.io import write_netcdf

        write_netcdf(folder / "spectra.nc", ds)  # as the rule does (propagate, steer read it)
    elif job == "propagate":  # the rule's kernel (scripts/transformers/propagate.py)
        from specalign.io import DiskStack, read_netcdf, write_netcdf
        from specalign.transformers.load import contracts
        from specalign.transformers.measure import spectra

        cfg_p = PAPER_PROPAGATION
        from specalign.transformers.measure import propagate as prop

        ids = hf.prompt_ids(ckpt, PAPER_PROMPTS)
        with DiskStack() as hidden:  # as the rule: the real states in a file
            hf.streamed_states(
                ckpt, ids, hidden, device=device, dtype=hf.torch_dtype(cfg_p["real_dtype"])
            )
            mw = contracts.read_weights_h5(folder / "weights.h5", lazy=True)
            dirs = spectra.block_directions(read_netcdf(folder / "spectra.nc"), "spectra.nc")
            run = prop.propagation_run(
                mw, hidden, PAPER_ETA, cfg_p, seed=0, directions=dirs, threads=threads
            )
        info["modes"] = run.layers
        ds = run.dataset
        write_netcdf(folder / "propagation.nc", ds, headline=("gamma", "psi", "rho"))
        info["nc_bytes"] = (folder / "propagation.nc").stat().st_size
    elif job == "steer":  # the rule's kernel (scripts/transformers/steer.py)
        from specalign.io import read_netcdf, write_netcdf
        from specalign.transformers.measure import spectra, steer

        ids = hf.prompt_ids(ckpt, PAPER_PROMPTS)
        ds = steer.steering_dataset(
            folder / "weights.h5", ckpt, ids, PAPER_ETA, PAPER_STEERING, seed=0,
            null_draws=PAPER_PROPAGATION["null_draws"], device=device,
            directions=spectra.block_directions(read_netcdf(folder / "spectra.nc"), "spectra.nc"),
            threads=threads,
        )  # fmt: skip
        write_netcdf(folder / "steering.nc", ds, headline=("gamma_u",))
        info["nc_bytes"] = (folder / "steering.nc").stat().st_size
    else:
        raise ValueError(job)
    info["wall_s"] = time.perf_counter() - t0
    info["cpu_s"] = time.process_time() - c0
    info["max_rss"] = peak_rss()
    return info


def peak_rss() -> int:
    """This process's peak resident memory (VmHWM: ru_maxrss would carry the parent's
    peak over the fork and exec), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def requested(job: str, cfg: dict[str, Any], threads: int) -> dict[str, int]:
    from specalign.transformers.load.resources import Workload, job_resources, model_size

    rule = {"propagate_real": "propagate", "steer_real": "steer"}.get(job, job)
    size = model_size(cfg)
    w = Workload(tokens=N_PROMPTS * N_TOKENS, n_prompts=N_PROMPTS,
                 layers_run=max(48, size.n_layers), variants=N_VARIANTS, null_draws=16)  # fmt: skip
    return job_resources(rule, size, w, threads)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="mistral-7b")
    parser.add_argument("--layers", type=int, help="fewer layers at the published width")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rules", nargs="+", default=list(JOBS[:3]), choices=JOBS)
    parser.add_argument("--tmp", type=Path, default=None)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the streamed passes)")
    parser.add_argument("--job", help=argparse.SUPPRESS)  # internal: run one job here
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    cfg = dict(SHAPES[args.shape])
    published = cfg["num_hidden_layers"]
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    if args.job:
        print(json.dumps(run_job(args.job, args.folder, cfg, args.threads, args.device)))
        return 0

    folder = Path(tempfile.mkdtemp(prefix="streamed-", dir=args.tmp))
    results: dict[str, Any] = {"shape": args.shape, "layers": cfg["num_hidden_layers"],
                               "published_layers": published, "threads": args.threads}  # fmt: skip
    try:
        r = results["rates"] = rates(args.threads, folder)
        print(f"{args.shape}: {cfg['num_hidden_layers']} of {published} layers, d "
              f"{cfg['hidden_size']}, vocabulary {cfg['vocab_size']}; {args.threads} threads; "
              f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        print(f"rates: GEMM float32 {r['gemm_float32'] / 1e9:.1f} GFLOP/s, float64 "
              f"{r['gemm_float64'] / 1e9:.1f} GFLOP/s, normal draws {r['normal'] / 1e9:.2f} G/s, "
              f"geev (1024, one thread) {r['geev_1024'] / 1e9:.1f} G(25 n^3)/s, "
              f"eigenvalues only {r['eigvals_1024'] / 1e9:.1f}, "
              f"disk write {r['write'] / 1e6:.0f} MB/s, "
              f"read {r['read'] / 1e6:.0f} MB/s")  # fmt: skip
        w_all = work(cfg)
        w_pub = work({**cfg, "num_hidden_layers": published})
        print(f"{'job':<16}{'GFLOP':>9}{'GB io':>8}{'ideal s':>9}{'wall s':>9}{'CPU s':>8}"
              f"{'ratio':>7}{'peak GiB':>9}{'request':>10}{'load':>6}"
              f"{'projected s':>13}")  # fmt: skip
        jobs = results["jobs"] = {}
        for job in args.rules:
            for name in ("checkpoint", "weights.h5"):
                if (folder / name).exists():
                    drop_cache(folder / name)
            load = os.getloadavg()[0]
            cmd = [sys.executable, __file__, "--shape", args.shape, "--threads",
                   str(args.threads), "--job", job, "--folder", str(folder),
                   "--device", args.device]  # fmt: skip
            if args.layers:
                cmd += ["--layers", str(args.layers)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                print(f"{job}: FAILED\n{proc.stderr[-3000:]}")
                jobs[job] = {"failed": proc.stderr[-3000:]}
                continue
            m = json.loads(proc.stdout.strip().splitlines()[-1])
            w = w_all.get(job, {})
            best = ideal(job, w, r, args.threads) if w else float("nan")
            req = requested(job, cfg, args.threads)
            # per layer: the measured time less the non-layer part, scaled to L
            proj = float("nan")
            if w and w_pub:
                proj = m["wall_s"] * ideal(job, w_pub[job], r, args.threads) / best
            flops = w.get("draws") or w.get("flops32", 0.0) + w.get("flops64", 0.0)
            io = w.get("read", 0.0) + w.get("written", 0.0) or float("nan")
            m.update(ideal_s=best, request=req, load_before=load, projected_s=proj, work=w,
                     load_after=os.getloadavg()[0])  # fmt: skip
            if job == "spectra":
                # issue 33's floor: every block's eigenvalues-only geev at the rate
                # measured above (one BLAS thread a block, `threads` blocks at once, as
                # the rule decomposes them), plus reading the blocks at the disk's rate
                eig_only = w["geev_flops"] / r["eigvals_1024"]
                m["floor_s"] = eig_only / args.threads + w["read"] / r["read"]
                m["ratio_floor"] = m["wall_s"] / m["floor_s"]
                # by CPU time: the decompositions' CPU (the reads' is small)
                m["floor_cpu_s"] = w["geev_flops"] / r["eigvals_1024_cpu"]
                m["ratio_floor_cpu"] = m["cpu_s"] / m["floor_cpu_s"]
            if w and job != "random_model":
                # measured CPU time per thread against the compute ideal at the CPU rates
                compute = w.get("flops64", 0.0) / r["gemm_float64_cpu"]
                compute += w.get("flops32", 0.0) / r["gemm_float32_cpu"]
                m["ideal_cpu_s"] = compute
                m["ratio_cpu"] = m["cpu_s"] / args.threads / compute if compute else float("nan")
            jobs[job] = m
            print(f"{job:<16}{flops / 1e9:>9.0f}{io / 1e9:>8.2f}{best:>9.1f}{m['wall_s']:>9.1f}"
                  f"{m['cpu_s']:>8.1f}{m['wall_s'] / best:>7.2f}{m['max_rss'] / GIB:>9.2f}"
                  f"{req['mem_mb'] / 1024:>8.1f}Gi{load:>6.1f}{proj:>13.0f}",
                  flush=True)  # fmt: skip
            fits = m["max_rss"] <= req["mem_mb"] * 1e6
            print(f"    {json.dumps({k: v for k, v in m.items() if k not in ('work', 'request')})}"
                  f"  request {'fits' if fits else 'EXCEEDED'}", flush=True)  # fmt: skip
            if args.json:
                args.json.write_text(json.dumps(results, indent=2, default=float))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    results["load_end"] = os.getloadavg()[0]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
