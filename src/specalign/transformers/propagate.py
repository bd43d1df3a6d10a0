"""Token propagation through transformer layers and the paper's alignment metrics.

Li & Altafini (arXiv:2605.25619) read one transformer layer, without its feed-forward
sub-layer and with LayerNorm taken as normalisation onto the sphere, as a step of the
power method on ``I + eta F_t`` (``F_t = W_O W_V`` of layer t):

    x_i <- normalize(x_i + eta * sum_h sum_j A^h_ij F^h x_j).

This module runs that *simplified* model from the embedding output (Figures 1-6, 8-10),
the *real* model through ``transformers`` (Figures 11-12), and measures per layer t and
token i (Section 3, Figures 2, 4, 5):

* ``gamma_t = |corr(x_i^t, v1_t)|``: alignment after layer t with the principal direction
  v1_t of F_t;
* ``psi_t = |corr(x_i^t, v1_t)| - |corr(x_i^{t-1}, v1_t)|``: the tilt layer t produces
  towards its own v1_t;
* ``rho_t``: the fraction of tokens with ``psi_t > 0``;
* the same for the mean token of each prompt (``*_mean``), ``|corr(x_i, v2_t)|``,
  ``|corr(x_i, x_i_proj)|`` and the mean inter-token distance (Figure 4);
* null levels: the same metrics against random unit directions (several seeded draws,
  averaged) and against the eigenvector of the most negative eigenvalue of F_t.

Correlation. ``corr="cosine"`` (default) is the cosine of the angle, the quantity the
power-method analogy is about (tokens on the sphere turning towards v1) and invariant to
the scale of real hidden states; ``corr="pearson"`` centres both vectors over their d
components first (the statistical correlation of the coordinate lists, which ignores any
common offset such as the large constant components of GPT-2's residual stream).

Principal directions. ``v1_t`` is the eigenvector of F_t whose eigenvalue has the largest
real part when that eigenvalue is real, otherwise the eigenvector of the real eigenvalue
with the largest real part ("leading real", as ``spectra.py``); ``v2_t`` the next real one;
``v_neg`` that of the most negative real eigenvalue. Real eigenvalues are those with an
exactly zero imaginary part (LAPACK ``geev`` returns them so). A direction that does not
exist (no real eigenvalue) is NaN and so are the metrics that use it.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import xarray as xr

from specalign.io import InputFileError
from specalign.transformers import spectra, streaming
from specalign.transformers.contracts import MODES
from specalign.transformers.families import adapter_class
from specalign.transformers.sources import TOKENIZER_PATTERNS
from specalign.transformers.variables import PROPAGATION, describe
from specalign.transformers.weights import BlockWeights, ModelWeights

Corr = Literal["cosine", "pearson"]

__all__ = [
    "apply_rotary",
    "attention_sublayer",
    "attention_weights",
    "correlation",
    "alignment",
    "family_norm",
    "layer_directions",
    "load_base_model",
    "layer_norm",
    "load_base_model",
    "model_hidden_states",
    "principal_directions",
    "block_principal_directions",
    "propagation_metrics",
    "random_prompts",
    "real_forward_hidden_states",
    "rms_norm",
    "rotary_tables",
    "simplified_forward",
    "text_prompts",
    "token_distance",
]


# --------------------------------------------------------------------------- spectra


def principal_directions(F: np.ndarray) -> dict[str, Any]:
    """Real unit directions of one layer matrix F used by the metrics
    (:func:`specalign.transformers.spectra.directions` of its eigen-decomposition).

    Returns ``v1``, ``v2``, ``v_neg`` (each (d,), NaN when missing), their eigenvalues
    ``lambda_v1``, ``lambda_v2``, ``lambda_neg``, ``lambda1_is_complex`` and ``top2_basis``
    (d, 3). The spectra rule stores the same for every block in ``spectra.nc``; pass them
    to :func:`layer_directions` instead of decomposing again.
    """
    out = spectra.directions(*spectra.sorted_eig(F))
    if np.isnan(out["lambda_v1"]):
        warnings.warn("F has no real eigenvalue: v1/v2/v_neg are NaN", stacklevel=2)
    return out


def block_principal_directions(mw: ModelWeights, blk: BlockWeights) -> dict[str, Any]:
    """:func:`principal_directions` of a block of ``mw``, through the r x r product
    (:func:`specalign.transformers.spectra.spectrum_factored`) when the model is
    factored (grouped-query attention, r < d), so that no d x d F is formed."""
    if not mw.factored:
        return principal_directions(blk.F)
    out = spectra.spectrum_factored(*mw.ov_factors(blk), eta=1.0)["directions"]
    if np.isnan(out["lambda_v1"]):
        warnings.warn("F has no real eigenvalue: v1/v2/v_neg are NaN", stacklevel=2)
    return out


def _schedule(mw: ModelWeights, n_layers: int | None) -> list[tuple[int, str, int]]:
    """(block index, "global"/"local", model layer) for each layer of a possibly prolonged
    run; the model layer says whose rotary frequencies the step uses.

    Layers past ``mw.n_layers`` repeat the last layer (for ALBERT that is the one shared
    block), as the paper's "artificially prolonged" transformers (Figure 6).
    """
    T = mw.n_layers if n_layers is None else int(n_layers)
    if T < 1:
        raise ValueError("n_layers must be >= 1")
    L = mw.n_layers
    kinds = list(mw.layer_attention) if mw.layer_attention else ["global"] * L
    layers = [min(t, L - 1) for t in range(T)]
    return [(int(mw.layer_block[ell]), kinds[ell], ell) for ell in layers]


def layer_directions(
    mw: ModelWeights,
    n_layers: int | None = None,
    directions: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, np.ndarray]:
    """Per-layer directions and eigenvalues (blocks decomposed once): arrays over layers.

    Keys: ``v1``, ``v2``, ``v_neg`` (T, d); ``lambda_v1``, ``lambda_v2``, ``lambda_neg``,
    ``lambda1_is_complex`` (T,); ``top2_basis`` (T, d, 3) (see :func:`principal_directions`).
    ``directions``: the per-block directions already computed (from ``spectra.nc``, by
    :func:`specalign.transformers.spectra.block_directions`), one per block of ``mw``;
    when None each block used is decomposed here.
    """
    sched = _schedule(mw, n_layers)
    if directions is not None:
        if len(directions) != len(mw.blocks):
            raise ValueError(
                f"{len(directions)} blocks of directions for a model of {len(mw.blocks)} blocks"
            )
        per_block = dict(enumerate(directions))
    else:
        per_block = {b: block_principal_directions(mw, mw.blocks[b]) for b in {s[0] for s in sched}}
    keys = (
        "v1", "v2", "v_neg", "lambda_v1", "lambda_v2", "lambda_neg", "lambda1_is_complex",
        "top2_basis",
    )  # fmt: skip
    return {k: np.array([per_block[s[0]][k] for s in sched]) for k in keys}


# --------------------------------------------------------------------------- attention


def layer_norm(X: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """Affine LayerNorm over the last axis (biased variance, as torch.nn.LayerNorm)."""
    mu = X.mean(axis=-1, keepdims=True)
    var = ((X - mu) ** 2).mean(axis=-1, keepdims=True)
    return (X - mu) / np.sqrt(var + eps) * weight + bias


def rms_norm(X: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis: x / sqrt(mean x^2 + eps) times the gain (no centring,
    no bias; Gemma's stored w is passed as the gain 1 + w)."""
    return X / np.sqrt((X**2).mean(axis=-1, keepdims=True) + eps) * weight


