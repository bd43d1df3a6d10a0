"""Token propagation through transformer layers (Li & Altafini, arXiv:2605.25619).

The paper reads one transformer layer, without its feed-forward sub-layer and with
LayerNorm taken as normalisation onto the sphere, as a step of the power method on
``I + eta F_t`` (``F_t = W_O W_V`` of layer t):

    x_i <- normalize(x_i + eta * sum_h sum_j A^h_ij F^h x_j).

This module runs that *simplified* model from the embedding output (Figures 1-6, 8-10),
with each layer's real attention reconstructed as the family computes it (norms, masks,
rotary positions), and gathers the states of every mode of the propagate rule: the
simplified runs beside the *real* model's hidden states (Figures 11-12, from
:mod:`specalign.transformers.load.hf`). The metrics of those states are
:mod:`specalign.transformers.measure.metrics`, against the directions of
:mod:`specalign.transformers.measure.directions`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np
import xarray as xr

from specalign.transformers import metric_table
from specalign.transformers.load.contracts import MODES
from specalign.transformers.measure.directions import block_principal_directions, layer_schedule
from specalign.transformers.measure.linalg import rows_matmul, stacked_matmul, unit
from specalign.transformers.measure.metrics import MetricsStream
from specalign.transformers.variables import PROPAGATION, describe
from specalign.transformers.weights import BlockWeights, ModelWeights, first_of_groups

__all__ = [
    "apply_rotary",
    "attention_sublayer",
    "attention_weights",
    "family_norm",
    "layer_norm",
    "PropagationRun",
    "propagation_dataset",
    "propagation_run",
    "propagation_states",
    "rms_norm",
    "rotary_tables",
    "simplified_forward",
    "simplified_steps",
]


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
    Q = _heads_split(rows_matmul(Z, blk.W_Q.T) + blk.b_Q, mw.n_heads)
    K = _kv_heads(mw, Z, blk.W_K, blk.b_K)
    if blk.q_norm is not None and blk.k_norm is not None:
        Q, K = rms_norm(Q, blk.q_norm, mw.ln_eps), rms_norm(K, blk.k_norm, mw.ln_eps)
    if mw.rotary is not None:
        cos, sin = rotary_tables(mw, layer, Z.shape[-2])
        Q, K = apply_rotary(Q, cos, sin, mw.rotary), apply_rotary(K, cos, sin, mw.rotary)
    return Q, _query_heads(mw, K)


def _kv_heads(
    mw: ModelWeights, Z: np.ndarray, W: np.ndarray, b: np.ndarray | None = None
) -> np.ndarray:
    """(P, n_kv_heads, n, d_head): Z projected by a key or value map once per key/value
    head. The block's W_K and W_V are expanded to one row block per query head, and with
    grouped-query attention the rows of a group's query heads are copies: projecting
    through all of them is n_heads / n_kv_heads times the work (4x at Mistral-7B's
    shape, 8x at Llama-3-70B's). The per-head steps that follow (q/k norms, rotary
    positions) are applied at n_kv_heads too, then :func:`_query_heads` repeats them."""
    kv = mw.kv_heads
    W = first_of_groups(W, mw.n_heads, kv)
    b = None if b is None else first_of_groups(b, mw.n_heads, kv)
    Y = rows_matmul(Z, W.T)
    return _heads_split(Y if b is None else Y + b, kv)


def _query_heads(mw: ModelWeights, K: np.ndarray) -> np.ndarray:
    """(P, n_heads, n, d_head) from key/value heads (P, n_kv_heads, n, d_head): query
    head h reads key/value head h // (n_heads / n_kv_heads)."""
    group = mw.n_heads // mw.kv_heads
    return K if group == 1 else np.repeat(K, group, axis=-3)


def _softmax_attention(
    mw: ModelWeights, blk: BlockWeights, kind: str, layer: int, Z: np.ndarray
) -> np.ndarray:
    """(P, H, n, n) softmax(cap(attn_scale * Q K^T)) under the layer's mask, from the
    norm-scale inputs Z (see :func:`_queries_keys`)."""
    Q, K = _queries_keys(mw, blk, layer, Z)
    scores = mw.attn_scale * stacked_matmul(Q, np.swapaxes(K, -1, -2))
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
    b, kind, ell = layer_schedule(mw, layer + 1)[layer]
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
    V = _query_heads(mw, _kv_heads(mw, Z, blk.W_V, blk.b_V))
    ctx = np.moveaxis(stacked_matmul(A, V), -3, -2)  # (P, n, H, dh)
    out = rows_matmul(ctx.reshape(*ctx.shape[:-2], -1), blk.W_O.T) + blk.b_O
    return out[0] if squeeze else out


