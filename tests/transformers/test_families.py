"""Every family adapter against the instantiated modules of a tiny random model.

For each case of ``tests/tiny_models.py`` (one per supported ``model_type``, plus OPT's
post-LN 350m layout), built and saved offline as the hub's head-model checkpoints are:

* F read back from ``weights.h5`` equals the linear map measured from the attention
  module: noise is fed into the module that produces V (so that LayerNorm's zero-mean
  output cannot hide F's action on the ones direction) and read at the output
  projection; where 1 < n_kv_heads < n_heads the wrong h % KV head mapping is shown to
  give another F;
* the attention weights and the attention output rebuilt from ``weights.h5`` (rotary
  positions, q/k norms, scale, softcap, windows) equal the module's eager ones;
* the real-model states equal Hugging Face's hidden states, the last one being the
  residual stream (not the final norm's output);
* the simplified update with uniform attention equals its closed form on the measured F;
* steering through the family's output projection makes the target an eigenvector of the
  F measured from the modified module.

Everything runs under ``tiny_models.float64_everywhere`` (the modules compute in float64
end to end), so the comparisons hold to round-off (1e-10 and below); the last test checks
the production path, a stock float32 model, at the float32 level.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tiny_models
import torch
from tiny_models import CONFIGS, float64_everywhere

from specalign.io import InputFileError
from specalign.transformers.load import hf
from specalign.transformers.load.contracts import read_weights_h5
from specalign.transformers.load.extract import extract, extract_to_h5
from specalign.transformers.load.families import FAMILIES, adapter_class, expand_kv
from specalign.transformers.load.families.llama import LlamaAdapter
from specalign.transformers.measure import propagate as prop
from specalign.transformers.measure import steer as st
from specalign.transformers.report.paper import PAPER_FAMILIES

torch.set_num_threads(1)

#: model_type -> (layer list in the base model, module fed with the noise (the one that
#: produces V), output projection), relative to one layer.
MODULES = {
    "bert": ("encoder.layer", "attention.self", "attention.output.dense"),
    "roberta": ("encoder.layer", "attention.self", "attention.output.dense"),
    "distilbert": ("transformer.layer", "attention", "attention.out_lin"),
    "albert": ("encoder.albert_layer_groups.0.albert_layers", "attention", "attention.dense"),
    "gpt2": ("h", "attn", "attn.c_proj"),
    "gpt_neo": ("h", "attn.attention", "attn.attention.out_proj"),
    "gpt_neox": ("layers", "attention", "attention.dense"),
    "gptj": ("h", "attn", "attn.out_proj"),
    "opt": ("decoder.layers", "self_attn", "self_attn.out_proj"),
    "falcon": ("h", "self_attention", "self_attention.dense"),
    # every family of the Llama layout, read from the registry
    **{
        mt: ("layers", "self_attn", "self_attn.o_proj")
        for mt, cls in FAMILIES.items()
        if issubclass(cls, LlamaAdapter)
    },
}
CASES = sorted(CONFIGS)
N_PROMPTS, N_TOKENS = 2, 8  # longer than every window of the tiny models


def test_every_family_has_a_tiny_model() -> None:
    assert set(tiny_models.BUILDERS) == set(FAMILIES) == set(MODULES)
    assert {cfg["model_type"] for cfg in CONFIGS.values()} == set(FAMILIES)


def test_modern_test_yaml_is_the_catalogue(repo: Path) -> None:
    """config/modern_test.yaml's models are what ``tiny_models`` derives (rewrite them
    with ``python tests/tiny_models.py``): a twin of a case per family beyond the
    paper's."""
    text = (repo / "config" / "modern_test.yaml").read_text()
    assert text == tiny_models.with_modern_test_models(text)
    twins = {CONFIGS[case]["model_type"] for case in tiny_models.TWINS.values()}
    assert twins == set(FAMILIES) - set(PAPER_FAMILIES)


class Case:
    """One tiny model: the torch model, its folder, the extracted weights."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name = name
        self.model_type = CONFIGS[name]["model_type"]
        with float64_everywhere():
            self.model, self.folder = tiny_models.save(name, folder)
            extract_to_h5(self.folder, folder / "weights.h5")
            self.mw = read_weights_h5(folder / "weights.h5")
        self.base = self.model.base_model
        layers, self.attn_path, self.out_path = MODULES[self.model_type]
        self.layers = self.base.get_submodule(layers)
        cfg = self.model.config
        self.ids = torch.as_tensor(
            hf.random_prompts(cfg.vocab_size, N_PROMPTS, N_TOKENS, seed=3, special_ids_to_avoid=[
                i for i in (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) if i is not None
            ])
        )  # fmt: skip

    def layer(self, i: int) -> Any:
        return self.layers[0 if self.mw.shared else i]

    def measured_F(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(F, c) with out = F x + c, least squares over noise x fed into layer i's
        attention module (sequences of one token: the softmax is exactly 1)."""
        d = self.mw.d_model
        X = torch.randn(
            2 * d + 8, 1, d, generator=torch.Generator().manual_seed(i), dtype=torch.float64
        )
        Y = _with_input_replaced(self, i, X)
        design = np.concatenate([X[:, 0].numpy(), np.ones((X.shape[0], 1))], axis=1)
        sol, *_ = np.linalg.lstsq(design, Y, rcond=None)
        return sol[:d].T, sol[d]


