"""Family adapters of ALBERT: one layer group shared by every layer, stored once (the
paper's shared-weight case), embeddings projected to the hidden size before layer 0.

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


class AlbertAdapter(FamilyAdapter):
    """ALBERT: post-LN, bidirectional, weights shared across layers.

    Traps: (1) all ``num_hidden_layers`` layers reuse the ``num_hidden_groups`` layer
    groups (1 for every released ALBERT), so the shared weights are stored once and
    ``layer_block`` maps every layer to block 0 — never duplicate them. (2) Token
    embeddings have ``embedding_size`` (128) dims and are projected to ``hidden_size``
    by ``encoder.embedding_hidden_mapping_in`` before the first layer; propagation
    from embeddings needs that map, exposed as ``embedding_projection`` (d_model,
    embedding_size) and ``embedding_projection_bias``. (3) The LayerNorm of the
    simplified update is the post-attention ``attention.LayerNorm``.

    With ``inner_group_num`` > 1 each layer applies several distinct sub-layers in
    sequence; those count as layers here (n_layers = num_hidden_layers *
    inner_group_num, one block per (group, inner) pair), since each is one attention
    step of the power-method view.
    """

    model_type = "albert"
    doc_title = "ALBERT"
    doc_layout = "one `albert_layer_groups.0` shared by every layer"
    doc_notes = (
        "Stored once (`F` has one block, `layer_block` all zeros). Embeddings (size 128) are "
        "projected to the hidden size first: exposed as `embedding_projection`. Post-LN."
    )
    ln_position = "post"
    causal = False
    shared_weights = True
    probe = "encoder.albert_layer_groups.0.albert_layers.0.attention.query.weight"
    prefixes = ("albert.", "")

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.n_groups = int(getattr(self.hf, "num_hidden_groups", None) or 1)
        self.n_inner = int(getattr(self.hf, "inner_group_num", None) or 1)
        self.n_hidden_layers = self.n_layers
        self.n_layers = self.n_hidden_layers * self.n_inner

    @property
    def n_blocks(self) -> int:
        return self.n_groups * self.n_inner

    def layer_block(self) -> np.ndarray:
        # Same group assignment as transformers' AlbertTransformer.forward.
        out = []
        for i in range(self.n_hidden_layers):
            group = int(i / (self.n_hidden_layers / self.n_groups))
            out.extend(group * self.n_inner + j for j in range(self.n_inner))
        return np.asarray(out, dtype=np.int64)

    def read_block(self, block: int, reader: TensorReader) -> BlockWeights:
        group, inner = divmod(block, self.n_inner)
        p = f"encoder.albert_layer_groups.{group}.albert_layers.{inner}.attention"
        return self._block(
            self._linear(reader, f"{p}.query"),
            self._linear(reader, f"{p}.key"),
            self._linear(reader, f"{p}.value"),
            self._linear(reader, f"{p}.dense"),
            self._norm(reader, f"{p}.LayerNorm"),
            where=f"albert group {group} layer {inner}",
        )

    def read_extras(self, reader: TensorReader) -> dict[str, np.ndarray]:
        w, b = self._linear(reader, "encoder.embedding_hidden_mapping_in")
        emb = int(getattr(self.hf, "embedding_size", None) or w.shape[1])
        if w.shape != (self.d_model, emb):
            raise ValueError(
                f"albert embedding projection has shape {w.shape}, expected {(self.d_model, emb)}"
            )
        return {
            "embedding_projection": w,
            "embedding_projection_bias": np.zeros(self.d_model) if b is None else b,
        }


# --------------------------------------------------------------------------- GPT-like
