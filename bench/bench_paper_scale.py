#!/usr/bin/env python
"""The transformer half of config/paper.yaml at the paper's own scale, on this machine.

For the largest model of each family of Li & Altafini (arXiv:2605.25619), a checkpoint with
random weights at the published size is written (bench/checkpoints.py: streamed, config.json
and model.safetensors as ``save_pretrained`` writes them), and the workflow's own transformer
rules run on it through Snakemake, with the settings of config/paper.yaml (100 prompts of
10 tokens, 48 prolonged layers, 16 null draws, 6 steering variants): ``random_model`` (its
random twin), ``extract_weights``, ``spectra``, ``propagate`` (every mode), ``steer``. Per rule
it prints the wall time, the peak RSS of the job (Snakemake's ``benchmark:`` record, which
includes child processes) and the bytes written, then deletes everything it wrote.

From the measured per-layer costs it projects the whole transformer half of paper.yaml
(13 checkpoints and 4 random twins; hub downloads are not included: they depend on the
network) and checks the targets, each printed as met or not:

* every job peaks at <= 16 GiB RSS (so the paper fits a 24 GiB workstation);
* the projected total on this machine's cores is <= 60 min;
* the spectra of all distinct layers run at >= 30 % of the float64 GEMM rate measured in
  the same run (``spectra_flops`` counts the eigen-decomposition as LAPACK's standard
  operation counts, see :func:`spectra_flops`).

Projection. Every rule's cost is ``overhead + n_units * c * (d / d_ref)^k``, with the
overhead measured on a tiny model of the same family in the same run, ``c`` the measured
cost per unit (a layer; for spectra a distinct block) of the family's largest model at
width ``d_ref``, and ``k`` the exponent of the rule's dominant work: 3 for the spectra
(an eigen-decomposition of a d x d matrix), 2 for the rest (matrix-vector work per token
and the checkpoint's bytes both grow as d^2 per layer).

The published sizes (``PAPER``) are those of the checkpoints' hub config.json files (not
reachable from here: the values are the published ones, and the parameter count of each
configuration, computed on the meta device, is printed beside the model card's figure as a
check).

Examples::

    python bench/bench_paper_scale.py --list            # sizes and parameter counts only
    python bench/bench_paper_scale.py --models gpt2-xl  # one family's largest model
    python bench/bench_paper_scale.py                   # all four (hours on 2 cores)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

try:
    import specalign  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from checkpoints import build_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30
MB = 2**20
MEM_TARGET = 16 * GIB
TIME_TARGET_S = 60 * 60
GEMM_FRACTION_TARGET = 0.30
RULES = ("random_model", "extract_weights", "spectra", "propagate", "steer")
#: The exponent of d in each rule's cost per unit (see the module docstring).
EXPONENT = {"random_model": 2, "extract_weights": 2, "spectra": 3, "propagate": 2, "steer": 2}


@dataclass(frozen=True)
class PaperModel:
    """One checkpoint of config/paper.yaml at its published size."""

    hub_id: str
    model_type: str
    architecture: str
    sizes: dict[str, Any]
    published: str  # the model card's parameter count
    largest: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def config(self) -> Any:
        from transformers import AutoConfig

        cfg = AutoConfig.for_model(self.model_type, **self.sizes, **self.extra)
        cfg.architectures = [self.architecture]
        return cfg


def _albert(d: int, layers: int, heads: int, ffn: int, published: str, largest=False):
    sizes = dict(
        hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=ffn, embedding_size=128, vocab_size=30000,
        max_position_embeddings=512, num_hidden_groups=1, inner_group_num=1,
    )  # fmt: skip
    return ("albert", "AlbertForMaskedLM", sizes, published, largest)


def _bert(d: int, layers: int, heads: int, published: str, largest=False):
    sizes = dict(
        hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * d, vocab_size=30522, max_position_embeddings=512,
    )  # fmt: skip
    return ("bert", "BertForMaskedLM", sizes, published, largest)


def _gpt2(d: int, layers: int, heads: int, published: str, largest=False):
    sizes = dict(n_embd=d, n_layer=layers, n_head=heads, vocab_size=50257, n_positions=1024)
    return ("gpt2", "GPT2LMHeadModel", sizes, published, largest)


def _gpt_neo(d: int, layers: int, heads: int, published: str, largest=False):
    sizes = dict(
        hidden_size=d, num_layers=layers, num_heads=heads, vocab_size=50257,
        max_position_embeddings=2048, window_size=256,
        attention_types=[[["global", "local"], layers // 2]],
    )  # fmt: skip
    return ("gpt_neo", "GPTNeoForCausalLM", sizes, published, largest)


#: config/paper.yaml's checkpoints at their published sizes (hub config.json: hidden size,
#: layers, heads, FFN size, vocabulary, positions; ALBERT's embedding size 128 and one layer
#: group shared by every layer; GPT-Neo's alternating global/local attention with a local
#: window of 256 tokens). ``published``: the parameter count the model card states.
PAPER: dict[str, PaperModel] = {
    name: PaperModel(hub_id, model_type, arch, sizes, published, largest)
    for name, hub_id, (model_type, arch, sizes, published, largest) in (
        ("albert-base-v2", "albert/albert-base-v2", _albert(768, 12, 12, 3072, "11M")),
        ("albert-large-v2", "albert/albert-large-v2", _albert(1024, 24, 16, 4096, "17M")),
        ("albert-xlarge-v2", "albert/albert-xlarge-v2", _albert(2048, 24, 16, 8192, "58M")),
        ("albert-xxlarge-v2", "albert/albert-xxlarge-v2",
         _albert(4096, 12, 64, 16384, "223M", largest=True)),
        ("bert-base", "google-bert/bert-base-uncased", _bert(768, 12, 12, "110M")),
        ("bert-large", "google-bert/bert-large-uncased", _bert(1024, 24, 16, "340M", True)),
        ("gpt2", "openai-community/gpt2", _gpt2(768, 12, 12, "124M")),
        ("gpt2-medium", "openai-community/gpt2-medium", _gpt2(1024, 24, 16, "355M")),
        ("gpt2-large", "openai-community/gpt2-large", _gpt2(1280, 36, 20, "774M")),
        ("gpt2-xl", "openai-community/gpt2-xl", _gpt2(1600, 48, 25, "1.5B", largest=True)),
        ("gpt-neo-125m", "EleutherAI/gpt-neo-125m", _gpt_neo(768, 12, 12, "125M")),
        ("gpt-neo-1.3b", "EleutherAI/gpt-neo-1.3B", _gpt_neo(2048, 24, 16, "1.3B")),
        ("gpt-neo-2.7b", "EleutherAI/gpt-neo-2.7B",
         _gpt_neo(2560, 32, 20, "2.7B", largest=True)),
    )
}  # fmt: skip
#: paper.yaml's random twins (one per family, like its smallest model).
TWINS = ("albert-base-v2", "bert-base", "gpt2", "gpt-neo-125m")
#: A tiny model per family for the fixed overhead of each rule (imports, loading).
TINY: dict[str, dict[str, Any]] = {
    "albert": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=128, embedding_size=16),
    "bert": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4),
    "gpt_neo": dict(hidden_size=64, num_layers=2, num_heads=4,
                    attention_types=[[["global", "local"], 1]]),
}  # fmt: skip


def geometry(m: PaperModel) -> dict[str, int]:
    """d, layers and distinct blocks (ALBERT shares one) of a checkpoint."""
    cfg = m.config()
    return {
        "d": int(cfg.hidden_size),
        "layers": int(cfg.num_hidden_layers),
        "blocks": 1 if m.model_type == "albert" else int(cfg.num_hidden_layers),
    }


def parameter_count(m: PaperModel) -> int:
    import torch
    import transformers

    with torch.device("meta"):
        model = getattr(transformers, m.architecture)(m.config())
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------- measuring


def gemm_rate(threads: int, n: int = 2048, repeats: int = 3) -> dict[str, float]:
    """float64 GEMM rate (FLOP/s) of this machine with ``threads`` BLAS threads: the
    best of ``repeats`` n x n products (2 n^3 flops each), per second of wall time
    (``wall``) and per CPU second times ``threads`` (``cpu``: what an idle machine gives
    when the cores are shared with other work)."""
    from specalign.runtime import pin_threads

    pin_threads(threads)
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    wall = cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        A @ B
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    return {"wall": 2.0 * n**3 / wall, "cpu": 2.0 * n**3 / cpu * threads}


def spectra_flops(d: int, blocks: int) -> float:
    """LAPACK's operation count for what the spectra rule computes per distinct block:
    all eigenvalues of a general real d x d matrix (10 d^3: Hessenberg reduction and the
    Francis QR iterations) and the eigenvectors it needs (25 d^3 - 10 d^3 for the full
    back-substitution when every eigenvector is computed)."""
    return blocks * 25.0 * d**3


def workflow_config(models: dict[str, dict[str, Any]], threads: int) -> dict[str, Any]:
    """paper.yaml's transformer settings with the given models."""
    import yaml

    paper = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    tcfg = dict(paper["transformers"], models=models, cache="models")
    # the random-weight checkpoints carry no tokenizer: the target is a token id
    tcfg["steering"] = dict(tcfg["steering"], target_id=1000)
    return {"threads": threads, "transformers": tcfg, "commutators": {"experiments": {}}}


