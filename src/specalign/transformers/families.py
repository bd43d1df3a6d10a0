"""Family adapters: checkpoint tensor names -> the package weight convention.

Every adapter turns one family's checkpoint into ``BlockWeights`` in the convention of
``specalign.transformers`` (column vectors, y = W x + b, W stored (out, in), float64).
An adapter only knows *names and layouts*; reading tensors (lazily, one at a time) is
``extract.py``'s job, which hands each adapter a ``TensorReader``. Names below are
relative: the reader strips whatever prefix the checkpoint adds (``bert.``, ``albert.``,
``transformer.``, ``model.``, none), and accepts the old TF-port LayerNorm names
``gamma``/``beta`` for ``weight``/``bias``.

The traps, one row per family (``{i}`` = layer, ``{g}``/``{j}`` = ALBERT group/inner layer):

==========  =====================================  ==============================================
family      checkpoint layout                      what the adapter does about it
==========  =====================================  ==============================================
bert        ``encoder.layer.{i}.attention.self.``  nn.Linear is already (out, in): copied as is.
            ``{query,key,value}``,                 Post-LN: the LayerNorm of the simplified update
            ``attention.output.dense``,            is the post-attention
            ``attention.output.LayerNorm``         ``attention.output.LayerNorm``. 1/sqrt(d_h).
albert      ``encoder.albert_layer_groups.{g}.``   One layer group shared by all layers: stored
            ``albert_layers.{j}.attention.``       ONCE (one block, ``layer_block`` all zeros).
            ``{query,key,value,dense,LayerNorm}``  Embeddings live in ``embedding_size`` and are
            ``encoder.embedding_hidden_mapping_``  projected to ``hidden_size`` by a Linear before
            ``in``                                 layer 0: exposed as ``embedding_projection``.
                                                   Post-LN (``attention.LayerNorm``).
gpt2        ``h.{i}.attn.c_attn``,                 Conv1D stores W as (in, out): TRANSPOSED here.
            ``h.{i}.attn.c_proj``, ``h.{i}.ln_1``  Q, K, V are fused in ``c_attn`` (out dim
                                                   3*d_model, in that order): split into three
                                                   d_model blocks. Pre-LN: ``ln_1``. Causal.
                                                   ``h.{i}.attn.bias`` is a causal-mask buffer in
                                                   old checkpoints, NOT ``c_attn.bias``.
gpt_neo     ``h.{i}.attn.attention.{q,k,v}_proj``  No q/k/v bias (zeros, ``has_bias`` False);
            ``h.{i}.attn.attention.out_proj``,     out_proj has one. Attention is NOT scaled by
            ``h.{i}.ln_1``                         1/sqrt(d_head) (``attn_scale`` 1.0). Layers
                                                   alternate global/local attention
                                                   (``attention_layers``, from ``attention_types``)
                                                   with a local window of ``window_size`` tokens
                                                   (self included). Pre-LN: ``ln_1``. Causal.
==========  =====================================  ==============================================

Adding a family is one small subclass of ``FamilyAdapter`` registered in ``FAMILIES``
under its config.json ``model_type``. Everything the rest of the package needs to know
about a family is a class attribute or method of its adapter (causal or not, shared
weights, where the final norm and the attention output projection live, the attention
scale and pattern), so no other module tests a family's name.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

import numpy as np

from specalign.transformers.weights import BlockWeights


class UnknownFamilyError(ValueError):
    """The checkpoint's ``model_type`` has no adapter."""


class TensorReader(Protocol):
    """What an adapter needs from a checkpoint: tensors by *relative* name, float64."""

    def get(self, name: str) -> np.ndarray:
        """The tensor ``name`` (prefix-free) as a float64 array; raise when missing."""
        ...

    def has(self, name: str) -> bool:
        """Whether ``name`` (prefix-free) exists in the checkpoint."""
        ...


