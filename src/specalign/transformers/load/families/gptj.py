"""Family adapters of GPT-J: no biases, interleaved rotary on the first rotary_dim
dimensions, parallel residual on one shared norm.

Each adapter's docstring names its traps; its ``doc_*`` attributes are its row of
the family table (docs/transformers.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from specalign.transformers.load.families.base import (
    FamilyAdapter,
    TensorReader,
)
from specalign.transformers.weights import BlockWeights


class GPTJAdapter(FamilyAdapter):
    """GPT-J: pre-LN, causal, interleaved partial rotary, parallel residual.

    Traps: (1) separate q/k/v/out projections, none with a bias. (2) Rotary rotates
    INTERLEAVED pairs (2k, 2k+1) ("rotate every two") on the first ``rotary_dim`` dims of
    each head, with theta 10000 hard-coded in the model (no config key); ``rotary_dim``
    must be set. (3) Parallel residual on ONE shared ``ln_1``: x + attn(ln_1 x) +
    mlp(ln_1 x). (4) Config keys ``n_embd``/``n_head``/``n_layer``.
    """

    model_type = "gptj"
    doc_title = "GPT-J"
    doc_layout = "`h.{i}.attn.{q,k,v,out}_proj`"
    doc_notes = (
        "No biases. Rotary on *interleaved* pairs (2k, 2k+1), first `rotary_dim` dims, theta "
        "10000 hard-coded. Parallel residual on one shared `ln_1`. Keys "
        "`n_embd`/`n_head`/`n_layer`."
    )
    ffn_key = "n_inner"
    ln_position = "pre"
    causal = True
    causal_lm = True
    rotary_style = "interleaved"
    residual = "parallel"
    out_projection = "transformer.h.{layer}.attn.out_proj"
    probe = "h.0.attn.q_proj.weight"
    prefixes = ("transformer.", "")

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        rot = getattr(self.hf, "rotary_dim", None)
        if not isinstance(rot, int) or not 0 < rot <= self.d_head or rot % 2:
            raise ValueError(f"gptj rotary_dim {rot!r} must be an even int <= d_head {self.d_head}")
        self.rotary_dim = rot

    def rotary(self) -> tuple[np.ndarray, np.ndarray] | None:
        rot = self.rotary_dim
        inv = 1.0 / 10000.0 ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
        return np.tile(inv, (self.n_layers, 1)), np.ones(self.n_layers)

    def read_block(self, block: int, reader: TensorReader) -> BlockWeights:
        p = f"h.{block}.attn"
        return self._block(
            *(self._linear(reader, f"{p}.{n}_proj") for n in ("q", "k", "v", "out")),
            self._norm(reader, f"h.{block}.ln_1"),
            where=f"gptj layer {block}",
        )
