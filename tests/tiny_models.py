"""Tiny random models of every supported family, keyed by config.json ``model_type``,
built offline: the one catalogue of tiny configurations, from which the family tests,
the hub tests (``hub_mirror.py``) and the tiny twins of ``config/modern_test.yaml`` are
built (``TWINS``; ``python tests/tiny_models.py`` rewrites that file's models, and
``test_modern_test_yaml_is_the_catalogue`` fails while they differ).

``TINY_CONFIGS`` holds one small configuration per family adapter in
``specalign.transformers.load.families.FAMILIES`` and ``BUILDERS`` a builder of each; the
tests that serve or extract "every supported family" check these key sets against
``FAMILIES``, so a new family adds one entry to ``CONFIGS``. The other cases of
``CONFIGS`` are variants of a family with a layout of their own (OPT's post-LN 350m
style). The configurations are chosen so that each family's traps show:

* grouped-query attention with 1 < n_kv_heads < n_heads (with 1 or n_heads key/value
  heads the wrong h % KV head mapping gives the right F);
* ``head_dim`` != d_model / n_heads where the family has the key;
* sliding windows shorter than the test prompts, layer patterns (Qwen2's
  ``max_window_layers``, Gemma 2's even layers, Gemma 3's pattern);
* fused Q/K/V layouts (GPT-2 contiguous, NeoX per head, Phi-3 contiguous grouped,
  Falcon's grouped per key/value head and multi-query);
* partial rotary (NeoX, GPT-J, Phi-3), llama3 rope scaling that bites at short range,
  a Gemma 2 softcap that bites, Gemma 2/3's query_pre_attn_scalar != head_dim;
* biases, pre/post-LN, project_in/out (OPT-350m style).

``build`` (float64 head models, for the family tests) re-draws every norm weight and
zero bias (they initialise to ones/zeros, which would hide a w vs 1 + w or a missing-bias
mistake). ``float64_everywhere`` makes the instantiated modules compute in float64 end to
end: stock ``transformers`` computes RMSNorm, rotary tables, eager softmax (and GPT-J's
whole score matrix) in float32 even in a float64 model, which floors any comparison at
about 1e-7. It changes no formula.
``tiny_model``, ``save_tiny`` and ``save_tiny_pickled`` give the float32 base models the
hub tests serve (weights from transformers' own initialisation under a fixed seed).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import yaml

from specalign.transformers.load.families import adapter_class

_ROPE = {"max_position_embeddings": 64, "vocab_size": 96}
_GQA = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, **_ROPE}  # fmt: skip
_GEMMA = {**_GQA, "hidden_size": 48, "head_dim": 16}
_ENCODER = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 64, "vocab_size": 96, "max_position_embeddings": 64}  # fmt: skip

#: case name -> config.json content (``model_type`` and the family's keys).
CONFIGS: dict[str, dict[str, Any]] = {
    "bert": {"model_type": "bert", **_ENCODER},
    "roberta": {"model_type": "roberta", **_ENCODER, "pad_token_id": 1, "bos_token_id": 0,
                "eos_token_id": 2, "type_vocab_size": 1},
    "distilbert": {"model_type": "distilbert", "dim": 32, "hidden_dim": 64, "n_layers": 2,
                   "n_heads": 4, "vocab_size": 96, "max_position_embeddings": 64},
    "albert": {"model_type": "albert", **_ENCODER, "num_hidden_layers": 3,
               "embedding_size": 16},
    "gpt2": {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 96,
             "n_positions": 64, "bos_token_id": 0, "eos_token_id": 0},
    "gpt_neo": {"model_type": "gpt_neo", "hidden_size": 32, "num_layers": 2, "num_heads": 4,
                "window_size": 4, "attention_types": [[["global", "local"], 1]],
                "vocab_size": 96, "max_position_embeddings": 64, "bos_token_id": 0,
                "eos_token_id": 0},
    # Pythia: fused per-head interleaved QKV, rotary on a quarter of each head, parallel.
    "gpt_neox": {"model_type": "gpt_neox", "hidden_size": 64, "intermediate_size": 96,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "rotary_pct": 0.25,
                 "use_parallel_residual": True, **_ROPE},
    # GPT-J: interleaved rotary on the first 8 of 16 dims of each head.
    "gptj": {"model_type": "gptj", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_inner": 96,
             "rotary_dim": 8, "vocab_size": 96, "n_positions": 64, "bos_token_id": 0,
             "eos_token_id": 0},
    # Falcon 40B/180B style: Q/K/V grouped per key/value head (2 of 4), two norms
    # (ln_attn, ln_mlp), parallel attention and MLP, biases on.
    "falcon": {"model_type": "falcon", "hidden_size": 64, "ffn_hidden_size": 96,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_kv_heads": 2,
               "new_decoder_architecture": True, "bias": True, "rope_theta": 1000.0,
               "bos_token_id": 0, "eos_token_id": 0, **_ROPE},
    # Falcon 7B style: multi-query (one key/value head, contiguous [Q | K | V]), one
    # shared input_layernorm, parallel attention and MLP, no biases.
    "falcon_multi_query": {"model_type": "falcon", "hidden_size": 64, "ffn_hidden_size": 96,
                           "num_hidden_layers": 2, "num_attention_heads": 4,
                           "multi_query": True, "parallel_attn": True, "bias": False,
                           "bos_token_id": 0, "eos_token_id": 0, **_ROPE},
    # Falcon with neither flag: Q/K/V interleaved per head (as NeoX), sequential residual
    # (post_attention_layernorm is the MLP's norm).
    "falcon_per_head": {"model_type": "falcon", "hidden_size": 64, "ffn_hidden_size": 96,
                        "num_hidden_layers": 2, "num_attention_heads": 4, "multi_query": False,
                        "parallel_attn": False, "bias": True, "bos_token_id": 0,
                        "eos_token_id": 0, **_ROPE},
    "opt": {"model_type": "opt", "hidden_size": 64, "ffn_dim": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "word_embed_proj_dim": 64, "do_layer_norm_before": True,
            **_ROPE},
    # OPT-350m style: post-LN, embeddings in 32 dims through project_in, project_out.
    "opt_post_ln": {"model_type": "opt", "hidden_size": 64, "ffn_dim": 96,
                    "num_hidden_layers": 2, "num_attention_heads": 4,
                    "word_embed_proj_dim": 32, "do_layer_norm_before": False, **_ROPE},
    # Llama 3.2 style: llama3 rope scaling with a short original context, so it bites.
    "llama": {"model_type": "llama", **_GQA, "tie_word_embeddings": True,
              "rope_theta": 500000.0,
              "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}},
    "mistral": {"model_type": "mistral", **_GQA, "sliding_window": 4},
    # Qwen2 with its window switched on: layers >= max_window_layers slide.
    "qwen2": {"model_type": "qwen2", **_GQA, "use_sliding_window": True, "sliding_window": 4,
              "max_window_layers": 1},
    "qwen3": {"model_type": "qwen3", **_GQA, "head_dim": 24},
    "gemma": {"model_type": "gemma", **_GEMMA},
    "gemma2": {"model_type": "gemma2", **_GEMMA, "query_pre_attn_scalar": 20,
               "sliding_window": 3, "attn_logit_softcapping": 5.0,
               "final_logit_softcapping": 30.0},
    "gemma3_text": {"model_type": "gemma3_text", **_GEMMA, "num_hidden_layers": 3,
                    "query_pre_attn_scalar": 20, "sliding_window": 3,
                    "sliding_window_pattern": 2, "rope_theta": 1000000.0,
                    "rope_local_base_freq": 10000.0},
    # OLMo 1: LayerNorm without parameters (no norm tensors in the checkpoint).
    "olmo": {"model_type": "olmo", **_GQA, "num_key_value_heads": 4},
    "phi3": {"model_type": "phi3", **_GQA, "sliding_window": 5, "partial_rotary_factor": 0.5,
             "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
             "tie_word_embeddings": False},
}  # fmt: skip


#: checkpoint of config/modern.yaml -> the case of CONFIGS that its tiny twin
#: ``<checkpoint>_tiny`` in config/modern_test.yaml is (one per family beyond the paper's
#: four, two for OPT's two layouts; Falcon's other two layouts are cases of the family
#: tests only): the twin carries the case's traps, not the checkpoint's size.
TWINS: dict[str, str] = {
    "pythia-160m": "gpt_neox",
    "gpt-j-6b": "gptj",
    "falcon-7b": "falcon_multi_query",
    "opt-125m": "opt",
    "opt-350m": "opt_post_ln",
    "llama-3.2-1b": "llama",
    "qwen2.5-0.5b": "qwen2",
    "qwen3-0.6b": "qwen3",
    "mistral-7b-v0.3": "mistral",
    "gemma-2b": "gemma",
    "gemma-2-2b": "gemma2",
    "gemma-3-1b": "gemma3_text",
    "phi-3-mini": "phi3",
    "olmo-1b": "olmo",
    "roberta-base": "roberta",
    "distilbert-base": "distilbert",
}
#: The twin whose own random twin (``like:``) exercises the null baseline of a model that
#: is itself built from a configuration.
NULL_TWIN_OF = "llama-3.2-1b"


def modern_test_models() -> dict[str, dict[str, Any]]:
    """``transformers.models`` of config/modern_test.yaml, derived from ``TWINS``: each
    twin ``source: random`` with its case's configuration, then the null twin."""
    models: dict[str, dict[str, Any]] = {
        f"{checkpoint}_tiny": {"source": "random", "config": copy.deepcopy(CONFIGS[case])}
        for checkpoint, case in TWINS.items()
    }
    like = f"{NULL_TWIN_OF}_tiny"
    models[f"{like}_random"] = {"source": "random", "like": like, "seed": 1}
    return models


