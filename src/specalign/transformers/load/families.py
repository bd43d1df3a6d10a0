"""Family adapters: checkpoint tensor names -> the package weight convention.

Every adapter turns one family's checkpoint into ``BlockWeights`` in the convention of
``specalign.transformers`` (column vectors, y = W x + b, W stored (out, in), float64).
An adapter only knows *names, layouts and the attention recipe*; reading tensors
(lazily, one at a time) is ``extract.py``'s job, which hands each adapter a
``TensorReader``. Names below are relative: the reader strips whatever prefix the
checkpoint adds (head models save under ``bert.``, ``albert.``, ``transformer.``,
``model.``, ``model.decoder.`` (OPT's ``model.`` + its own ``decoder.``), ``gpt_neox.``,
``roberta.``, ``distilbert.``; base models under none), and accepts the old TF-port
LayerNorm names ``gamma``/``beta`` for ``weight``/``bias``.

config.json is read through ``transformers``' own configuration class of the family
(:func:`hf_config`; no weights, no network): a key *absent* from config.json takes the
class default, which is often not the value a reader would derive (Mistral's absent
``num_key_value_heads`` is 8, not ``num_attention_heads``; Qwen3's absent ``head_dim``
is 128, not d/H), and both config.json dialects (4.x ``rope_scaling``/``rotary_pct``,
5.x ``rope_parameters``) come out in one form. The adapters read that object's plain
values (:func:`config_facts`), which are kept on disk by config.json's content and the
version of ``transformers``: building the object imports ``transformers`` and torch
(2.9 s), which every ``snakemake`` call, a dry run too, paid for its checks before any
job.

Conventions shared by every family (the traps of the newer ones in brief):

* Grouped-query attention: K and V have ``n_kv_heads`` heads; query head h reads key/value
  head h // (n_heads / n_kv_heads) (``repeat_kv`` is ``repeat_interleave``; reading it as
  h % n_kv_heads is wrong and invisible when n_kv_heads is 1 or n_heads). The blocks store
  W_K, W_V (and b_K, b_V) *expanded* to one row block per query head, so that
  F = W_O W_V = sum_h W_O^h W_V^{g(h)} and every per-head routine and the steering
  construction work unchanged.
* ``d_head`` is the family's ``head_dim`` where it has one (then n_heads * d_head may
  differ from d_model: W_O is (d_model, n_heads * d_head)), else d_model / n_heads.
* ``ln_weight``/``ln_bias`` are the *effective* gain and bias of the norm the simplified
  update uses (``norm``: "layernorm", centred, or "rmsnorm", x / rms(x), no bias): Gemma
  stores w and computes x_hat * (1 + w), so the gain stored here is 1 + w.
* Rotary position embeddings are part of the attention scores: ``rotary()`` gives each
  layer's inverse frequencies (their count is half the rotated dimensions, which may be
  part of a head) and the factor applied to cos/sin, derived from ``transformers``' own
  rotary module of the family so that every rope type it supports is covered.

The traps, one row per family (``{i}`` = layer, ``{g}``/``{j}`` = ALBERT group/inner layer):

============  =========================================  ==========================================
family        checkpoint layout                          what the adapter does about it
============  =========================================  ==========================================
bert          ``encoder.layer.{i}.attention.self.``      nn.Linear is already (out, in): copied as
              ``{query,key,value}``,                     is. Post-LN: the LayerNorm of the
              ``attention.output.dense``,                simplified update is the post-attention
              ``attention.output.LayerNorm``             ``attention.output.LayerNorm``.
roberta       the BERT layout (head prefix               As BERT. Positions start at pad + 1
              ``roberta.``)                              (state 0 comes from the model). Masked
                                                         LM: no next-token probability.
distilbert    ``transformer.layer.{i}.attention.``       Config keys ``dim``/``n_heads``/
              ``{q,k,v,out}_lin``, ``sa_layer_norm``     ``n_layers``. Post-LN ``sa_layer_norm``,
                                                         eps 1e-12 hard-coded (no config key).
                                                         Masked LM: no next-token probability.
albert        ``encoder.albert_layer_groups.{g}.``       One layer group shared by all layers:
              ``albert_layers.{j}.attention.``           stored ONCE (one block, ``layer_block``
              ``{query,key,value,dense,LayerNorm}``      all zeros). Embeddings live in
              ``encoder.embedding_hidden_mapping_in``    ``embedding_size`` and are projected to
                                                         ``hidden_size`` before layer 0: exposed
                                                         as ``embedding_projection``. Post-LN.
gpt2          ``h.{i}.attn.c_attn``,                     Conv1D stores W as (in, out): TRANSPOSED
              ``h.{i}.attn.c_proj``, ``h.{i}.ln_1``      here. Q, K, V fused in ``c_attn`` (out
                                                         dim 3*d_model, in that order): split into
                                                         three. ``h.{i}.attn.bias`` is a mask
                                                         buffer in old checkpoints. Pre-LN.
gpt_neo       ``h.{i}.attn.attention.{q,k,v}_proj``      No q/k/v bias. Scores NOT scaled by
              ``h.{i}.attn.attention.out_proj``,         1/sqrt(d_head). Layers alternate global/
              ``h.{i}.ln_1``                             local (window ``window_size``). Pre-LN.
gpt_neox      ``layers.{i}.attention.``                  Fused Q/K/V INTERLEAVED PER HEAD: rows
(Pythia)      ``query_key_value`` (3d, d),               reshape to (H, 3, d_head, d), V is
              ``attention.dense``,                       [:, 2] (the contiguous [Q|K|V] split of
              ``input_layernorm``                        GPT-2 gives another F). Rotary on the
                                                         first ``rotary_pct`` of each head only.
                                                         Parallel residual x + attn(ln1 x) +
                                                         mlp(ln2 x). Pre-LN.
falcon        ``h.{i}.self_attention.``                  Fused Q/K/V in three layouts: GROUPED per
              ``query_key_value``, ``.dense``,           KV head (new_decoder_architecture; KV =
              ``h.{i}.ln_attn`` or ``input_layernorm``   ``num_kv_heads``), CONTIGUOUS [Q|K|V]
                                                         with one KV head (multi_query), else per
                                                         head as NeoX. Parallel attention + MLP.
                                                         ALiBi refused. Last state after ``ln_f``.
gptj          ``h.{i}.attn.{q,k,v,out}_proj``,           No biases. Rotary INTERLEAVED (pairs 2k,
              ``h.{i}.ln_1``                             2k+1) on the first ``rotary_dim`` dims,
                                                         theta 10000 hard-coded. Parallel residual
                                                         on ONE shared ``ln_1``. Keys ``n_embd``/
                                                         ``n_head``/``n_layer``.
opt           ``decoder.layers.{i}.self_attn.``          Biases. Pre-LN ``self_attn_layer_norm``,
              ``{q,k,v,out}_proj``,                      except the 350m style
              ``self_attn_layer_norm``                   (``do_layer_norm_before`` false): post-LN,
                                                         embeddings in ``word_embed_proj_dim``
                                                         projected by ``decoder.project_in``
                                                         (exposed as ``embedding_projection``), no
                                                         final norm, hidden_states[-1] is
                                                         ``project_out`` of another width. The
                                                         per-layer ``final_layer_norm`` is the
                                                         FFN's. LayerNorm eps 1e-5 (no key).
llama         ``layers.{i}.self_attn.{q,k,v,o}_proj``,   GQA (above). RMSNorm (no bias, no
              ``input_layernorm``                        centring) before attention. Rotary
                                                         (rotate_half; llama3 scaling from the
                                                         config). ``post_attention_layernorm`` is
                                                         the FFN's norm. Sequential residual.
mistral       as llama                                   Sliding window on every layer unless
                                                         ``sliding_window`` is null (v0.3); absent
                                                         key = class default 4096.
qwen2         as llama                                   q/k/v biases always. A window only with
                                                         ``use_sliding_window``, on layers
                                                         >= ``max_window_layers``.
qwen3         as llama, plus ``self_attn.{q,k}_norm``    Per-head RMSNorm on q and k before rotary
                                                         (scores only; F unaffected). head_dim
                                                         explicit (0.6B: H d_head = 2 d_model).
gemma         as llama                                   RMSNorm x_hat (1 + w): gain stored as
                                                         1 + w. Embeddings scaled by sqrt(d)
                                                         inside ``embed_tokens`` (state 0 comes
                                                         from the model). head_dim explicit.
gemma2        as llama; ``post_attention_layernorm``     x + norm_post(attn(norm_in x)): the
              is the norm ON THE ATTENTION OUTPUT        post-attention (1 + w) gain is stored as
                                                         ``post_norm``. Scores scaled by
                                                         ``query_pre_attn_scalar``^-1/2 and soft-
                                                         capped (tanh, ``attn_logit_softcapping``).
                                                         Even layers slide (``layer_types``).
gemma3_text   as gemma2, plus ``self_attn.{q,k}_norm``   (1 + w) q/k norms; no softcap; 5 sliding :
                                                         1 full layers; rotary theta per layer
                                                         type. Bidirectional variants refused.
phi3          ``layers.{i}.self_attn.qkv_proj``          Fused Q/K/V CONTIGUOUS [Q (H d_head) |
              ((H + 2 KV) d_head, d), ``o_proj``         K (KV d_head) | V (KV d_head)], not
                                                         interleaved. Partial rotary honoured.
                                                         Window on every layer (mini-4k 2047).
============  =========================================  ==========================================

Adding a family is one small subclass of ``FamilyAdapter`` whose class body sets its
config.json ``model_type``: defining it registers it in ``FAMILIES`` (read-only, filled by
``FamilyAdapter.__init_subclass__``), and ``adapter_class(model_type)`` returns it.
Everything the rest of the package needs to know about a family is a class attribute or
method of its adapter (causal or not, shared weights, norm kind, residual layout, rotary,
where the attention output projection lives, the attention scale, cap and pattern), so
no other module tests a family's name.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import math
import sys
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

import numpy as np

from specalign.transformers.weights import BlockWeights

Linear = tuple[np.ndarray, "np.ndarray | None"]


class UnknownFamilyError(ValueError):
    """The checkpoint's ``model_type`` has no adapter."""


