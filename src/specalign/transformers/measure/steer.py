"""Steering the output of a transformer through its last layer's W_O (Section 3.3).

In the power-method reading, the last layer tilts tokens towards the principal
eigenvector of ``F_T = W_O W_V``. Making a chosen unit direction u an eigenvector of the
modified ``F' = W_O' W_V`` with eigenvalue ``c * r`` (r the spectral radius of the original
F_T; c > 1 aims at making u the leading direction) therefore steers the last-layer tokens
towards u (Figures 3 and 10). Only W_O of the last layer changes; W_V, the attention
pattern and every other layer are untouched.

Two constructions of ``Delta = W_O' - W_O``:

* ``min_norm`` -- the minimum-Frobenius-norm solution of ``Delta (W_V u) = c r u - F u``,
  ``Delta = (c r u - F u)(W_V u)^T / ||W_V u||^2``: a rank-one change that makes u an exact
  eigenvector whenever ``W_V u != 0``.
* ``lstsq`` -- the rank-one change of F itself, ``F_mod = F + (c r u - F u) u^T``, pulled
  back to W_O through the pseudo-inverse of W_V: ``W_O' = F_mod W_V^+``, i.e.
  ``Delta = (c r u - F u) u^T W_V^+``. It is exact when u lies in the row space of W_V
  (always, for the square invertible W_V of BERT/GPT-2), but its norm scales with
  ``||W_V^{+T} u||`` >= ``1/||W_V u||`` and blows up for ill-conditioned W_V.

Both are reported as ``||Delta||_F / ||W_O||_F``; the min-norm one is never larger.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import xarray as xr

from specalign.io import DiskStack, InputFileError
from specalign.runtime import heap_set_aside
from specalign.transformers.load import contracts, hf, streaming
from specalign.transformers.load.families import adapter_class
from specalign.transformers.measure import metrics, propagate, spectra
from specalign.transformers.measure.directions import block_principal_directions, layer_directions
from specalign.transformers.measure.metrics import Corr
from specalign.transformers.variables import STEERING, describe
from specalign.transformers.weights import BlockWeights, ModelWeights

Method = Literal["min_norm", "lstsq"]

__all__ = [
    "SteeringResult",
    "SteeringTarget",
    "compare_steering",
    "next_token_prob_change",
    "steer",
    "model_inputs",
    "model_space",
    "next_token_probs",
    "steer_model_weights",
    "steered_weights",
    "steering_gamma",
    "steering_target",
    "target_direction",
]


@dataclass
class SteeringResult:
    """Outcome of one W_O modification (all float64, package convention (out, in)).

    Both methods change W_O by a rank-one Delta = outer(left, right) / scale (Sec. 3.3),
    kept as those factors: at Llama-3-70B's width a Delta is 0.54 GB, and a variant's
    result held it beside W_O'."""

    method: str
    W_O: np.ndarray  # modified output projection (d_model, n_heads*d_head)
    delta_factors: tuple[np.ndarray, np.ndarray, float]  # (left, right, scale) of Delta
    W_V: np.ndarray  # the layer's (unchanged, expanded) value projection
    target_eigenvalue: float  # c * r
    old_spectral_radius: float  # r
    relative_change: float  # ||Delta||_F / ||W_O||_F
    residual: float  # ||F' u - c r u|| / |c r| (/ r for c = 0): 0 for an exact eigenvector
    u_is_leading: bool  # c r is (one of) F''s eigenvalues of largest real part
    eigenvalues: np.ndarray  # of F', sorted as in spectra.py (a factored F': its r listed)
    directions: dict[str, Any]  # of F' (spectra.directions): the steered last layer's

    @property
    def delta(self) -> np.ndarray:
        """Delta = W_O' - W_O (d_model x n_heads*d_head, formed on request)."""
        return _rank_one(*self.delta_factors)

    @property
    def F(self) -> np.ndarray:
        """The modified F' = W_O' W_V (d x d, formed on request: a grouped-query layer's
        steering never needs it)."""
        return self.W_O @ self.W_V


def _unit(u: np.ndarray) -> np.ndarray:
    u = np.asarray(u, dtype=np.float64).reshape(-1)
    norm = np.linalg.norm(u)
    if not np.isfinite(norm) or norm == 0:
        raise ValueError("target direction u must be a finite non-zero vector")
    return u / norm