def _with_input_replaced(case: Case, i: int, X: torch.Tensor) -> np.ndarray:
    """Layer i's output-projection output when its attention module reads X."""
    layer = case.layer(i)
    captured: list[torch.Tensor] = []

    def feed(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (X, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": X}

    def read(module: Any, args: tuple, out: torch.Tensor) -> None:
        if not captured:  # ALBERT's shared layer runs once per layer: keep layer 0's
            captured.append(out.detach().clone())

    hooks = [
        layer.get_submodule(case.attn_path).register_forward_pre_hook(feed, with_kwargs=True),
        layer.get_submodule(case.out_path).register_forward_hook(read),
    ]
    ids = torch.full((X.shape[0], 1), int(case.ids[0, 0]))
    try:
        with float64_everywhere(), torch.no_grad():
            case.base(input_ids=ids, attention_mask=torch.ones_like(ids))
    finally:
        for h in hooks:
            h.remove()
    return captured[0][:, 0].numpy()


class _Cases(dict):
    """Case name -> Case, each built on first use (tests of one case need only it)."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        super().__init__()
        self.factory = factory

    def __missing__(self, name: str) -> Case:
        self[name] = Case(name, self.factory.mktemp(name))
        return self[name]


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    return _Cases(tmp_path_factory)


# --------------------------------------------------------------------------- F


@pytest.mark.parametrize("name", CASES)
def test_F_equals_the_map_measured_from_the_attention_module(cases: dict, name: str) -> None:
    case = cases[name]
    mw = case.mw
    for b, blk in enumerate(mw.blocks):
        F, c = case.measured_F(b)
        scale = np.abs(F).max()
        np.testing.assert_allclose(blk.F, F, rtol=0, atol=1e-10 * scale, err_msg=f"{name} {b}")
        np.testing.assert_allclose(blk.W_O @ blk.b_V + blk.b_O, c, rtol=0, atol=1e-10 * scale)
        dh = mw.d_head
        per_head = sum(
            blk.W_O[:, h * dh : (h + 1) * dh] @ blk.W_V[h * dh : (h + 1) * dh]
            for h in range(mw.n_heads)
        )
        np.testing.assert_allclose(per_head, F, rtol=0, atol=1e-10 * scale)
        kv = mw.n_kv_heads or mw.n_heads
        if 1 < kv < mw.n_heads:  # the h % KV reading of grouped-query attention is wrong
            compact = blk.W_V.reshape(mw.n_heads, dh, -1)[:: mw.n_heads // kv].reshape(kv * dh, -1)
            np.testing.assert_array_equal(expand_kv(compact, mw.n_heads, kv), blk.W_V)
            wrong = blk.W_O @ np.tile(compact, (mw.n_heads // kv, 1))
            assert np.abs(wrong - F).max() > 1e-3 * scale


@pytest.mark.parametrize("name", CASES)
def test_weights_h5_describes_the_family(cases: dict, name: str) -> None:
    case = cases[name]
    mw, cfg = case.mw, case.model.config
    adapter = adapter_class(case.model_type)
    assert mw.family == case.model_type and mw.norm == adapter.norm
    assert mw.d_head * mw.n_heads == case.mw.blocks[0].W_O.shape[1]
    # the module's own key/value head count: Llama-style ``num_key_value_groups``,
    # Falcon's ``num_kv_heads`` (its config key means nothing with multi_query)
    attn = case.layer(0).get_submodule(case.attn_path)
    groups = getattr(attn, "num_key_value_groups", None)
    kv = mw.n_heads // groups if groups else getattr(attn, "num_kv_heads", mw.n_heads)
    assert mw.n_kv_heads == kv == (getattr(cfg, "num_key_value_heads", None) or kv)
    with float64_everywhere():
        in_memory = extract(case.folder)  # the streamed file holds what extract() holds
    for a, b in zip(in_memory.blocks, mw.blocks, strict=True):
        for field in ("W_Q", "W_K", "W_V", "W_O", "ln_weight", "ln_bias", "q_norm", "post_norm"):
            x, y = getattr(a, field), getattr(b, field)
            assert (x is None) == (y is None)
            if x is not None:
                np.testing.assert_array_equal(x, y)
    for field in ("rotary", "attn_softcap", "residual", "window_size", "layer_attention"):
        assert getattr(in_memory, field) == getattr(mw, field), field


@pytest.mark.parametrize("name", CASES)
def test_base_model_checkpoint_extracts_the_same(cases: dict, name: str, tmp_path: Path) -> None:
    """Base models save without the head prefix (OPT's still start with decoder.)."""
    case = cases[name]
    case.base.save_pretrained(str(tmp_path))
    with float64_everywhere():
        base = extract(tmp_path)
    for a, b in zip(base.blocks, case.mw.blocks, strict=True):
        np.testing.assert_array_equal(a.F, b.F)
        np.testing.assert_array_equal(a.W_Q, b.W_Q)


# --------------------------------------------------------------------------- attention


def _run(case: Case, **kwargs: Any) -> tuple[Any, list[np.ndarray]]:
    """The base model on the test prompts, and each layer's output-projection output."""
    outs: list[np.ndarray] = []
    hooks = [
        case.layer(i)
        .get_submodule(case.out_path)
        .register_forward_hook(lambda m, a, o: outs.append(o.detach().numpy().copy()))
        for i in range(1 if case.mw.shared else case.mw.n_layers)
    ]
    try:
        with float64_everywhere(), torch.no_grad():
            out = case.base(input_ids=case.ids, attention_mask=torch.ones_like(case.ids), **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return out, outs


@pytest.mark.parametrize("name", CASES)
def test_attention_from_weights_h5_equals_the_module(cases: dict, name: str) -> None:
    case = cases[name]
    mw = case.mw
    out, proj = _run(case, output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == mw.n_layers
    for i in range(mw.n_layers):
        X = out.hidden_states[i].numpy()  # the input of layer i
        A = prop.attention_weights(mw, i, X)
        A_mod = out.attentions[i].numpy()
        np.testing.assert_allclose(A, A_mod, rtol=0, atol=1e-10, err_msg=f"{name} layer {i}")
        if mw.layer_attention[i] == "local":  # the window bites: the last query sees W keys
            assert (A_mod[0, 0, -1] > 0).sum() == mw.window_size < N_TOKENS
        o = prop.attention_sublayer(mw, i, X)
        np.testing.assert_allclose(o, proj[i % len(proj)], rtol=0, atol=1e-10 * np.abs(o).max())


@pytest.mark.parametrize("name", CASES)
def test_real_states_are_the_hidden_states_and_the_residual_stream(cases: dict, name: str) -> None:
    case = cases[name]
    last: list[np.ndarray] = []
    hook = case.layers[-1].register_forward_hook(
        lambda m, a, o: last.append((o[0] if isinstance(o, tuple) else o).detach().numpy())
    )
    try:
        out, _ = _run(case, output_hidden_states=True)
    finally:
        hook.remove()
    with float64_everywhere():
        states = hf.real_forward_hidden_states(case.folder, case.ids.numpy(), dtype=torch.float64)
    hs = [h.numpy() for h in out.hidden_states]
    assert states.shape[0] == len(hs) == case.mw.n_layers + 1
    for t in range(case.mw.n_layers):
        np.testing.assert_allclose(states[t], hs[t], rtol=0, atol=1e-12, err_msg=f"state {t}")
    np.testing.assert_allclose(states[-1], last[-1], rtol=0, atol=1e-12)
    if case.mw.causal:  # decoders: transformers' own last state is after the final norm
        assert hs[-1].shape != states[-1].shape or np.abs(hs[-1] - states[-1]).max() > 1e-3


# --------------------------------------------------------------------------- updates


@pytest.mark.parametrize("name", CASES)
def test_uniform_simplified_update_is_its_closed_form(cases: dict, name: str) -> None:
    """x_i <- normalize(x_i + eta F m_i), m_i the mean of the tokens x_i may see, with F
    measured from the modules."""
    case = cases[name]
    mw, eta = case.mw, 0.7
    X0 = np.random.default_rng(0).standard_normal((N_PROMPTS, N_TOKENS, mw.d_model))
    states = prop.simplified_forward(mw, X0, eta, "full", n_layers=mw.n_layers + 2)
    X = X0 / np.linalg.norm(X0, axis=-1, keepdims=True)
    Fs = [case.measured_F(int(b))[0] for b in mw.layer_block]
    for t in range(mw.n_layers + 2):
        F = Fs[min(t, mw.n_layers - 1)]
        if mw.causal:
            M = np.cumsum(X, axis=1) / np.arange(1, N_TOKENS + 1)[:, None]
        else:
            M = np.broadcast_to(X.mean(axis=1, keepdims=True), X.shape)
        Y = X + eta * M @ F.T
        X = Y / np.linalg.norm(Y, axis=-1, keepdims=True)
        np.testing.assert_allclose(states[t + 1], X, rtol=0, atol=1e-10, err_msg=f"layer {t}")


@pytest.mark.parametrize("name", CASES)
def test_simplified_real_update_uses_the_family_attention(cases: dict, name: str) -> None:
    """One step of simplified_real equals normalize(x + eta W_O (A (W_V x))) with A the
    module's own attention weights on the family norm of the sphere-valued tokens."""
    case = cases[name]
    mw, eta = case.mw, 0.5
    X0 = np.random.default_rng(1).standard_normal((N_PROMPTS, N_TOKENS, mw.d_model))
    step = prop.simplified_forward(mw, X0, eta, "real", n_layers=1)[1]
    X = X0 / np.linalg.norm(X0, axis=-1, keepdims=True)
    blk = mw.blocks[int(mw.layer_block[0])]
    Z = prop.family_norm(mw, blk, X)
    pre = mw.ln_position == "pre"
    A = prop.attention_weights(mw, 0, X if pre else Z)  # pre-LN families normalise inside
    V = (X @ blk.W_V.T).reshape(N_PROMPTS, N_TOKENS, mw.n_heads, -1).transpose(0, 2, 1, 3)
    drift = (A @ V).transpose(0, 2, 1, 3).reshape(N_PROMPTS, N_TOKENS, -1) @ blk.W_O.T
    Y = X + eta * drift
    np.testing.assert_allclose(step, Y / np.linalg.norm(Y, axis=-1, keepdims=True), atol=1e-12)


@pytest.mark.parametrize(
    "name", [c for c in CASES if adapter_class(CONFIGS[c]["model_type"]).causal_lm]
)
def test_steering_through_the_output_projection(cases: dict, name: str) -> None:
    """The min-norm W_O (with the expanded W_V) written into the causal LM's output
    projection makes u an eigenvector of the F measured from the modified module, and
    moves the next-token probability."""
    case = cases[name]
    mw = case.mw
    E = case.model.get_input_embeddings().weight.detach().numpy()
    u = E[5] / np.linalg.norm(E[5])
    if mw.embedding_projection is not None:  # OPT-350m: embeddings live in fewer dims
        u = mw.embedding_projection @ E[5]
        u /= np.linalg.norm(u)
    steered, res = st.steer_model_weights(mw, u, c=2.0)
    assert res.residual < 1e-10
    module, transposed = st._out_projection(case.model, -1)
    assert not transposed or case.model_type == "gpt2"
    original = module.weight.detach().clone()
    try:
        with torch.no_grad():
            module.weight.copy_(torch.as_tensor(res.W_O.T if transposed else res.W_O))
        F_new, _ = case.measured_F(mw.n_layers - 1)
    finally:
        with torch.no_grad():
            module.weight.copy_(original)
    np.testing.assert_allclose(F_new @ u, res.target_eigenvalue * u, atol=1e-10)
    with float64_everywhere():
        change = st.next_token_prob_change(
            case.folder, case.ids.numpy(), 5, res.W_O, model=case.model
        )
    assert np.isfinite(change["p_before"]).all() and np.abs(change["delta"]).max() > 0


def test_steering_dataset_on_a_projected_post_ln_model(cases: dict) -> None:
    """The steering rule's computation end to end on OPT-350m's layout (its last
    transformers state is ``project_out`` of another width): state 0 is the embedding
    output through ``project_in``, u an eigenvector, the probabilities finite."""
    case = cases["opt_post_ln"]
    cfg = {"target_text": "", "target_id": 5, "c": [2.0], "methods": ["min_norm"]}
    ds = st.steering_dataset(case.mw, case.folder, case.ids.numpy(), 1.0, cfg, 0, 2)
    assert float(ds["residual"].max()) < 1e-10
    p = ds["p_before"].values
    assert np.isfinite(p).all() and ((p > 0) & (p < 1)).all()
    base = hf.load_base_model(case.folder)
    with torch.no_grad():
        out = base(input_ids=case.ids, output_hidden_states=True)
    state0, e = st.model_inputs(case.folder, case.ids.numpy(), 5)
    np.testing.assert_allclose(state0, out.hidden_states[0].double().numpy(), rtol=0, atol=1e-6)
    E = base.get_input_embeddings().weight.detach().double().numpy()
    np.testing.assert_array_equal(e, E[5])
    assert out.hidden_states[-1].shape[-1] != state0.shape[-1]  # the trap is there


# --------------------------------------------------------------------------- contracts


def test_version_1_weights_h5_is_read_with_its_meaning(cases: dict, tmp_path: Path) -> None:
    import h5py

    case = cases["gpt2"]
    path = tmp_path / "weights.h5"
    extract_to_h5(case.folder, path)
    with h5py.File(path, "a") as f:
        for key in ("norm", "n_kv_heads", "attn_softcap", "residual", "rotary"):
            del f.attrs[key]
        f.attrs["format_version"] = 1
    old = read_weights_h5(path)
    assert (old.norm, old.rotary, old.attn_softcap, old.residual) == (
        "layernorm", None, None, "sequential",
    )  # fmt: skip
    np.testing.assert_array_equal(old.blocks[1].F, case.mw.blocks[1].F)
    with h5py.File(path, "a") as f:
        f.attrs["format_version"] = 4
    with pytest.raises(InputFileError, match="format_version 4 is newer.*rerun extract_weights"):
        read_weights_h5(path)
    with h5py.File(path, "a") as f:
        f.attrs["format_version"] = 2
    with pytest.raises(InputFileError, match="missing root attribute.*norm"):
        read_weights_h5(path)


def test_config_defaults_come_from_the_family_class(tmp_path: Path) -> None:
    """An absent key takes the class default: Mistral's num_key_value_heads is 8, not
    n_heads, and Qwen3's head_dim is 128, not d / H."""
    from specalign.transformers.load.families import adapter_for

    mistral = adapter_for({"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 16})
    assert (mistral.n_kv_heads, mistral.d_head) == (8, 4)
    qwen3 = adapter_for({"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 32})
    assert (qwen3.n_kv_heads, qwen3.d_head) == (32, 128)
    neox = adapter_for({"model_type": "gpt_neox", "hidden_size": 64, "num_attention_heads": 4,
                        "rotary_pct": 0.5, "partial_rotary_factor": 1.0})  # fmt: skip
    inv, scale = neox.rotary()
    assert inv.shape[1] * 2 == 8 and (scale == 1).all()  # rotary_pct, not the top-level key
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gptj", "n_embd": 64,
                                                      "n_head": 4, "rotary_dim": 7}))  # fmt: skip
    with pytest.raises(InputFileError, match="rotary_dim 7"):
        extract(tmp_path)


def test_falcon_key_value_heads_and_alibi() -> None:
    """Falcon's key/value head count follows its layout, not ``num_kv_heads`` alone
    (multi-query: 1; neither layout: n_heads, whatever the key says; the new architecture:
    the key), and ALiBi scores are refused rather than read as rotary ones."""
    from specalign.transformers.load.families import adapter_for

    base = {"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 8}
    assert adapter_for(base).n_kv_heads == 1  # the class default: multi_query
    per_head = adapter_for({**base, "multi_query": False, "num_kv_heads": 2})
    assert per_head.n_kv_heads == 8
    grouped = adapter_for({**base, "new_decoder_architecture": True, "num_kv_heads": 2})
    assert (grouped.n_kv_heads, grouped.residual) == (2, "parallel")
    assert adapter_for({**base, "parallel_attn": False}).residual == "sequential"
    with pytest.raises(ValueError, match="alibi"):
        adapter_for({**base, "alibi": True})


@pytest.mark.parametrize("name", CASES)
def test_stock_float32_model_matches_at_the_float32_level(name: str, tmp_path: Path) -> None:
    """The production path: a stock float32 model and weights.h5 extracted without the
    float64 patch (rotary frequencies as transformers computes them) agree to float32
    round-off, for prompts longer than the tiny models' windows."""
    model = tiny_models.build(name).to(torch.float32)
    model.save_pretrained(str(tmp_path))
    mw = extract(tmp_path)
    ids = torch.as_tensor(hf.random_prompts(96, 2, 12, seed=0, special_ids_to_avoid=[0, 1, 2]))
    with torch.no_grad():
        out = model.base_model(input_ids=ids, output_attentions=True, output_hidden_states=True)
    for i in range(mw.n_layers):
        A = prop.attention_weights(mw, i, out.hidden_states[i].double().numpy())
        np.testing.assert_allclose(A, out.attentions[i].double().numpy(), rtol=0, atol=1e-6)


def test_random_twin_of_a_causal_lm_is_saved_with_its_head(tmp_path: Path) -> None:
    """An untied LM head left out of a random model would be drawn afresh, unseeded, at
    every load, so the steering probabilities of a random twin would not repeat."""
    from safetensors import safe_open

    from specalign.transformers.load.sources import make_random_model

    folder = make_random_model(dict(CONFIGS["phi3"]), tmp_path / "twin", seed=0)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" in f.keys()
    ids = hf.random_prompts(96, 2, 5, seed=0)
    lm = hf.load_causal_lm(folder)
    W_O = lm.model.layers[-1].self_attn.o_proj.weight.detach().double().numpy()
    # two independent loads of the folder: an unsaved head would differ between them
    p = [st.next_token_prob_change(folder, ids, 3, W_O)["p_before"] for _ in range(2)]
    np.testing.assert_array_equal(p[0], p[1])
    masked = make_random_model(dict(CONFIGS["roberta"]), tmp_path / "masked", seed=0)
    assert extract(masked).family == "roberta"


@pytest.mark.parametrize("name", ["llama", "gpt_neox", "gemma3_text", "qwen2", "phi3"])
def test_hub_config_dialect_reads_the_same(cases: dict, name: str, tmp_path: Path) -> None:
    """config.json as 4.x wrote it (rope_theta + rope_scaling, rotary_pct, Gemma 3's
    rope_local_base_freq + sliding_window_pattern, Qwen2's max_window_layers) gives the
    attention recipe of the 5.x file that save_pretrained writes."""
    import shutil

    case = cases[name]
    shutil.copy(case.folder / "model.safetensors", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS[name]))
    with float64_everywhere():
        hub = extract(tmp_path)
    assert "rope_parameters" not in CONFIGS[name]
    assert json.loads((case.folder / "config.json").read_text()).get("rope_parameters")
    np.testing.assert_array_equal(hub.rotary_inv_freq, case.mw.rotary_inv_freq)
    np.testing.assert_array_equal(hub.rotary_scaling, case.mw.rotary_scaling)
    for field in ("layer_attention", "window_size", "n_kv_heads", "attn_scale", "rotary"):
        assert getattr(hub, field) == getattr(case.mw, field), field


def test_random_prompts_avoid_the_config_special_ids(tmp_path: Path) -> None:
    """A folder without a tokenizer (a twin built from a configuration): the prompts avoid
    config.json's pad/bos/eos ids (a pad id inside a RoBERTa prompt shifts positions)."""
    config = {"model_type": "gpt2", "vocab_size": 16, "pad_token_id": 1, "bos_token_id": 0,
              "eos_token_id": [2, 3]}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = {"kind": "random", "n_prompts": 50, "n_tokens": 10, "seed": 0}
    ids = set(np.unique(hf.prompt_ids(tmp_path, cfg)).tolist())
    assert ids and not ids & {0, 1, 2, 3} and ids <= set(range(4, 16))


@pytest.mark.parametrize("name", CASES)
def test_position_limit_is_the_model_s(cases: dict, name: str) -> None:
    """``max_positions`` (what the config check holds ``n_tokens`` to, read through the
    family's configuration class) is a length the model runs; with learned positions one
    token more fails, so the limit is exact (RoBERTa's starts past its padding id: 62 of
    64 positions). The config check names n_tokens past it, from an inline config too."""
    from specalign.transformers.load.limits import model_problems

    case = cases[name]
    adapter = adapter_class(case.model_type)(CONFIGS[name])
    limit = adapter.max_positions
    assert limit == (62 if case.model_type == "roberta" else 64)
    cfg = case.model.config
    special = [i for i in (cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id) if i is not None]

    def run(n: int) -> None:
        ids = hf.random_prompts(cfg.vocab_size, 1, n, seed=0, special_ids_to_avoid=special)
        with torch.no_grad():
            case.base(input_ids=torch.as_tensor(ids))

    run(limit)
    if adapter.rotary() is None:  # rotary positions have no table to run out of
        with pytest.raises((IndexError, RuntimeError, ValueError)):
            run(limit + 1)
    tcfg = {"prompts": {"n_tokens": limit}, "steering": {}}
    assert model_problems(tcfg, name, CONFIGS[name]) == []
    tcfg["prompts"]["n_tokens"] = limit + 1
    (problem,) = model_problems(tcfg, name, CONFIGS[name])
    assert (
        problem.startswith("transformers.prompts.n_tokens:") and f"has {limit} positions" in problem
    )


def _facts_cases() -> dict[str, dict[str, Any]]:
    """Every tiny family configuration, today's checkpoints' structure in modern_test.yaml
    and the key variants the adapters branch on."""
    cases = {f"tiny/{name}": dict(cfg) for name, cfg in CONFIGS.items()}
    for name, spec in tiny_models.modern_test_models().items():
        if isinstance(spec.get("config"), dict):
            cases[f"modern/{name}"] = dict(spec["config"])
    falcon = {"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 8}
    cases["falcon/grouped"] = {**falcon, "new_decoder_architecture": True, "num_kv_heads": 2}
    cases["falcon/sequential"] = {**falcon, "parallel_attn": False}
    cases["mistral/defaults"] = {"model_type": "mistral", "hidden_size": 64,
                                 "num_attention_heads": 16}  # fmt: skip
    return cases


def _adapter_values(adapter: Any) -> dict[str, Any]:
    """What an adapter says about its family: every public attribute and property that
    is not a method (rotary tables included), or the type of the error it raises."""
    values: dict[str, Any] = {}
    for name in dir(adapter):
        if name.startswith("_") or name in ("hf", "hf_object", "config"):
            continue
        try:
            value = getattr(adapter, name)
        except Exception as exc:
            values[name] = ("raises", type(exc).__name__)
            continue
        if name == "rotary":
            value = value()
        elif callable(value):
            continue
        values[name] = value
    return values


def test_adapters_read_the_same_from_kept_facts_as_from_the_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adapters read config.json's values from ConfigFacts (kept on disk by content
    and transformers version, so that `snakemake` checks need neither transformers nor
    torch): built from facts just computed, from facts read back, and from transformers'
    configuration object itself, every adapter says the same of every case."""
    from specalign.transformers.load import families

    monkeypatch.setenv("SPECALIGN_CACHE", str(tmp_path))
    for case, config in _facts_cases().items():
        fresh = families.adapter_for(config)
        kept = list((tmp_path / "config-facts").glob("*.json"))
        assert kept, case
        again = families.adapter_for(config)  # read back
        with monkeypatch.context() as m:
            m.setattr(families, "config_facts", families.hf_config)
            real = families.adapter_for(config)
        expected = _adapter_values(real)
        for adapter in (fresh, again):
            got = _adapter_values(adapter)
            assert got.keys() == expected.keys(), case
            for name, value in expected.items():
                if isinstance(value, tuple) and value and isinstance(value[0], np.ndarray):
                    for a, b in zip(got[name], value, strict=True):
                        np.testing.assert_array_equal(a, b, err_msg=f"{case}: {name}")
                else:
                    assert got[name] == value, (case, name)


def _in_fresh_process(config: dict[str, Any], expression: str, cache: Path) -> list[str]:
    """``expression`` (of ``a``, the adapter of ``config``) printed by a fresh Python
    process reading kept facts from ``cache``, followed by whether that process imported
    transformers and torch."""
    import os
    import subprocess
    import sys

    probe = (
        "import sys, json; from specalign.transformers.load.families import adapter_for; "
        f"a = adapter_for(json.loads({json.dumps(json.dumps(config))})); "
        f"print({expression}, 'transformers' in sys.modules, 'torch' in sys.modules)"
    )
    env = {**os.environ, "SPECALIGN_CACHE": str(cache)}
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=env, check=True)  # fmt: skip
    return run.stdout.split()


def test_kept_facts_are_keyed_by_content_and_errors_are_kept_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    from specalign.transformers.load import families

    monkeypatch.setenv("SPECALIGN_CACHE", str(tmp_path))
    base = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 64}
    assert families.adapter_for(base).d_model == 32
    assert families.adapter_for({**base, "n_embd": 48}).d_model == 48  # another file
    folder = tmp_path / "config-facts"
    assert len(list(folder.glob("*.json"))) == 2
    # a configuration transformers rejects is rejected again from what was kept
    bad = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 3,
           "num_key_value_heads": 2}  # fmt: skip
    for _ in range(2):
        with pytest.raises(ValueError):
            families.adapter_for(bad)
    # a damaged file is computed again and rewritten
    for path in folder.glob("*.json"):
        path.write_text("{not json")
    assert families.adapter_for(base).d_model == 32
    # read back in a fresh process without importing transformers or torch
    out = _in_fresh_process(base, "a.d_model, a.max_positions", tmp_path)
    assert out == ["32", "1024", "False", "False"]
    # SPECALIGN_CACHE="" keeps nothing
    monkeypatch.setenv("SPECALIGN_CACHE", "")
    assert families.adapter_for({**base, "n_embd": 64}).d_model == 64
    assert len(list(folder.glob("*.json"))) == 3  # the two files and the rejected one


def _rotary_outcome(adapter: Any) -> Any:
    try:
        return adapter.rotary()
    except Exception as exc:
        return ("raises", type(exc).__name__, str(exc))


def test_float64_everywhere_neither_reads_nor_keeps_kept_facts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tests' float64 patch of torch is invisible to the kept facts' keys (library
    versions, not patches): inside it a rotary family's frequencies are its float64 ones
    although the float32 ones are kept, and nothing computed inside is kept (the family
    tests failed when a worker had kept a configuration's float32 frequencies first)."""
    from specalign.transformers.load import families

    config = CONFIGS["llama"]
    monkeypatch.setenv("SPECALIGN_CACHE", "")
    with float64_everywhere():
        want64 = families.adapter_for(config).rotary()[0]
    monkeypatch.setenv("SPECALIGN_CACHE", str(tmp_path))
    kept32 = families.adapter_for(config).rotary()[0]
    assert not np.array_equal(kept32, want64)  # else this test could not fail
    files = sorted((tmp_path / "rotary").glob("*.json"))
    with float64_everywhere():
        np.testing.assert_array_equal(families.adapter_for(config).rotary()[0], want64)
    assert sorted((tmp_path / "rotary").glob("*.json")) == files
    assert os.environ["SPECALIGN_CACHE"] == str(tmp_path)
    np.testing.assert_array_equal(families.adapter_for(config).rotary()[0], kept32)


def test_rotary_frequencies_kept_are_the_modeling_modules_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rotary family's frequencies and scalings (written to weights.h5) are the same to
    the bit computed with nothing kept, computed and kept, and read back, in every case;
    one fact per configuration; every family whose adapter keeps them is among the cases;
    read back in a fresh process, they import neither transformers nor torch; an error
    is raised each time, never kept."""

    from specalign.transformers.load import families
    from specalign.transformers.load.families import base

    computed: list[tuple[str, Any]] = []  # (model_type, what the modeling module gave)
    compute = base.rotary_from_transformers

    def counting(hf: Any, layer_types: list[str]) -> Any:
        computed.append((hf.model_type, compute(hf, layer_types)))
        return computed[-1][1]

    monkeypatch.setattr(base, "rotary_from_transformers", counting)
    new_facts = 0
    for case, config in _facts_cases().items():
        monkeypatch.setenv("SPECALIGN_CACHE", "")
        start = len(computed)
        direct = _rotary_outcome(families.adapter_for(config))
        monkeypatch.setenv("SPECALIGN_CACHE", str(tmp_path))
        before = len(computed)
        fresh = _rotary_outcome(families.adapter_for(config))
        again = _rotary_outcome(families.adapter_for(config))
        if direct is None or isinstance(direct[0], str):  # no rotary, or an error
            assert fresh == again == direct, case
            continue
        if before == start:  # its own formula (GPT-J), not the modeling module's
            assert len(computed) == before, case
            continue
        assert len(computed) <= before + 1, f"{case}: computed again although kept"
        new_facts += len(computed) - before  # none where an earlier case had this config
        expected = computed[before - 1][1]  # the module's own arrays, nothing kept between
        for got in (direct, fresh, again):
            assert len(got) == 2, case
            for a, b in zip(got, expected, strict=True):
                assert a.dtype == b.dtype == np.float64, case
                np.testing.assert_array_equal(a, b, err_msg=case)
    assert len(list((tmp_path / "rotary").glob("*.json"))) == new_facts > 0
    keeping = {
        model_type
        for model_type, cls in families.FAMILIES.items()
        if "kept_rotary" in cls.rotary.__code__.co_names
    }
    assert keeping and keeping <= {t for t, _ in computed}, keeping

    config = _facts_cases()["mistral/defaults"]
    out = _in_fresh_process(config, "a.rotary()[0].shape[0], a.rotary()[0].dtype", tmp_path)
    n_layers = families.adapter_for(config).n_layers
    assert out == [str(n_layers), "float64", "False", "False"]

    def failing(hf: Any, layer_types: list[str]) -> Any:
        raise ValueError("no rotary class")

    monkeypatch.setattr(base, "rotary_from_transformers", failing)
    other = tmp_path / "other"
    monkeypatch.setenv("SPECALIGN_CACHE", str(other))
    for _ in range(2):
        with pytest.raises(ValueError, match="no rotary class"):
            families.adapter_for(config).rotary()
    assert not list((other / "rotary").glob("*.json"))


def test_olmo_with_clip_qkv_is_refused_in_one_line_naming_the_key() -> None:
    """OLMo's clip_qkv clamps q, k and v elementwise, which the simplified update does
    not model: the adapter refuses such a config.json, and the configuration check says
    so in one line naming the model and the key, before any job runs. Unset (None, the
    published checkpoints') it is accepted."""
    from specalign.transformers.load.limits import model_problems

    config = {**CONFIGS["olmo"], "clip_qkv": 8.0}
    with pytest.raises(ValueError, match="clip_qkv = 8.0"):
        adapter_class("olmo")(config)
    tcfg = {"prompts": {"n_tokens": 8}, "steering": {}}
    (problem,) = model_problems(tcfg, "olmo_clipped", config)
    assert problem.startswith("transformers.models.olmo_clipped: config.json olmo: clip_qkv")
    assert "\n" not in problem
    assert model_problems(tcfg, "olmo", {**CONFIGS["olmo"], "clip_qkv": None}) == []
