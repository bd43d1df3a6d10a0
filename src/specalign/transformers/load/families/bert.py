"""Family adapters of BERT, RoBERTa and DistilBERT: post-LN encoders whose nn.Linear
weights are already (out, in); masked LMs (no next-token probability).

Each adapter's docstring names its traps; its ``doc_*`` attributes are its row of
the family table (docs/transformers.md)."""

from __future__ import annotations

from typing import ClassVar

from specalign.transformers.load.families.base import (
    FamilyAdapter,
    TensorReader,
)
from specalign.transformers.weights import BlockWeights


class BertAdapter(FamilyAdapter):
    """BERT (and MiniLM-style BERT checkpoints): post-LN, bidirectional.

    Trap: the simplified update's LayerNorm is the *post-attention*
    ``attention.output.LayerNorm`` (applied to x + attention(x)), not the FFN's
    ``output.LayerNorm``. Hub checkpoints converted from TF may call its parameters
    ``gamma``/``beta`` (the reader maps them).
    """

    model_type = "bert"
    doc_title = "BERT"
    doc_layout = "`encoder.layer.{i}.attention.self.{query,key,value}`, `attention.output.dense`"
    doc_notes = (
        "nn.Linear is already (out, in). Post-LN: the simplified update uses "
        "`attention.output.LayerNorm`. Scores scaled by 1/sqrt(d_head)."
    )
    ln_position = "post"
    causal = False
    probe = "encoder.layer.0.attention.self.query.weight"
    prefixes: ClassVar[tuple[str, ...]] = ("bert.", "")

    def read_block(self, block: int, reader: TensorReader) -> BlockWeights:
        p = f"encoder.layer.{block}.attention"
        return self._block(
            self._linear(reader, f"{p}.self.query"),
            self._linear(reader, f"{p}.self.key"),
            self._linear(reader, f"{p}.self.value"),
            self._linear(reader, f"{p}.output.dense"),
            self._norm(reader, f"{p}.output.LayerNorm"),
            where=f"{self.model_type} layer {block}",
        )


class RobertaAdapter(BertAdapter):
    """RoBERTa: the BERT layout under ``roberta.``; post-LN, bidirectional (unless the
    config says ``is_decoder``).

    Traps: (1) learned positions start at ``pad_token_id + 1`` (2), so a pad id inside a
    prompt shifts the positions after it: random prompts avoid the config's special ids.
    State 0 is taken from the model itself, so the offset never needs re-deriving. (2) It
    is a masked LM: ``RobertaForCausalLM`` without ``is_decoder`` is still bidirectional,
    so there is no next-token probability (steering stores NaN, as for BERT). (3) For the
    same reason a prompt holds at most ``max_position_embeddings - pad_token_id - 1``
    tokens (512 of roberta-base's 514 positions).
    """

    model_type = "roberta"
    doc_title = "RoBERTa"
    doc_layout = "the BERT layout under `roberta.`"
    doc_notes = (
        "As BERT. Positions start at pad + 1 (random prompts avoid the config's special ids). "
        "Masked LM: no next-token probability (NaN)."
    )
    prefixes = ("roberta.", "")

    @property
    def max_positions(self) -> int | None:
        table = super().max_positions
        pad = getattr(self.hf, "pad_token_id", None)
        return None if table is None else table - (int(pad) + 1 if pad is not None else 0)


class DistilBertAdapter(FamilyAdapter):
    """DistilBERT: post-LN, bidirectional, masked LM.

    Traps: (1) config keys ``dim``/``n_heads``/``n_layers`` (aliased by its configuration
    class). (2) The simplified update's LayerNorm is ``sa_layer_norm`` (on x + attn x);
    every LayerNorm has eps 1e-12 hard-coded, with no config key. (3) The MLM head sits at
    the checkpoint's root, outside ``distilbert.``. No next-token probability.
    """

    model_type = "distilbert"
    doc_title = "DistilBERT"
    doc_layout = "`transformer.layer.{i}.attention.{q,k,v,out}_lin`, `sa_layer_norm`"
    doc_notes = (
        "Config keys `dim`/`n_heads`/`n_layers`. Post-LN `sa_layer_norm`, eps 1e-12 "
        "hard-coded (no key). Masked LM: no next-token probability."
    )
    ffn_key = "hidden_dim"
    ln_position = "post"
    causal = False
    probe = "transformer.layer.0.attention.q_lin.weight"
    prefixes = ("distilbert.", "")

    def _ln_eps(self) -> float:
        return 1e-12

    def read_block(self, block: int, reader: TensorReader) -> BlockWeights:
        p = f"transformer.layer.{block}"
        return self._block(
            *(self._linear(reader, f"{p}.attention.{n}_lin") for n in ("q", "k", "v", "out")),
            self._norm(reader, f"{p}.sa_layer_norm"),
            where=f"distilbert layer {block}",
        )