def steer(
    W_O: np.ndarray,
    W_V: np.ndarray,
    u: np.ndarray,
    c: float = 1.0,
    method: Method = "min_norm",
    rcond: float | None = None,
    radius: float | None = None,
    W_V_pinv: np.ndarray | None = None,
    n_heads: int | None = None,
    n_kv_heads: int | None = None,
) -> SteeringResult:
    """Change W_O so that u is an eigenvector of ``F' = W_O' W_V`` with eigenvalue ``c r``.

    Parameters
    ----------
    W_O : (d_model, n_heads*d_head) output projection of the layer.
    W_V : (n_heads*d_head, d_model) value projection.
    u : (d_model,) target direction (normalised here).
    c : factor on the old spectral radius r of F = W_O W_V.
    method : "min_norm" or "lstsq" (see the module docstring).
    rcond : cut-off for ``numpy.linalg.pinv`` in "lstsq" (numpy's default when None).
    radius : the spectral radius r of F when already known (it is the same for every
        variant of one layer: an eigen-decomposition saved per call).
    W_V_pinv : ``pinv(W_V, rcond)`` when already known (same reason, an SVD saved); for a
        factored layer ``pinv(W_V', rcond)`` of its key/value rows.
    n_heads, n_kv_heads : the layer's heads; with grouped-query attention and r =
        n_kv_heads * d_head < d the change is computed on the factors, never forming a
        d x d product (:func:`_steer_factored`; the same Delta up to round-off).

    F' is decomposed once (``spectra.sorted_eigenpairs``): its eigenvalues decide
    ``u_is_leading`` and its :func:`~specalign.transformers.measure.spectra.directions` are the
    steered layer's, for the per-layer metrics.
    """
    W_O = np.asarray(W_O, dtype=np.float64)
    W_V = np.asarray(W_V, dtype=np.float64)
    if W_O.ndim != 2 or W_V.ndim != 2 or W_O.shape != W_V.shape[::-1]:
        raise ValueError(f"W_O {W_O.shape} and W_V {W_V.shape} must be (d, k) and (k, d)")
    u = _unit(u)
    if u.size != W_V.shape[1]:
        raise ValueError(f"u has {u.size} components, the model width is {W_V.shape[1]}")
    heads = _grouping(W_V, n_heads, n_kv_heads)
    if heads is not None:
        return _steer_factored(W_O, W_V, u, c, method, rcond, radius, W_V_pinv, *heads)
    F = W_O @ W_V
    r = float(np.max(np.abs(np.linalg.eigvals(F)))) if radius is None else float(radius)
    target = c * r
    rhs = target * u - F @ u  # what Delta must add to F u
    a = W_V @ u
    if method == "min_norm":
        factors = _min_norm_delta(rhs, a)
    elif method == "lstsq":
        pinv = W_V_pinv if W_V_pinv is not None else _pinv(W_V, rcond)
        factors = (rhs, u @ pinv, 1.0)
    else:
        raise ValueError(f"method must be 'min_norm' or 'lstsq', got {method!r}")
    W_new = _rank_one(*factors)
    W_new += W_O  # W_O + Delta, without a second d x k array
    F_new = W_new @ W_V
    lam, column = spectra.sorted_eigenpairs(F_new)
    return _steering_result(
        method, W_O, W_new, factors, W_V, target, r, F_new @ u - target * u,
        lam, spectra.directions(lam, column, F_new.shape[0]), top=lam.real.max(),
    )  # fmt: skip


