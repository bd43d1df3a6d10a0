"""Family adapters of GPT-2 (Conv1D weights stored (in, out), Q/K/V fused) and GPT-Neo (no
q/k/v bias, unscaled scores, alternating global and local layers): pre-LN causal LMs.

Each adapter's docstring names its traps; its ``doc_*`` attributes are its row of
the family table (docs/transformers.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specalign.transformers.load.families.base import (
    FamilyAdapter,
    TensorReader,
)
from specalign.transformers.weights import BlockWeights


class GPT2Adapter(FamilyAdapter):
    """GPT-2: pre-LN, causal, Conv1D layers.

    Traps: (1) ``Conv1D`` stores its weight as (in, out) — the transpose of
    nn.Linear — so every weight is transposed here. (2) Q, K, V are one fused
    ``c_attn`` with output dim 3*d_model in the order Q, K, V: after transposing, rows
    0:d are W_Q, d:2d W_K, 2d:3d W_V (the bias splits the same way). (3) Old checkpoints
    also hold ``h.{i}.attn.bias``, the causal-mask buffer; it is not a parameter.
    (4) ``scale_attn_by_inverse_layer_idx`` (a per-layer extra 1/(i+1)) cannot be
    expressed by one ``attn_scale`` and is refused.
    """

    model_type = "gpt2"
    doc_title = "GPT-2"
    doc_layout = "`h.{i}.attn.c_attn`, `c_proj` (Conv1D)"
    doc_notes = (
        "Conv1D stores W as (in, out): transposed. Q, K, V fused in `c_attn` along the output "
        "dimension: split into three. Pre-LN (`ln_1`), causal."
    )
    ffn_key = "n_inner"
    ln_position = "pre"
    causal = True
    causal_lm = True
    out_projection = "transformer.h.{layer}.attn.c_proj"
    out_projection_transposed = True
    probe = "h.0.attn.c_attn.weight"
    prefixes = ("transformer.", "")

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        if getattr(self.hf, "scale_attn_by_inverse_layer_idx", False):
            raise ValueError(
                "gpt2 config has scale_attn_by_inverse_layer_idx=True: the per-layer attention "
                "scale 1/(sqrt(d_head)*(layer+1)) is not supported by ModelWeights.attn_scale"
            )

    @property
    def attn_scale(self) -> float:
        return super().attn_scale if getattr(self.hf, "scale_attn_weights", True) else 1.0

    def read_block(self, block: int, reader: TensorReader) -> BlockWeights:
        p = f"h.{block}.attn"
        w_qkv = reader.get(f"{p}.c_attn.weight").T  # Conv1D (in, out) -> (out, in)
        b_qkv = reader.get(f"{p}.c_attn.bias")
        d = self.d_model
        if w_qkv.shape != (3 * d, d) or b_qkv.shape != (3 * d,):
            raise ValueError(
                f"gpt2 layer {block}: c_attn weight {w_qkv.shape[::-1]} / bias {b_qkv.shape}, "
                f"expected ({d}, {3 * d}) / ({3 * d},)"
            )
        q, k, v = (
            (w_qkv[s * d : (s + 1) * d].copy(), b_qkv[s * d : (s + 1) * d].copy()) for s in range(3)
        )
        o = (reader.get(f"{p}.c_proj.weight").T.copy(), reader.get(f"{p}.c_proj.bias"))
        return self._block(
            q, k, v, o, self._norm(reader, f"h.{block}.ln_1"), where=f"gpt2 layer {block}"
        )


class GPTNeoAdapter(FamilyAdapter):
    """GPT-Neo: pre-LN, causal, unscaled attention, alternating global/local layers.

    Traps: (1) q/k/v projections have no bias (zeros stored, ``has_bias`` False);
    ``out_proj`` has one. (2) The attention logits are NOT divided by sqrt(d_head)
    (``attn_scale`` = 1.0) — a port of Mesh-TensorFlow's behaviour the weights were
    trained with. (3) Layers alternate global and local attention per
    ``attention_layers`` (expanded from ``attention_types`` = [[[types...], repeat],
    ...]); a local layer lets token i see tokens j with i - window_size < j <= i.
    (4) Its hidden states are collected by a loop of its own, the last one after ``ln_f``.
    """

    model_type = "gpt_neo"
    doc_title = "GPT-Neo"
    doc_layout = "`h.{i}.attn.attention.{q,k,v,out}_proj`"
    doc_notes = (
        "No q/k/v bias (zeros, flagged). Scores are *not* scaled by 1/sqrt(d_head). Layers "
        "alternate global and local (windowed) attention. Pre-LN, causal. Its own loop "
        "appends the last hidden state after `ln_f` (replaced by the identity for the "
        "residual stream)."
    )
    ln_position = "pre"
    causal = True
    causal_lm = True
    final_norm_in_loop = "ln_f"
    out_projection = "transformer.h.{layer}.attn.attention.out_proj"
    probe = "h.0.attn.attention.q_proj.weight"
    prefixes = ("transformer.", "")

    def layer_attention(self) -> list[str]:
        layers = list(getattr(self.hf, "attention_layers", None) or [])
        if len(layers) != self.n_layers or set(layers) - {"global", "local"}:
            raise ValueError(
                f"gpt_neo attention_layers {layers} must list 'global'/'local' for each of "
                f"{self.n_layers} layers"
            )
        return layers

    @property
    def attn_scale(self) -> float:
        return 1.0

    @property
    def window_size(self) -> int | None:
        return int(getattr(self.hf, "window_size", None) or 256)

    def read_block(self, block: int, reader: TensorReader) -> BlockWeights:
        p = f"h.{block}.attn.attention"
        return self._block(
            *(self._linear(reader, f"{p}.{n}_proj") for n in ("q", "k", "v", "out")),
            self._norm(reader, f"h.{block}.ln_1"),
            where=f"gpt_neo layer {block}",
        )
