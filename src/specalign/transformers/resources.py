"""What each transformer rule asks the scheduler for, from the size of its model.

A cluster job is killed when it passes its memory request or its wall-time limit, and a
request far above the need keeps it queued: GPT-Neo 2.7B needs about 12 GiB where MiniLM
needs 1, so one ``mem_mb`` for every model is wrong for one of them. Each transformer
rule's ``mem_mb`` and ``runtime`` are therefore computed from the model's size, read
from its folder when the rule is about to run: the parameter count ``n_params`` (from
the safetensors headers; from config.json when the weights are not on disk), the width
d, the layers L, the distinct blocks B (1 for ALBERT), the vocabulary V, and the
workflow's settings: P x N prompt tokens, T prolonged layers, the steering variants.

Memory (bytes) is the largest of the phases a job goes through, each the arrays it holds
at once (``mem_bytes``), plus the interpreter with torch and transformers imported
(``BASE_BYTES``), times ``SAFETY``:

* ``random_model``: the float32 model and what ``save_pretrained`` holds while it
  writes (1.05 x 4 n_params: 10.8 GB peak measured for GPT-Neo 2.7B's 10.6 GB);
* ``extract_weights``: one block at a time in float64 (it streams the checkpoint);
* ``spectra``: the float64 attention weights of every block (4 d^2 B x 8) and LAPACK's
  work arrays for one d x d eigen-decomposition (about 8 d^2 x 8);
* ``propagate``: the float32 model with its float64 hidden states, then (the model
  freed) the float64 weights with the states of every simplified run (T + 1 states of
  P N tokens, two attention readings, and the metrics' normalised copies);
* ``steer``: the model for the embedding output; the float64 weights with one run of
  states and every variant's W_O', Delta W_O and F'; the float32 causal LM with its
  replayed layer outputs and the logits (P N V x 4).

Runtime (minutes) is ``RUNTIME_MARGIN`` times the work at rates per core measured by
``bench/bench_paper_scale.py`` on a 2-core machine (``RATES``: the float64 eigen-solver,
float64 matrix products, the float32 model forward, reading and writing checkpoints),
plus ``RUNTIME_FLOOR_MIN`` for starting Python and loading, so that a slower node still
finishes. The constants are printed and checked against the benchmark's measured peaks
(the README's "Cluster resources" section has the numbers).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specalign.transformers.families import adapter_for

#: Resident memory of a job before any model array: Python, numpy, torch, transformers
#: and xarray imported (700-900 MB measured for the MiniLM jobs).
BASE_BYTES = 1.0 * 2**30
#: Margin on the estimated arrays (allocator fragmentation, temporaries not counted).
SAFETY = 1.3
#: Work rates per core (FLOP/s, or bytes/s for I/O), measured on the benchmark machine
#: and rounded down (see the module doc).
RATES = {
    # 25 d^3 flops of a float64 eigen-decomposition with vectors, on one BLAS thread:
    # 14, 19 and 25 GFLOP/s per CPU second measured at d = 1024, 2560, 4096
    "eig": 8e9,
    "gemm64": 6.0e9,  # float64 products of the simplified model and the metrics
    "forward32": 8.0e9,  # 2 n_params flops per token of a float32 model forward
    "io": 100e6,  # checkpoint bytes read or written per second
}
RUNTIME_MARGIN = 3.0
RUNTIME_FLOOR_MIN = 10
#: The rules whose request is computed here.
RULES = ("random_model", "extract_weights", "spectra", "propagate", "steer")


@dataclass(frozen=True)
class ModelSize:
    """The sizes of one model that its jobs' memory and time follow."""

    n_params: int
    d_model: int
    n_layers: int
    n_blocks: int
    vocab_size: int


@dataclass(frozen=True)
class Workload:
    """The workflow settings that the transformer jobs' work follows."""

    tokens: int  # P x N prompt tokens
    n_prompts: int
    layers_run: int  # the longest simplified run: max(L, prolonged_layers)
    variants: int  # steering (method, c) pairs
    null_draws: int

    @classmethod
    def from_config(cls, tcfg: Mapping[str, Any], n_layers: int) -> Workload:
        """From the ``transformers`` section of the workflow config."""
        prompts, steering = tcfg["prompts"], tcfg["steering"]
        return cls(
            tokens=int(prompts["n_prompts"]) * int(prompts["n_tokens"]),
            n_prompts=int(prompts["n_prompts"]),
            layers_run=max(int(tcfg["propagation"]["prolonged_layers"]), n_layers),
            variants=len(steering["c"]) * len(steering["methods"]),
            null_draws=int(tcfg["propagation"]["null_draws"]),
        )


def safetensors_parameters(model_dir: str | Path) -> int | None:
    """The number of stored values of the folder's one checkpoint, from its safetensors
    headers alone (no tensor is read; Mistral's ``consolidated.safetensors`` beside the
    shards is not counted twice); None without any, or when a header is damaged: this
    runs in the Snakemake process for every model, and the model's own jobs name the
    damaged file (:mod:`specalign.transformers.checkpoint`)."""
    from specalign.transformers.checkpoint import CheckpointError, stored_parameters

    try:
        return stored_parameters(model_dir)
    except CheckpointError:
        return None


