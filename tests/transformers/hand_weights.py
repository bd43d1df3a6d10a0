"""Transformer weights built by hand, or read straight off tiny random ``transformers``
modules, independent of the checkpoint extraction code: the inputs of the dynamics and
steering tests (test_dynamics.py, test_steering.py)."""

from __future__ import annotations

import numpy as np
import torch

from specalign.transformers.weights import BlockWeights, ModelWeights


def sym(lam, seed=0):
    """Symmetric matrix with eigenvalues lam and a random orthonormal eigenbasis."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.standard_normal((len(lam), len(lam))))
    return Q @ np.diag(lam) @ Q.T


def block(W_Q, W_K, W_V, W_O, ln_w=None, ln_b=None):
    d, k = W_O.shape
    return BlockWeights(
        W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O,
        b_Q=np.zeros(k), b_K=np.zeros(k), b_V=np.zeros(k), b_O=np.zeros(d),
        ln_weight=np.ones(d) if ln_w is None else ln_w,
        ln_bias=np.zeros(d) if ln_b is None else ln_b,
    )  # fmt: skip


def model_from_F(Fs, n_heads=1, causal=False, layer_block=None, seed=0, kinds=None,
                  window=None, family="bert"):  # fmt: skip
    """ModelWeights whose blocks have F = W_O W_V = Fs[b] (W_V random invertible)."""
    rng = np.random.default_rng(seed)
    blocks = []
    for F in Fs:
        d = F.shape[0]
        W_V = np.eye(d) + 0.3 * rng.standard_normal((d, d))
        W_O = F @ np.linalg.inv(W_V)
        W_Q, W_K = rng.standard_normal((2, d, d)) / np.sqrt(d)
        blocks.append(block(W_Q, W_K, W_V, W_O))
    lb = np.arange(len(Fs)) if layer_block is None else np.asarray(layer_block)
    return ModelWeights(
        family=family, d_model=Fs[0].shape[0], n_heads=n_heads, n_layers=len(lb),
        blocks=blocks, layer_block=lb, ln_position="post", causal=causal,
        attn_scale=1.0 / np.sqrt(Fs[0].shape[0] // n_heads),
        layer_attention=kinds or ["global"] * len(lb), window_size=window,
    )  # fmt: skip


def bert_weights(model):
    cfg = model.config
    blocks = []
    for layer in model.encoder.layer:
        a, o = layer.attention.self, layer.attention.output

        def w(m):
            return m.weight.detach().double().numpy().copy()

        def b(m):
            return m.bias.detach().double().numpy().copy()

        blk = BlockWeights(
            W_Q=w(a.query), W_K=w(a.key), W_V=w(a.value), W_O=w(o.dense),
            b_Q=b(a.query), b_K=b(a.key), b_V=b(a.value), b_O=b(o.dense),
            ln_weight=w(o.LayerNorm), ln_bias=b(o.LayerNorm),
        )  # fmt: skip
        blocks.append(blk)
    H = cfg.num_attention_heads
    return ModelWeights(
        family="bert", d_model=cfg.hidden_size, n_heads=H, n_layers=len(blocks),
        blocks=blocks, layer_block=np.arange(len(blocks)), ln_position="post",
        causal=False, attn_scale=1.0 / np.sqrt(cfg.hidden_size // H),
        layer_attention=["global"] * len(blocks), ln_eps=cfg.layer_norm_eps,
    )  # fmt: skip


def gpt2_weights(model):
    """GPT-2 Conv1D stores (in, out) with Q, K, V fused: transpose, then split rows."""
    cfg = model.config
    d = cfg.n_embd
    blocks = []
    for blk in model.h:
        Wqkv = blk.attn.c_attn.weight.detach().double().numpy().T  # (3d, d)
        bqkv = blk.attn.c_attn.bias.detach().double().numpy()
        blocks.append(
            BlockWeights(
                W_Q=Wqkv[:d].copy(), W_K=Wqkv[d : 2 * d].copy(), W_V=Wqkv[2 * d :].copy(),
                W_O=blk.attn.c_proj.weight.detach().double().numpy().T.copy(),
                b_Q=bqkv[:d].copy(), b_K=bqkv[d : 2 * d].copy(), b_V=bqkv[2 * d :].copy(),
                b_O=blk.attn.c_proj.bias.detach().double().numpy().copy(),
                ln_weight=blk.ln_1.weight.detach().double().numpy().copy(),
                ln_bias=blk.ln_1.bias.detach().double().numpy().copy(),
            )
        )  # fmt: skip
    H = cfg.n_head
    return ModelWeights(
        family="gpt2", d_model=d, n_heads=H, n_layers=len(blocks), blocks=blocks,
        layer_block=np.arange(len(blocks)), ln_position="pre", causal=True,
        attn_scale=1.0 / np.sqrt(d // H), layer_attention=["global"] * len(blocks),
        ln_eps=cfg.layer_norm_epsilon,
    )  # fmt: skip


def randomise_norms(model, seed):
    """Random LayerNorm affine parameters, so that they matter in the comparisons."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
            elif isinstance(m, torch.nn.Linear) and m.bias is not None:
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
    return model


def tiny_bert_model():
    """A 2-layer BERT (d = 32, 4 heads) with random norms and biases, in float64."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=32, attn_implementation="eager",
    )  # fmt: skip
    return randomise_norms(BertModel(cfg), 1).double().eval()


def tiny_gpt2_model():
    """A 2-layer GPT-2 LM (d = 32, 4 heads) whose softmax is far from uniform, in float64."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32,
        attn_implementation="eager",
    )  # fmt: skip
    model = GPT2LMHeadModel(cfg)
    # GPT-2 init uses std 0.02: scale the attention up so the softmax is far from uniform
    with torch.no_grad():
        for blk in model.transformer.h:
            blk.attn.c_attn.weight.mul_(20)
            blk.attn.c_proj.weight.mul_(10)
    return randomise_norms(model, 2).double().eval()