def run_rules(work: Path, model: str, threads: int) -> dict[str, dict[str, float]]:
    """Run the transformer rules of ``model`` (and its random twin's ``random_model``) in
    ``work``; return per rule the wall time, peak RSS and bytes written."""
    targets = [
        f"results/transformers/{model}/{f}"
        for f in ("weights.h5", "spectra.nc", "propagation.nc", "steering.nc")
    ] + [f"models/{model}_random/manifest.json"]
    cmd = [
        sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(work),
        "--configfile", str(work / "config.yaml"), "--cores", str(threads), *targets,
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(f"snakemake failed for {model}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    out = {}
    for rule in RULES:
        name = f"{model}_random" if rule == "random_model" else model
        with open(work / "benchmarks" / "transformers" / name / f"{rule}.tsv") as f:
            row = next(csv.DictReader(f, delimiter="\t"))
        out[rule] = {
            "s": float(row["s"]),
            "cpu_s": float(row["cpu_time"]),
            "max_rss": float(row["max_rss"]) * MB,
            "io_out": float(row["io_out"]) * MB,
            "requested": requested(work, model if rule != "random_model" else f"{model}_random",
                                   rule, threads),
        }  # fmt: skip
    return out


def requested(work: Path, model: str, rule: str, threads: int) -> dict[str, int]:
    """What the rule's job asks the scheduler for (specalign.transformers.load.resources), to
    print beside what it used."""
    import yaml

    from specalign.transformers.load.resources import Workload, job_resources, model_size

    tcfg = yaml.safe_load((work / "config.yaml").read_text())["transformers"]
    manifest = json.loads((work / "models" / model / "manifest.json").read_text())
    folder = Path(manifest["path"])
    if not folder.is_absolute():  # a random twin's manifest names it from the work folder
        folder = work / folder
    size = model_size(json.loads((folder / "config.json").read_text()), folder)
    return job_resources(rule, size, Workload.from_config(tcfg, size.n_layers), threads)


def measure(name: str, tmp: Path, threads: int, tiny: bool = False) -> dict[str, Any]:
    """Build the checkpoint (or the family's tiny one), run the rules, delete it all."""
    m = PAPER[name]
    if tiny:
        m = PaperModel(m.hub_id, m.model_type, m.architecture, TINY[m.model_type], m.published)
    work = tmp / (name + ("-tiny" if tiny else ""))
    work.mkdir(parents=True)
    try:
        built = build_checkpoint(work / "checkpoint", m.config())
        models = {
            name: {"source": "local", "path": str(work / "checkpoint")},
            f"{name}_random": {"source": "random", "like": name, "seed": 0},
        }
        import yaml

        (work / "config.yaml").write_text(yaml.safe_dump(workflow_config(models, threads)))
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        rules = run_rules(work, name, threads)
        written = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
        return {
            "model": name,
            "tiny": tiny,
            **built,
            "wall_s": time.perf_counter() - t0,
            "load": [load, os.getloadavg()[0]],
            "disk_bytes": written,
            "rules": rules,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ----------------------------------------------------------------------------- projecting


def project(
    measured: dict[str, dict[str, Any]],
    tiny: dict[str, dict[str, Any]],
    key: str = "s",
    threads: int = 1,
) -> dict:
    """Projected time of every rule of paper.yaml's transformer half (see the docstring),
    from the jobs' wall times (``key="s"``) or from their CPU times divided by ``threads``
    (``key="cpu_s"``: the wall time on an idle machine, when the cores were shared)."""

    def seconds(rules: dict[str, dict[str, float]], rule: str) -> float:
        return rules[rule][key] / (threads if key == "cpu_s" else 1)

    rows, missing = [], []
    for name, m in PAPER.items():
        ref = reference(m, measured)
        if ref is None:
            missing.append(name)
            continue
        g, g_ref = geometry(m), geometry(PAPER[ref])
        for rule in RULES:
            if rule == "random_model" and name not in TWINS:
                continue
            units = g["blocks"] if rule == "spectra" else g["layers"]
            units_ref = g_ref["blocks"] if rule == "spectra" else g_ref["layers"]
            fixed = seconds(tiny[PAPER[ref].model_type]["rules"], rule)
            variable = max(seconds(measured[ref]["rules"], rule) - fixed, 0.0) / units_ref
            scale = (g["d"] / g_ref["d"]) ** EXPONENT[rule]
            rows.append({"model": name, "rule": rule, "s": fixed + units * variable * scale})
        if name in TWINS:  # the twin runs every rule but random_model again
            rows += [
                {**r, "model": f"{name}_random"}
                for r in rows
                if r["model"] == name and r["rule"] != "random_model"
            ]
    return {"rows": rows, "total_s": sum(r["s"] for r in rows), "not_projected": missing}


def reference(m: PaperModel, measured: dict[str, Any]) -> str | None:
    """The measured model whose per-unit costs stand for ``m``: the largest of its own
    family, else (a family not measured in this run) one of a family with the same
    attention kind (causal decoders, or bidirectional encoders), nearest in width: their
    layers do the same work per token."""
    from specalign.transformers.load.families import adapter_class

    own = [n for n in measured if PAPER[n].model_type == m.model_type]
    if own:
        return own[0]
    causal = adapter_class(m.model_type).causal
    alike = [n for n in measured if adapter_class(PAPER[n].model_type).causal == causal]
    d = geometry(m)["d"]
    return min(alike, key=lambda n: abs(geometry(PAPER[n])["d"] - d), default=None)


# ----------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=[n for n, m in PAPER.items() if m.largest])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--list", action="store_true", help="sizes and parameter counts only")
    parser.add_argument("--json", type=Path, help="write every number to this file")
    parser.add_argument("--tmp", type=Path, default=None, help="scratch folder (default: $TMPDIR)")
    parser.add_argument(
        "--project",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="no run: the targets and projection from the --json files of earlier runs "
        "(several: their models together, at the highest GEMM rate they measured)",
    )
    args = parser.parse_args()
    if args.project:
        return project_files(args.project, args.json)

    print(f"{'model':<20} {'hub id':<34} {'d':>5} {'layers':>6} {'blocks':>6} "
          f"{'params':>14} {'model card':>10}")  # fmt: skip
    for name, m in PAPER.items():
        g = geometry(m)
        print(f"{name:<20} {m.hub_id:<34} {g['d']:>5} {g['layers']:>6} {g['blocks']:>6} "
              f"{parameter_count(m):>14,} {m.published:>10}")  # fmt: skip
    if args.list:
        return 0

    rate = gemm_rate(args.threads)
    print(f"\nfloat64 GEMM rate, {args.threads} thread(s): {rate['wall'] / 1e9:.1f} GFLOP/s per "
          f"second of wall time, {rate['cpu'] / 1e9:.1f} per CPU second x {args.threads} "
          f"(load average {os.getloadavg()[0]:.1f})")  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="paper-scale-", dir=args.tmp))
    results: dict[str, Any] = {"threads": args.threads, "gemm_flops": rate}
    try:
        families = {PAPER[n].model_type: n for n in args.models}
        tiny = {f: measure(n, tmp, args.threads, tiny=True) for f, n in families.items()}
        results["tiny"] = tiny
        measured = results["measured"] = {}
        for name in args.models:
            print(f"\n{name}: building the checkpoint and running the rules ...", flush=True)
            measured[name] = measure(name, tmp, args.threads)
            report_model(measured[name])
            if args.json:  # after every model: a long run stopped early keeps what it has
                args.json.write_text(json.dumps(results, indent=2, default=float))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results.update(targets(measured, tiny, rate, args.threads))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=float))
    return 0


