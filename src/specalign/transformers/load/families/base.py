"""The family adapters' common ground: the adapter protocol (:class:`FamilyAdapter`),
the tensor reader it is handed, the registry of families (:data:`FAMILIES`, filled as
each adapter class is defined), config.json read through ``transformers`` (kept facts)
and the rotary frequencies of ``transformers``' own modules (kept too)."""

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


def config_attr(hf: Any, *names: str) -> Any:
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
    #: The feed-forward is gated (SwiGLU/GeGLU: gate, up and down projections, three
    #: d x f matrices) rather than two d x f matrices with biases.
    gated_ffn: ClassVar[bool] = False
    #: The gate and up projections are stored as one (2 f, d) tensor (Phi-3's
    #: ``gate_up_proj``): the largest tensor of a layer.
    fused_gate_up: ClassVar[bool] = False
    #: config.json's key for the feed-forward width f; absent or null: 4 d_model.
    ffn_key: ClassVar[str] = "intermediate_size"
    #: The family's row of the family table (docs/transformers.md, :func:`family_table`):
    #: its name, its checkpoint's layout and what the adapter does about it (markdown).
    doc_title: ClassVar[str]
    doc_layout: ClassVar[str]
    doc_notes: ClassVar[str]

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
        #: config.json as parsed (the key of what is kept of it: :func:`kept_rotary`)
        self.config = MappingProxyType(copy.deepcopy(dict(config)))
        #: transformers' configuration of it, as plain values: every fact below is read
        #: from it
        self.hf = config_facts(config)
        self.d_model = int(config_attr(self.hf, "hidden_size"))
        self.n_heads = int(config_attr(self.hf, "num_attention_heads"))
        self.n_layers = int(config_attr(self.hf, "num_hidden_layers"))
        self.n_kv_heads = int(getattr(self.hf, "num_key_value_heads", None) or self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{self.n_heads} query heads are not a multiple of {self.n_kv_heads} "
                "key/value heads"
            )
        self.d_head = self._d_head()
        self.ln_eps = self._ln_eps()

    @property
    def d_ffn(self) -> int:
        """The feed-forward width f (config.json's :attr:`ffn_key`, else 4 d_model)."""
        value = self.config.get(self.ffn_key)
        return int(value) if value else 4 * self.d_model

    @property
    def attention_bias(self) -> bool:
        """Whether the attention projections carry biases (counted in a layer's size)."""
        return True

    def _d_head(self) -> int:
        """d_model / n_heads (families without a ``head_dim`` key)."""
        if self.d_model % self.n_heads:
            raise ValueError(f"hidden size {self.d_model} not divisible by {self.n_heads} heads")
        return self.d_model // self.n_heads

    def _ln_eps(self) -> float:
        return float(config_attr(self.hf, "layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps"))

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
            value = config_attr(self.hf, "max_position_embeddings", "n_positions", "n_ctx")
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


def rotary_from_transformers(hf: Any, layer_types: list[str]) -> tuple[np.ndarray, np.ndarray]:
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


#: The version of what :func:`kept_rotary` keeps; another version is recomputed.
ROTARY_FORMAT = 1


def kept_rotary(config: Mapping[str, Any], layer_types: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`rotary_from_transformers` of ``config``'s configuration object, kept on disk
    (:mod:`specalign.kept`, folder ``rotary``) by the content of ``config``, the layer
    types and the installed ``transformers`` and torch versions, and read without
    importing either when kept.

    Building a family's rotary class imports its modeling module and with it most of
    ``transformers`` (3.1 s of a 15.9 s extraction of an 8-layer Mistral-7B-shaped
    checkpoint): kept, a configuration pays that once, not once per checkpoint (a series
    of training steps, a rerun). The values come back bit for bit: JSON writes a float as
    the shortest text that reads back to it. An error is raised, not kept."""
    from importlib.metadata import version

    from specalign.kept import kept

    text = json.dumps(dict(config), sort_keys=True, default=str)
    key = (
        f"{ROTARY_FORMAT}\n{version('transformers')}\n{version('torch')}\n"
        f"{json.dumps(list(layer_types))}\n{text}"
    )

    def compute() -> dict[str, Any]:
        freqs, scale = rotary_from_transformers(hf_config(config), list(layer_types))
        return {"inv_freq": freqs.tolist(), "attention_scaling": scale.tolist()}

    fact = kept("rotary", key, compute)
    return (
        np.asarray(fact["inv_freq"], dtype=np.float64),
        np.asarray(fact["attention_scaling"], dtype=np.float64),
    )


def adapter_class(model_type: Any) -> type[FamilyAdapter]:
    """The adapter class of ``model_type``; an unknown one raises naming the supported
    families and the one class to add."""
    if model_type not in FAMILIES:
        raise UnknownFamilyError(
            f"unsupported model_type {model_type!r} in config.json; supported: "
            f"{', '.join(sorted(FAMILIES))}; fix: use a model of a supported family, or add "
            f"one FamilyAdapter subclass with model_type = {model_type!r} in a module of "
            "specalign/transformers/load/families/ that its __init__ imports (defining the "
            "class registers it)"
        )
    return FAMILIES[model_type]


def adapter_for(config: Mapping[str, Any]) -> FamilyAdapter:
    """The adapter for a parsed config.json; unknown ``model_type`` raises with the list."""
    return adapter_class(config.get("model_type"))(config)


def family_table() -> str:
    """The family table of docs/transformers.md, one row per registered family in
    definition order, from each adapter's ``doc_*`` attributes (written into the docs by
    ``python -m specalign.transformers.load.families``; a test holds them equal)."""
    rows = ["| family (model_type) | checkpoint layout | what the adapter does |",
            "| --- | --- | --- |"]  # fmt: skip
    for model_type, cls in FAMILIES.items():
        rows.append(f"| {cls.doc_title} (`{model_type}`) | {cls.doc_layout} | {cls.doc_notes} |")
    return "\n".join(rows) + "\n"