def _cfg(config: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    """First of ``names`` present in ``config`` (families spell the same thing differently)."""
    for name in names:
        if config.get(name) is not None:
            return config[name]
    if default is None:
        raise ValueError(f"config.json lacks {' / '.join(names)}")
    return default


class FamilyAdapter(ABC):
    """Maps one family's checkpoint onto ``BlockWeights``; built from config.json.

    Subclasses set the class attributes and implement ``read_block``. ``probe`` is a
    relative tensor name every checkpoint of the family contains; the reader finds the
    checkpoint's name prefix by locating it. ``prefixes`` lists the prefixes seen on
    the Hub (used to break ties, and as documentation).
    """

    model_type: ClassVar[str]
    ln_position: ClassVar[str]
    causal: ClassVar[bool]
    probe: ClassVar[str]
    prefixes: ClassVar[tuple[str, ...]]
    #: One block serves every layer (ALBERT): the paper's shared-weight case.
    shared_weights: ClassVar[bool] = False
    #: ``AutoModelForCausalLM`` gives next-token probabilities (used by steering).
    causal_lm: ClassVar[bool] = False
    #: Attribute of the base ``AutoModel`` holding the final norm applied to the last
    #: hidden state (None: the family has none), removed so every state is the
    #: residual stream.
    final_norm: ClassVar[str | None] = None
    #: Path, inside the causal LM, of layer ``{layer}``'s attention output projection,
    #: whose weight steering replaces (None: no causal LM).
    out_projection: ClassVar[str | None] = None
    #: Whether that projection stores its weight (in, out) (GPT-2's Conv1D) rather than
    #: nn.Linear's (out, in).
    out_projection_transposed: ClassVar[bool] = False

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = dict(config)
        self.d_model = int(_cfg(config, "hidden_size", "n_embd", "d_model"))
        self.n_heads = int(_cfg(config, "num_attention_heads", "n_head", "num_heads"))
        self.n_layers = int(_cfg(config, "num_hidden_layers", "n_layer", "num_layers"))
        if self.d_model % self.n_heads:
            raise ValueError(f"hidden size {self.d_model} not divisible by {self.n_heads} heads")
        self.d_head = self.d_model // self.n_heads
        self.ln_eps = float(_cfg(config, "layer_norm_eps", "layer_norm_epsilon", default=1e-5))

    # Per-model facts propagation needs; overridden where a family differs.
    @property
    def n_blocks(self) -> int:
        return self.n_layers

    def layer_block(self) -> np.ndarray:
        return np.arange(self.n_layers, dtype=np.int64)

    def layer_attention(self) -> list[str]:
        return ["global"] * self.n_layers

    @property
    def attn_scale(self) -> float:
        return 1.0 / math.sqrt(self.d_head)

    @property
    def window_size(self) -> int | None:
        return None

    @property
    def max_positions(self) -> int | None:
        """The longest token sequence the position embeddings cover (config.json's
        ``max_position_embeddings`` / ``n_positions`` / ``n_ctx``); None when it names none."""
        for key in ("max_position_embeddings", "n_positions", "n_ctx"):
            if self.config.get(key):
                return int(self.config[key])
        return None

    @abstractmethod
    def read_block(self, block: int, reader: TensorReader) -> BlockWeights:
        """Read distinct block ``block`` (float64, y = W x + b convention)."""

    def read_extras(self, reader: TensorReader) -> dict[str, np.ndarray]:
        """Model-level tensors outside the blocks that propagation needs (by field name)."""
        return {}

    # Shared by the linear-layer families.
    def _linear(self, reader: TensorReader, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """An nn.Linear ``name``: weight already (out, in); bias or None if absent."""
        bias = reader.get(f"{name}.bias") if reader.has(f"{name}.bias") else None
        return reader.get(f"{name}.weight"), bias

    def _block(
        self,
        q: tuple[np.ndarray, np.ndarray | None],
        k: tuple[np.ndarray, np.ndarray | None],
        v: tuple[np.ndarray, np.ndarray | None],
        o: tuple[np.ndarray, np.ndarray | None],
        ln: tuple[np.ndarray, np.ndarray],
        where: str,
    ) -> BlockWeights:
        """Assemble and shape-check a block; absent biases become zeros with has_bias False."""
        inner = self.n_heads * self.d_head
        expect = {
            "Q": (inner, self.d_model),
            "K": (inner, self.d_model),
            "V": (inner, self.d_model),
            "O": (self.d_model, inner),
        }
        parts = {"Q": q, "K": k, "V": v, "O": o}
        for key, (w, b) in parts.items():
            if w.shape != expect[key]:
                raise ValueError(
                    f"{where}: W_{key} has shape {w.shape}, expected {expect[key]} from "
                    f"config (d_model={self.d_model}, n_heads={self.n_heads})"
                )
            if b is not None and b.shape != (expect[key][0],):
                raise ValueError(f"{where}: b_{key} has shape {b.shape}, not {expect[key][:1]}")
        for name, arr in zip(("weight", "bias"), ln, strict=True):
            if arr.shape != (self.d_model,):
                raise ValueError(f"{where}: LayerNorm {name} has shape {arr.shape}")

        def bias(key: str) -> np.ndarray:
            b = parts[key][1]
            return np.zeros(expect[key][0]) if b is None else b

        return BlockWeights(
            W_Q=q[0],
            W_K=k[0],
            W_V=v[0],
            W_O=o[0],
            b_Q=bias("Q"),
            b_K=bias("K"),
            b_V=bias("V"),
            b_O=bias("O"),
            ln_weight=ln[0],
            ln_bias=ln[1],
            has_bias={key: parts[key][1] is not None for key in parts},
        )

    def _layernorm(self, reader: TensorReader, name: str) -> tuple[np.ndarray, np.ndarray]:
        return reader.get(f"{name}.weight"), reader.get(f"{name}.bias")


class BertAdapter(FamilyAdapter):
    """BERT (and MiniLM-style BERT checkpoints): post-LN, bidirectional.

    Trap: the simplified update's LayerNorm is the *post-attention*
    ``attention.output.LayerNorm`` (applied to x + attention(x)), not the FFN's
    ``output.LayerNorm``. Hub checkpoints converted from TF may call its parameters
    ``gamma``/``beta`` (the reader maps them).
    """

    model_type = "bert"
    ln_position = "post"
    causal = False
    probe = "encoder.layer.0.attention.self.query.weight"
    prefixes = ("bert.", "")

    def read_block(self, block: int, reader: TensorReader) -> BlockWeights:
        p = f"encoder.layer.{block}.attention"
        return self._block(
            self._linear(reader, f"{p}.self.query"),
            self._linear(reader, f"{p}.self.key"),
            self._linear(reader, f"{p}.self.value"),
            self._linear(reader, f"{p}.output.dense"),
            self._layernorm(reader, f"{p}.output.LayerNorm"),
            where=f"bert layer {block}",
        )


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
    ln_position = "post"
    causal = False
    shared_weights = True
    probe = "encoder.albert_layer_groups.0.albert_layers.0.attention.query.weight"
    prefixes = ("albert.", "")

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.n_groups = int(config.get("num_hidden_groups") or 1)
        self.n_inner = int(config.get("inner_group_num") or 1)
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
            self._layernorm(reader, f"{p}.LayerNorm"),
            where=f"albert group {group} layer {inner}",
        )

    def read_extras(self, reader: TensorReader) -> dict[str, np.ndarray]:
        w, b = self._linear(reader, "encoder.embedding_hidden_mapping_in")
        emb = int(self.config.get("embedding_size") or w.shape[1])
        if w.shape != (self.d_model, emb):
            raise ValueError(
                f"albert embedding projection has shape {w.shape}, expected {(self.d_model, emb)}"
            )
        return {
            "embedding_projection": w,
            "embedding_projection_bias": np.zeros(self.d_model) if b is None else b,
        }


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
    ln_position = "pre"
    causal = True
    causal_lm = True
    final_norm = "ln_f"
    out_projection = "transformer.h.{layer}.attn.c_proj"
    out_projection_transposed = True
    probe = "h.0.attn.c_attn.weight"
    prefixes = ("transformer.", "")

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        if config.get("scale_attn_by_inverse_layer_idx"):
            raise ValueError(
                "gpt2 config has scale_attn_by_inverse_layer_idx=True: the per-layer attention "
                "scale 1/(sqrt(d_head)*(layer+1)) is not supported by ModelWeights.attn_scale"
            )

    @property
    def attn_scale(self) -> float:
        return super().attn_scale if self.config.get("scale_attn_weights", True) else 1.0

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
            q, k, v, o, self._layernorm(reader, f"h.{block}.ln_1"), where=f"gpt2 layer {block}"
        )


