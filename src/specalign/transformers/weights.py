"""In-memory form of one transformer's attention weights in the package convention.

See ``specalign.transformers`` for the convention (y = W x + b, W as (out, in)). One
``BlockWeights`` per *distinct* layer: ALBERT shares one block across all layers, so
``ModelWeights.blocks`` has one entry and ``layer_block`` maps every layer to 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class BlockWeights:
    """Attention weights of one distinct layer (float64, y = W x + b convention).

    ``ln_weight``/``ln_bias`` are the effective gain and bias of the norm (LayerNorm or
    RMSNorm, ``ModelWeights.norm``) that the simplified power-method update reads: the
    post-attention norm for post-LN families (BERT, ALBERT, RoBERTa, DistilBERT, OPT-350m),
    the pre-attention one for pre-LN families (GPT-2, GPT-Neo, Llama, ...). Gemma's
    x_hat (1 + w) is stored as the gain 1 + w, RMSNorms as a zero bias. With grouped-query
    attention W_K, W_V, b_K, b_V are expanded to one row block per query head (query head
    h reads key/value head h // (n_heads / n_kv_heads)); ``weights.h5`` (v3) stores them
    once per key/value head, and :meth:`ModelWeights.ov_factors` gives F's factors.
    Families without a bias store zeros and say so in ``has_bias``.

    Optional, per family: ``q_norm``/``k_norm`` (d_head,), the gains of the per-head
    RMSNorms on queries and keys (Qwen3, Gemma 3), and ``post_norm`` (d_model,), the gain
    of the RMSNorm on the attention output (Gemma 2/3: x + post_norm(attn(norm x))).
    """

    W_Q: np.ndarray  # (n_heads*d_head, d_model)
    W_K: np.ndarray  # (n_heads*d_head, d_model)
    W_V: np.ndarray  # (n_heads*d_head, d_model)
    W_O: np.ndarray  # (d_model, n_heads*d_head)
    b_Q: np.ndarray  # (n_heads*d_head,)
    b_K: np.ndarray
    b_V: np.ndarray
    b_O: np.ndarray  # (d_model,)
    ln_weight: np.ndarray  # (d_model,)
    ln_bias: np.ndarray  # (d_model,)
    has_bias: dict[str, bool] = field(default_factory=dict)
    q_norm: np.ndarray | None = None  # (d_head,)
    k_norm: np.ndarray | None = None  # (d_head,)
    post_norm: np.ndarray | None = None  # (d_model,)

    @property
    def F(self) -> np.ndarray:
        """F = W_O W_V, the (d_model, d_model) value-output map of the layer."""
        return self.W_O @ self.W_V


#: The name, in weights.h5 and in the spectra.nc made from it, of :attr:`ModelWeights.shared`
#: (1: every layer applies the one stored block, ALBERT's cross-layer sharing).
SHARED = "shared"


@dataclass
class ModelWeights:
    """All distinct attention blocks of a model plus what propagation needs to know."""

    family: str  # a model_type of specalign.transformers.load.families.FAMILIES
    d_model: int
    n_heads: int
    n_layers: int
    blocks: Sequence[BlockWeights]  # a list, or contracts.LazyBlocks (read per index)
    layer_block: np.ndarray  # (n_layers,) int: block index of each layer
    ln_position: str  # "post" (BERT/ALBERT/...) or "pre" (GPT-2/Llama/...)
    causal: bool
    attn_scale: float  # multiplies Q K^T: 1/sqrt(d_head), 1.0 for GPT-Neo, Gemma 2/3's own
    layer_attention: list[str]  # per layer: "global" or "local" (sliding window)
    window_size: int | None = None  # keys a "local" layer's query sees, its own included
    ln_eps: float = 1e-5
    source: str = ""
    revision: str = ""
    # ALBERT, OPT-350m: token embeddings live in a smaller space and enter layer 0
    # through y = P e + p; a steering target from an embedding row needs P (d_model, e).
    embedding_projection: np.ndarray | None = None
    embedding_projection_bias: np.ndarray | None = None  # (d_model,)
    norm: str = "layernorm"  # "layernorm" (centred, affine) or "rmsnorm" (x/rms(x) * gain)
    n_kv_heads: int | None = None  # key/value heads before expansion (None: n_heads)
    attn_softcap: float | None = None  # scores s -> cap tanh(s / cap) (Gemma 2)
    residual: str = "sequential"  # or "parallel": attention and FFN both read x
    # Rotary positions of q and k: "half" (rotate_half) or "interleaved" (GPT-J), with
    # per-layer inverse frequencies (n_layers, rotated dims / 2) and cos/sin factors.
    rotary: str | None = None
    rotary_inv_freq: np.ndarray | None = None
    rotary_scaling: np.ndarray | None = None  # (n_layers,)

    @property
    def shared(self) -> bool:
        """One block serves every layer (the paper's shared-weight case, ALBERT); what
        ``weights.h5`` and ``spectra.nc`` record as ``shared`` (:func:`shares_weights`)."""
        return len(self.blocks) == 1 and self.n_layers > 1

    @property
    def d_head(self) -> int:
        # a lazily read file's blocks know it from the shapes, without reading a block
        known = getattr(self.blocks, "d_head", None)
        return int(known) if known is not None else self.blocks[0].W_V.shape[0] // self.n_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads (``n_kv_heads``; ``n_heads`` without grouped-query attention)."""
        return int(self.n_kv_heads or self.n_heads)

    @property
    def rank_bound(self) -> int:
        """r = n_kv_heads * d_head, a bound on the rank of every F = W_O W_V (issue 14):
        F = W_O' W_V' with W_V' (r, d) the key/value heads' rows, at most min(r, d)."""
        return self.kv_heads * self.d_head

    @property
    def factored(self) -> bool:
        """Whether F is handled through its factors (r < d): no d x d F is stored, and the
        spectra come from the r x r product W_V' W_O' (:func:`ov_factors`)."""
        return self.rank_bound < self.d_model

    def ov_factors(self, blk: BlockWeights) -> tuple[np.ndarray, np.ndarray]:
        """(W_O', W_V') with F = W_O W_V = W_O' W_V' for a block of this model.

        W_V' (r, d) holds each key/value head's rows once; W_O' (d, r) sums, for each
        key/value head g, the output columns W_O^h of the query heads h that read it
        (h // (n_heads / n_kv_heads) = g): sum_h W_O^h W_V^{g(h)} = sum_g (sum_h W_O^h) W_V^g.
        Without grouped-query attention they are W_O and W_V themselves (not copies).
        """
        return ov_factors(blk, self.n_heads, self.kv_heads)


def ov_factors(blk: BlockWeights, n_heads: int, n_kv_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """(W_O', W_V') of ``blk`` (see :meth:`ModelWeights.ov_factors`), from the expanded
    W_O (d, n_heads*d_head) and W_V (n_heads*d_head, d) of the package convention."""
    if n_kv_heads == n_heads:
        return blk.W_O, blk.W_V
    W_V = first_of_groups(blk.W_V, n_heads, n_kv_heads)
    return grouped_output(blk.W_O, n_heads, n_kv_heads), np.ascontiguousarray(W_V)


def grouped_output(W_O: np.ndarray, n_heads: int, n_kv_heads: int) -> np.ndarray:
    """W_O' (d, n_kv_heads*d_head) of :func:`ov_factors` from W_O (d, n_heads*d_head)
    alone: for each key/value head, the sum of the output columns of its query heads."""
    d, inner = W_O.shape
    d_head = inner // n_heads
    W_O = W_O.reshape(d, n_kv_heads, n_heads // n_kv_heads, d_head).sum(axis=2)
    return W_O.reshape(d, n_kv_heads * d_head)


def first_of_groups(W: np.ndarray, n_heads: int, n_kv_heads: int) -> np.ndarray:
    """The rows of the first query head of each key/value group of an expanded W_K, W_V,
    b_K or b_V (n_heads*d_head, ...): (n_kv_heads*d_head, ...), W itself without grouping.
    Unchecked, for the hot loops (:func:`group_rows` checks that the groups are copies)."""
    if n_kv_heads == n_heads:
        return W
    shaped = W.reshape(n_kv_heads, n_heads // n_kv_heads, W.shape[0] // n_heads, *W.shape[1:])
    return shaped[:, 0].reshape(-1, *W.shape[1:])


def group_rows(W: np.ndarray, n_heads: int, n_kv_heads: int) -> np.ndarray:
    """The key/value heads' rows (n_kv_heads*d_head, ...) of an expanded W_K, W_V, b_K or
    b_V (n_heads*d_head, ...): the first query head of each group; every other query head
    of the group must hold an exact copy (ValueError otherwise: not a grouped block)."""
    if n_kv_heads == n_heads:
        return W
    group = n_heads // n_kv_heads
    shaped = W.reshape(n_kv_heads, group, W.shape[0] // n_heads, *W.shape[1:])
    if not (shaped == shaped[:, :1]).all():
        raise ValueError(
            f"key/value rows are not repeated over the {group} query heads of each of the "
            f"{n_kv_heads} key/value heads"
        )
    return np.ascontiguousarray(first_of_groups(W, n_heads, n_kv_heads))


def expand_rows(W: np.ndarray, n_heads: int, n_kv_heads: int) -> np.ndarray:
    """Inverse of :func:`group_rows`: one copy of its key/value head's rows per query head."""
    if n_kv_heads == n_heads:
        return W
    group = n_heads // n_kv_heads
    shaped = W.reshape(n_kv_heads, 1, W.shape[0] // n_kv_heads, *W.shape[1:])
    return np.repeat(shaped, group, axis=1).reshape(n_heads * shaped.shape[2], *W.shape[1:])


def shares_weights(attrs: Mapping[str, Any]) -> bool:
    """Whether a model's layers share one block of attention weights (the paper's
    shared-weight case, ALBERT, Figs. 1b and 6), as its file records it.

    ``attrs``: the root attributes of ``weights.h5`` or of ``spectra.nc``, whose writers
    record :attr:`ModelWeights.shared` (one distinct block, more than one layer) as
    ``shared``. The one reading of it: the figures, the tables, the series and the
    reproduction report ask here, not the family adapter or the eigenvalues.
    ``propagation.nc`` and ``steering.nc`` do not record it (read the model's
    ``spectra.nc``): ValueError when the attribute is absent.
    """
    if SHARED not in attrs:
        raise ValueError(
            f"no {SHARED!r} attribute: pass the root attributes of weights.h5 or spectra.nc "
            "(propagation.nc and steering.nc do not record it)"
        )
    return bool(int(attrs[SHARED]))