def project_files(paths: list[Path], out: Path | None) -> int:
    """The targets of several runs' results together (``--project``)."""
    runs = [json.loads(p.read_text()) for p in paths]
    tiny = {k: v for r in runs for k, v in r.get("tiny", {}).items()}
    measured = {k: v for r in runs for k, v in r.get("measured", {}).items()}
    rate = max((r["gemm_flops"] for r in runs), key=lambda g: g["wall"])
    threads = runs[0]["threads"]
    print(f"{', '.join(measured)} measured; float64 GEMM rate {rate['wall'] / 1e9:.1f} GFLOP/s")
    for name in measured:
        print(f"\n{name}")
        report_model(measured[name])
    results = {"threads": threads, "gemm_flops": rate, "tiny": tiny, "measured": measured}
    results.update(targets(measured, tiny, rate, threads))
    if out:
        out.write_text(json.dumps(results, indent=2, default=float))
    return 0


def report_model(r: dict[str, Any]) -> None:
    """Per rule: wall and CPU time, peak RSS against the job's request, bytes written."""
    print(f"  checkpoint {r['bytes'] / GIB:.2f} GiB ({r['n_params']:,} parameters) "
          f"written in {r['build_s']:.0f} s; rules {r['wall_s']:.0f} s (load average "
          f"{r['load'][0]:.1f} -> {r['load'][1]:.1f}), {r['disk_bytes'] / GIB:.2f} GiB on disk "
          "at the end")  # fmt: skip
    for rule, v in r["rules"].items():
        req = v["requested"]
        fits = "fits" if v["max_rss"] <= req["mem_mb"] * 1e6 else "EXCEEDS"
        print(f"  {rule:<16} {v['s']:8.1f} s wall {v['cpu_s']:8.1f} s CPU  peak RSS "
              f"{v['max_rss'] / GIB:6.2f} GiB ({fits} mem_mb={req['mem_mb']}, "
              f"runtime={req['runtime']} min)  written {v['io_out'] / GIB:6.2f} GiB",
              flush=True)  # fmt: skip


