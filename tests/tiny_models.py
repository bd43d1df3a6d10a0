"""Tiny random models of every supported family, keyed by config.json ``model_type``.

``TINY_CONFIGS`` holds one small configuration per family adapter in
``specalign.transformers.families.FAMILIES``; the tests that serve or extract "every
supported family" check the two key sets against each other, so a new family adds one
entry here. Weights come from transformers' own initialisation under a fixed seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

D, HEADS, VOCAB = 32, 4, 100
_COMMON = {"vocab_size": VOCAB, "max_position_embeddings": 64}

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "bert": {
        "hidden_size": D, "num_hidden_layers": 2, "num_attention_heads": HEADS,
        "intermediate_size": 64, **_COMMON,
    },
    "albert": {
        "embedding_size": 16, "hidden_size": D, "num_hidden_layers": 3,
        "num_attention_heads": HEADS, "intermediate_size": 64, **_COMMON,
    },
    # bos/eos inside the tiny vocabulary (the defaults, 50256, are not)
    "gpt2": {
        "n_embd": D, "n_layer": 2, "n_head": HEADS, "vocab_size": VOCAB, "n_positions": 64,
        "bos_token_id": 0, "eos_token_id": 0,
    },
    "gpt_neo": {
        "hidden_size": D, "num_layers": 2, "num_heads": HEADS, "window_size": 8,
        "attention_types": [[["global", "local"], 1]], "bos_token_id": 0, "eos_token_id": 0,
        **_COMMON,
    },
}  # fmt: skip


def tiny_model(model_type: str, seed: int) -> Any:
    """A float32 ``AutoModel`` of ``model_type`` with the tiny configuration, seeded."""
    import torch
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model(model_type, **TINY_CONFIGS[model_type])
    torch.manual_seed(seed)
    return AutoModel.from_config(config, dtype=torch.float32).eval()


def save_tiny(model_type: str, folder: str | Path, seed: int, **save_kwargs: Any) -> Path:
    """Save a tiny model as ``save_pretrained`` does (safetensors; ``max_shard_size``
    in ``save_kwargs`` shards it)."""
    tiny_model(model_type, seed).save_pretrained(str(folder), **save_kwargs)
    return Path(folder)


def save_tiny_pickled(model_type: str, folder: str | Path, seed: int) -> Path:
    """config.json and a pickled ``pytorch_model.bin`` only, as transformers 4.x saved
    checkpoints (5.x writes safetensors only)."""
    import torch

    model = tiny_model(model_type, seed)
    folder = Path(folder)
    model.config.save_pretrained(str(folder))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    torch.save(state, folder / "pytorch_model.bin")
    return folder
