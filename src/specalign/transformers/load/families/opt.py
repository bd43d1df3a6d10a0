"""Family adapters of OPT: biases, positions offset by 2, pre-LN except the 350m style
(post-LN, projected embeddings, no final norm).

Each adapter's docstring names its traps; its ``doc_*`` attributes are its row of
the family table (docs/transformers.md)."""

from __future__ import annotations

import numpy as np

from specalign.transformers.load.families.base import (
    FamilyAdapter,
    TensorReader,
)
from specalign.transformers.weights import BlockWeights


class OPTAdapter(FamilyAdapter):
    """OPT: causal, learned positions, pre-LN (125m style) or post-LN (350m style).

    Traps: (1) ``do_layer_norm_before`` false (350m) means post-LN: the simplified
    update's LayerNorm is ``self_attn_layer_norm`` on x + attn(x), there is no final norm,
    and hidden_states[-1] is ``project_out`` of another width; the embeddings live in
    ``word_embed_proj_dim`` dims and enter through ``decoder.project_in`` (exposed as
    ``embedding_projection`` for steering targets). (2) The per-layer
    ``final_layer_norm`` is the FFN's LayerNorm, not the model's. (3) Positions are
    offset by 2 (state 0 comes from the model). (4) q is scaled after its bias (the same
    scores). (5) LayerNorm eps is torch's 1e-5 (no config key).
    """

    model_type = "opt"
    doc_title = "OPT"
    doc_layout = "`decoder.layers.{i}.self_attn.{q,k,v,out}_proj`, `self_attn_layer_norm`"
    doc_notes = (
        "Biases; positions offset by 2. Pre-LN, except the 350m style (`do_layer_norm_before` "
        "false): post-LN, embeddings in 512 dims through `project_in` (exposed as "
        "`embedding_projection`), `project_out`, no final norm. The per-layer "
        "`final_layer_norm` is the FFN's. eps 1e-5 (no key)."
    )
    ffn_key = "ffn_dim"
    causal = True
    causal_lm = True
    out_projection = "model.decoder.layers.{layer}.self_attn.out_proj"
    probe = "decoder.layers.0.self_attn.q_proj.weight"
    prefixes = ("model.", "")

    @property
    def ln_position(self) -> str:  # type: ignore[override]
        return "pre" if getattr(self.hf, "do_layer_norm_before", True) else "post"

    def _ln_eps(self) -> float:
        return 1e-5

    def read_block(self, block: int, reader: TensorReader) -> BlockWeights:
        p = f"decoder.layers.{block}"
        return self._block(
            *(self._linear(reader, f"{p}.self_attn.{n}_proj") for n in ("q", "k", "v", "out")),
            self._norm(reader, f"{p}.self_attn_layer_norm"),
            where=f"opt layer {block}",
        )

    def read_extras(self, reader: TensorReader) -> dict[str, np.ndarray]:
        if not reader.has("decoder.project_in.weight"):
            return {}
        w, b = self._linear(reader, "decoder.project_in")
        return {
            "embedding_projection": w,
            "embedding_projection_bias": np.zeros(self.d_model) if b is None else b,
        }
