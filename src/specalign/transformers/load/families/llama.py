"""Family adapters of the Llama lineage: Llama, Mistral, Qwen2/2.5, Qwen3, Gemma 1-3 and
Phi-3: RMSNorm, grouped-query attention, rotary positions, gated feed-forward.

Each adapter's docstring names its traps; its ``doc_*`` attributes are its row of
the family table (docs/transformers.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from specalign.transformers.load.families.base import (
    FamilyAdapter,
    Linear,
    TensorReader,
    config_attr,
    kept_rotary,
)
from specalign.transformers.weights import BlockWeights


class LlamaAdapter(FamilyAdapter):
    """Llama (3.x): pre-RMSNorm, causal, grouped-query attention, rotary positions.

    Traps: (1) K and V have ``num_key_value_heads`` heads; query head h reads head
    h // (H / KV) — expanded here. (2) ``head_dim`` may differ from d_model / n_heads,
    then W_O is (d_model, n_heads * head_dim). (3) RMSNorm: no bias, no centring (reading
    it as a LayerNorm is wrong). (4) ``post_attention_layernorm`` is the FFN's norm, not
    one on the attention output. (5) Rotary half-rotation on the whole head; Llama 3's
    ``llama3`` rope scaling changes the frequencies (taken from transformers' own rotary
    module). Subclasses share this layout and differ in the traps they name.
    """

    model_type = "llama"
    doc_title = "Llama"
    doc_layout = "`layers.{i}.self_attn.{q,k,v,o}_proj`, `input_layernorm`"
    doc_notes = (
        "Grouped-query K/V expanded. RMSNorm (no bias, no centring) before attention. Rotary "
        "(rotate_half), `llama3` rope scaling from the config. `post_attention_layernorm` is "
        "the FFN's norm."
    )
    gated_ffn = True
    ln_position = "pre"
    causal = True
    causal_lm = True
    norm = "rmsnorm"
    rotary_style = "half"
    out_projection = "model.layers.{layer}.self_attn.o_proj"
    probe = "layers.0.self_attn.o_proj.weight"
    prefixes = ("model.", "")
    #: Per-head RMSNorms ``self_attn.{q,k}_norm`` on queries and keys before rotary.
    qk_norm: ClassVar[bool] = False
    #: ``post_attention_layernorm`` normalises the attention OUTPUT (Gemma 2/3) rather
    #: than the FFN input (Llama): stored as ``post_norm``.
    attention_post_norm: ClassVar[bool] = False

    def _d_head(self) -> int:
        head_dim = getattr(self.hf, "head_dim", None)
        return int(head_dim) if head_dim else super()._d_head()

    def _layer_types(self) -> list[str]:
        """transformers' per-layer ``layer_types`` ("full_attention" /
        "sliding_attention"); a family without them slides on every layer when it has a
        ``sliding_window`` (Mistral, Phi-3), else on none."""
        types = getattr(self.hf, "layer_types", None)
        if types:
            return list(types)
        kind = "sliding_attention" if self._window() is not None else "full_attention"
        return [kind] * self.n_layers

    def _window(self) -> int | None:
        window = getattr(self.hf, "sliding_window", None)
        return None if window is None else int(window)

    def layer_attention(self) -> list[str]:
        types = self._layer_types()
        unknown = set(types) - {"full_attention", "sliding_attention"}
        if len(types) != self.n_layers or unknown:
            raise ValueError(f"{self.model_type} layer_types {types} not understood")
        return ["local" if t == "sliding_attention" else "global" for t in types]

    @property
    def window_size(self) -> int | None:
        return self._window() if "local" in self.layer_attention() else None

    def rotary(self) -> tuple[np.ndarray, np.ndarray] | None:
        return kept_rotary(self.config, self._layer_types())

    def _attention(self, reader: TensorReader, p: str) -> tuple[Linear, Linear, Linear, Linear]:
        return (
            self._linear(reader, f"{p}.q_proj"),
            self._linear(reader, f"{p}.k_proj"),
            self._linear(reader, f"{p}.v_proj"),
            self._linear(reader, f"{p}.o_proj"),
        )

    def read_block(self, block: int, reader: TensorReader) -> BlockWeights:
        p = f"layers.{block}.self_attn"
        optional = {}
        if self.qk_norm:
            for name in ("q_norm", "k_norm"):
                optional[name] = reader.get(f"{p}.{name}.weight") + self.norm_offset
        if self.attention_post_norm:
            post = self._norm(reader, f"layers.{block}.post_attention_layernorm")
            optional["post_norm"] = post[0]
        return self._block(
            *self._attention(reader, p),
            self._norm(reader, f"layers.{block}.input_layernorm"),
            where=f"{self.model_type} layer {block}",
            **optional,
        )

    @property
    def attention_bias(self) -> bool:
        return bool(getattr(self.hf, "attention_bias", False))


class MistralAdapter(LlamaAdapter):
    """Mistral: the Llama layout without biases.

    Trap: ``sliding_window`` applies to every layer unless it is null (v0.1: 4096; v0.3:
    null, full causal attention); a config.json without the key takes the class
    default 4096, and an absent ``num_key_value_heads`` is 8, not n_heads.
    """

    model_type = "mistral"
    doc_title = "Mistral"
    doc_layout = "as Llama"
    doc_notes = (
        "Sliding window on every layer unless `sliding_window` is null (v0.3); an absent key "
        "is the class default 4096."
    )


class Qwen2Adapter(LlamaAdapter):
    """Qwen2 / Qwen2.5: the Llama layout with q/k/v biases (always; o has none).

    Trap: ``sliding_window`` only counts with ``use_sliding_window``, and then only on
    layers i >= ``max_window_layers`` (transformers' ``layer_types``); Qwen2.5 ships a
    window with ``use_sliding_window`` false, i.e. none. Absent KV heads default to 32.
    """

    model_type = "qwen2"
    doc_title = "Qwen2 / 2.5"
    doc_layout = "as Llama"
    doc_notes = (
        "q/k/v biases. A window only with `use_sliding_window`, on layers >= "
        "`max_window_layers`."
    )

    @property
    def attention_bias(self) -> bool:
        return True


class Qwen3Adapter(LlamaAdapter):
    """Qwen3: the Qwen2 layout with per-head RMSNorms on q and k.

    Traps: (1) ``self_attn.q_norm``/``k_norm`` (d_head,) normalise every query and key
    head (plain gain w) before rotary: they change the scores, not F. (2) ``head_dim`` is
    explicit (absent: 128) and n_heads * head_dim may exceed d_model (0.6B: 2048 vs
    1024). (3) ``attention_bias`` applies to q, k, v and o.
    """

    model_type = "qwen3"
    doc_title = "Qwen3"
    doc_layout = "as Llama, plus `self_attn.{q,k}_norm`"
    doc_notes = (
        "Per-head RMSNorms on q and k before rotary (stored as `q_norm`, `k_norm`; scores "
        "only). Explicit `head_dim` (0.6B: n_heads·d_head = 2 d_model)."
    )
    qk_norm = True


class GemmaAdapter(LlamaAdapter):
    """Gemma: the Llama layout with Gemma's RMSNorm.

    Traps: (1) RMSNorm computes x_hat * (1 + w): the stored weight (0 at initialisation)
    is not the gain; the gain 1 + w is stored. (2) ``embed_tokens`` multiplies by
    sqrt(d_model) inside its forward (``.weight`` is unscaled): state 0 is taken from the
    model, and a steering target direction is unaffected by a scale. (3) ``head_dim``
    explicit (absent: 256; Gemma-7B: 16 x 256 = 4096 vs d_model 3072).
    """

    model_type = "gemma"
    doc_title = "Gemma"
    doc_layout = "as Llama"
    doc_notes = (
        "RMSNorm x_hat (1 + w): the gain 1 + w is stored. Embeddings scaled by sqrt(d) inside "
        "`embed_tokens` (state 0 comes from the model). Explicit `head_dim`."
    )
    norm_offset = 1.0


class Gemma2Adapter(GemmaAdapter):
    """Gemma 2: Gemma's norms around the attention, scaled and capped scores.

    Traps: (1) the layer is x + norm_post(attn(norm_in x)): ``post_attention_layernorm``
    is the norm ON THE ATTENTION OUTPUT here (in Llama it is the FFN's); its gain 1 + w
    is stored as ``post_norm`` (F stays W_O W_V). (2) Scores are scaled by
    ``query_pre_attn_scalar``^-1/2, not d_head^-1/2, then capped: s -> cap tanh(s / cap)
    with ``attn_logit_softcapping``. (3) Sliding and full layers alternate (even layers
    slide, ``layer_types``). (4) The final logits are capped too (the LM does it).
    """

    model_type = "gemma2"
    doc_title = "Gemma 2"
    doc_layout = "as Llama; `post_attention_layernorm` is on the attention *output*"
    doc_notes = (
        "x + norm_post(attn(norm_in x)): the post-attention gain is stored (`post_norm`), F "
        "stays W_O W_V. Scores scaled by `query_pre_attn_scalar`^-1/2 and soft-capped. Even "
        "layers slide."
    )
    attention_post_norm = True

    @property
    def attn_scale(self) -> float:
        return float(config_attr(self.hf, "query_pre_attn_scalar")) ** -0.5

    @property
    def attn_softcap(self) -> float | None:
        cap = getattr(self.hf, "attn_logit_softcapping", None)
        return None if cap is None else float(cap)


class Gemma3TextAdapter(Gemma2Adapter):
    """Gemma 3 (text): Gemma 2's layout with (1 + w) q/k norms.

    Traps: (1) per-head ``q_norm``/``k_norm`` with gain 1 + w before rotary. (2) No
    softcap by default. (3) Five sliding layers to one full (``layer_types``), each type
    with its own rotary theta (``rope_local_base_freq`` for sliding layers; scaling only
    on full ones): one frequency table per layer. (4) ``use_bidirectional_attention``
    (embedding variants) halves the window and drops causality: refused. The multimodal
    ``gemma3`` checkpoints are another model_type.
    """

    model_type = "gemma3_text"
    doc_title = "Gemma 3"
    doc_layout = "as Gemma 2, plus `self_attn.{q,k}_norm`"
    doc_notes = (
        "(1 + w) q/k norms; five sliding layers to one full, each type with its own rotary "
        "theta (one frequency table per layer). Bidirectional variants refused."
    )
    qk_norm = True

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        if getattr(self.hf, "use_bidirectional_attention", False):
            raise ValueError(
                "gemma3_text with use_bidirectional_attention=True (bidirectional, halved "
                "window) is not supported"
            )


class Phi3Adapter(LlamaAdapter):
    """Phi-3: the Llama layout with fused projections.

    Traps: (1) ``qkv_proj`` ((H + 2 KV) d_head, d_model) is CONTIGUOUS [Q | K | V], not
    interleaved per head as GPT-NeoX. (2) ``partial_rotary_factor`` is honoured (the
    Llama default rope ignores it). (3) ``sliding_window`` on every layer (mini-4k:
    2047). (4) Class defaults pad/eos id 32000.
    """

    model_type = "phi3"
    doc_title = "Phi-3"
    doc_layout = "`layers.{i}.self_attn.qkv_proj` ((H + 2 KV) d_head, d), `o_proj`"
    doc_notes = (
        "Fused Q/K/V *contiguous*: rows [Q; K; V] in that order (not interleaved per head). "
        "Partial rotary honoured. Window on every layer (mini-4k: 2047)."
    )
    fused_gate_up = True

    def _attention(self, reader: TensorReader, p: str) -> tuple[Linear, Linear, Linear, Linear]:
        w, b = self._linear(reader, f"{p}.qkv_proj")
        q_rows, kv_rows = self.n_heads * self.d_head, self.n_kv_heads * self.d_head
        if w.shape[0] != q_rows + 2 * kv_rows:
            raise ValueError(f"{p}.qkv_proj has {w.shape[0]} rows, not {q_rows + 2 * kv_rows}")
        cuts = (0, q_rows, q_rows + kv_rows, q_rows + 2 * kv_rows)
        q, k, v = (
            (w[a:z].copy(), None if b is None else b[a:z].copy())
            for a, z in zip(cuts[:-1], cuts[1:], strict=True)
        )
        return q, k, v, self._linear(reader, f"{p}.o_proj")


class OlmoAdapter(LlamaAdapter):
    """OLMo (1): the Llama layout with a LayerNorm that has no parameters.

    Traps: (1) ``input_layernorm`` is a centred LayerNorm without weight or bias (no
    tensor in the checkpoint: gain ones, bias zeros) and eps 1e-5 fixed in the code, not
    a config key; (2) ``clip_qkv`` clamps q, k and v elementwise, which the simplified
    update does not model: refused when set.
    """

    model_type = "olmo"
    doc_title = "OLMo"
    doc_layout = "as Llama, no norm weights"
    doc_notes = (
        "LayerNorm without weight or bias before attention (gain 1, bias 0; eps 1e-5 in the "
        "code, no key). `clip_qkv` (q, k, v clamped) refused."
    )
    norm = "layernorm"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        if getattr(self.hf, "clip_qkv", None) is not None:
            raise ValueError(
                f"olmo: clip_qkv = {self.hf.clip_qkv} clamps q, k and v, which the simplified "
                "model does not; such checkpoints are not supported"
            )

    def _ln_eps(self) -> float:
        return 1e-5