def family_norm(mw: ModelWeights, blk: BlockWeights, X: np.ndarray) -> np.ndarray:
    """The block's own norm (``mw.norm``: LayerNorm or RMSNorm) with its effective gain
    and bias, applied over the last axis of X."""
    if mw.norm == "rmsnorm":
        return rms_norm(X, blk.ln_weight, mw.ln_eps) + blk.ln_bias
    return layer_norm(X, blk.ln_weight, blk.ln_bias, mw.ln_eps)


def _mask(n: int, causal: bool, kind: str, window: int | None) -> np.ndarray:
    """(n, n) boolean: True where query i may attend to key j.

    Causal: j <= i. "local" (sliding-window) layers further keep only i - j < window, so
    the query sees ``window`` keys, its own included (GPT-Neo's ``tril(bias) xor
    tril(bias, -window_size)``; Mistral's, Qwen2's, Gemma's and Phi-3's sliding windows).
    """
    allowed = np.ones((n, n), dtype=bool)
    if causal:
        allowed = np.tril(allowed)
    if kind == "local":
        if window is None:
            raise ValueError("a 'local' attention layer needs ModelWeights.window_size")
        i, j = np.indices((n, n))
        allowed &= (i - j) < window
    return allowed


def _heads_split(M: np.ndarray, n_heads: int) -> np.ndarray:
    """(..., n, H*dh) -> (..., H, n, dh)."""
    *lead, n, hd = M.shape
    return np.moveaxis(M.reshape(*lead, n, n_heads, hd // n_heads), -2, -3)


def _stacked_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for stacks of small matrices (per prompt and head: n x d_head, n x n) on
    one BLAS thread. Each product is tiny, so a second thread gains nothing, and when the
    cores are shared with other work, BLAS threads that wait for each other on thousands
    of tiny products made the simplified run 10x slower (measured on 2 busy cores)."""
    with _one_blas_thread():
        return a @ b


def _one_blas_thread() -> Any:
    """A context limiting BLAS to one thread (threadpoolctl's controller, built once)."""
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1, user_api="blas")


_CONTROLLER: Any = None


def rotary_tables(mw: ModelWeights, layer: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (n, rotated dims) of ``layer``'s rotary embedding at positions 0..n-1
    (the prompts are unpadded), each frequency laid out as the family pairs dimensions:
    (f, f) halves for "half", (f0, f0, f1, f1, ...) for "interleaved"."""
    assert mw.rotary_inv_freq is not None and mw.rotary_scaling is not None
    angle = np.arange(n, dtype=np.float64)[:, None] * mw.rotary_inv_freq[layer][None, :]
    if mw.rotary == "interleaved":
        angle = np.repeat(angle, 2, axis=-1)
    else:
        angle = np.concatenate([angle, angle], axis=-1)
    scale = float(mw.rotary_scaling[layer])
    return np.cos(angle) * scale, np.sin(angle) * scale


def apply_rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, style: str) -> np.ndarray:
    """Rotate the first ``cos.shape[-1]`` dims of every head of x (..., n, d_head); the
    rest pass through (partial rotary). "half" pairs dims (k, k + r/2) (rotate_half),
    "interleaved" pairs (2k, 2k + 1) (GPT-J's rotate_every_two)."""
    r = cos.shape[-1]
    xr, rest = x[..., :r], x[..., r:]
    if style == "half":
        turned = np.concatenate([-xr[..., r // 2 :], xr[..., : r // 2]], axis=-1)
    elif style == "interleaved":
        turned = np.stack([-xr[..., 1::2], xr[..., 0::2]], axis=-1).reshape(xr.shape)
    else:
        raise ValueError(f"rotary style must be 'half' or 'interleaved', got {style!r}")
    return np.concatenate([xr * cos + turned * sin, rest], axis=-1)


def _queries_keys(
    mw: ModelWeights, blk: BlockWeights, layer: int, Z: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-head queries and keys (P, H, n, d_head) as the family forms them: projection,
    then the per-head q/k RMSNorms (Qwen3, Gemma 3), then the rotary positions."""
    Q = _heads_split(Z @ blk.W_Q.T + blk.b_Q, mw.n_heads)
    K = _heads_split(Z @ blk.W_K.T + blk.b_K, mw.n_heads)
    if blk.q_norm is not None and blk.k_norm is not None:
        Q, K = rms_norm(Q, blk.q_norm, mw.ln_eps), rms_norm(K, blk.k_norm, mw.ln_eps)
    if mw.rotary is not None:
        cos, sin = rotary_tables(mw, layer, Z.shape[-2])
        Q, K = apply_rotary(Q, cos, sin, mw.rotary), apply_rotary(K, cos, sin, mw.rotary)
    return Q, K


def _softmax_attention(
    mw: ModelWeights, blk: BlockWeights, kind: str, layer: int, Z: np.ndarray
) -> np.ndarray:
    """(P, H, n, n) softmax(cap(attn_scale * Q K^T)) under the layer's mask, from the
    norm-scale inputs Z (see :func:`_queries_keys`)."""
    Q, K = _queries_keys(mw, blk, layer, Z)
    scores = mw.attn_scale * _stacked_matmul(Q, np.swapaxes(K, -1, -2))
    if mw.attn_softcap is not None:
        scores = mw.attn_softcap * np.tanh(scores / mw.attn_softcap)
    allowed = _mask(Z.shape[-2], mw.causal, kind, mw.window_size)
    scores = np.where(allowed, scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    A = np.exp(scores)
    return A / A.sum(axis=-1, keepdims=True)


def _as_batch(X: np.ndarray, d: int) -> tuple[np.ndarray, bool]:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim == 2:
        return X[None], True
    if X.ndim != 3 or X.shape[-1] != d:
        raise ValueError(f"X must be (n_tokens, {d}) or (n_prompts, n_tokens, {d}), got {X.shape}")
    return X, False


def _sublayer_input(
    mw: ModelWeights, layer: int, X: np.ndarray
) -> tuple[np.ndarray, BlockWeights, str, int]:
    """(Z, block, kind) of ``layer`` for the residual-stream input X (P, n, d): Z is the
    family norm of X for pre-LN families, X itself for post-LN ones."""
    b, kind, ell = _schedule(mw, layer + 1)[layer]
    blk = mw.blocks[b]
    Z = family_norm(mw, blk, X) if mw.ln_position == "pre" else X
    return Z, blk, kind, ell


def attention_weights(mw: ModelWeights, layer: int, X: np.ndarray) -> np.ndarray:
    """Real softmax attention of ``layer`` (0-based; past the end repeats the last layer).

    X is the input of the layer's attention sub-layer as the real model sees it: for
    pre-LN families (GPT-2, Llama, ...) the residual stream, to which the block's norm is
    applied here; for post-LN families (BERT, ALBERT, RoBERTa, DistilBERT, OPT-350m) the
    previous layer's (already normalised) output, used as is. The scores include what
    the family applies to them: rotary positions 0..n-1, q/k norms, scale, softcap,
    causal mask and sliding window. Returns (n_prompts, n_heads, n, n) (no prompt axis if
    X had none).
    """
    Xb, squeeze = _as_batch(X, mw.d_model)
    Z, blk, kind, ell = _sublayer_input(mw, layer, Xb)
    A = _softmax_attention(mw, blk, kind, ell, Z)
    return A[0] if squeeze else A


def attention_sublayer(mw: ModelWeights, layer: int, X: np.ndarray) -> np.ndarray:
    """Reconstruction of one real attention sub-layer output, before the residual add.

    ``W_O concat_h(sum_j A^h_ij (W_V^h z_j + b_V^h)) + b_O`` with z the family norm of x
    for pre-LN families and z = x for post-LN ones (see :func:`attention_weights`). This
    is what a forward hook sees on the attention output projection (BERT's
    ``attention.output.dense``, Llama's ``o_proj``; before Gemma 2/3's post-attention
    norm); it checks that the ``ModelWeights`` convention reproduces the checkpoint.
    X: (n, d) or (n_prompts, n, d); returns the same shape.
    """
    Xb, squeeze = _as_batch(X, mw.d_model)
    Z, blk, kind, ell = _sublayer_input(mw, layer, Xb)
    A = _softmax_attention(mw, blk, kind, ell, Z)
    V = _heads_split(Z @ blk.W_V.T + blk.b_V, mw.n_heads)
    ctx = np.moveaxis(_stacked_matmul(A, V), -3, -2)  # (P, n, H, dh)
    out = ctx.reshape(*ctx.shape[:-2], -1) @ blk.W_O.T + blk.b_O
    return out[0] if squeeze else out


# --------------------------------------------------------------------------- forward


def _unit(X: np.ndarray) -> np.ndarray:
    return X / np.linalg.norm(X, axis=-1, keepdims=True)


def _uniform_attention(n: int, causal: bool) -> np.ndarray:
    """A = 1/n, or for causal models A_ij = 1/i over j <= i (1-based i): the uniform
    average over the keys a token may see, so the update stays a power-method step on the
    running mean of the prefix."""
    if causal:
        A = np.tril(np.ones((n, n)))
        return A / A.sum(axis=1, keepdims=True)
    return np.full((n, n), 1.0 / n)


def simplified_forward(
    mw: ModelWeights,
    X0: np.ndarray,
    eta: float,
    attention: Literal["real", "full"] = "real",
    n_layers: int | None = None,
    start: int = 0,
) -> np.ndarray:
    """The paper's simplified transformer from the embedding output (Section 3).

    ``x_i <- normalize(x_i + eta * sum_h sum_j A^h_ij F^h x_j)`` layer by layer, with F^h
    from the block of each layer (``mw.layer_block``; with grouped-query attention F^h
    reads the key/value head of query head h), no FFN, no biases in the update, and the
    tokens kept on the unit sphere (the initial embeddings are normalised first; state 0
    is that normalised input).

    ``attention="real"``: each layer's real softmax weights, computed as the family
    computes them (our reading, the same for every family): the sphere-valued x has no
    natural scale for the query/key maps, which were trained on normalised inputs, so z
    is x passed through the layer's own norm (``family_norm``: LayerNorm or RMSNorm with
    the stored effective gain, e.g. Gemma's 1 + w; the pre-attention norm for pre-LN, the
    post-attention one for post-LN families), then q = W_Q z + b_Q, k = W_K z + b_K, the
    per-head q/k norms (Qwen3, Gemma 3), the rotary positions 0..n-1 of the prompt
    (half-rotation or GPT-J's interleaved pairs, partial where the family rotates part of
    a head), ``attn_scale`` (1/sqrt(d_head), GPT-Neo's 1, Gemma 2/3's
    query_pre_attn_scalar^-1/2), the softcap (Gemma 2), the causal mask and the sliding
    window of "local" layers. What the families do *outside* the scores is not part of
    the simplified update: parallel residuals (GPT-NeoX, GPT-J) add the FFN beside the
    attention (the update is the attention half), and Gemma 2/3's post-attention RMSNorm
    rescales each token's attention output (a positive per-token factor times the gain
    diag(``post_norm``)): F stays W_O W_V, the paper's object, comparable across
    families, and the gain is in weights.h5 for a reader who wants diag(g) F.

    ``attention="full"``: A = 1/n (causal models: A_ij = 1/i over j <= i, the local window
    is ignored); then ``sum_h A F^h = A F`` and each step is a power-method step on
    ``I + eta F`` applied to the (prefix) mean.

    ``n_layers`` beyond ``mw.n_layers`` prolongs the model by repeating its last layer (the
    shared layer for ALBERT; Figure 6; its rotary frequencies too). Returns
    (n_layers + 1, n_prompts, n_tokens, d).

    ``start`` > 0 continues a run: ``X0`` is then the state after layer ``start`` (already
    on the sphere, so not normalised again) and the result holds states ``start`` to
    ``n_layers``, exactly as the same slice of a run from the embedding output.
    """
    X, squeeze = _as_batch(X0, mw.d_model)
    if squeeze:
        raise ValueError("X0 must be (n_prompts, n_tokens, d)")
    if attention not in ("real", "full"):
        raise ValueError(f"attention must be 'real' or 'full', got {attention!r}")
    sched = _schedule(mw, n_layers)[start:]
    n = X.shape[1]
    states = np.empty((len(sched) + 1, *X.shape))
    X = _unit(X) if start == 0 else np.array(X, dtype=np.float64)
    states[0] = X
    A_full = _uniform_attention(n, mw.causal) if attention == "full" else None
    # W_O W_V once per run of layers of one block (ALBERT's shared one, a prolonged run's
    # repeated last one: a block's layers are consecutive), only the current block's kept,
    # so a lazily read mw holds one block; a factored (grouped-query) model applies F x as
    # W_O'(W_V' x) instead: 2 d r flops per token, never d x d
    F: dict[int, Any] = {}
    for t, (b, kind, layer) in enumerate(sched):
        blk = mw.blocks[b]
        if A_full is not None:
            if b not in F:
                F = {b: mw.ov_factors(blk) if mw.factored else blk.F}
            if mw.factored:
                W_O, W_V = F[b]
                drift = ((A_full @ X) @ W_V.T) @ W_O.T
            else:
                drift = (A_full @ X) @ F[b].T
        else:
            A = _softmax_attention(mw, blk, kind, layer, family_norm(mw, blk, X))
            # mixing W_V x before W_O costs H d_head d per token instead of H d^2 for F^h
            V = _heads_split(X @ blk.W_V.T, mw.n_heads)
            ctx = np.moveaxis(_stacked_matmul(A, V), -3, -2)
            drift = ctx.reshape(*ctx.shape[:-2], -1) @ blk.W_O.T
        X = _unit(X + eta * drift)
        states[t + 1] = X
    return states


def load_base_model(
    model_dir: str | os.PathLike[str], device: str = "cpu", dtype: Any = None
) -> Any:
    """``AutoModel`` of a local model folder (``local_files_only``: never the network),
    eager attention, eval mode, float32 unless ``dtype`` (a torch dtype) says otherwise."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(
        str(model_dir), local_files_only=True, attn_implementation="eager",
        trust_remote_code=False,
    )  # fmt: skip
    return model.to(device=device, dtype=dtype or torch.float32).eval()


def real_forward_hidden_states(
    model_dir: str | os.PathLike[str],
    input_ids: np.ndarray,
    device: str = "cpu",
    dtype: Any = None,
    final_norm: bool = False,
    stream: bool = True,
    mem_limit: int | None = None,
) -> np.ndarray:
    """Hidden states of the real model (embeddings, FFN, norms), Figures 11-12.

    With ``stream`` (default) the model runs from its checkpoint one layer at a time
    (:func:`specalign.transformers.streaming.streamed_model`: peak memory one layer in
    ``dtype`` plus the states, whatever the model's size); otherwise ``AutoModel`` is
    loaded whole (:func:`load_base_model`). Returns :func:`model_hidden_states` of
    ``input_ids`` (n_prompts, n_tokens), in the compute dtype.
    """
    if not stream:
        model = load_base_model(model_dir, device, dtype)
        return model_hidden_states(model, input_ids, final_norm=final_norm)
    model = streaming.streamed_model(model_dir, "base", device, dtype, mem_limit=mem_limit)
    try:
        return model_hidden_states(model, input_ids, final_norm=final_norm)
    finally:
        streaming.close_stream(model)


def model_hidden_states(model: Any, input_ids: np.ndarray, final_norm: bool = False) -> np.ndarray:
    """The hidden states of a loaded (or streamed) base model on ``input_ids``
    (n_prompts, n_tokens).

    Returns (n_layers + 1, n_prompts, n_tokens, d) in the model's compute dtype (float32
    states are held as float32: they grow with depth, and every reader converts them
    to float64 exactly): state 0 is the input of layer
    0 (the embedding output: for ALBERT after the embedding-to-hidden projection, for
    Gemma scaled by sqrt(d), for OPT-350m after ``project_in``), state t the output of
    layer t. ``transformers`` (5.x) replaces the last hidden state of every decoder family
    by the model's final output (after ``ln_f``/``norm``/``final_layer_norm``, for
    OPT-350m ``project_out`` of another width); with ``final_norm=False`` (default) the
    model's ``config.tie_last_hidden_states`` is switched off and GPT-Neo's final norm,
    which its own loop applies before the last state, replaced by the identity (the model
    is changed in place), so that every state is the residual stream, comparable across
    layers. With ``final_norm=True`` the model is left as it is.
    """
    import torch

    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be (n_prompts, n_tokens), got {ids.shape}")
    if not final_norm:
        model.config.tie_last_hidden_states = False
        loop_norm = adapter_class(getattr(model.config, "model_type", None)).final_norm_in_loop
        if loop_norm is not None:
            setattr(model, loop_norm, torch.nn.Identity())
    device = streaming.model_device(model)
    with torch.no_grad():
        t_ids = torch.as_tensor(ids, dtype=torch.long, device=device)
        out = model(
            input_ids=t_ids, attention_mask=torch.ones_like(t_ids), output_hidden_states=True
        )
    if out.hidden_states is None:
        raise RuntimeError(f"{type(model).__name__} returned no hidden states")
    hs = list(out.hidden_states)
    del out  # the list holds the only references: each state is freed once copied
    first = hs[0]
    dtype = torch.float64 if first.dtype == torch.float64 else torch.float32
    states = np.empty((len(hs), *first.shape), dtype=np.float64 if dtype == torch.float64
                      else np.float32)  # fmt: skip
    for t in range(len(hs)):
        states[t] = hs[t].detach().to("cpu", dtype).numpy()
        hs[t] = None
    return states


# --------------------------------------------------------------------------- metrics


def correlation(X: np.ndarray, v: np.ndarray, corr: Corr = "cosine") -> np.ndarray:
    """Signed correlation of each row of X (..., d) with v (d,) or with matched rows of v.

    ``cosine``: <x, v>/(|x||v|). ``pearson``: the same after subtracting each vector's mean
    over its d components. Zero-norm vectors give NaN.
    """
    X = np.asarray(X, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if corr == "pearson":
        X = X - X.mean(axis=-1, keepdims=True)
        v = v - v.mean(axis=-1, keepdims=True)
    elif corr != "cosine":
        raise ValueError(f"corr must be 'cosine' or 'pearson', got {corr!r}")
    num = np.einsum("...d,...d->...", X, v)  # no (..., d) temporary for large models
    den = np.linalg.norm(X, axis=-1) * np.linalg.norm(v, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def token_distance(states: np.ndarray, normalize: bool = True) -> np.ndarray:
    """Mean pairwise distance ``mean_{i<j} |x_i - x_j|`` per prompt (Figure 4).

    states: (..., n_tokens, d) -> (...). With ``normalize`` the tokens are first put on
    the unit sphere, so real hidden states and simplified states are on one scale.
    """
    X = _unit(states) if normalize else np.asarray(states, dtype=np.float64)
    n = X.shape[-2]
    if n < 2:
        return np.full(X.shape[:-2], np.nan)
    # via the Gram matrix: an explicit (..., n, n, d) difference array would take
    # gigabytes for 33 layers x 100 prompts of 2560-dim GPT-Neo tokens
    G = _stacked_matmul(X, np.swapaxes(X, -1, -2))
    sq = np.diagonal(G, axis1=-2, axis2=-1)
    D = np.sqrt(np.clip(sq[..., :, None] + sq[..., None, :] - 2.0 * G, 0.0, None))
    iu = np.triu_indices(n, 1)
    return D[..., iu[0], iu[1]].mean(axis=-1)


def _unit_rows(X: np.ndarray, corr: Corr) -> np.ndarray:
    """Rows of X prepared so that a dot product is the correlation: centred over the d
    components for Pearson, then divided by their norm (zero rows become NaN)."""
    X = np.asarray(X, dtype=np.float64)
    if corr == "pearson":
        X = X - X.mean(axis=-1, keepdims=True)
    norm = np.linalg.norm(X, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, X / np.where(norm > 0, norm, 1.0), np.nan)


def _align(Su: np.ndarray, Mu: np.ndarray, dirs: np.ndarray) -> dict[str, np.ndarray]:
    """gamma, psi, rho and their mean-token versions against per-layer directions.

    ``Su`` (T+1, P, N, d) and ``Mu`` (T+1, P, d) are the states and the prompts' mean
    tokens, and ``dirs`` (T, d) the directions, all already passed through
    :func:`_unit_rows`: the norms are computed once per mode rather than once for every
    one of the many null directions, which dominated the cost for large models.
    """
    T = Su.shape[0] - 1
    after = np.abs(np.einsum("tpnd,td->tpn", Su[1:], dirs))  # (T, P, N)
    before = np.abs(np.einsum("tpnd,td->tpn", Su[:-1], dirs))
    m_after = np.abs(np.einsum("tpd,td->tp", Mu[1:], dirs))
    m_before = np.abs(np.einsum("tpd,td->tp", Mu[:-1], dirs))
    psi, psi_m = after - before, m_after - m_before
    with np.errstate(invalid="ignore"):
        rho = np.where(np.isnan(psi).all(axis=(1, 2)), np.nan, (psi > 0).mean(axis=(1, 2)))
        rho_m = np.where(np.isnan(psi_m).all(axis=1), np.nan, (psi_m > 0).mean(axis=1))
    return {
        "gamma": after.reshape(T, -1),
        "psi": psi.reshape(T, -1),
        "rho": rho,
        "gamma_mean": m_after,
        "psi_mean": psi_m,
        "rho_mean": rho_m,
    }


def alignment(S: np.ndarray, dirs: np.ndarray, corr: Corr = "cosine") -> dict[str, np.ndarray]:
    """gamma, psi, rho and their mean-token versions of states ``S`` (T+1, P, N, d)
    against per-layer directions ``dirs`` (T, d): the alignment metrics of
    :func:`propagation_metrics` for one run, without the nulls (see the module doc)."""
    S = np.asarray(S, dtype=np.float64)
    return _align(_unit_rows(S, corr), _unit_rows(S.mean(axis=2), corr), _unit_rows(dirs, corr))


def propagation_metrics(
    mw: ModelWeights,
    states: Mapping[str, np.ndarray],
    corr: Corr = "cosine",
    n_null_draws: int = 8,
    seed: int = 0,
    proj: Literal["top2", "v1"] = "top2",
    normalize_distance: bool = True,
    directions: Sequence[Mapping[str, Any]] | None = None,
) -> xr.Dataset:
    """All per-layer metrics and null levels for several runs ("modes") of one model.

    ``states`` maps a mode name (e.g. "simplified_real", "simplified_full",
    "real_model") to states (T_mode + 1, n_prompts, n_tokens, d) as returned by
    :func:`simplified_forward` / :func:`real_forward_hidden_states`; all modes share the
    prompts. Layer t is measured against the directions of ``F_t`` (prolonged runs repeat
    the last layer's); modes shorter than the longest are NaN-padded.

    Dataset layout (dims: ``mode``, ``layer`` = 1..T, ``token`` = prompt-major flattened
    (prompt, position) with coords ``token_prompt``/``token_position``, ``prompt``,
    ``state`` = 0..T where state 0 is the input):

    * ``gamma``, ``psi``, ``gamma_v2``, ``corr_proj`` (mode, layer, token)
    * ``rho``, ``rho_mean`` (mode, layer); ``gamma_mean``, ``psi_mean`` (mode, layer, prompt)
    * ``token_distance`` (mode, state, prompt)
    * random-direction nulls, averaged over ``n_null_draws`` unit directions per layer drawn
      from ``numpy.random.default_rng(seed)`` (the same draws for every mode):
      ``gamma_null``, ``psi_null`` (mode, layer, token), ``rho_null``, ``rho_mean_null``
      (mode, layer), ``gamma_mean_null``, ``psi_mean_null`` (mode, layer, prompt)
    * most-negative-eigenvector nulls with the same dims: ``gamma_neg_null``,
      ``psi_neg_null``, ``rho_neg_null``, ``gamma_mean_neg_null``, ``psi_mean_neg_null``,
      ``rho_mean_neg_null``
    * per-layer eigenvalues ``lambda_v1``, ``lambda_v2``, ``lambda_neg`` and flag
      ``lambda1_is_complex`` (layer)

    ``corr_proj = |corr(x_i, x_i_proj)|`` with ``x_i_proj`` the orthogonal projection of x_i
    onto a principal subspace of F_t (Figure 5, third panel). ``proj="v1"`` projects onto
    span(v1_t); then x_i_proj is a multiple of v1_t and, for cosine correlation,
    ``corr_proj == gamma`` identically, so it carries no information of its own.
    ``proj="top2"`` (default) projects onto the real invariant subspace of the two
    eigenvalues with the largest real part (``top2_basis`` of :func:`principal_directions`:
    span(v1, v2), or the plane of a complex leading pair), the reading under which the
    panel measures how much of each token lies in the principal eigenspace.

    The mean token of a prompt is the plain mean of its states (of the raw hidden states
    for the real model, so larger tokens weigh more).
    Distances use unit-normalised tokens unless ``normalize_distance=False``.
    ``directions``: the blocks' directions from ``spectra.nc`` (see :func:`layer_directions`).
    """
    if proj not in ("top2", "v1"):
        raise ValueError(f"proj must be 'top2' or 'v1', got {proj!r}")
    if n_null_draws < 1:
        raise ValueError("n_null_draws must be >= 1")
    T, P, N, d = _states_shape(mw, states)
    dirs = layer_directions(mw, T, directions)
    rng = np.random.default_rng(seed)
    rand = _unit(rng.standard_normal((n_null_draws, T, d)))
    if proj == "v1":
        bases = np.zeros((T, d, 3))
        bases[:, :, 0] = dirs["v1"]
    else:
        bases = dirs["top2_basis"]

    modes = list(states)
    sizes = {"mode": len(modes), "layer": T, "token": P * N, "prompt": P, "state": T + 1}
    out = {k: np.full([sizes[x] for x in dm], np.nan) for k, dm in _METRIC_DIMS.items()}
    for mi, mode in enumerate(modes):
        S = np.asarray(states[mode], dtype=np.float64)
        for k, val in _mode_metrics(S, dirs, rand, bases, corr, normalize_distance).items():
            out[k][mi, : val.shape[0]] = val

    data_vars: dict[str, Any] = {k: (_METRIC_DIMS[k], arr) for k, arr in out.items()}
    for k in ("lambda_v1", "lambda_v2", "lambda_neg"):
        data_vars[k] = (("layer",), dirs[k].astype(np.float64))
    data_vars["lambda1_is_complex"] = (("layer",), dirs["lambda1_is_complex"].astype(np.int8))
    coords = {
        "mode": modes,
        # layers 1..T as the paper counts them, each with its block (the repeated layer's
        # past the model's depth); state t is the output of layer t, state 0 the embedding
        "layer": np.arange(1, T + 1),
        "layer_block": ("layer", np.array([s[0] for s in _schedule(mw, T)], dtype=np.int64)),
        "state": np.arange(T + 1),
        "prompt": np.arange(P),
        "token": np.arange(P * N),
        "token_prompt": ("token", np.repeat(np.arange(P), N)),
        "token_position": ("token", np.tile(np.arange(N), P)),
    }
    return xr.Dataset(
        data_vars,
        coords=coords,
        attrs={
            "corr": corr,
            "n_null_draws": int(n_null_draws),
            "null_seed": int(seed),
            "proj": proj,
            "normalize_distance": int(normalize_distance),
            "family": mw.family,
            "source": mw.source,
            "description": (
                "Li & Altafini (arXiv:2605.25619) alignment metrics: gamma=|corr(x_t, v1_t)|, "
                "psi=|corr(x_t, v1_t)|-|corr(x_{t-1}, v1_t)|, rho=P(psi>0); *_mean for the "
                "mean token of each prompt; *_null against random unit directions, "
                "*_neg_null against the eigenvector of the most negative eigenvalue."
            ),
        },
    )


_PER_TOKEN = ("mode", "layer", "token")
_PER_LAYER = ("mode", "layer")
_PER_PROMPT = ("mode", "layer", "prompt")
#: The dims of each alignment metric of :func:`_align`.
_ALIGN_DIMS: dict[str, tuple[str, ...]] = {
    "gamma": _PER_TOKEN,
    "psi": _PER_TOKEN,
    "rho": _PER_LAYER,
    "gamma_mean": _PER_PROMPT,
    "psi_mean": _PER_PROMPT,
    "rho_mean": _PER_LAYER,
}
#: The dims of every variable of :func:`propagation_metrics`: the alignment metrics
#: against v1 and their two nulls, then the others.
_METRIC_DIMS: dict[str, tuple[str, ...]] = {
    **{k + suffix: dm for suffix in ("", "_null", "_neg_null") for k, dm in _ALIGN_DIMS.items()},
    "gamma_v2": _PER_TOKEN,
    "corr_proj": _PER_TOKEN,
    "token_distance": ("mode", "state", "prompt"),
}


def _states_shape(mw: ModelWeights, states: Mapping[str, np.ndarray]) -> tuple[int, ...]:
    """(T, n_prompts, n_tokens, d) shared by all modes, T the longest; checked."""
    if not states:
        raise ValueError("states is empty")
    shapes = {m: np.asarray(s).shape for m, s in states.items()}
    base = next(iter(shapes.values()))
    for m, sh in shapes.items():
        if len(sh) != 4 or sh[1:] != base[1:] or sh[-1] != mw.d_model:
            raise ValueError(
                f"mode {m!r}: states {sh} must be (T+1, n_prompts, n_tokens, {mw.d_model}) "
                f"with the same prompts as the others {base}"
            )
    T = max(sh[0] for sh in shapes.values()) - 1
    if T < 1:
        raise ValueError("states need at least one layer (T + 1 >= 2)")
    return (T, *base[1:])


def _mode_metrics(
    S: np.ndarray,
    dirs: Mapping[str, np.ndarray],
    rand: np.ndarray,
    bases: np.ndarray,
    corr: Corr,
    normalize_distance: bool,
) -> dict[str, np.ndarray]:
    """Every metric of one mode's states S (T_m + 1, P, N, d), over its own T_m layers
    (modes may be shorter: the real model is never prolonged)."""
    Tm = S.shape[0] - 1
    Su, Mu = _unit_rows(S, corr), _unit_rows(S.mean(axis=2), corr)
    out = _align(Su, Mu, _unit_rows(dirs["v1"][:Tm], corr))
    for k, val in _align(Su, Mu, _unit_rows(dirs["v_neg"][:Tm], corr)).items():
        out[k + "_neg_null"] = val
    draws = [_align(Su, Mu, _unit_rows(rand[r, :Tm], corr)) for r in range(rand.shape[0])]
    for k in _ALIGN_DIMS:
        out[k + "_null"] = np.mean([dr[k] for dr in draws], axis=0)
    after = S[1:]
    out["gamma_v2"] = np.abs(correlation(after, dirs["v2"][:Tm, None, None, :], corr)).reshape(
        Tm, -1
    )
    coef = np.einsum("tdk,tpnd->tpnk", bases[:Tm], after)
    proj_x = np.einsum("tdk,tpnk->tpnd", bases[:Tm], coef)
    out["corr_proj"] = np.abs(correlation(after, proj_x, corr)).reshape(Tm, -1)
    out["token_distance"] = token_distance(S, normalize=normalize_distance)
    return out


# --------------------------------------------------------------------------- prompts


def random_prompts(
    vocab_size: int,
    n_prompts: int,
    n_tokens: int,
    seed: int = 0,
    special_ids_to_avoid: Iterable[int] = (),
) -> np.ndarray:
    """(n_prompts, n_tokens) int64 token ids drawn uniformly from the vocabulary minus
    ``special_ids_to_avoid`` (the paper's random prompts), reproducible from ``seed``."""
    avoid = np.unique(np.asarray(list(special_ids_to_avoid), dtype=np.int64))
    allowed = np.setdiff1d(np.arange(int(vocab_size), dtype=np.int64), avoid)
    if allowed.size == 0:
        raise ValueError("no token id left after removing the special ids")
    rng = np.random.default_rng(seed)
    return allowed[rng.integers(0, allowed.size, size=(int(n_prompts), int(n_tokens)))]


def text_prompts(
    tokenizer: Any, lines: Iterable[str], n_tokens: int, add_special_tokens: bool = False
) -> np.ndarray:
    """(n_prompts, n_tokens) int64: the first ``n_tokens`` token ids of each text line.

    Lines with fewer tokens are skipped, so every prompt has the same length (no padding,
    whose positions would enter the metrics). ``tokenizer`` is any callable returning a
    mapping with ``"input_ids"`` (a ``transformers`` tokenizer).
    """
    rows = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        ids = list(tokenizer(line, add_special_tokens=add_special_tokens)["input_ids"])
        if len(ids) >= n_tokens:
            rows.append(ids[:n_tokens])
    if not rows:
        raise ValueError(f"no line has at least {n_tokens} tokens")
    return np.asarray(rows, dtype=np.int64)


def load_tokenizer(model_dir: str | Path) -> Any | None:
    """The model's tokenizer from its folder, or None when the folder has none.

    A folder without any tokenizer file (a random twin built from a configuration) has
    none: ``AutoTokenizer`` would otherwise build a vocabulary-less tokenizer of the
    family from nothing, after seconds of imports, whose special ids are not the model's.
    A tokenizer that is there but does not load is an InputFileError naming its file
    (dropping it would change the random prompts under the same seed). Loaded with
    ``trust_remote_code=False``: an ``auto_map`` naming code in the model folder is never
    run (transformers would otherwise ask "[y/N]" on the job's terminal), and a
    tokenizer that exists only as such code is refused.
    """
    model_dir = Path(model_dir)
    files = sorted({f for p in TOKENIZER_PATTERNS for f in model_dir.glob(p) if f.is_file()})
    if not files:
        return None
    for file in files:
        if file.suffix == ".json":
            try:
                json.loads(file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise InputFileError(
                    f"{file}: the tokenizer file is damaged (not JSON: {exc}); fix: copy "
                    "the model's original tokenizer files into the folder again"
                ) from exc
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            str(model_dir), local_files_only=True, trust_remote_code=False
        )
    except Exception as exc:  # transformers raises assorted types for a bad tokenizer
        text = " ".join(str(exc).split())
        if "trust_remote_code" in text or "custom code" in text:
            raise InputFileError(
                f"{model_dir / 'tokenizer_config.json'}: the tokenizer exists only as code in "
                "the model folder (auto_map); the workflow never runs code from a model "
                "folder; fix: give the folder a tokenizer.json or a tokenizer class of "
                "transformers (tokenizer_class)"
            ) from exc
        raise InputFileError(
            f"{model_dir}: the tokenizer ({', '.join(f.name for f in files)}) does not load "
            f"({type(exc).__name__}: {text[:300]}); fix: copy the model's original "
            "tokenizer files into the folder again"
        ) from exc


def prompt_ids(model_dir: str | Path, cfg: Mapping[str, Any]) -> np.ndarray:
    """(n_prompts, n_tokens) token ids for the configured prompt source.

    ``random``: seeded uniform ids from the vocabulary without the special tokens (the
    tokenizer's, and config.json's pad/bos/eos ids for folders without a tokenizer, such as
    random twins built from a config: a pad id inside a RoBERTa prompt would shift its
    positions) (the paper's ALBERT figures use 100 prompts of 10 tokens). ``text``: the first
    ``n_tokens`` tokens of each line of a local file that has that many. ``dataset``:
    the same from a Hugging Face dataset's text column (needs the ``datasets`` package
    and the network).
    """
    config = json.loads((Path(model_dir) / "config.json").read_text())
    n_prompts, n_tokens = int(cfg["n_prompts"]), int(cfg["n_tokens"])
    tok = load_tokenizer(model_dir)
    if cfg["kind"] == "random":
        special = list(getattr(tok, "all_special_ids", []) or []) if tok else []
        for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
            ids = config.get(key)
            special += [int(i) for i in (ids if isinstance(ids, list) else [ids]) if i is not None]
        return random_prompts(
            int(config["vocab_size"]), n_prompts, n_tokens, int(cfg["seed"]), special
        )
    if tok is None:
        raise InputFileError(f"{model_dir}: no tokenizer files for {cfg['kind']} prompts")
    if cfg["kind"] == "text":
        lines = Path(cfg["text_file"]).read_text(encoding="utf-8").splitlines()
    else:
        try:
            import datasets
        except ImportError as exc:
            raise RuntimeError(
                "prompts.kind 'dataset' needs the `datasets` package (pip install datasets) "
                "and network access; use kind 'text' with a local file offline"
            ) from exc
        data = datasets.load_dataset(
            cfg["dataset"], cfg.get("dataset_config"), split=cfg["dataset_split"]
        )
        lines = (row[cfg["dataset_column"]] for row in data)
    ids = text_prompts(tok, lines, n_tokens)
    return ids[:n_prompts]


# --------------------------------------------------------------------------- propagation


def torch_dtype(name: str) -> Any:
    """The torch dtype of a config name (``propagation.real_dtype``)."""
    import torch

    return {"float32": torch.float32, "float64": torch.float64}[name]


def propagation_states(
    mw: ModelWeights,
    hidden: np.ndarray,
    eta: float,
    cfg: Mapping[str, Any],
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, np.ndarray]:
    """The token states of every mode, each (T_mode + 1, n_prompts, n_tokens, d).

    ``hidden``: the real model's states (:func:`real_forward_hidden_states`), computed by
    the caller first, so that the model is freed before the float64 weights are read (at
    GPT-Neo 2.7B the two together would not fit 16 GiB); the simplified runs start from
    its embedding output. ``progress(done, total)`` is called after each attention
    reading; a simplified run and its prolonged continuation share one pass
    (``simplified_*`` is a view of the first ``n_layers + 1`` states of ``prolonged_*``).
    """
    T = max(int(cfg["prolonged_layers"]), mw.n_layers)
    prolong = T > mw.n_layers
    states = {"real_model": hidden}
    for i, attention in enumerate(("real", "full"), start=1):
        # A prolonged run repeats the last layer after the model's own layers, so the
        # model's run is its first n_layers + 1 states: one pass computes both.
        run = simplified_forward(mw, np.asarray(hidden[0], np.float64), eta, attention, T)
        states[f"simplified_{attention}"] = run[: mw.n_layers + 1]
        if prolong:
            states[f"prolonged_{attention}"] = run
        if progress:
            progress(i, 2)
    return {mode: states[mode] for mode in MODES if mode in states}


def propagation_dataset(
    mw: ModelWeights,
    states: Mapping[str, np.ndarray],
    cfg: Mapping[str, Any],
    seed: int,
    directions: Sequence[Mapping[str, Any]] | None = None,
) -> xr.Dataset:
    """All metrics of ``propagation_metrics`` with the configured correlation,
    plus ``gamma``, ``psi``, ``rho`` and their random-direction nulls under the other
    correlation (suffix ``_pearson`` or ``_cosine``) so the two readings can be compared.
    ``directions``: the blocks' directions from ``spectra.nc`` (decomposed here if None).
    """
    corr = cfg["corr"]
    other = "pearson" if corr == "cosine" else "cosine"
    draws = int(cfg["null_draws"])
    if directions is None:
        directions = [block_principal_directions(mw, blk) for blk in mw.blocks]
    kw = {"n_null_draws": draws, "seed": seed, "directions": directions}
    ds = propagation_metrics(mw, states, corr=corr, **kw)
    alt = propagation_metrics(mw, states, corr=other, **kw)
    for var in ("gamma", "psi", "rho", "gamma_null", "rho_null", "rho_mean"):
        ds[f"{var}_{other}"] = alt[var]
        ds[f"{var}_{other}"].attrs["description"] = f"{var} with corr = {other}"
    ds.attrs.update(corr=corr, corr_other=other)
    return describe(ds, PROPAGATION)