_MODELS_KEY = "  models:\n"  # under ``transformers:`` in the file


def with_modern_test_models(text: str) -> str:
    """The text of config/modern_test.yaml with its ``transformers.models`` block
    replaced by :func:`modern_test_models` (comments elsewhere kept): the block runs
    from ``  models:`` to the next key of ``transformers``."""
    head, sep, rest = text.partition(_MODELS_KEY)
    if not sep:
        raise ValueError("no 'models:' key under 'transformers:' in config/modern_test.yaml")
    lines = rest.splitlines(keepends=True)
    end = next(
        (i for i, line in enumerate(lines) if line.startswith("  ") and line[2] not in " #"),
        len(lines),
    )
    block = [
        "    # Written by `python tests/tiny_models.py` from its CONFIGS and TWINS (edit those):\n",
        "    # each twin is its family's tiny test case, traps included.\n",
    ]
    for name, spec in modern_test_models().items():
        block.append(f"    {name}:\n")
        for key, value in spec.items():
            # one flow mapping a value, continued 8 columns in: the file stays readable
            flow = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=80).strip()
            flow = flow.removesuffix("\n...").splitlines()
            block.append(f"      {key}: {flow[0]}\n")
            block.extend(f"        {line.strip()}\n" for line in flow[1:])
    indented = "".join(block)
    return head + sep + indented + "".join(lines[end:])