class GPTNeoAdapter(FamilyAdapter):
    """GPT-Neo: pre-LN, causal, unscaled attention, alternating global/local layers.

    Traps: (1) q/k/v projections have no bias (zeros stored, ``has_bias`` False);
    ``out_proj`` has one. (2) The attention logits are NOT divided by sqrt(d_head)
    (``attn_scale`` = 1.0) — a port of Mesh-TensorFlow's behaviour the weights were
    trained with. (3) Layers alternate global and local attention per
    ``attention_layers`` (expanded from ``attention_types`` = [[[types...], repeat],
    ...]); a local layer lets token i see tokens j with i - window_size < j <= i.
    """

    model_type = "gpt_neo"
    ln_position = "pre"
    causal = True
    causal_lm = True
    final_norm = "ln_f"
    out_projection = "transformer.h.{layer}.attn.attention.out_proj"
    probe = "h.0.attn.attention.q_proj.weight"
    prefixes = ("transformer.", "")

    def layer_attention(self) -> list[str]:
        layers = self.config.get("attention_layers")
        if not layers:
            default = [[["global", "local"], self.n_layers // 2]]  # transformers' default
            types = self.config.get("attention_types") or default
            layers = [kind for pattern, repeat in types for _ in range(repeat) for kind in pattern]
        if len(layers) != self.n_layers or set(layers) - {"global", "local"}:
            raise ValueError(
                f"gpt_neo attention_layers {layers} must list 'global'/'local' for each of "
                f"{self.n_layers} layers"
            )
        return list(layers)

    @property
    def attn_scale(self) -> float:
        return 1.0

    @property
    def window_size(self) -> int | None:
        return int(self.config.get("window_size") or 256)

    def read_block(self, block: int, reader: TensorReader) -> BlockWeights:
        p = f"h.{block}.attn.attention"
        return self._block(
            self._linear(reader, f"{p}.q_proj"),
            self._linear(reader, f"{p}.k_proj"),
            self._linear(reader, f"{p}.v_proj"),
            self._linear(reader, f"{p}.out_proj"),
            self._layernorm(reader, f"h.{block}.ln_1"),
            where=f"gpt_neo layer {block}",
        )


FAMILIES: dict[str, type[FamilyAdapter]] = {
    cls.model_type: cls for cls in (BertAdapter, AlbertAdapter, GPT2Adapter, GPTNeoAdapter)
}


def family(model_type: Any) -> type[FamilyAdapter]:
    """The adapter class of ``model_type``; an unknown one raises with the list."""
    if model_type not in FAMILIES:
        raise UnknownFamilyError(
            f"unsupported model_type {model_type!r} in config.json; supported: "
            f"{', '.join(sorted(FAMILIES))}; fix: use a model of a supported family, or add "
            "a FamilyAdapter for this one in specalign.transformers.families"
        )
    return FAMILIES[model_type]


def adapter_for(config: Mapping[str, Any]) -> FamilyAdapter:
    """The adapter for a parsed config.json; unknown ``model_type`` raises with the list."""
    return family(config.get("model_type"))(config)
