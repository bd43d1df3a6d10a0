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
(``BASE_BYTES``), times ``SAFETY``. The real model is never held whole: its passes and
the random twin are streamed one *unit* at a time (a decoder layer, the embeddings, the
LM head; ``streaming.py``, ``twin.py``). A streamed pass holds a decoder layer in
float32 and, while a tensor is cast, that tensor in its stored dtype; of the token
table only the rows of the prompts' ids; a causal LM's head in its stored dtype with one
slice of the vocabulary cast (``streaming.HEAD_SLICE_BYTES``):

* ``random_model``: the unit being drawn in float32 (the token table is the largest)
  and one slice of it cast (``twin.WRITE_SLICE_BYTES``);
* ``extract_weights``: one block at a time in float64 (it streams the checkpoint): W_Q
  and W_O at n_heads (2 d H d_head) with, where the block is factored (r = n_kv_heads
  d_head < d), K, V and W_O' at n_kv_heads as written (3 d r) and the stored bytes of the
  tensor being widened; where it is not, K and V at n_heads, their float32 reading, the
  key/value rows written (3 d r) and F (d^2); two blocks with two or more threads (one
  written while the next is read);
* ``spectra``: reads ``weights.h5`` a block at a time and decomposes up to ``threads``
  blocks at once (:func:`specalign.transformers.measure.spectra.map_blocks`). A dense block
  holds its float64 weights (4 d H d_head, K and V expanded, and W_O's transposed copy
  for the per-head products), F (d^2) and LAPACK's work arrays for the d x d
  eigen-decomposition (about 8 d^2 x 8); a factored one (r < d) reads only W_V', W_O
  and W_O' (d H d_head + 3 d r) and decomposes the r x r product (8 r^2 x 8); the
  per-block results (the directions and listed eigenvalues) of every block;
* ``propagate``: the streamed unit with a layer's float32 states (each state is written
  to a temporary file as its layer produces it, ``io.DiskStack``), then one block's
  float64 weights (read from ``weights.h5`` a block at a time, the one in use let go
  before the next is read, once for the two simplified runs, which advance together)
  and the current block's F or factors, the real states read back one at a time; the
  simplified runs are reduced to their metrics a state at a time
  (:class:`specalign.transformers.measure.metrics.MetricsStream`), so beside them only a
  few layers' states in float64 are held (``STREAM_LAYERS`` and
  ``SECOND_RUN_LAYERS``), never a run;