def head_class(model_type: str) -> Any:
    """The head model a hub checkpoint of the family is saved from: the causal LM where
    the family has one, else the masked LM."""
    import transformers

    if adapter_class(model_type).causal_lm:
        return transformers.AutoModelForCausalLM
    return transformers.AutoModelForMaskedLM


def _instantiate(case: str, head: bool, seed: int, **dtype: Any) -> Any:
    """The model of ``case`` as transformers initialises it under ``seed``, in the
    default dtype unless ``dtype=`` says otherwise (left to the default, a model built
    inside :func:`float64_everywhere` is float64 from the start: buffers such as Gemma's
    embedding scale are then exact)."""
    import transformers

    config = copy.deepcopy(CONFIGS[case])
    model_type = config.pop("model_type")
    cfg = transformers.AutoConfig.for_model(model_type, **config)
    torch.manual_seed(seed)
    cls = head_class(model_type) if head else transformers.AutoModel
    return cls.from_config(cfg, attn_implementation="eager", **dtype).eval()


def build(case: str, *, head: bool = True, seed: int = 0) -> Any:
    """The tiny model of ``case`` (a key of CONFIGS) in float64, eval mode, eager
    attention, every norm weight and zero bias re-drawn (seeded)."""
    model = _instantiate(case, head, seed).to(torch.float64)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = "norm" in name.lower() or ".ln_" in name or name.startswith("ln_")
            if is_norm or (name.endswith(".bias") and not p.abs().max() > 0):
                p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def save(case: str, folder: Path, **kwargs: Any) -> tuple[Any, Path]:
    """``build(case)`` saved to ``folder`` with ``save_pretrained`` (float64 safetensors)."""
    model = build(case, **kwargs)
    model.save_pretrained(str(folder))
    return model, folder


