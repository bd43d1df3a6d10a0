"""In-memory form of one transformer's attention weights in the package convention.

See ``specalign.transformers`` for the convention (y = W x + b, W as (out, in)). One
``BlockWeights`` per *distinct* layer: ALBERT shares one block across all layers, so
``ModelWeights.blocks`` has one entry and ``layer_block`` maps every layer to 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class BlockWeights:
    """Attention weights of one distinct layer (float64, y = W x + b convention).

    ``ln_weight``/``ln_bias`` are the affine parameters of the LayerNorm that the
    simplified power-method update reads as normalisation onto the sphere: the
    post-attention LayerNorm for post-LN families (BERT, ALBERT), the pre-attention
    ``ln_1`` for pre-LN families (GPT-2, GPT-Neo). Families without a bias store zeros
    and say so in ``has_bias``.
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

    @property
    def F(self) -> np.ndarray:
        """F = W_O W_V, the (d_model, d_model) value-output map of the layer."""
        return self.W_O @ self.W_V


@dataclass
class ModelWeights:
    """All distinct attention blocks of a model plus what propagation needs to know."""

    family: str  # "bert" | "albert" | "gpt2" | "gpt_neo"
    d_model: int
    n_heads: int
    n_layers: int
    blocks: list[BlockWeights]
    layer_block: np.ndarray  # (n_layers,) int: block index of each layer
    ln_position: str  # "post" (BERT/ALBERT) or "pre" (GPT-2/GPT-Neo)
    causal: bool
    attn_scale: float  # multiplies Q K^T: 1/sqrt(d_head), or 1.0 for GPT-Neo
    layer_attention: list[str]  # per layer: "global" or "local"
    window_size: int | None = None  # GPT-Neo local attention window
    ln_eps: float = 1e-5
    source: str = ""
    revision: str = ""
    # ALBERT only: token embeddings live in ``embedding_size`` dims and enter layer 0
    # through y = P e + p; propagation from embeddings needs P (d_model, embedding_size).
    embedding_projection: np.ndarray | None = None
    embedding_projection_bias: np.ndarray | None = None  # (d_model,)

    @property
    def shared(self) -> bool:
        return len(self.blocks) == 1 and self.n_layers > 1

    @property
    def d_head(self) -> int:
        return self.blocks[0].W_V.shape[0] // self.n_heads