#: model_type -> adapter class, written only by ``FamilyAdapter.__init_subclass__``.
_REGISTRY: dict[str, type[FamilyAdapter]] = {}
#: model_type -> adapter class, read-only, in definition order: each adapter class joins
#: it as it is defined, so there is no list of adapters to keep beside them.
FAMILIES: Mapping[str, type[FamilyAdapter]] = MappingProxyType(_REGISTRY)


class TensorReader(Protocol):
    """What an adapter needs from a checkpoint: tensors by *relative* name, float64."""

    def get(self, name: str) -> np.ndarray:
        """The tensor ``name`` (prefix-free) as a float64 array; raise when missing."""
        ...

    def has(self, name: str) -> bool:
        """Whether ``name`` (prefix-free) exists in the checkpoint."""
        ...


def hf_config(config: Mapping[str, Any]) -> Any:
    """``transformers``' configuration object of a parsed config.json (no weights, no
    network), so that absent keys take the family's class defaults.

    Raises ValueError naming the problem when ``transformers`` does not know the
    ``model_type`` or rejects the file.
    """
    import transformers
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ValueError(
            f"transformers {transformers.__version__} does not know model_type "
            f"{model_type!r}; upgrade transformers"
        )
    cls = CONFIG_MAPPING[model_type]
    # a deep copy: transformers standardises nested entries in place (rope_theta is
    # written into the caller's rope_scaling), which changed a dict shared by the tests
    fields = copy.deepcopy({k: v for k, v in config.items() if k != "model_type"})
    try:
        return cls.from_dict(fields)
    except Exception as exc:  # configuration classes raise assorted types
        raise ValueError(f"config.json rejected by transformers' {cls.__name__} ({exc})") from exc