* ``steer``: the prompts' rows of the token table for the embedding output; one
  block's float64 weights (read a block at a time, as propagate) with a few layers'
  states (the unchanged run is reduced a state at a time), ``threads`` variants in the
  making (W_O', with Delta W_O as its rank-one factors, and their decomposition), every
  finished variant's W_O' written to disk in float32 (``io.DiskStack``); the streamed
  causal LM with one variant's W_O read back at a time, its layer or its head, the
  replayed layer output and, since the unchanged model
  and the variants advance through the units together (each unit read once), the
  hidden states and last position's logits of each. Nothing there grows with depth:
  glibc maps large blocks apart from its heap while a model streams
  (before, heap fragmentation added about two float32 states per layer).

A unit's size comes from config.json (:func:`unit_parameters`): a layer's grouped-query
attention (Q and O at n_heads d_head, K and V at n_kv_heads d_head), its feed-forward
(three d x f matrices where the FFN is gated, two otherwise), norms and biases; the
token embeddings; an untied LM head.

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

from specalign.transformers.load.families import adapter_for
from specalign.transformers.load.streaming import HEAD_SLICE_BYTES
from specalign.transformers.load.twin import WRITE_SLICE_BYTES

#: Resident memory of a job before any model array: Python, numpy, torch, transformers
#: and xarray imported (700-900 MB measured for the MiniLM jobs).
BASE_BYTES = 1.0 * 2**30
#: Margin on the estimated arrays (allocator fragmentation, temporaries not counted).
SAFETY = 1.3
#: Layer-sized float64 arrays (one state of every token) a streamed propagation holds
#: at once: the simplified step's own (the input, its norm, queries and keys, values,
#: context, drift and the next state), and the metrics' (each correlation's unit rows
#: of the previous state of the two modes fed together, the pair compared, Pearson's
#: centred copy, the projections).
STREAM_LAYERS = 16
#: What propagation's second simplified run adds, in the same unit: the two runs (real
#: and full attention) advance together, a layer at a time, so that weights.h5 is read
#: once for both; between its steps the other run holds its state and each
#: correlation's unit rows of it (tokens, mean tokens), and its temporaries interleave
#: with the first run's on the heap. 10: the Mistral-7B shape's simplified phase peaked
#: up to 0.25 GB (7.6 states) above the one-run-at-a-time pass (2.94 GB against 2.69;
#: three runs of the same code peaked at 2.37-2.94 GB, glibc's heap varying).
SECOND_RUN_LAYERS = 10
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
#: A job whose work on one core is under this many seconds asks for one core: a second
#: thread would save a few seconds at most, and two cores held by each small job kept
#: them from running side by side (the default config's nine series points: 45 jobs of
#: 5-7 s, mostly start-up, one at a time on 2 cores).
SMALL_JOB_SECONDS = 10.0
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
    #: the largest unit the twin draws whole in float32 (a layer, the embeddings, the head)
    unit_params: int = 0
    #: the largest single tensor (cast from its stored dtype one at a time)
    tensor_params: int = 0
    #: one decoder layer, the largest unit a streamed pass holds in float32 (the
    #: token table's rows are read for the ids alone; the head stays as stored)
    layer_params: int = 0
    #: the largest tensor of a layer (cast from its stored dtype one at a time)
    layer_tensor_params: int = 0
    #: the token table V x e: a causal LM's head (tied or not) holds it as stored
    vocab_params: int = 0
    #: bytes per stored value of the checkpoint (2 for bf16)
    stored_bytes: float = 4.0
    #: H d_head: the width of W_O's input (the steering variants are d x H d_head)
    inner: int = 0
    #: r = n_kv_heads d_head, the rank bound of F = W_O W_V (0: the same as ``inner``);
    #: a block with r < d is handled through its factors, without a d x d F (issue 14)
    rank: int = 0
    #: the width of one attention head (0: unknown, taken as 128)
    d_head: int = 0

    @property
    def factored(self) -> bool:
        """Whether F is kept and decomposed as its factors (r < d)."""
        return (self.rank or self.inner or self.d_model) < self.d_model

    @property
    def eig_size(self) -> int:
        """n of the n x n eigen-decomposition per block: r when factored, else d."""
        return (self.rank or self.inner or self.d_model) if self.factored else self.d_model


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
    damaged file (:mod:`specalign.transformers.load.checkpoint`)."""
    from specalign.transformers.load.checkpoint import CheckpointError, stored_parameters

    try:
        return stored_parameters(model_dir)
    except CheckpointError:
        return None


def unit_parameters(config: Mapping[str, Any]) -> dict[str, int]:
    """Parameters of each kind of unit a streamed pass holds at once, from config.json:
    ``layer`` (one decoder layer: grouped-query attention with its biases where the
    family has them, the feed-forward, two norms), ``embeddings`` (tokens, positions,
    ALBERT's and OPT-350m's projection), ``head`` (the LM head when untied, else 0)."""
    adapter = adapter_for(config)
    d, H, kv, dh = adapter.d_model, adapter.n_heads, adapter.n_kv_heads, adapter.d_head
    f = adapter.d_ffn
    hf = adapter.hf
    bias = adapter.attention_bias
    attention = 2 * d * H * dh + 2 * d * kv * dh + (bias * (H * dh + 2 * kv * dh + d))
    ffn = (3 * d * f) if adapter.gated_ffn else (2 * d * f + f + d)
    layer = attention + ffn + 4 * d
    vocab = int(config.get("vocab_size") or 0)
    positions = 0 if adapter.rotary_style else int(adapter.max_positions or 0)
    e = int(config.get("embedding_size") or config.get("word_embed_proj_dim") or d)
    embeddings = (vocab + positions) * e + (e * d if e != d else 0)
    tied = bool(getattr(hf, "tie_word_embeddings", True))
    head = 0 if tied or not adapter.causal_lm else vocab * e
    return {"layer": layer, "embeddings": embeddings, "head": head}


def config_parameters(config: Mapping[str, Any]) -> int:
    """The parameter count a transformer of config.json's sizes has, when its weights are
    not on disk (a hub model not fetched yet): every distinct block's layer, the
    embeddings and an untied head (:func:`unit_parameters`); within 3 % of the
    instantiated architecture for the paper's and today's families (tested)."""
    units = unit_parameters(config)
    return adapter_for(config).n_blocks * units["layer"] + units["embeddings"] + units["head"]


def stored_bytes_per_value(config: Mapping[str, Any], model_dir: str | Path | None) -> float:
    """Bytes per stored value: from the safetensors headers when the weights are on disk,
    else config.json's ``dtype`` / ``torch_dtype`` (float32 when it names none)."""
    if model_dir is not None:
        from specalign.transformers.load.checkpoint import (
            CheckpointError,
            read_header,
            safetensors_files,
        )

        total = count = 0
        try:  # bounded headers of the one checkpoint; a damaged one is named by its jobs
            for path in safetensors_files(model_dir):
                for entry in read_header(path).values():
                    n = math.prod(entry["shape"])
                    total += n * _DTYPE_BYTES.get(entry["dtype"], 4)
                    count += n
        except CheckpointError:
            total = count = 0
        if count:
            return total / count
    name = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return {"bfloat16": 2.0, "float16": 2.0, "float64": 8.0}.get(name, 4.0)


_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}  # fmt: skip