# --------------------------------------------------------------------------- forward


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
    steps = simplified_steps(mw, X0, eta, attention, n_layers, start)  # checks the input
    n_states = len(layer_schedule(mw, n_layers)[start:]) + 1
    states = np.empty((n_states, *np.shape(X0)))
    for t, state in enumerate(steps):
        states[t] = state
    return states


def simplified_steps(
    mw: ModelWeights,
    X0: np.ndarray,
    eta: float,
    attention: Literal["real", "full"] = "real",
    n_layers: int | None = None,
    start: int = 0,
) -> Iterator[np.ndarray]:
    """The states of :func:`simplified_forward` one at a time, (n_prompts, n_tokens, d)
    each, state ``start`` first: a caller that reduces each state as it comes (the
    propagate rule's metrics) never holds the run, which grows with depth (issue 14).
    The input is checked here, before the first state is asked for."""
    X, squeeze = _as_batch(X0, mw.d_model)
    if squeeze:
        raise ValueError("X0 must be (n_prompts, n_tokens, d)")
    if attention not in ("real", "full"):
        raise ValueError(f"attention must be 'real' or 'full', got {attention!r}")
    return _steps(mw, X, eta, attention, layer_schedule(mw, n_layers)[start:], start)


def _steps(
    mw: ModelWeights,
    X: np.ndarray,
    eta: float,
    attention: str,
    sched: list[tuple[int, str, int]],
    start: int,
) -> Iterator[np.ndarray]:
    n = X.shape[1]
    X = unit(X) if start == 0 else np.array(X, dtype=np.float64)
    yield X
    A_full = _uniform_attention(n, mw.causal) if attention == "full" else None
    # W_O W_V once per run of layers of one block (ALBERT's shared one, a prolonged run's
    # repeated last one: a block's layers are consecutive), only the current block's kept,
    # so a lazily read mw holds one block; a factored (grouped-query) model applies F x as
    # W_O'(W_V' x) instead: 2 d r flops per token, never d x d
    F: dict[int, Any] = {}
    for b, kind, layer in sched:
        blk = mw.blocks[b]
        if A_full is not None:
            if b not in F:
                F = {b: mw.ov_factors(blk) if mw.factored else blk.F}
            if mw.factored:
                W_O, W_V = F[b]
                drift = rows_matmul(rows_matmul(A_full @ X, W_V.T), W_O.T)
            else:
                drift = rows_matmul(A_full @ X, F[b].T)
        else:
            A = _softmax_attention(mw, blk, kind, layer, family_norm(mw, blk, X))
            # mixing W_V x before W_O costs H d_head d per token instead of H d^2 for F^h
            V = _query_heads(mw, _kv_heads(mw, X, blk.W_V))
            ctx = np.moveaxis(stacked_matmul(A, V), -3, -2)
            drift = rows_matmul(ctx.reshape(*ctx.shape[:-2], -1), blk.W_O.T)
        # the block goes before the next one is read: a lazily read mw then holds one
        # (2.15 GB in float64 at Llama-3-70B's width), not the one in use and the next
        del blk
        X = unit(X + eta * drift)
        yield X


# --------------------------------------------------------------------------- propagation