def _min_norm_delta(rhs: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """The smallest Delta (Frobenius norm) with Delta a = rhs, a = W_V u (Sec. 3.3):
    outer(rhs, a) / |a|^2, as its factors (:func:`_rank_one`)."""
    na2 = float(a @ a)
    if na2 == 0.0:
        raise ValueError("W_V u = 0: no change of W_O alone can make u an eigenvector")
    return rhs, a, na2


def _rank_one(left: np.ndarray, right: np.ndarray, scale: float) -> np.ndarray:
    """outer(left, right) / scale, in one array (the same values as written out)."""
    out = np.outer(left, right)
    if scale != 1.0:
        out /= scale
    return out


def _steering_result(
    method: str,
    W_O: np.ndarray,
    W_new: np.ndarray,
    delta_factors: tuple[np.ndarray, np.ndarray, float],
    W_V: np.ndarray,
    target: float,
    r: float,
    miss: np.ndarray,
    eigenvalues: np.ndarray,
    directions: dict[str, Any],
    top: float,
) -> SteeringResult:
    """One steering variant's result; ``miss`` is F' u - c r u, whose relative norm is the
    stored residual (u an exact eigenvector: round-off), ``top`` F''s largest real
    eigenvalue, which decides whether u is now the leading direction."""
    # relative to the target eigenvalue |c r|; for c = 0 (u sent to F''s null space)
    # relative to r, the size of F's eigenvalues its round-off follows: against |0| (a
    # floor of the smallest float) round-off read as 2e291, "not an eigenvector"
    scale = abs(target) if target != 0 else abs(r)
    left, right, s = delta_factors
    # ||outer(l, r) / s||_F = ||l|| ||r|| / |s|: no d x k array for a norm
    delta_norm = float(np.linalg.norm(left) * np.linalg.norm(right) / abs(s))
    return SteeringResult(
        method=method,
        W_O=W_new,
        delta_factors=delta_factors,
        W_V=W_V,
        target_eigenvalue=float(target),
        old_spectral_radius=r,
        relative_change=delta_norm / float(np.linalg.norm(W_O)),
        residual=float(np.linalg.norm(miss) / scale) if scale > 0 else float("nan"),
        u_is_leading=bool(target >= top - 1e-9 * max(1.0, abs(top))),
        eigenvalues=eigenvalues,
        directions=directions,
    )


def _grouping(
    W_V: np.ndarray, n_heads: int | None, n_kv_heads: int | None
) -> tuple[int, int] | None:
    """(n_heads, n_kv_heads) when the layer is to be steered through its factors (grouped
    query attention with r = n_kv_heads * d_head < d), None for the dense path."""
    if n_heads is None or n_kv_heads is None or n_kv_heads == n_heads:
        return None
    rank_bound = n_kv_heads * (W_V.shape[0] // n_heads)
    return (int(n_heads), int(n_kv_heads)) if rank_bound < W_V.shape[1] else None


def _steer_factored(
    W_O: np.ndarray,
    W_V: np.ndarray,
    u: np.ndarray,
    c: float,
    method: str,
    rcond: float | None,
    radius: float | None,
    W_V_pinv: np.ndarray | None,
    n_heads: int,
    n_kv_heads: int,
) -> SteeringResult:
    """:func:`steer` of a grouped-query layer without a d x d product.

    F u = W_O (W_V u) costs two matrix-vector products. The min-norm Delta is the same
    formula. For "lstsq", W_V (expanded) = E W_V' with E replicating each key/value head's
    rows over its g = n_heads / n_kv_heads query heads, and E / sqrt(g) has orthonormal
    columns, so pinv(W_V) = pinv(W_V') E^T / g: the SVD is of the (r, d) W_V' (``W_V_pinv``
    is then ``pinv(W_V')``, (d, r)), and each query head of a group gets 1/g of its
    key/value head's share. F' = W_O' W_V is decomposed through W_V' W_O'^{grouped}
    (:func:`spectra.spectrum_factored`).
    """
    from specalign.transformers.weights import BlockWeights, expand_rows, ov_factors

    def factors(W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        zeros = np.zeros(0)
        blk = BlockWeights(W, W_V, W_V, W, zeros, zeros, zeros, zeros, zeros, zeros)
        return ov_factors(blk, n_heads, n_kv_heads)

    W_Og, W_Vg = factors(W_O)
    if radius is None:
        radius = float(np.max(np.abs(np.linalg.eigvals(W_Vg @ W_Og))))
    r = float(radius)
    target = c * r
    a = W_V @ u
    rhs = target * u - W_O @ a  # what Delta must add to F u
    if method == "min_norm":
        delta = _min_norm_delta(rhs, a)
    elif method == "lstsq":
        pinv = W_V_pinv if W_V_pinv is not None else _pinv(W_Vg, rcond)
        g = n_heads // n_kv_heads
        delta = (rhs, expand_rows(u @ pinv, n_heads, n_kv_heads) / g, 1.0)
    else:
        raise ValueError(f"method must be 'min_norm' or 'lstsq', got {method!r}")
    W_new = _rank_one(*delta)
    W_new += W_O  # W_O + Delta, without a second d x k array
    spec = spectra.spectrum_factored(*factors(W_new), eta=1.0)
    top = max(float(spec["eigenvalues"].real.max()), 0.0)  # F' has exact zeros too
    return _steering_result(
        method, W_O, W_new, delta, W_V, target, r, W_new @ a - target * u,
        spec["eigenvalues"], spec["directions"], top=top,
    )  # fmt: skip


def _pinv(W_V: np.ndarray, rcond: float | None = None) -> np.ndarray:
    return np.linalg.pinv(W_V) if rcond is None else np.linalg.pinv(W_V, rcond=rcond)


def compare_steering(
    W_O: np.ndarray, W_V: np.ndarray, u: np.ndarray, c: float = 1.0
) -> dict[str, SteeringResult]:
    """Both constructions side by side: ``{"min_norm": ..., "lstsq": ...}``."""
    return {m: steer(W_O, W_V, u, c, method=m) for m in ("min_norm", "lstsq")}


def target_direction(embedding_matrix: np.ndarray, token_id: int) -> np.ndarray:
    """The normalised input-embedding row of ``token_id`` (vocab, d) -> (d,): the direction
    in token space the paper steers towards."""
    E = np.asarray(embedding_matrix)
    if E.ndim != 2:
        raise ValueError(f"embedding matrix must be (vocab, d), got {E.shape}")
    if not 0 <= int(token_id) < E.shape[0]:
        raise ValueError(f"token id {token_id} outside the vocabulary of {E.shape[0]}")
    return _unit(E[int(token_id)])


def steered_weights(mw: ModelWeights, W_O_new: np.ndarray) -> ModelWeights:
    """A copy of ``mw`` whose last layer uses ``W_O_new``; all other layers keep theirs.

    The last layer gets a block of its own (a copy of its block with the new W_O) unless
    no other layer shares its block, so for ALBERT's shared block only the last
    application changes. The unchanged arrays are shared with ``mw``, not copied (a
    model's float64 weights can be several GB); no function of the package changes a
    weight array in place.
    """
    W_O_new = np.asarray(W_O_new, dtype=np.float64)
    last = int(mw.layer_block[-1])
    if W_O_new.shape != mw.blocks[last].W_O.shape:
        raise ValueError(f"new W_O {W_O_new.shape} != old {mw.blocks[last].W_O.shape}")
    block = dataclasses.replace(mw.blocks[last], W_O=W_O_new.copy())
    layer_block = np.asarray(mw.layer_block).copy()
    own = np.count_nonzero(layer_block == last) == 1
    if not isinstance(mw.blocks, list):  # read lazily: the other blocks stay in the file
        out = dataclasses.replace(mw, blocks=_ReplacedBlocks(mw.blocks, last, block, own))
        if not own:
            layer_block[-1] = len(mw.blocks)
        out.layer_block = layer_block
        return out
    out = dataclasses.replace(mw, blocks=list(mw.blocks))
    if own:
        out.blocks[last] = block
    else:
        out.blocks.append(block)
        layer_block[-1] = len(out.blocks) - 1
    out.layer_block = layer_block
    return out


class _ReplacedBlocks(Sequence[BlockWeights]):
    """``base`` (a lazily read model's blocks) with block ``index`` replaced by ``block``
    (``replace``), or with ``block`` appended after them: :func:`steered_weights` of a
    lazily read model, which reads no block it does not run."""

    def __init__(self, base: Sequence[BlockWeights], index: int, block: BlockWeights,
                 replace: bool) -> None:  # fmt: skip
        self.base, self.index, self.block, self.replace = base, index, block, replace
        self.d_head = getattr(base, "d_head", None)

    def __len__(self) -> int:
        return len(self.base) + (0 if self.replace else 1)

    def __getitem__(self, b: Any) -> Any:
        if isinstance(b, slice):
            return [self[i] for i in range(*b.indices(len(self)))]
        n, b = len(self), int(b)
        if not -n <= b < n:
            raise IndexError(f"block {b} of {n}")
        b %= n
        if b == (self.index if self.replace else len(self.base)):
            return self.block
        return self.base[b]


def steer_model_weights(
    mw: ModelWeights, u: np.ndarray, c: float = 1.0, method: Method = "min_norm"
) -> tuple[ModelWeights, SteeringResult]:
    """Steer the last layer of ``mw`` towards u; returns the modified weights and result."""
    blk = mw.blocks[int(mw.layer_block[-1])]
    res = steer(blk.W_O, blk.W_V, u, c, method=method, n_heads=mw.n_heads,
                n_kv_heads=mw.kv_heads)  # fmt: skip
    return steered_weights(mw, res.W_O), res


def steering_gamma(
    mw: ModelWeights,
    X0: np.ndarray,
    eta: float,
    u: np.ndarray,
    W_O_new: np.ndarray,
    attention: Literal["real", "full"] = "real",
    corr: Corr = "cosine",
) -> xr.Dataset:
    """``|corr(x_i, u)|`` after the last layer of the simplified model, with and without
    the W_O change (Figure 3's question: does the output turn towards u?).

    Variables ``gamma_u`` (variant, token) and ``gamma_u_mean`` (variant, prompt) for the
    mean token of each prompt; ``variant`` = ["original", "steered"]; ``token`` is the
    prompt-major flattened (prompt, position) as in ``propagation_metrics``.
    """
    u = _unit(u)
    finals = []
    for weights in (mw, steered_weights(mw, W_O_new)):
        finals.append(propagate.simplified_forward(weights, X0, eta, attention=attention)[-1])
    S = np.stack(finals)  # (2, P, N, d)
    P, N = S.shape[1:3]
    return xr.Dataset(
        {
            "gamma_u": (
                ("variant", "token"),
                np.abs(metrics.correlation(S, u, corr)).reshape(2, -1),
            ),
            "gamma_u_mean": (
                ("variant", "prompt"),
                np.abs(metrics.correlation(S.mean(axis=2), u, corr)),
            ),
        },
        coords={
            "variant": ["original", "steered"],
            "token": np.arange(P * N),
            "prompt": np.arange(P),
            "token_prompt": ("token", np.repeat(np.arange(P), N)),
            "token_position": ("token", np.tile(np.arange(N), P)),
        },
        attrs={"corr": corr, "eta": float(eta), "attention": attention},
    )


def _out_projection(model: Any, layer: int) -> tuple[Any, bool]:
    """Layer ``layer``'s attention output projection module of a causal LM and whether
    its weight is stored transposed ((in, out), GPT-2's Conv1D) rather than (out, in)."""
    adapter = adapter_class(getattr(model.config, "model_type", None))
    if adapter.out_projection is None:
        raise ValueError(
            f"next-token steering needs a causal LM; {adapter.model_type!r} models have none"
        )
    layer = layer % int(model.config.num_hidden_layers)
    path = adapter.out_projection.format(layer=layer)
    return model.get_submodule(path), adapter.out_projection_transposed


def _out_projection_path(model: Any, layer: int) -> str:
    adapter = adapter_class(getattr(model.config, "model_type", None))
    return str(adapter.out_projection).format(layer=layer % int(model.config.num_hidden_layers))


def _decoder_layers(model: Any) -> Any:
    """The causal LM's list of layers, from the adapter's output-projection path
    (``transformer.h.{layer}.attn.c_proj`` -> ``transformer.h``)."""
    adapter = adapter_class(getattr(model.config, "model_type", None))
    prefix = str(adapter.out_projection).split("{layer}")[0].rstrip(".")
    return model.get_submodule(prefix)


def next_token_probs(
    model: Any,
    input_ids: np.ndarray,
    target_id: int,
    variants: Sequence[np.ndarray],
    layer: int = -1,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Probability of ``target_id`` as the next token (last position of each prompt) with
    the causal LM ``model`` as it is, and with one layer's attention output projection
    replaced by each W_O of ``variants`` (package convention (d_model, n_heads*d_head),
    any float dtype, cast to the model's as it runs; written into the checkpoint's own
    storage, transposed for GPT-2's Conv1D ``c_proj``; the output bias is kept). Returns
    ``p_before`` (n_prompts,) and one ``p_after`` per variant; the model is left as it was.

    Only the changed layer and those after it run again for a variant: the outputs of the
    earlier layers are replayed (their ``forward`` is replaced by the output the last of
    them gave in the unchanged run, the input of the changed layer), since they cannot
    depend on a later layer's weights. At GPT-Neo 2.7B a variant then costs one layer and the LM
    head instead of 32 layers. A streamed model runs the unchanged model and every variant
    in lockstep (:func:`_streamed_probs`): each unit is read from the checkpoint once for
    all of them.
    """
    import torch

    ids = np.asarray(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    stream = streaming.stream_of(model)
    device = str(streaming.model_device(model))
    module, transposed = _out_projection(model, layer)
    n_layers = int(model.config.num_hidden_layers)
    changed = layer % n_layers
    # each variant checked here and read again when its forward uses it: a stack on
    # disk (io.DiskStack, the steer rule's) is then in memory one variant at a time
    stored = _InLayout(variants, transposed)
    for k, st in enumerate(stored):
        if not np.issubdtype(st.dtype, np.floating):
            raise ValueError(f"new W_O must be floating point, got {st.dtype}")
        if tuple(module.weight.shape) != st.shape:
            layout = "(in, out)" if transposed else "(out, in)"
            raise ValueError(
                f"new W_O {np.shape(variants[k])} does not fit the output projection "
                f"{tuple(module.weight.shape)} (stored {layout})"
            )
        del st
    t_ids = torch.as_tensor(ids, dtype=torch.long, device=device)
    # only the last position's logits are read: the head (V x d per token, the largest
    # product of a Llama-3 pass) runs on that position alone where the LM allows it
    last_only = {"logits_to_keep": 1} if streaming.accepts_logits_to_keep(model) else {}

    def prob() -> np.ndarray:
        with torch.no_grad():
            logits = model(
                input_ids=t_ids,
                attention_mask=torch.ones_like(t_ids),
                use_cache=False,
                **last_only,
            ).logits
        p = torch.softmax(logits[:, -1, :].to(torch.float64), dim=-1)[:, int(target_id)]
        return p.cpu().numpy()

    layers = _decoder_layers(model)
    if stream is not None:
        before, *after = _streamed_probs(model, prob, layers[changed], module, stored, device)
        return before, after
    # only the output of the layer before the changed one reaches it: the earlier
    # replayed layers feed replayed layers, which ignore their input, so they return
    # the same record (one layer's states held, not L - 1)
    recorded: dict[int, Any] = {}
    hooks = [
        layers[changed - 1].register_forward_hook(
            lambda _m, _a, out: recorded.__setitem__(changed - 1, streaming.clone_output(out))
        )
    ] if changed else []  # fmt: skip
    try:
        before = prob()
    finally:
        for h in hooks:
            h.remove()
    # each variant written into the loaded model's storage, the original put back after
    original = module.weight.detach().clone()
    after = []
    try:
        for i in range(changed):
            layers[i].forward = lambda *_a, **_k: recorded[changed - 1]
        for st in stored:
            new = torch.as_tensor(st, dtype=module.weight.dtype, device=device)
            with torch.no_grad():
                module.weight.copy_(new)
            after.append(prob())
    finally:
        with torch.no_grad():
            module.weight.copy_(original)
        for i in range(changed):
            layers[i].__dict__.pop("forward", None)
    return before, after


class _InLayout(Sequence[np.ndarray]):
    """The W_O variants in the output projection's stored layout (transposed for GPT-2's
    Conv1D), each read from ``variants`` when it is asked for."""

    def __init__(self, variants: Sequence[np.ndarray], transposed: bool) -> None:
        self.variants, self.transposed = variants, transposed

    def __len__(self) -> int:
        return len(self.variants)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        W = np.asarray(self.variants[k])
        return W.T if self.transposed else W


def _streamed_probs(
    model: Any,
    prob: Callable[[], np.ndarray],
    layer: Any,
    module: Any,
    stored: Sequence[np.ndarray],
    device: str,
) -> list[np.ndarray]:
    """``prob()`` of the streamed causal LM as it is, then with the output projection
    ``module`` of the decoder layer ``layer`` set to each W_O of ``stored`` (in its stored
    layout), all in lockstep (:func:`specalign.transformers.load.streaming.forwards_in_lockstep`):
    every unit is read from the checkpoint once for all of them, the layers before
    ``layer`` run once (the variants replay their outputs), and one unit's weights are
    resident at a time, beside the forwards' own states.

    Each forward puts its own W_O into the resident layer just before the projection
    runs (a pre-hook; the forwards take turns, so no other runs meanwhile): the
    unchanged one the tensor the stream read, a variant its W_O cast to the compute dtype
    then, so that one variant's cast copy exists at a time. Every forward computes what
    it would alone, on the same values: the probabilities equal those of one variant
    streamed at a time (tested).
    """
    import torch

    seen: dict[str, Any] = {}

    def own_weight(mod: Any, _args: Any) -> None:
        current = mod._parameters["weight"]
        if current is not seen.get("installed"):
            seen["original"] = current  # the stream's, read from the checkpoint
        k = streaming.current_run(model)
        if not k:
            weight = seen["original"]
        else:
            new = torch.as_tensor(stored[k - 1], dtype=current.dtype, device=device)
            weight = torch.nn.Parameter(new, requires_grad=False)
        mod._parameters["weight"] = seen["installed"] = weight

    handle = module.register_forward_pre_hook(own_weight)
    try:
        return streaming.forwards_in_lockstep(model, layer, [prob] * (len(stored) + 1))
    finally:
        handle.remove()
        seen.clear()


def next_token_prob_change(
    model_dir: str | os.PathLike[str],
    input_ids: np.ndarray,
    target_id: int,
    new_W_O: np.ndarray,
    layer: int = -1,
    device: str = "cpu",
    dtype: Any = None,
    model: Any = None,
) -> dict[str, np.ndarray]:
    """Probability of ``target_id`` as the next token, before and after replacing one
    layer's attention output projection (default: the last) by ``new_W_O``
    (:func:`next_token_probs` for one variant).

    ``model``: an already loaded causal LM (from
    :func:`specalign.transformers.load.hf.load_causal_lm`); otherwise the one in ``model_dir``
    is loaded. Returns ``p_before``, ``p_after`` and ``delta``
    (n_prompts,) at the last position of each prompt.
    """
    if model is None:
        model = hf.load_causal_lm(model_dir, device, dtype)
    before, (after,) = next_token_probs(model, input_ids, target_id, [new_W_O], layer)
    return {"p_before": before, "p_after": after, "delta": after - before}


# --------------------------------------------------------------------------- steering.nc


def model_inputs(
    model_dir: str | Path, ids: np.ndarray, token_id: int, device: str = "cpu"
) -> tuple[np.ndarray, np.ndarray]:
    """The real model's embedding output for ``ids`` (n_prompts, n_tokens, d_model) and
    the input embedding of ``token_id`` as stored (embedding_size,), both float64, from
    one load of the model (freed on return)."""
    import torch

    # streamed and stopped at the first layer: only the embeddings are read
    model = streaming.streamed_model(model_dir, "base", device)
    try:
        t_ids = torch.as_tensor(np.asarray(ids), dtype=torch.long, device=device)
        X0 = streaming.first_layer_input(model, t_ids).to("cpu", torch.float64).numpy()
        # as the model computes with it (its compute dtype): the value the model used
        row = model.specalign_stream.embedding_row(int(token_id))
        e = row.to(model.specalign_stream.dtype).to(torch.float64).numpy()
    finally:
        streaming.close_stream(model)
    del model
    gc.collect()
    return X0, e


def model_space(mw: ModelWeights, e: np.ndarray) -> np.ndarray:
    """An input embedding in model space (d_model,): ALBERT and OPT-350m embed in a smaller
    space and project to the hidden size (``mw.embedding_projection``), so that u lives
    where the tokens do; the other families embed in model space already."""
    e = np.asarray(e, dtype=np.float64)
    if getattr(mw, "embedding_projection", None) is not None:
        e = mw.embedding_projection @ e
        if getattr(mw, "embedding_projection_bias", None) is not None:
            e = e + mw.embedding_projection_bias
    return e


@dataclass(frozen=True)
class SteeringTarget:
    """The steering target's token and how the configured text encodes."""

    token_id: int
    pieces: tuple[str, ...]  # the tokens of target_text (just the id's when target_id)
    warning: str  # "" when the target is exactly one known token


def steering_target(
    model_dir: str | Path, text: str, token_id: int | None = None
) -> SteeringTarget:
    """The steering target: ``token_id`` when given, else the first token of ``text``
    under the model's tokenizer.

    A text that encodes to several tokens keeps its first one, with a ``warning`` (u is
    then the direction of that token only); a text that encodes to nothing, a first
    token that is the tokenizer's unknown token, and a token id outside the vocabulary
    are errors naming the config key.
    """
    tok = hf.load_tokenizer(model_dir)
    if token_id is not None:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        vocab_size = int(config.get("vocab_size") or 0) or None
        if vocab_size is not None and not 0 <= int(token_id) < vocab_size:
            raise ValueError(
                f"transformers.steering.target_id: {token_id} is outside the vocabulary of "
                f"{model_dir} (vocab_size {vocab_size}); fix: a token id below {vocab_size}"
            )
        piece = tok.convert_ids_to_tokens(int(token_id)) if tok is not None else str(token_id)
        return SteeringTarget(int(token_id), (str(piece),), "")
    if tok is None:
        raise InputFileError(
            f"{model_dir}: cannot encode the steering target {text!r} (no tokenizer files in "
            "the model folder); set transformers.steering.target_id to a token id instead"
        )
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    pieces = tuple(str(p) for p in tok.convert_ids_to_tokens(ids))
    if not ids:
        raise ValueError(
            f"transformers.steering.target_text: {text!r} encodes to no token under the "
            f"tokenizer of {model_dir}; fix: give a word, or set target_id"
        )
    if tok.unk_token_id is not None and ids[0] == tok.unk_token_id:
        raise ValueError(
            f"transformers.steering.target_text: {text!r} encodes to the unknown token "
            f"{pieces[0]!r} under the tokenizer of {model_dir}, whose direction says nothing "
            "about the text; fix: a word of the model's vocabulary, or set target_id"
        )
    warning = ""
    if len(ids) > 1:
        warning = (
            f"target_text {text!r} encodes to {len(ids)} tokens {list(pieces)}: the steering "
            f"target is its first token {pieces[0]!r} only"
        )
    return SteeringTarget(int(ids[0]), pieces, warning)


def target_token(model_dir: str | Path, text: str, token_id: int | None = None) -> int:
    """The steering target's token id (:func:`steering_target`)."""
    return steering_target(model_dir, text, token_id).token_id


def _random_units(d: int, n: int, seed: int) -> np.ndarray:
    R = np.random.default_rng(seed).standard_normal((n, d))
    return R / np.linalg.norm(R, axis=1, keepdims=True)


# its collections between the passes scan only what it makes (runtime.set_aside_heap)
@heap_set_aside()
def steering_dataset(
    weights: ModelWeights | str | Path,
    model_dir: str | Path,
    ids: np.ndarray,
    eta: float,
    cfg: Mapping[str, Any],
    seed: int,
    null_draws: int,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
    directions: Sequence[Mapping[str, Any]] | None = None,
    threads: int = 1,
) -> xr.Dataset:
    """Steer the last layer towards u for every (method, c) and measure the effect.

    Variables (dims): ``gamma_u`` (method, c, variant, token) = |cos(x_i, u)| after the
    last layer of the simplified model with real attention, variant original/steered;
    ``gamma_u_mean`` (method, c, variant, prompt) for the mean token; ``gamma_u_null``
    (method, c, variant, token): the same against random unit directions (averaged), the
    chance level; ``gamma_layers`` / ``rho_layers`` (method, c, layer, token / layer): the
    paper's per-layer gamma and rho of the steered model (Figures 3, 10);
    ``relative_change`` = |Delta W_O|_F / |W_O|_F, ``residual`` = |F' u - c r u| / |c r|
    (/ r for c = 0), ``target_eigenvalue``, ``u_is_leading`` (method, c); for causal
    language models
    ``p_before``, ``p_after`` (method, c, prompt): the probability of the target token as
    the next token through the LM head, before and after the change (NaN otherwise, and
    for a checkpoint without its output head: attribute ``probs_warning`` says so).

    ``weights``: the model's ``ModelWeights``, or the path of its ``weights.h5``, read only
    after the model that gives the embedding output is freed and dropped before the causal
    LM is loaded, so that the float64 weights and a float32 model are never held together.
    ``directions``: the blocks' directions from ``spectra.nc`` (decomposed here if None).
    ``threads``: the variants' W_O changes and decompositions run that many at once.

    Only the last layer changes, so the simplified run and the per-layer metrics of the
    unchanged layers are computed once; each variant decomposes the steered F' once and
    reruns the last layer alone, and the causal LM replays its unchanged layers
    (:func:`next_token_probs`). The result equals the direct computation (a full run of
    every steered model; tested).
    """
    target = steering_target(model_dir, cfg["target_text"], cfg.get("target_id"))
    if target.warning and progress:
        progress(f"warning: {target.warning}")
    X0, e = model_inputs(model_dir, ids, target.token_id, device)
    # a weights.h5 is read a block at a time (the steered runs read only the last)
    if not isinstance(weights, ModelWeights):
        weights = contracts.read_weights_h5(weights, lazy=True)
    mw = weights
    u = _unit(model_space(mw, e))
    methods, cs = list(cfg["methods"]), [float(c) for c in cfg["c"]]
    out = _SteeringArrays((len(methods), len(cs)), *ids.shape, mw.n_layers, mw.layer_block)
    fam = mw.family
    causal_lm = adapter_class(fam).causal_lm
    # next-token probabilities only through the checkpoint's own head (issue 29, 5)
    probs_warning = ""
    if causal_lm and not streaming.output_head_stored(model_dir):
        causal_lm = False
        probs_warning = (
            f"{model_dir} holds no output head (a base model's weights): next-token "
            "probabilities are not computed (NaN), since a head drawn at random would "
            "give numbers of no model"
        )
        if progress:
            progress(f"warning: {probs_warning}")
    # the causal LM computes in streaming.COMPUTE_DTYPE and casts each W_O to it as it
    # runs: each variant's is cast once as it is made instead, and kept on disk until
    # its forward uses it (io.DiskStack: at Llama-3-70B's width the six float64 W_O' are
    # 3.2 GB, in float32 1.6), the same values reaching it. Without a causal LM none is
    # kept.
    compute = streaming.COMPUTE_DTYPE
    with DiskStack() as W_O_new:
        _simplified_steering(
            mw, X0, eta, u, methods, cs, out, seed, null_draws, directions, progress,
            threads, keep=lambda W: W_O_new.append(W.astype(compute)) if causal_lm else None,
        )  # fmt: skip
        del mw, weights
        gc.collect()
        if causal_lm:
            if progress:
                progress("next-token probabilities through the causal LM")
            # loaded once, after the float64 weights are gone
            lm = streaming.streamed_model(model_dir, "causal_lm", device, hf.torch_dtype(compute))
            try:
                before, after = next_token_probs(lm, ids, target.token_id, W_O_new)
            finally:
                streaming.close_stream(lm)
            out.p_before[...] = before
            out.p_after[...] = np.reshape(after, out.p_after.shape)
    ds = out.dataset(methods, cs, u)
    ds.attrs.update(
        target_text=cfg["target_text"],
        target_id=target.token_id,
        target_tokens=json.dumps(list(target.pieces)),
        target_warning=target.warning,
        eta=float(eta),
        family=fam,
        causal_lm=int(causal_lm),
        probs_warning=probs_warning,
        null_draws=int(null_draws),
    )
    return ds


def _simplified_steering(
    mw: ModelWeights,
    X0: np.ndarray,
    eta: float,
    u: np.ndarray,
    methods: list[str],
    cs: list[float],
    out: _SteeringArrays,
    seed: int,
    null_draws: int,
    directions: Sequence[Mapping[str, Any]] | None,
    progress: Callable[[str], None] | None,
    threads: int,
    keep: Callable[[np.ndarray], Any] = lambda W: W,
) -> list[Any]:
    """Every (method, c) variant through the simplified model, recorded in ``out``;
    returns ``keep`` of the steered W_O of each variant in (method, c) order."""
    last = int(mw.layer_block[-1])
    if directions is None:
        directions = [block_principal_directions(mw, b) for b in mw.blocks]
    # the unchanged run a state at a time: the variants need its last two states and
    # its layers' gamma and rho, not the run (L + 1 states of every token; issue 14)
    v1 = layer_directions(mw, directions=directions)["v1"]
    L, P, N = mw.n_layers, X0.shape[0], X0.shape[1]
    base_layers = {"gamma": np.full((L, P * N), np.nan), "rho": np.full(L, np.nan)}
    kept: list[np.ndarray] = []  # the last two states
    for t, X in enumerate(propagate.simplified_steps(mw, X0, eta, "real")):
        if t > 0:
            layer = metrics.alignment(np.stack([kept[-1], X]), v1[t - 1 : t])
            base_layers["gamma"][t - 1] = layer["gamma"][0]
            base_layers["rho"][t - 1] = layer["rho"][0]
        kept = [*kept[-1:], X]
    before_last, base_final = kept
    # after the pass, whose last block a lazily read mw keeps: no block is read twice
    blk = mw.blocks[last]
    # one BLAS thread per decomposition, several at once (spectra.map_blocks): the
    # result does not depend on the thread count, and LAPACK's eigen-solver uses a second
    # core poorly
    # a grouped-query layer (r < d): the radius from the r x r product, the SVD of W_V'
    W_Og, W_Vg = mw.ov_factors(blk)
    M = (W_Vg @ W_Og) if mw.factored else blk.F
    (radius,) = spectra.map_blocks(lambda F: float(np.max(np.abs(np.linalg.eigvals(F)))), [M])
    pinv = _pinv(W_Vg if mw.factored else blk.W_V) if "lstsq" in methods else None
    heads = {"n_heads": mw.n_heads, "n_kv_heads": mw.kv_heads}
    variants = [(i, j, m, c) for i, m in enumerate(methods) for j, c in enumerate(cs)]
    if progress:
        progress(f"steering: {len(variants)} variants of W_O, {threads} at a time")
    R = _random_units(mw.d_model, null_draws, seed)
    W_O_new = []
    workers = max(int(threads), 1)
    # ``threads`` variants at a time: of each only the steered W_O is kept once it is
    # recorded (its Delta, W_V and decomposition are d x inner each)
    for k in range(0, len(variants), workers):
        chunk = variants[k : k + workers]
        results = spectra.map_blocks(
            lambda v: steer(
                blk.W_O, blk.W_V, u, v[3], method=v[2], radius=radius, W_V_pinv=pinv, **heads
            ),
            chunk,
            threads,
        )
        for (i, j, method, c), res in zip(chunk, results, strict=True):
            if progress:
                progress(f"steering: method={method} c={c:g}: the steered last layer")
            final = propagate.simplified_forward(
                steered_weights(mw, res.W_O), before_last, eta, "real", start=mw.n_layers - 1
            )[-1]
            last_layer = metrics.alignment(
                np.stack([before_last, final]), res.directions["v1"][None]
            )
            out.record(i, j, base_final, final, base_layers, last_layer, u, R, res)
            W_O_new.append(keep(res.W_O))
        del results
    return W_O_new


class _SteeringArrays:
    """The arrays of ``steering.nc`` over (method, c), filled one variant at a time."""

    _SCALARS = ("relative_change", "residual", "target_eigenvalue", "u_is_leading")

    def __init__(
        self, shape: tuple[int, int], P: int, N: int, n_layers: int, layer_block: Any = None
    ) -> None:
        self.P, self.N, self.n_layers = P, N, n_layers
        # the unsteered model's layer -> block map (the coordinate layer_block)
        self.layer_block = np.asarray(
            np.arange(n_layers) if layer_block is None else layer_block, dtype=np.int64
        )
        self.g_u = np.full((*shape, 2, P * N), np.nan)
        self.g_um = np.full((*shape, 2, P), np.nan)
        self.g_null = np.full((*shape, 2, P * N), np.nan)
        self.g_layers = np.full((*shape, n_layers, P * N), np.nan)
        self.r_layers = np.full((*shape, n_layers), np.nan)
        self.scalars = {k: np.full(shape, np.nan) for k in self._SCALARS}
        self.p_before = np.full((*shape, P), np.nan)
        self.p_after = np.full((*shape, P), np.nan)

    def record(
        self,
        i: int,
        j: int,
        base_final: np.ndarray,
        final: np.ndarray,
        base_layers: Mapping[str, np.ndarray],
        last_layer: Mapping[str, np.ndarray],
        u: np.ndarray,
        R: np.ndarray,
        res: SteeringResult,
    ) -> None:
        """gamma_u of the original and the steered final tokens, with the null, and the
        steered model's per-layer gamma and rho: the unchanged model's for every layer
        but the last (``base_layers``), the steered last layer's (``last_layer``)."""
        for v, X in enumerate((base_final, final)):
            # u and the null draws in one product
            g = np.abs(metrics.correlations(X, np.vstack([u, R])))
            self.g_u[i, j, v] = g[0].reshape(-1)
            self.g_um[i, j, v] = np.abs(metrics.correlation(X.mean(axis=1), u))
            self.g_null[i, j, v] = g[1:].reshape(len(R), -1).mean(axis=0)
        self.g_layers[i, j, :-1] = base_layers["gamma"][:-1]
        self.g_layers[i, j, -1] = last_layer["gamma"][0]
        self.r_layers[i, j, :-1] = base_layers["rho"][:-1]
        self.r_layers[i, j, -1] = last_layer["rho"][0]
        self.scalars["relative_change"][i, j] = res.relative_change
        self.scalars["residual"][i, j] = res.residual
        self.scalars["target_eigenvalue"][i, j] = res.target_eigenvalue
        self.scalars["u_is_leading"][i, j] = float(res.u_is_leading)

    def dataset(self, methods: list[str], cs: list[float], u: np.ndarray) -> xr.Dataset:
        P, N = self.P, self.N
        coords = {
            "method": methods,
            "c": cs,
            "variant": ["original", "steered"],
            "token": np.arange(P * N),
            "prompt": np.arange(P),
            # layers 1..L as the paper counts them, each with its (0-based) block
            "layer": np.arange(1, self.n_layers + 1),
            "layer_block": ("layer", self.layer_block),
        }
        mc = ("method", "c")
        ds = xr.Dataset(
            {
                "gamma_u": ((*mc, "variant", "token"), self.g_u),
                "gamma_u_mean": ((*mc, "variant", "prompt"), self.g_um),
                "gamma_u_null": ((*mc, "variant", "token"), self.g_null),
                "gamma_layers": ((*mc, "layer", "token"), self.g_layers),
                "rho_layers": ((*mc, "layer"), self.r_layers),
                **{k: (mc, v) for k, v in self.scalars.items()},
                "p_before": ((*mc, "prompt"), self.p_before),
                "p_after": ((*mc, "prompt"), self.p_after),
                "u": (("component",), u),
            },
            coords=coords,
        )
        return describe(ds, STEERING)
