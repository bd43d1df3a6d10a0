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

The package: ``base`` (the adapter protocol, the tensor reader, the registry, config.json
read through ``transformers``) and one module per layout lineage: ``bert`` (BERT,
RoBERTa, DistilBERT), ``albert``, ``gpt2`` (GPT-2, GPT-Neo), ``gpt_neox``, ``falcon``,
``gptj``, ``opt`` and ``llama`` (Llama, Mistral, Qwen2/3, Gemma 1-3, Phi-3). Each
family's traps are in its adapter's docstring and its row of the family table
(``doc_title``, ``doc_layout``, ``doc_notes``), from which docs/transformers.md's table
is written (``python -m specalign.transformers.load.families``; a test holds them equal).

Adding a family is one small subclass of ``FamilyAdapter`` whose class body sets its
config.json ``model_type``: defining it registers it in ``FAMILIES`` (read-only, filled by
``FamilyAdapter.__init_subclass__``), and ``adapter_class(model_type)`` returns it.
Everything the rest of the package needs to know about a family is a class attribute or
method of its adapter (causal or not, shared weights, norm kind, residual layout, rotary,
where the attention output projection lives, the attention scale, cap and pattern), so
no other module tests a family's name.
Every fact a size estimate needs is an attribute too (``gated_ffn``, ``fused_gate_up``,
``d_ffn``, ``attention_bias``).

May import: what its stage ``load`` may; this package's ``__init__`` imports every
lineage module, so that the registry is whole wherever a family is looked up.
"""

from specalign.transformers.load.families import (  # noqa: F401 (each registers its families)
    albert,
    bert,
    falcon,
    gpt2,
    gpt_neox,
    gptj,
    llama,
    opt,
)
from specalign.transformers.load.families.base import (
    FAMILIES,
    FamilyAdapter,
    TensorReader,
    UnknownFamilyError,
    adapter_class,
    adapter_for,
    config_facts,
    expand_kv,
    family_table,
    hf_config,
)

__all__ = [
    "FAMILIES",
    "FamilyAdapter",
    "TensorReader",
    "UnknownFamilyError",
    "adapter_class",
    "adapter_for",
    "config_facts",
    "expand_kv",
    "family_table",
    "hf_config",
]