def propagation_states(
    mw: ModelWeights,
    hidden: np.ndarray,
    eta: float,
    cfg: Mapping[str, Any],
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, np.ndarray]:
    """The token states of every mode, each (T_mode + 1, n_prompts, n_tokens, d).

    ``hidden``: the real model's states
    (:func:`specalign.transformers.load.hf.real_forward_hidden_states`), computed by the caller
    first, so that the model is freed before the float64 weights are read (at
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
    """All metrics of ``propagation_metrics`` with the configured correlation, plus
    those the metric table stores under the other correlation too
    (:func:`~specalign.transformers.metric_table.other_variables`: ``gamma``, ``psi``,
    ``rho``, ``rho_mean`` and the random-direction nulls of gamma and rho), suffixed
    ``_pearson`` or ``_cosine``, so that the two readings can be compared.
    ``directions``: the blocks' directions from ``spectra.nc`` (decomposed here if None).
    The propagate rule computes the same dataset with :func:`propagation_run`, without
    holding the states.
    """
    first = np.shape(next(iter(states.values())))
    stream = _metrics_stream(
        mw, {m: np.shape(s)[0] - 1 for m, s in states.items()}, first[1:3], cfg, seed, directions
    )
    for mode, S in states.items():
        for X in S:
            stream.add(mode, X)
    return _both_readings(stream, cfg)


class PropagationRun(NamedTuple):
    """What :func:`propagation_run` returns."""

    #: the metrics (:func:`propagation_dataset`)
    dataset: xr.Dataset
    #: each mode's number of layers, in the dataset's order
    layers: dict[str, int]
    #: for each mode whose states stop being finite, the first such state (0: the
    #: embedding output)
    first_nonfinite: dict[str, int]


def propagation_run(
    mw: ModelWeights,
    hidden: Sequence[np.ndarray],
    eta: float,
    cfg: Mapping[str, Any],
    seed: int,
    directions: Sequence[Mapping[str, Any]] | None = None,
    progress: Callable[[int, int], None] | None = None,
    threads: int = 1,
) -> PropagationRun:
    """:func:`propagation_dataset` of :func:`propagation_states`, each state reduced to
    its metrics as it is computed (:class:`~specalign.transformers.measure.metrics.MetricsStream`):
    only a layer's states are held, never the T + 1 of a simplified run (issue 14: at
    Llama-3-70B's width the two 81-state runs of 1000 tokens would be 10.6 GB in
    float64). ``hidden``, the real model's states (float32, as computed), is read a state
    at a time: an array, or a :class:`specalign.io.DiskStack` from
    :func:`specalign.transformers.load.hf.streamed_states` (the propagate rule's). The values
    are those of the whole runs, bit for bit.

    The two simplified runs (real and full attention) advance together, a layer at a
    time, so that a lazily read ``mw`` reads each block once for both.
    ``progress(done, T + 1)`` is called after each of their states; ``threads``: the
    job's cores, on which the two correlations' metrics of a state are computed side by
    side.
    """
    L = mw.n_layers
    T = max(int(cfg["prolonged_layers"]), L)
    prolong = T > L
    layers = {"real_model": np.shape(hidden)[0] - 1}
    for attention in ("real", "full"):
        layers[f"simplified_{attention}"] = L
        if prolong:
            layers[f"prolonged_{attention}"] = T
    modes = {m: layers[m] for m in MODES if m in layers}
    stream = _metrics_stream(mw, modes, np.shape(hidden)[1:3], cfg, seed, directions, threads)
    for X in hidden:
        stream.add("real_model", X)
    X0 = np.asarray(hidden[0], np.float64)
    # a prolonged run repeats the last layer after the model's own layers, so the
    # model's run is its first L + 1 states: one pass computes both
    attentions = ("real", "full")
    both = {a: [f"simplified_{a}", f"prolonged_{a}"][: 1 + prolong] for a in attentions}
    # the two attentions' runs advance a layer at a time together: each step asks for
    # its layer's block, which a lazily read mw has just read for the other run (it
    # keeps the last block), so weights.h5 is read once for both, not once a run
    runs = [simplified_steps(mw, X0, eta, a, T) for a in attentions]
    for t, states in enumerate(zip(*runs, strict=True)):
        for attention, X in zip(attentions, states, strict=True):
            # the states a run and its prolongation share are measured once
            stream.add(both[attention] if t <= L else both[attention][1:], X)
        del states
        if progress:
            progress(t + 1, T + 1)
    return PropagationRun(_both_readings(stream, cfg), modes, dict(stream.first_nonfinite))


def _metrics_stream(
    mw: ModelWeights,
    modes: Mapping[str, int],
    prompts_tokens: Sequence[int],
    cfg: Mapping[str, Any],
    seed: int,
    directions: Sequence[Mapping[str, Any]] | None,
    threads: int = 1,
) -> MetricsStream:
    """The metrics of both correlations in one pass, the configured one first."""
    corr = cfg["corr"]
    other = "pearson" if corr == "cosine" else "cosine"
    if directions is None:
        directions = [block_principal_directions(mw, blk) for blk in mw.blocks]
    P, N = prompts_tokens
    return MetricsStream(
        mw,
        modes,
        P,
        N,
        corrs=(corr, other),
        n_null_draws=int(cfg["null_draws"]),
        seed=seed,
        directions=directions,
        threads=threads,
    )


def _both_readings(stream: MetricsStream, cfg: Mapping[str, Any]) -> xr.Dataset:
    corr, other = stream.corrs
    ds = stream.dataset(corr)
    alt = stream.dataset(other)
    for var in metric_table.other_variables():
        ds[f"{var}_{other}"] = alt[var]
        ds[f"{var}_{other}"].attrs["description"] = f"{var} with corr = {other}"
    ds.attrs.update(corr=corr, corr_other=other)
    return describe(ds, PROPAGATION)