def model_size(config: Mapping[str, Any], model_dir: str | Path | None = None) -> ModelSize:
    """The sizes of the model with config.json ``config``; its parameter count from the
    weights in ``model_dir`` when there are any, else from the configuration."""
    adapter = adapter_for(config)
    stored = safetensors_parameters(model_dir) if model_dir is not None else None
    units = unit_parameters(config)
    d = adapter.d_model
    vocab = int(config.get("vocab_size") or 0)
    f = adapter.d_ffn
    e = int(config.get("embedding_size") or config.get("word_embed_proj_dim") or d)
    layer_tensor = max(d * adapter.n_heads * adapter.d_head,
                       d * f * (2 if adapter.fused_gate_up else 1))  # fmt: skip
    return ModelSize(
        n_params=int(stored if stored is not None else config_parameters(config)),
        d_model=d,
        n_layers=adapter.n_layers,
        n_blocks=adapter.n_blocks,
        vocab_size=vocab,
        unit_params=max(units.values()),
        tensor_params=max(vocab * d, layer_tensor),
        layer_params=units["layer"],
        layer_tensor_params=layer_tensor,
        vocab_params=vocab * e,
        stored_bytes=stored_bytes_per_value(config, model_dir),
        inner=adapter.n_heads * adapter.d_head,
        rank=int(adapter.n_kv_heads or adapter.n_heads) * adapter.d_head,
        d_head=adapter.d_head,
    )


