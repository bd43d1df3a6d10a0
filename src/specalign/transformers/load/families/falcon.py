"""Family adapters of Falcon: fused Q/K/V in three layouts (grouped, multi-query, per
head), parallel attention and MLP, rotary; ALiBi refused.

Each adapter's docstring names its traps; its ``doc_*`` attributes are its row of
the family table (docs/transformers.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from specalign.transformers.load.families.base import (
    FamilyAdapter,
    TensorReader,
    config_attr,
    kept_rotary,
)
from specalign.transformers.weights import BlockWeights


class FalconAdapter(FamilyAdapter):
    """Falcon: pre-LN, causal, rotary, one fused Q/K/V in one of three layouts, attention
    and MLP in parallel.

    Traps: (1) ``self_attention.query_key_value`` packs Q, K and V three ways. With
    ``new_decoder_architecture`` (40B, 180B) GROUPED PER KEY/VALUE HEAD: its rows reshape
    to (KV, H/KV + 2, d_head), group g holding its H/KV query heads, then its key, then
    its value (so query head h reads key/value head h // (H/KV), as ``repeat_kv``); with
    ``multi_query`` (7B) CONTIGUOUS [Q (H d_head) | K (d_head) | V (d_head)], one
    key/value head for all; else INTERLEAVED PER HEAD (H, 3, d_head) as GPT-NeoX. Each
    other reading gives another F. (2) The key/value head count is ``num_kv_heads`` (not
    ``num_key_value_heads``) with the new architecture, 1 with ``multi_query``, H
    otherwise. (3) Attention and MLP read the same x (``parallel_attn``, and always with
    the new architecture): x + attn(ln x) + mlp(ln' x), where with two norms
    (``num_ln_in_parallel_attn`` 2, the new architecture's default) the attention's is
    ``ln_attn`` and the MLP's ``ln_mlp``, with one both are ``input_layernorm``.
    (4) ``alibi`` (the falcon-rw checkpoints) adds a per-head linear bias to the scores,
    which the package does not model: refused. (5) The base model collects its hidden
    states in a loop of its own, the last one after ``ln_f``. (6) ``bias`` switches
    every linear bias on or off together.
    """

    model_type = "falcon"
    doc_title = "Falcon"
    doc_layout = (
        "`h.{i}.self_attention.query_key_value`, `self_attention.dense`, `ln_attn` or "
        "`input_layernorm`"
    )
    doc_notes = (
        "Fused Q/K/V in three layouts: grouped per key/value head, rows (KV, H/KV + 2, "
        'd_head) (`new_decoder_architecture`, KV = `num_kv_heads`); contiguous [Q \\| K \\| V] '
        "with one key/value head (`multi_query`, 7B); else per head as NeoX. Parallel "
        "attention and MLP (one shared norm, or `ln_attn`/`ln_mlp`). ALiBi (falcon-rw) "
        "refused. Its own loop appends the last hidden state after `ln_f`. Pre-LN, causal, "
        "rotary."
    )
    ffn_key = "ffn_hidden_size"
    ln_position = "pre"
    causal = True
    causal_lm = True
    rotary_style = "half"
    final_norm_in_loop = "ln_f"
    out_projection = "transformer.h.{layer}.self_attention.dense"
    probe = "h.0.self_attention.query_key_value.weight"
    prefixes = ("transformer.", "")

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        if getattr(self.hf, "alibi", False):
            raise ValueError(
                "falcon with alibi=True (the falcon-rw checkpoints): ALiBi's linear bias on "
                "the attention scores is not supported"
            )
        self.new_architecture = bool(getattr(self.hf, "new_decoder_architecture", False))
        self.multi_query = bool(getattr(self.hf, "multi_query", True))
        if self.new_architecture:
            self.n_kv_heads = int(config_attr(self.hf, "num_kv_heads"))
        else:  # the model ignores num_kv_heads here (its qkv rows say so)
            self.n_kv_heads = 1 if self.multi_query else self.n_heads
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"falcon: {self.n_heads} query heads are not a multiple of {self.n_kv_heads} "
                "key/value heads"
            )

    @property
    def residual(self) -> str:  # type: ignore[override]
        parallel = self.new_architecture or getattr(self.hf, "parallel_attn", True)
        return "parallel" if parallel else "sequential"

    def _attention_norm(self) -> str:
        """The norm the attention reads: ``ln_attn`` where the new architecture has two
        (``num_ln_in_parallel_attn`` absent counts as 2 there, as in the model)."""
        n_norms = getattr(self.hf, "num_ln_in_parallel_attn", None) or 2
        return "ln_attn" if self.new_architecture and n_norms == 2 else "input_layernorm"

    def rotary(self) -> tuple[np.ndarray, np.ndarray] | None:
        return kept_rotary(self.config, ["full_attention"] * self.n_layers)

    def _qkv_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row indices of Q (H d_head), K and V (KV d_head each) in ``query_key_value``,
        head by head in the model's order."""
        H, KV, dh = self.n_heads, self.n_kv_heads, self.d_head
        rows = np.arange((H + 2 * KV) * dh)
        if self.new_architecture:
            grouped = rows.reshape(KV, H // KV + 2, dh)  # group: its queries, its K, its V
            q, k, v = grouped[:, :-2], grouped[:, -2], grouped[:, -1]
            return q.reshape(-1), k.reshape(-1), v.reshape(-1)
        if self.multi_query:
            return rows[: H * dh], rows[H * dh : (H + 1) * dh], rows[(H + 1) * dh :]
        per_head = rows.reshape(H, 3, dh)
        return tuple(per_head[:, s].reshape(-1) for s in range(3))  # type: ignore[return-value]

    def read_block(self, block: int, reader: TensorReader) -> BlockWeights:
        p = f"h.{block}.self_attention"
        w, b = self._linear(reader, f"{p}.query_key_value")
        q_rows, k_rows, v_rows = self._qkv_rows()
        n_rows = len(q_rows) + len(k_rows) + len(v_rows)
        if w.shape != (n_rows, self.d_model):
            raise ValueError(
                f"falcon layer {block}: query_key_value {w.shape}, not {(n_rows, self.d_model)}"
            )
        q, k, v = (
            (w[rows].copy(), None if b is None else b[rows].copy())
            for rows in (q_rows, k_rows, v_rows)
        )
        return self._block(
            q,
            k,
            v,
            self._linear(reader, f"{p}.dense"),
            self._norm(reader, f"h.{block}.{self._attention_norm()}"),
            where=f"falcon layer {block}",
        )
