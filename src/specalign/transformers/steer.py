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

import copy
import os
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import xarray as xr

from .propagate import Corr, correlation, simplified_forward
from .weights import ModelWeights

Method = Literal["min_norm", "lstsq"]

__all__ = [
    "SteeringResult",
    "compare_steering",
    "next_token_prob_change",
    "steer",
    "steer_model_weights",
    "steered_weights",
    "steering_gamma",
    "target_direction",
]


@dataclass
class SteeringResult:
    """Outcome of one W_O modification (all float64, package convention (out, in))."""

    method: str
    W_O: np.ndarray  # modified output projection (d_model, n_heads*d_head)
    delta: np.ndarray  # W_O' - W_O
    F: np.ndarray  # modified F' = W_O' W_V
    target_eigenvalue: float  # c * r
    old_spectral_radius: float  # r
    relative_change: float  # ||Delta||_F / ||W_O||_F
    residual: float  # ||F' u - c r u|| / max(|c r|, tiny): 0 when u is an exact eigenvector
    u_is_leading: bool  # c r is (one of) F''s eigenvalues of largest real part


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
    """
    W_O = np.asarray(W_O, dtype=np.float64)
    W_V = np.asarray(W_V, dtype=np.float64)
    if W_O.ndim != 2 or W_V.ndim != 2 or W_O.shape != W_V.shape[::-1]:
        raise ValueError(f"W_O {W_O.shape} and W_V {W_V.shape} must be (d, k) and (k, d)")
    u = _unit(u)
    if u.size != W_V.shape[1]:
        raise ValueError(f"u has {u.size} components, the model width is {W_V.shape[1]}")
    F = W_O @ W_V
    r = float(np.max(np.abs(np.linalg.eigvals(F))))
    target = c * r
    rhs = target * u - F @ u  # what Delta must add to F u
    a = W_V @ u
    if method == "min_norm":
        na2 = float(a @ a)
        if na2 == 0.0:
            raise ValueError("W_V u = 0: no change of W_O alone can make u an eigenvector")
        delta = np.outer(rhs, a) / na2
    elif method == "lstsq":
        pinv = np.linalg.pinv(W_V) if rcond is None else np.linalg.pinv(W_V, rcond=rcond)
        delta = np.outer(rhs, u @ pinv)
    else:
        raise ValueError(f"method must be 'min_norm' or 'lstsq', got {method!r}")
    W_new = W_O + delta
    F_new = W_new @ W_V
    lam = np.linalg.eigvals(F_new)
    scale = max(abs(target), np.finfo(float).tiny)
    top = lam.real.max()
    return SteeringResult(
        method=method,
        W_O=W_new,
        delta=delta,
        F=F_new,
        target_eigenvalue=float(target),
        old_spectral_radius=r,
        relative_change=float(np.linalg.norm(delta) / np.linalg.norm(W_O)),
        residual=float(np.linalg.norm(F_new @ u - target * u) / scale),
        u_is_leading=bool(target >= top - 1e-9 * max(1.0, abs(top))),
    )


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
    application changes.
    """
    W_O_new = np.asarray(W_O_new, dtype=np.float64)
    last = int(mw.layer_block[-1])
    if W_O_new.shape != mw.blocks[last].W_O.shape:
        raise ValueError(f"new W_O {W_O_new.shape} != old {mw.blocks[last].W_O.shape}")
    out = copy.deepcopy(mw)
    block = copy.deepcopy(mw.blocks[last])
    block.W_O = W_O_new.copy()
    layer_block = np.asarray(out.layer_block).copy()
    if np.count_nonzero(layer_block == last) == 1:
        out.blocks[last] = block
    else:
        out.blocks.append(block)
        layer_block[-1] = len(out.blocks) - 1
    out.layer_block = layer_block
    return out


def steer_model_weights(
    mw: ModelWeights, u: np.ndarray, c: float = 1.0, method: Method = "min_norm"
) -> tuple[ModelWeights, SteeringResult]:
    """Steer the last layer of ``mw`` towards u; returns the modified weights and result."""
    blk = mw.blocks[int(mw.layer_block[-1])]
    res = steer(blk.W_O, blk.W_V, u, c, method=method)
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
        finals.append(simplified_forward(weights, X0, eta, attention=attention)[-1])
    S = np.stack(finals)  # (2, P, N, d)
    P, N = S.shape[1:3]
    return xr.Dataset(
        {
            "gamma_u": (("variant", "token"), np.abs(correlation(S, u, corr)).reshape(2, -1)),
            "gamma_u_mean": (("variant", "prompt"), np.abs(correlation(S.mean(axis=2), u, corr))),
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
    """The last-layer attention output projection module of a causal LM and whether its
    weight is stored transposed ((in, out), GPT-2's Conv1D) rather than (out, in)."""
    kind = getattr(model.config, "model_type", "")
    blocks = model.transformer.h
    if kind == "gpt2":
        return blocks[layer].attn.c_proj, True
    if kind == "gpt_neo":
        return blocks[layer].attn.attention.out_proj, False
    raise ValueError(f"next-token steering supports GPT-2 and GPT-Neo, not {kind!r}")


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
    layer's attention output projection (default: the last) by ``new_W_O``.

    ``model``: an already loaded causal LM (from :func:`load_causal_lm`) to reuse across
    many calls; its projection is restored after the measurement, so loading a large model
    once serves every steering variant.

    ``new_W_O`` is in the package convention (d_model, n_heads*d_head); it is written into
    the checkpoint's own storage (transposed for GPT-2's Conv1D ``c_proj``, as is for
    GPT-Neo's ``out_proj``); the output bias is kept. Runs the real model (embeddings,
    FFN, LayerNorms, LM head) from a local directory. Returns ``p_before``, ``p_after`` and
    ``delta`` (n_prompts,) at the last position of each prompt.
    """
    import torch

    ids = np.asarray(input_ids)
    if ids.ndim == 1:
        ids = ids[None]
    if model is None:
        model = load_causal_lm(model_dir, device, dtype)
    device = str(next(model.parameters()).device)
    module, transposed = _out_projection(model, layer)
    W = np.asarray(new_W_O, dtype=np.float64)
    stored = W.T if transposed else W
    if tuple(module.weight.shape) != stored.shape:
        raise ValueError(
            f"new W_O {W.shape} does not fit the output projection {tuple(module.weight.shape)} "
            f"(stored {'(in, out)' if transposed else '(out, in)'})"
        )
    t_ids = torch.as_tensor(ids, dtype=torch.long, device=device)

    def prob() -> np.ndarray:
        with torch.no_grad():
            logits = model(input_ids=t_ids, attention_mask=torch.ones_like(t_ids)).logits
        p = torch.softmax(logits[:, -1, :].to(torch.float64), dim=-1)[:, int(target_id)]
        return p.cpu().numpy()

    before = prob()
    original = module.weight.detach().clone()
    try:
        with torch.no_grad():
            module.weight.copy_(torch.as_tensor(stored, dtype=module.weight.dtype, device=device))
        after = prob()
    finally:
        with torch.no_grad():
            module.weight.copy_(original)
    return {"p_before": before, "p_after": after, "delta": after - before}


def load_causal_lm(
    model_dir: str | os.PathLike[str], device: str = "cpu", dtype: Any = None
) -> Any:
    """The causal LM of a local model folder (eager attention, eval mode, float32 unless
    ``dtype`` says otherwise), for :func:`next_token_prob_change`."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), local_files_only=True, attn_implementation="eager"
    )
    return model.to(device=device, dtype=dtype or torch.float32).eval()