def config_parameters(config: Mapping[str, Any]) -> int:
    """The parameter count a transformer of config.json's sizes has, when its weights are
    not on disk (a hub model not fetched yet): per distinct block 4 d^2 of attention and
    2 d f of feed-forward (f the FFN width, 4 d when config.json names none), plus the
    token and position embeddings (of ALBERT's ``embedding_size`` e, with its e x d
    projection, when it embeds in a smaller space)."""
    adapter = adapter_for(config)
    d = adapter.d_model
    ffn = next(
        (int(config[k]) for k in ("intermediate_size", "n_inner", "ffn_dim", "hidden_dim")
         if config.get(k)),
        4 * d,
    )  # fmt: skip
    vocab = int(config.get("vocab_size") or 0)
    positions = int(adapter.max_positions or 0)
    e = int(config.get("embedding_size") or d)
    embeddings = (vocab + positions) * e + (e * d if e != d else 0)
    return adapter.n_blocks * (4 * d * d + 2 * d * ffn) + embeddings


def model_size(config: Mapping[str, Any], model_dir: str | Path | None = None) -> ModelSize:
    """The sizes of the model with config.json ``config``; its parameter count from the
    weights in ``model_dir`` when there are any, else from the configuration."""
    adapter = adapter_for(config)
    stored = safetensors_parameters(model_dir) if model_dir is not None else None
    return ModelSize(
        n_params=int(stored if stored is not None else config_parameters(config)),
        d_model=adapter.d_model,
        n_layers=adapter.n_layers,
        n_blocks=adapter.n_blocks,
        vocab_size=int(config.get("vocab_size") or 0),
    )


def mem_bytes(rule: str, s: ModelSize, w: Workload) -> float:
    """The arrays the job of ``rule`` holds at its peak (see the module doc), in bytes."""
    d, L, B = s.d_model, s.n_layers, s.n_blocks
    model32 = 4.0 * s.n_params
    hidden = (L + 1) * w.tokens * d * (8 + 4)  # float64 states and the float32 outputs
    weights64 = 8.0 * 4 * d * d * B
    run = (w.layers_run + 1) * w.tokens * d * 8.0
    phases = {
        "random_model": [1.05 * model32],
        "extract_weights": [8.0 * 10 * d * d + 2 * 4.0 * d * d],
        "spectra": [weights64 + 8.0 * 8 * d * d],
        # the real model's states stay while the simplified runs and their metrics run
        "propagate": [model32 + hidden, weights64 + hidden + 2 * run * 3],
        "steer": [
            model32 + hidden,
            # the variants' W_O', Delta and F' (d x d each) are held together
            weights64 + 3 * (L + 1) * w.tokens * d * 8.0 + w.variants * 3 * d * d * 8.0,
            model32 + L * w.tokens * d * 4.0 + 2 * w.tokens * s.vocab_size * 4.0,
        ],
    }
    if rule not in phases:
        raise ValueError(f"no memory model for rule {rule!r}; rules: {', '.join(RULES)}")
    return max(phases[rule])


def work_seconds(rule: str, s: ModelSize, w: Workload, threads: int) -> float:
    """The job's work at :data:`RATES` on ``threads`` cores, in seconds."""
    d, L, B = s.d_model, s.n_layers, s.n_blocks
    cores = max(int(threads), 1)
    eig = 25.0 * d**3 / (RATES["eig"] * cores)
    forward = 2.0 * s.n_params * w.tokens / (RATES["forward32"] * cores)
    io = 4.0 * s.n_params / RATES["io"]
    # one simplified layer: Q, K, V, O products of every token (4 x 2 d^2 flops each)
    layer = 8.0 * d * d * w.tokens / (RATES["gemm64"] * cores)
    # the alignment metrics: every state against 2 + null_draws directions, two correlations
    metrics = 2 * (w.layers_run + 1) * w.tokens * d * (3 + w.null_draws) * 2.0
    metrics /= RATES["gemm64"] * cores
    work = {
        "random_model": 2 * io,
        "extract_weights": io + B * 2.0 * d**3 / (RATES["gemm64"] * cores),
        "spectra": B * eig,
        "propagate": io + forward + 2 * w.layers_run * layer + metrics,
        "steer": 2 * io + 2 * forward + L * layer + w.variants * (eig + layer),
    }
    if rule not in work:
        raise ValueError(f"no time model for rule {rule!r}; rules: {', '.join(RULES)}")
    return work[rule]


def job_resources(rule: str, s: ModelSize, w: Workload, threads: int) -> dict[str, int]:
    """``mem_mb`` and ``runtime`` (minutes) of the job of ``rule`` for this model."""
    mem = BASE_BYTES + SAFETY * mem_bytes(rule, s, w)
    minutes = RUNTIME_FLOOR_MIN + RUNTIME_MARGIN * work_seconds(rule, s, w, threads) / 60
    return {"mem_mb": int(math.ceil(mem / 1e6 / 100) * 100), "runtime": int(math.ceil(minutes))}