def targets(measured: dict, tiny: dict, rate: dict[str, float], threads: int) -> dict[str, Any]:
    """Print the issue's targets, met or not, and return the numbers."""
    print("\nTargets")
    peak = max(v["max_rss"] for r in measured.values() for v in r["rules"].values())
    print(f"  peak RSS of any job {peak / GIB:.2f} GiB <= 16 GiB: "
          f"{'met' if peak <= MEM_TARGET else 'NOT met'}")  # fmt: skip
    out: dict[str, Any] = {"peak_rss": peak}
    # wall times count the waits for a core another process holds; CPU times / threads
    # are what an idle machine would take (the two agree on an idle machine)
    for key, label in (("s", "wall times"), ("cpu_s", "CPU times / threads")):
        proj = project(measured, tiny, key, threads)
        print(f"  whole transformer half of paper.yaml from the jobs' {label}: projected "
              f"{proj['total_s'] / 60:.1f} min <= 60 min: "
              f"{'met' if proj['total_s'] <= TIME_TARGET_S else 'NOT met'}")  # fmt: skip
        by_rule: dict[str, float] = {}
        for row in proj["rows"]:
            by_rule[row["rule"]] = by_rule.get(row["rule"], 0.0) + row["s"]
        for rule, sec in by_rule.items():
            print(f"    {rule:<16} {sec / 60:7.1f} min")
        if proj["not_projected"]:
            print(f"    not projected (no measured model of their kind): "
                  f"{', '.join(proj['not_projected'])}")  # fmt: skip
        out[f"projection_{key}"] = proj
    for key, rkey in (("s", "wall"), ("cpu_s", "cpu")):
        flops = time_s = 0.0
        for name, r in measured.items():
            g = geometry(PAPER[name])
            div = threads if key == "cpu_s" else 1
            fixed = tiny[PAPER[name].model_type]["rules"]["spectra"][key] / div
            flops += spectra_flops(g["d"], g["blocks"])
            time_s += max(r["rules"]["spectra"][key] / div - fixed, 1e-9)
        frac = flops / time_s / rate[rkey]
        print(f"  spectra at {frac:.0%} of the float64 GEMM rate ({rkey}) (>= 30 %): "
              f"{'met' if frac >= GEMM_FRACTION_TARGET else 'NOT met'}")  # fmt: skip
        out[f"spectra_gemm_fraction_{rkey}"] = frac
    return out


if __name__ == "__main__":
    sys.exit(main())