#: model_type -> its tiny configuration (the case named after the model_type), without
#: the ``model_type`` key, as ``AutoConfig.for_model(model_type, **config)`` takes it.
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    case: {k: v for k, v in cfg.items() if k != "model_type"}
    for case, cfg in CONFIGS.items()
    if case == cfg["model_type"]
}

#: model_type -> builder of its tiny float64 model.
BUILDERS: dict[str, Callable[..., Any]] = {
    model_type: functools.partial(build, model_type) for model_type in TINY_CONFIGS
}


def tiny_model(model_type: str, seed: int) -> Any:
    """A float32 base model (``AutoModel``) of ``model_type``, as initialised under
    ``seed``: what the hub tests serve."""
    return _instantiate(model_type, head=False, seed=seed, dtype=torch.float32)


def save_tiny(model_type: str, folder: str | Path, seed: int, **save_kwargs: Any) -> Path:
    """Save a tiny model as ``save_pretrained`` does (safetensors; ``max_shard_size``
    in ``save_kwargs`` shards it)."""
    tiny_model(model_type, seed).save_pretrained(str(folder), **save_kwargs)
    return Path(folder)


def save_tiny_pickled(model_type: str, folder: str | Path, seed: int) -> Path:
    """config.json and a pickled ``pytorch_model.bin`` only, as transformers 4.x saved
    checkpoints (5.x writes safetensors only)."""
    model = tiny_model(model_type, seed)
    folder = Path(folder)
    model.config.save_pretrained(str(folder))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    torch.save(state, folder / "pytorch_model.bin")
    return folder


@contextlib.contextmanager
def float64_everywhere() -> Iterator[None]:
    """Every float32 request inside torch/transformers becomes float64 (``Tensor.to``,
    ``Tensor.float``, ``softmax(dtype=)``, ``arange(dtype=)``, the default dtype), so that
    the modules compute exactly what they compute normally, in float64.

    Nothing is read from or kept in :mod:`specalign.kept` meanwhile: its keys name the
    library versions, not this patch, so a rotary family's frequencies kept from a float32
    computation would be read here (and these kept for later float32 readers), which made
    the family tests depend on which test a worker ran first."""
    f32, f64 = torch.float32, torch.float64
    cache = os.environ.get("SPECALIGN_CACHE")
    saved = (torch.Tensor.to, torch.Tensor.float, torch.nn.functional.softmax, torch.arange)
    default = torch.get_default_dtype()
    orig_to, _, orig_softmax, orig_arange = saved

    def sub(x: Any) -> Any:
        return f64 if x is f32 else x

    def to(self: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        return orig_to(self, *(sub(x) for x in a), **{kk: sub(v) for kk, v in k.items()})

    def as_float(self: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        return orig_to(self, f64)

    def softmax(input: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> Any:  # noqa: A002
        return orig_softmax(input, dim=dim, dtype=sub(dtype))

    def arange(*a: Any, **k: Any) -> torch.Tensor:
        if "dtype" in k:
            k["dtype"] = sub(k["dtype"])
        return orig_arange(*a, **k)

    torch.Tensor.to, torch.Tensor.float = to, as_float  # type: ignore[method-assign]
    torch.nn.functional.softmax, torch.arange = softmax, arange
    torch.set_default_dtype(f64)
    os.environ["SPECALIGN_CACHE"] = ""
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.float, torch.nn.functional.softmax, torch.arange = saved  # type: ignore[method-assign]
        torch.set_default_dtype(default)
        if cache is None:
            os.environ.pop("SPECALIGN_CACHE", None)
        else:
            os.environ["SPECALIGN_CACHE"] = cache


if __name__ == "__main__":
    # python tests/tiny_models.py [config/modern_test.yaml]: rewrite the twins from CONFIGS
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "config/modern_test.yaml")
    target.write_text(with_modern_test_models(target.read_text()))
