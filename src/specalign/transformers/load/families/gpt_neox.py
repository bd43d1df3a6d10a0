"""Family adapters of GPT-NeoX / Pythia: Q/K/V fused and interleaved per head, partial
rotary, parallel residual.

Each adapter's docstring names its traps; its ``doc_*`` attributes are its row of
the family table (docs/transformers.md)."""

from __future__ import annotations

import numpy as np

from specalign.transformers.load.families.base import (
    FamilyAdapter,
    TensorReader,
    kept_rotary,
)
from specalign.transformers.weights import BlockWeights


class GPTNeoXAdapter(FamilyAdapter):
    """GPT-NeoX (Pythia): pre-LN, causal, fused interleaved Q/K/V, partial rotary.

    Traps: (1) ``attention.query_key_value`` (3 d, d) is interleaved PER HEAD: its rows
    reshape to (H, 3, d_head, d), V = [:, 2] (the naive split [2d:3d] gives another F);
    the bias splits the same way. (2) Rotary on the first ``rotary_pct`` of each head
    only (a top-level ``partial_rotary_factor`` is ignored by NeoX). (3) Parallel
    residual by default (``use_parallel_residual``): x + attn(ln1 x) + mlp(ln2 x). (4)
    ``post_attention_layernorm`` is the MLP's LayerNorm.
    """

    model_type = "gpt_neox"
    doc_title = "GPT-NeoX / Pythia"
    doc_layout = "`layers.{i}.attention.query_key_value` (3d, d), `attention.dense`"
    doc_notes = (
        "Fused Q/K/V interleaved *per head*: rows reshape to (H, 3, d_head, d), V = [:, 2] "
        "(GPT-2's contiguous split gives another F). Rotary on the first `rotary_pct` of each "
        "head. Parallel residual x + attn(ln1 x) + mlp(ln2 x). Pre-LN."
    )
    ln_position = "pre"
    causal = True
    causal_lm = True
    rotary_style = "half"
    out_projection = "gpt_neox.layers.{layer}.attention.dense"
    probe = "layers.0.attention.query_key_value.weight"
    prefixes = ("gpt_neox.", "")

    @property
    def residual(self) -> str:  # type: ignore[override]
        return "parallel" if getattr(self.hf, "use_parallel_residual", True) else "sequential"

    def rotary(self) -> tuple[np.ndarray, np.ndarray] | None:
        return kept_rotary(self.config, ["full_attention"] * self.n_layers)

    def read_block(self, block: int, reader: TensorReader) -> BlockWeights:
        p = f"layers.{block}.attention"
        H, dh, d = self.n_heads, self.d_head, self.d_model
        w, b = self._linear(reader, f"{p}.query_key_value")
        if w.shape != (3 * d, d):
            raise ValueError(f"gpt_neox layer {block}: query_key_value {w.shape}, not {(3 * d, d)}")
        w = w.reshape(H, 3, dh, d)
        b = None if b is None else b.reshape(H, 3, dh)
        q, k, v = (
            (w[:, s].reshape(H * dh, d).copy(), None if b is None else b[:, s].reshape(-1).copy())
            for s in range(3)
        )
        return self._block(
            q,
            k,
            v,
            self._linear(reader, f"{p}.dense"),
            self._norm(reader, f"layers.{block}.input_layernorm"),
            where=f"gpt_neox layer {block}",
        )