def phase_bytes(rule: str, s: ModelSize, w: Workload, threads: int = 1) -> dict[str, float]:
    """The arrays the job of ``rule`` holds in each of its phases (see the module doc),
    in bytes, by phase name; the phases that stream the real model are ``streamed*``.
    ``threads``: the job's cores (``spectra`` decomposes that many blocks at once)."""
    d, B = s.d_model, s.n_blocks
    # the twin draws a unit whole in float32 and casts it a slice at a time
    twin_unit = 4.0 * (s.unit_params or s.n_params) + WRITE_SLICE_BYTES
    # a streamed pass: a layer in float32 while its largest tensor is cast from the
    # stored dtype (of the token table only the prompts' rows); a causal LM's head as
    # stored, cast a slice of the vocabulary at a time
    unit = 4.0 * (s.layer_params or s.unit_params or s.n_params) + s.stored_bytes * (
        s.layer_tensor_params or s.tensor_params
    )
    head = s.stored_bytes * s.vocab_params + HEAD_SLICE_BYTES
    layer64 = w.tokens * d * 8.0  # one state of every token in float64
    inner = s.inner or d
    r, n = s.rank or inner, s.eig_size
    dense_F = 0.0 if s.factored else 1.0 * d * d
    # one block in float64 as read (K, V expanded), with the grouped rows and W_O'
    block64 = 8.0 * (4 * d * inner + 3 * d * r + dense_F)
    # ... and what one decomposition adds: W_O's transposed copy (per-head products),
    # the factors W_O', W_V', LAPACK's n x n work arrays
    eig64 = 8.0 * (d * inner + 2 * d * r + 8 * n * n)
    # per block kept to the end: 13 d-vectors (v1, v2, directions, bases), n eigenvalues
    results = B * 8.0 * (13 * d + 2 * n) * 2  # and their stacked copy in the dataset
    # a factored block's spectra read only W_V' and W_O (and W_O' to check it), not the
    # block: W_O (d H d_head), W_V', W_O' read and W_O' summed (3 d r), the r x r product,
    # its complex eigenvectors and LAPACK's work arrays (8 n^2 x 8)
    spectra_block = (
        8.0 * (d * inner + 3 * d * r + 8 * n * n) if s.factored else block64 + eig64
    )
    # a block as extraction holds it: where it is factored, W_Q and W_O at n_heads and
    # K, V and W_O' at n_kv_heads in float64 (K and V are read as stored, never
    # expanded), with the stored bytes of the tensor being widened; otherwise the block
    # as read and its float32 reading
    extract_block = (
        8.0 * (2 * d * inner + 3 * d * r) + s.stored_bytes * d * inner
        if s.factored
        else block64 + 2 * 4.0 * d * inner
    )
    phases = {
        "random_model": {"streamed twin": twin_unit},
        # with two or more threads block b is written while block b + 1 is read
        "extract_weights": {"block": min(2 if int(threads) > 1 else 1, B) * extract_block},
        "spectra": {"blocks": min(max(int(threads), 1), B) * spectra_block + results},
        # the real model's states go to a file as they come (a layer's input and output
        # in memory); then the two simplified runs, side by side, read weights.h5 a
        # block at a time (the one in use let go before the next is read) with the
        # current block's F or factors, each state reduced to its metrics as it is
        # computed
        "propagate": {
            "streamed real model": unit + 2 * w.tokens * d * 4.0,
            "simplified runs": block64
            + 8.0 * (2 * d * r if s.factored else d * d)
            + (STREAM_LAYERS + SECOND_RUN_LAYERS) * layer64,
        },
        "steer": {
            # the token table's rows of the prompts' ids and the embedding output
            "streamed embeddings": 2 * w.tokens * d * (4.0 + 8.0),
            # the variants' W_O', Delta and F' (d x d each) are held together
            # weights.h5 read a block at a time (the one in use let go before the next)
            # the unchanged run a state at a time (its last two kept); ``threads``
            # variants at once, each with W_O' (Delta is kept as its rank-one factors), a
            # copy of it for the steered last layer's run, and its decomposition (F' and
            # the d x d work arrays where the block is dense, the r x r ones if factored);
            # every variant's W_O' is cast to float32 and written to disk as it is made
            "simplified steering": block64
            + STREAM_LAYERS * layer64
            + min(max(int(threads), 1), w.variants)
            * 8.0
            * (2 * d * inner + (0.0 if s.factored else d * d) + 8 * n * n),
            # one variant's W_O read back from disk when its forward reaches the layer
            # (and its transposed copy for GPT-2's Conv1D), the replayed layer output
            # with one layer's activations; the unchanged pass and the variants advance
            # together (a unit read once for all): each one's states and last position's
            # logits at once. Nothing grows with depth since glibc maps large blocks
            # apart from its heap while a model streams (streaming.STREAM_MMAP_THRESHOLD;
            # before, the peak grew by about two float32 states per layer)
            "streamed causal LM": max(unit, head)
            + 2 * d * inner * 4.0
            + (w.variants + 2) * w.tokens * d * 4.0
            + (w.variants + 2) * w.n_prompts * s.vocab_size * 4.0,
        },
    }
    if rule not in phases:
        raise ValueError(f"no memory model for rule {rule!r}; rules: {', '.join(RULES)}")
    return phases[rule]