#: The version of what :func:`config_facts` keeps; another version is recomputed.
FACTS_FORMAT = 1


class ConfigFacts:
    """The plain values of a ``transformers`` configuration object, read as attributes
    (``facts.hidden_size``), with ``getattr(facts, name, default)`` for absent ones as
    on the object. An attribute whose value is not plain data (a nested configuration)
    raises TypeError when read, rather than reading as absent."""

    def __init__(self, values: Mapping[str, Any], opaque: frozenset[str] = frozenset()):
        self._values = dict(values)
        self._opaque = frozenset(opaque)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        if name in self.__dict__.get("_opaque", ()):
            raise TypeError(f"the configuration's {name} is not a plain value; read hf_config")
        raise AttributeError(name)

    def to_dict(self) -> dict[str, Any]:
        return dict(self._values)


def _plain(value: Any) -> bool:
    """Whether ``value`` survives a JSON round trip unchanged in kind (tuples as lists)."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _facts_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`config_facts` keeps of ``config``: every public attribute of the
    configuration object (class defaults, aliases and properties included) that is plain
    data, the names of the others, or the error ``hf_config`` raises."""
    try:
        hf = hf_config(config)
    except ValueError as exc:
        return {"error": str(exc)}
    values, opaque = {}, []
    # the aliases (GPT-2's hidden_size for n_embd) are not in dir(); reading deprecated
    # names logs and warns, which says nothing about config.json
    names = set(dir(hf)) | set(getattr(hf, "attribute_map", {}))
    quiet = logging.getLogger("transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        _read_values(hf, sorted(names), values, opaque)
    finally:
        quiet.setLevel(level)
    return {"values": values, "opaque": sorted(opaque)}


def _read_values(hf: Any, names: list[str], values: dict[str, Any], opaque: list[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            if name.startswith("_"):
                continue
            try:
                value = getattr(hf, name)
            except Exception:  # a property that does not apply to this configuration
                continue
            if callable(value):
                continue
            if _plain(value):
                values[name] = json.loads(json.dumps(value))
            else:
                opaque.append(name)


def config_facts(config: Mapping[str, Any]) -> ConfigFacts:
    """:func:`hf_config`'s object of ``config`` as :class:`ConfigFacts`, kept on disk
    (:mod:`specalign.kept`, folder ``config-facts``) by the content of ``config`` and the
    installed ``transformers`` version, and read without importing either
    ``transformers`` or torch when kept. Raises ValueError as :func:`hf_config` does."""
    from importlib.metadata import version

    from specalign.kept import kept

    text = json.dumps(config, sort_keys=True, default=str)
    key = f"{FACTS_FORMAT}\n{version('transformers')}\n{text}"
    facts = kept("config-facts", key, lambda: _facts_of(config))
    if "error" in facts:
        raise ValueError(facts["error"])
    return ConfigFacts(facts["values"], frozenset(facts["opaque"]))


def _attr(hf: Any, *names: str) -> Any:
    """First of ``names`` set on the configuration object (families spell things
    differently; the configuration classes alias most of them already)."""
    for name in names:
        value = getattr(hf, name, None)
        if value is not None:
            return value
    raise ValueError(f"config.json lacks {' / '.join(names)}")


def expand_kv(W: np.ndarray, n_heads: int, n_kv_heads: int) -> np.ndarray:
    """(n_kv_heads * d_head, ...) -> (n_heads * d_head, ...): query head h gets key/value
    head h // (n_heads / n_kv_heads), as ``transformers``' ``repeat_kv``."""
    if n_kv_heads == n_heads:
        return W
    blocks = W.reshape(n_kv_heads, -1, *W.shape[1:])
    return np.repeat(blocks, n_heads // n_kv_heads, axis=0).reshape(-1, *W.shape[1:])


class FamilyAdapter(ABC):
    """Maps one family's checkpoint onto ``BlockWeights``; built from config.json.

    Subclasses set the class attributes and implement ``read_block``. ``probe`` is a
    relative tensor name every checkpoint of the family contains; the reader finds the
    checkpoint's name prefix by locating it. ``prefixes`` lists the prefixes seen on
    the Hub (used to break ties, and as documentation).
    """

    model_type: ClassVar[str]
    ln_position: str  # "pre" or "post": a class attribute, or a property where it varies
    causal: ClassVar[bool]
    probe: ClassVar[str]
    prefixes: ClassVar[tuple[str, ...]]
    #: One block serves every layer (ALBERT): the paper's shared-weight case.
    shared_weights: ClassVar[bool] = False
    #: ``read_block`` expands K and V (and their biases) to the query heads, the package
    #: convention; ``extract_to_h5`` sets it False on its adapter for a factored model,
    #: whose weights.h5 stores them at the key/value heads (expanding them only to group
    #: them back cost a third of that job's time at Mistral-7B's width, issue 14).
    kv_expanded: bool = True
    #: ``AutoModelForCausalLM`` gives next-token probabilities (used by steering).
    causal_lm: ClassVar[bool] = False
    #: Attribute of the base ``AutoModel`` holding the final norm, for families whose
    #: model appends its last hidden state *after* that norm in a loop of its own (GPT-Neo),
    #: which ``config.tie_last_hidden_states`` does not reach: replaced by the identity so
    #: that every state is the residual stream.
    final_norm_in_loop: ClassVar[str | None] = None
    #: Path, inside the causal LM, of layer ``{layer}``'s attention output projection,
    #: whose weight steering replaces (None: no causal LM).
    out_projection: ClassVar[str | None] = None
    #: Whether that projection stores its weight (in, out) (GPT-2's Conv1D) rather than
    #: nn.Linear's (out, in).
    out_projection_transposed: ClassVar[bool] = False
    #: The norm the simplified update reads: "layernorm" (centred, affine) or
    #: "rmsnorm" (x / sqrt(mean x^2 + eps) times a gain, no bias).
    norm: ClassVar[str] = "layernorm"
    #: The stored norm weight w acts as the gain w + norm_offset (Gemma: 1 + w).
    norm_offset: ClassVar[float] = 0.0
    #: Rotary position embedding of q and k: "half" (rotate_half, pairs (k, k + r/2)),
    #: "interleaved" (GPT-J, pairs (2k, 2k + 1)) or None (positions enter state 0).
    rotary_style: ClassVar[str | None] = None
    #: "sequential" (x + attn(norm x), then the FFN) or "parallel" (attention and FFN
    #: both read x); the simplified update is the attention part either way.
    residual: str = "sequential"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register the adapter under the ``model_type`` its class body sets: defining
        the class is adding the family (a subclass that inherits ``model_type`` without
        setting its own, a shared base, registers nothing)."""
        super().__init_subclass__(**kwargs)
        model_type = cls.__dict__.get("model_type")
        if model_type is None:
            return
        if model_type in _REGISTRY:
            raise TypeError(
                f"model_type {model_type!r} of {cls.__qualname__} is already the family of "
                f"{_REGISTRY[model_type].__qualname__}"
            )
        _REGISTRY[model_type] = cls

    def __init__(self, config: Mapping[str, Any]) -> None:
        #: config.json as parsed, for :attr:`hf_object`
        self.config = MappingProxyType(copy.deepcopy(dict(config)))
        #: transformers' configuration of it, as plain values: every fact below is read
        #: from it
        self.hf = config_facts(config)
        self.d_model = int(_attr(self.hf, "hidden_size"))
        self.n_heads = int(_attr(self.hf, "num_attention_heads"))
        self.n_layers = int(_attr(self.hf, "num_hidden_layers"))
        self.n_kv_heads = int(getattr(self.hf, "num_key_value_heads", None) or self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{self.n_heads} query heads are not a multiple of {self.n_kv_heads} "
                "key/value heads"
            )
        self.d_head = self._d_head()
        self.ln_eps = self._ln_eps()

    @property
    def hf_object(self) -> Any:
        """``transformers``' configuration object itself (imports transformers and
        torch): for what needs more than its values, the family's rotary module."""
        return hf_config(self.config)

    def _d_head(self) -> int:
        """d_model / n_heads (families without a ``head_dim`` key)."""
        if self.d_model % self.n_heads:
            raise ValueError(f"hidden size {self.d_model} not divisible by {self.n_heads} heads")
        return self.d_model // self.n_heads

    def _ln_eps(self) -> float:
        return float(_attr(self.hf, "layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps"))

    # Per-model facts propagation needs; overridden where a family differs.
    @property
    def n_blocks(self) -> int:
        return self.n_layers

    def layer_block(self) -> np.ndarray:
        return np.arange(self.n_layers, dtype=np.int64)

    def layer_attention(self) -> list[str]:
        """Per layer "global" or "local" (a causal sliding window of ``window_size``
        keys, the query's own included)."""
        return ["global"] * self.n_layers

    @property
    def attn_scale(self) -> float:
        return 1.0 / math.sqrt(self.d_head)

    @property
    def attn_softcap(self) -> float | None:
        """Scores s become cap * tanh(s / cap) before the mask (None: no cap)."""
        return None

    @property
    def window_size(self) -> int | None:
        return None

    @property
    def max_positions(self) -> int | None:
        """The longest token sequence the position embeddings cover (config.json's
        ``max_position_embeddings``, ``n_positions`` or ``n_ctx``, read through the
        family's configuration class, so an absent key is the class default); None when
        the configuration names none. Overridden where positions start past 0."""
        try:
            value = _attr(self.hf, "max_position_embeddings", "n_positions", "n_ctx")
        except ValueError:
            return None
        return int(value) if value else None

    def rotary(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Per layer: inverse frequencies (n_layers, n_rotated_dims / 2) and the factor
        on cos/sin (n_layers,), float64; None for families without rotary embeddings."""
        return None

    @abstractmethod
    def read_block(self, block: int, reader: TensorReader) -> BlockWeights:
        """Read distinct block ``block`` (float64, y = W x + b convention)."""

    def read_extras(self, reader: TensorReader) -> dict[str, np.ndarray]:
        """Model-level tensors outside the blocks that propagation needs (by field name)."""
        return {}

    # Shared by the linear-layer families.
    def _linear(self, reader: TensorReader, name: str) -> Linear:
        """An nn.Linear ``name``: weight already (out, in); bias or None if absent."""
        bias = reader.get(f"{name}.bias") if reader.has(f"{name}.bias") else None
        return reader.get(f"{name}.weight"), bias

    def _norm(self, reader: TensorReader, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Effective (gain, bias) of the norm ``name``: the stored weight plus the
        family's ``norm_offset`` (ones when the norm has no weight), its bias or zeros."""
        d = self.d_model
        has_weight = reader.has(f"{name}.weight")
        gain = reader.get(f"{name}.weight") + self.norm_offset if has_weight else np.ones(d)
        bias = reader.get(f"{name}.bias") if reader.has(f"{name}.bias") else np.zeros(d)
        return gain, bias

    def _block(
        self,
        q: Linear,
        k: Linear,
        v: Linear,
        o: Linear,
        ln: tuple[np.ndarray, np.ndarray],
        where: str,
        **optional: np.ndarray,
    ) -> BlockWeights:
        """Assemble and shape-check a block; K and V (and their biases) are expanded from
        ``n_kv_heads`` to ``n_heads`` heads (unless ``kv_expanded`` is False); absent
        biases become zeros with has_bias False. ``optional``: ``q_norm``, ``k_norm``
        (d_head,) and ``post_norm`` (d_model,) effective gains."""
        inner, kv, d = self.n_heads * self.d_head, self.n_kv_heads * self.d_head, self.d_model
        expect = {"Q": (inner, d), "K": (kv, d), "V": (kv, d), "O": (d, inner)}
        parts = {"Q": q, "K": k, "V": v, "O": o}
        for key, (w, b) in parts.items():
            if w.shape != expect[key]:
                raise ValueError(
                    f"{where}: W_{key} has shape {w.shape}, expected {expect[key]} from config "
                    f"(d_model={d}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                    f"d_head={self.d_head})"
                )
            if b is not None and b.shape != (expect[key][0],):
                raise ValueError(f"{where}: b_{key} has shape {b.shape}, not {expect[key][:1]}")
        for name, arr in zip(("weight", "bias"), ln, strict=True):
            if arr.shape != (d,):
                raise ValueError(f"{where}: norm {name} has shape {arr.shape}")
        sizes = {"q_norm": self.d_head, "k_norm": self.d_head, "post_norm": d}
        for name, arr in optional.items():
            if arr.shape != (sizes[name],):
                raise ValueError(f"{where}: {name} has shape {arr.shape}, not {(sizes[name],)}")

        expand = self.kv_expanded

        def weight(key: str) -> np.ndarray:
            w = parts[key][0]
            return expand_kv(w, self.n_heads, self.n_kv_heads) if expand and key in "KV" else w

        def bias(key: str) -> np.ndarray:
            b = parts[key][1]
            b = np.zeros(expect[key][0]) if b is None else b
            return expand_kv(b, self.n_heads, self.n_kv_heads) if expand and key in "KV" else b

        return BlockWeights(
            **{f"W_{key}": weight(key) for key in parts},
            **{f"b_{key}": bias(key) for key in parts},
            ln_weight=ln[0],
            ln_bias=ln[1],
            has_bias={key: parts[key][1] is not None for key in parts},
            **optional,
        )


# --------------------------------------------------------------------------- BERT-like


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


def _rotary_from_transformers(hf: Any, layer_types: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer inverse frequencies and cos/sin factors from the family's own rotary
    module (``<Family>RotaryEmbedding`` of its modeling file, built from the config
    alone), so that rope types and partial rotation are the model's: whatever
    ``rope_parameters`` says (llama3, linear, yarn, longrope, ...) and per layer type
    where the family has one table per type (Gemma 3)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    module = sys.modules[getattr(transformers, MODEL_MAPPING_NAMES[hf.model_type]).__module__]
    classes = [
        obj
        for name, obj in vars(module).items()
        if name.endswith("RotaryEmbedding") and inspect.isclass(obj)
        and obj.__module__ == module.__name__
    ]  # fmt: skip
    if len(classes) != 1:
        raise ValueError(f"{module.__name__}: expected one *RotaryEmbedding class, found {classes}")
    rope = classes[0](hf)
    inv, scale = [], []
    for kind in layer_types:
        if hasattr(rope, "inv_freq"):
            inv.append(rope.inv_freq)
            scale.append(rope.attention_scaling)
        else:  # one table per layer type
            inv.append(getattr(rope, f"{kind}_inv_freq"))
            scale.append(getattr(rope, f"{kind}_attention_scaling"))
    freqs = np.stack([t.detach().to("cpu").double().numpy() for t in inv])
    return freqs, np.asarray(scale, dtype=np.float64)


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
        return _rotary_from_transformers(self.hf_object, self._layer_types())

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


class MistralAdapter(LlamaAdapter):
    """Mistral: the Llama layout without biases.

    Trap: ``sliding_window`` applies to every layer unless it is null (v0.1: 4096; v0.3:
    null, full causal attention); a config.json without the key takes the class
    default 4096, and an absent ``num_key_value_heads`` is 8, not n_heads.
    """

    model_type = "mistral"


class Qwen2Adapter(LlamaAdapter):
    """Qwen2 / Qwen2.5: the Llama layout with q/k/v biases (always; o has none).

    Trap: ``sliding_window`` only counts with ``use_sliding_window``, and then only on
    layers i >= ``max_window_layers`` (transformers' ``layer_types``); Qwen2.5 ships a
    window with ``use_sliding_window`` false, i.e. none. Absent KV heads default to 32.
    """

    model_type = "qwen2"


class Qwen3Adapter(LlamaAdapter):
    """Qwen3: the Qwen2 layout with per-head RMSNorms on q and k.

    Traps: (1) ``self_attn.q_norm``/``k_norm`` (d_head,) normalise every query and key
    head (plain gain w) before rotary: they change the scores, not F. (2) ``head_dim`` is
    explicit (absent: 128) and n_heads * head_dim may exceed d_model (0.6B: 2048 vs
    1024). (3) ``attention_bias`` applies to q, k, v and o.
    """

    model_type = "qwen3"
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
    attention_post_norm = True

    @property
    def attn_scale(self) -> float:
        return float(_attr(self.hf, "query_pre_attn_scalar")) ** -0.5

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
        return _rotary_from_transformers(self.hf_object, ["full_attention"] * self.n_layers)

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
            self.n_kv_heads = int(_attr(self.hf, "num_kv_heads"))
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
        return _rotary_from_transformers(self.hf_object, ["full_attention"] * self.n_layers)

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


class GPTJAdapter(FamilyAdapter):
    """GPT-J: pre-LN, causal, interleaved partial rotary, parallel residual.

    Traps: (1) separate q/k/v/out projections, none with a bias. (2) Rotary rotates
    INTERLEAVED pairs (2k, 2k+1) ("rotate every two") on the first ``rotary_dim`` dims of
    each head, with theta 10000 hard-coded in the model (no config key); ``rotary_dim``
    must be set. (3) Parallel residual on ONE shared ``ln_1``: x + attn(ln_1 x) +
    mlp(ln_1 x). (4) Config keys ``n_embd``/``n_head``/``n_layer``.
    """

    model_type = "gptj"
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


def adapter_class(model_type: Any) -> type[FamilyAdapter]:
    """The adapter class of ``model_type``; an unknown one raises naming the supported
    families and the one class to add."""
    if model_type not in FAMILIES:
        raise UnknownFamilyError(
            f"unsupported model_type {model_type!r} in config.json; supported: "
            f"{', '.join(sorted(FAMILIES))}; fix: use a model of a supported family, or add "
            f"one FamilyAdapter subclass with model_type = {model_type!r} to "
            "specalign/transformers/load/families.py (defining it registers it)"
        )
    return FAMILIES[model_type]


def adapter_for(config: Mapping[str, Any]) -> FamilyAdapter:
    """The adapter for a parsed config.json; unknown ``model_type`` raises with the list."""
    return adapter_class(config.get("model_type"))(config)