def mem_bytes(rule: str, s: ModelSize, w: Workload, threads: int = 1) -> float:
    """The arrays the job of ``rule`` holds at its peak (the largest of its phases)."""
    return max(phase_bytes(rule, s, w, threads).values())


def work_seconds(rule: str, s: ModelSize, w: Workload, threads: int) -> float:
    """The job's work at :data:`RATES` on ``threads`` cores, in seconds."""
    d, L, B = s.d_model, s.n_layers, s.n_blocks
    cores = max(int(threads), 1)
    eig = 25.0 * d**3 / (RATES["eig"] * cores)
    inner = s.inner or d
    r, n = s.rank or inner, s.eig_size
    # a block's float64 weights.h5 datasets (K, V and W_O' at n_kv_heads; F if dense)
    block_file = 8.0 * (2 * d * inner + 2 * d * r + (d * r if s.factored else d * d))
    # spectra per block: the n x n decomposition, M = W_V' W_O' (2 d r^2), the
    # per-head products W_V^h W_O^h (2 d inner d_head) and their eigenvalues (eigvals,
    # ~10 d_head^3 a head)
    dh = s.d_head or 128
    spectra_block = (25.0 * n**3 + 10.0 * inner * dh * dh) / RATES["eig"]
    spectra_block += (2.0 * d * r * r * s.factored + 2.0 * d * inner * dh) / RATES["gemm64"]
    forward = 2.0 * s.n_params * w.tokens / (RATES["forward32"] * cores)
    io = s.stored_bytes * s.n_params / RATES["io"]
    # one simplified layer: Q, K, V, O products of every token (4 x 2 d^2 flops each)
    layer = 8.0 * d * d * w.tokens / (RATES["gemm64"] * cores)
    # the alignment metrics: every state against 2 + null_draws directions, two correlations
    metrics = 2 * (w.layers_run + 1) * w.tokens * d * (3 + w.null_draws) * 2.0
    metrics /= RATES["gemm64"] * cores
    work = {
        "random_model": 2 * io,
        # F = W_O W_V (2 d^2 H d_head) only where it is stored; writing the blocks
        "extract_weights": io
        + B * (0.0 if s.factored else 2.0 * d * d * inner) / (RATES["gemm64"] * cores)
        + B * block_file / RATES["io"],
        "spectra": B * spectra_block / cores + B * block_file / RATES["io"],
        "propagate": io + forward + 2 * w.layers_run * layer + metrics,
        "steer": 2 * io + 2 * forward + L * layer + w.variants * (eig + layer),
    }
    if rule not in work:
        raise ValueError(f"no time model for rule {rule!r}; rules: {', '.join(RULES)}")
    return work[rule]


def job_threads(rule: str, s: ModelSize, w: Workload, threads: int) -> int:
    """The cores the job of ``rule`` asks for: ``threads``, or one when its work on one
    core (:func:`work_seconds`) is under :data:`SMALL_JOB_SECONDS`."""
    if int(threads) <= 1 or work_seconds(rule, s, w, 1) < SMALL_JOB_SECONDS:
        return 1
    return int(threads)


def job_resources(rule: str, s: ModelSize, w: Workload, threads: int) -> dict[str, int]:
    """``mem_mb`` and ``runtime`` (minutes) of the job of ``rule`` for this model."""
    mem = BASE_BYTES + SAFETY * mem_bytes(rule, s, w, threads)
    minutes = RUNTIME_FLOOR_MIN + RUNTIME_MARGIN * work_seconds(rule, s, w, threads) / 60
    return {"mem_mb": int(math.ceil(mem / 1e6 / 100) * 100), "runtime": int(math.ceil(minutes))}
