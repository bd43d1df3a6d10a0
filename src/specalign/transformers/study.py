"""One model of the transformer study, from a model folder to the data contracts.

Connects the kernels (``extract``, ``spectra``, ``propagate``, ``steer``, ``sphere``)
with the files the workflow writes for every configured model:

* ``resources/models/{model}/manifest.json``: where the model folder is and where it
  came from (hub id and resolved commit, local folder, package, or random weights);
* ``results/transformers/{model}/propagation.nc``: token metrics per mode, layer, token;
* ``results/transformers/{model}/steering.nc``: the last-layer W_O change and its effect;
* ``results/transformers/sphere/sphere.nc``: the supplement's sphere dynamics.

Modes of ``propagation.nc`` (Section 3 of Li & Altafini and its supplement):

* ``simplified_real``: the paper's simplified model (no FFN, LayerNorm as normalisation
  onto the sphere) from the embedding output, with each layer's real attention weights;
* ``simplified_full``: the same with full attention A = 1/n, the exact power-method step
  on I + eta F;
* ``real_model``: the real model's hidden states (embeddings, FFN, affine LayerNorm;
  Figures 11, 12);
* ``prolonged_real`` / ``prolonged_full``: the simplified model run for
  ``prolonged_layers`` layers, repeating the shared (ALBERT) or last layer (Figure 6).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from specalign import io
from specalign.transformers import propagate, steer
from specalign.transformers.weights import ModelWeights

# --------------------------------------------------------------------------- manifests


def write_manifest(path: str | Path, model_dir: str | Path, info: Mapping[str, Any]) -> None:
    """Record where a model folder is (absolute) and its provenance."""
    io.write_json(path, {"path": str(Path(model_dir).resolve()), **dict(info)})


_SOURCE_FIELDS = {"hub": ("id", "revision"), "local": ("path",), "package": ("package",)}


def source_spec(model_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The ``sources.resolve_model_dir`` spec of a configured (non-random) model."""
    kind = model_cfg["source"]
    if kind not in _SOURCE_FIELDS:
        raise ValueError(f"model source {kind!r} is not fetched (one of {list(_SOURCE_FIELDS)})")
    return {"kind": kind, **{k: model_cfg[k] for k in _SOURCE_FIELDS[kind]}}


def read_manifest(path: str | Path) -> dict[str, Any]:
    """Read a manifest; the model folder it names must still exist."""
    path = Path(path)
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise io.InputFileError(f"{path}: file does not exist") from exc
    except json.JSONDecodeError as exc:
        raise io.InputFileError(f"{path}: not valid JSON ({exc})") from exc
    model_dir = Path(manifest.get("path", ""))
    if not (model_dir / "config.json").exists():
        raise io.InputFileError(
            f"{path}: the model folder {model_dir} it names has no config.json any more; "
            "delete the manifest and rerun the workflow to fetch the model again"
        )
    return manifest


# --------------------------------------------------------------------------- prompts


def _tokenizer(model_dir: str | Path) -> Any | None:
    """The model's tokenizer from its folder, or None when the folder has none."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError, KeyError):
        return None


def prompt_ids(model_dir: str | Path, cfg: Mapping[str, Any]) -> np.ndarray:
    """(n_prompts, n_tokens) token ids for the configured prompt source.

    ``random``: seeded uniform ids from the vocabulary without the special tokens (the
    paper's ALBERT figures use 100 prompts of 10 tokens). ``text``: the first
    ``n_tokens`` tokens of each line of a local file that has that many. ``dataset``:
    the same from a Hugging Face dataset's text column (needs the ``datasets`` package
    and the network).
    """
    config = json.loads((Path(model_dir) / "config.json").read_text())
    n_prompts, n_tokens = int(cfg["n_prompts"]), int(cfg["n_tokens"])
    tok = _tokenizer(model_dir)
    if cfg["kind"] == "random":
        special = list(getattr(tok, "all_special_ids", []) or []) if tok else []
        return propagate.random_prompts(
            int(config["vocab_size"]), n_prompts, n_tokens, int(cfg["seed"]), special
        )
    if tok is None:
        raise io.InputFileError(f"{model_dir}: no tokenizer files for {cfg['kind']} prompts")
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
    ids = propagate.text_prompts(tok, lines, n_tokens)
    return ids[:n_prompts]


# --------------------------------------------------------------------------- propagation


def _torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "float64": torch.float64}[name]


def propagation_states(
    mw: ModelWeights,
    model_dir: str | Path,
    ids: np.ndarray,
    eta: float,
    cfg: Mapping[str, Any],
    device: str = "cpu",
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, np.ndarray]:
    """The token states of every mode, each (T_mode + 1, n_prompts, n_tokens, d).

    ``progress(done, total)`` is called after each mode (the real model first, since
    the simplified runs start from its embedding output).
    """
    prolong = int(cfg["prolonged_layers"]) > mw.n_layers
    T = int(cfg["prolonged_layers"])
    runs: list[tuple[str, Callable[[np.ndarray], np.ndarray]]] = [
        ("simplified_real", lambda X0: propagate.simplified_forward(mw, X0, eta, "real")),
        ("simplified_full", lambda X0: propagate.simplified_forward(mw, X0, eta, "full")),
    ]
    if prolong:
        runs += [
            ("prolonged_real", lambda X0: propagate.simplified_forward(mw, X0, eta, "real", T)),
            ("prolonged_full", lambda X0: propagate.simplified_forward(mw, X0, eta, "full", T)),
        ]
    total = len(runs) + 1
    hidden = propagate.real_forward_hidden_states(
        model_dir, ids, device=device, dtype=_torch_dtype(cfg["real_dtype"])
    )
    if progress:
        progress(1, total)
    states = {"real_model": hidden}
    for i, (mode, run) in enumerate(runs, start=2):
        states[mode] = run(hidden[0])
        if progress:
            progress(i, total)
    order = ["simplified_real", "simplified_full", "real_model", "prolonged_real", "prolonged_full"]
    return {mode: states[mode] for mode in order if mode in states}


def propagation_dataset(
    mw: ModelWeights,
    states: Mapping[str, np.ndarray],
    cfg: Mapping[str, Any],
    seed: int,
) -> xr.Dataset:
    """All metrics of ``propagate.propagation_metrics`` with the configured correlation,
    plus ``gamma``, ``psi``, ``rho`` and their random-direction nulls under the other
    correlation (suffix ``_pearson`` or ``_cosine``) so the two readings can be compared.
    """
    corr = cfg["corr"]
    other = "pearson" if corr == "cosine" else "cosine"
    draws = int(cfg["null_draws"])
    ds = propagate.propagation_metrics(mw, states, corr=corr, n_null_draws=draws, seed=seed)
    alt = propagate.propagation_metrics(mw, states, corr=other, n_null_draws=draws, seed=seed)
    for var in ("gamma", "psi", "rho", "gamma_null", "rho_null", "rho_mean"):
        ds[f"{var}_{other}"] = alt[var]
        ds[f"{var}_{other}"].attrs["description"] = f"{var} with corr = {other}"
    ds.attrs.update(corr=corr, corr_other=other)
    return ds


# --------------------------------------------------------------------------- steering


def input_embedding(model_dir: str | Path, mw: ModelWeights, token_id: int) -> np.ndarray:
    """The input embedding of ``token_id`` in model space (d_model,), float64.

    ALBERT embeds in a smaller space and projects to the hidden size; the projection
    (``mw.embedding_projection``) is applied so that u lives where the tokens do.
    """
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True)
    E = model.get_input_embeddings().weight.detach().to("cpu").double().numpy()
    e = E[int(token_id)]
    if getattr(mw, "embedding_projection", None) is not None:
        e = mw.embedding_projection @ e
        if getattr(mw, "embedding_projection_bias", None) is not None:
            e = e + mw.embedding_projection_bias
    return e


def target_token(model_dir: str | Path, text: str, token_id: int | None = None) -> int:
    """The steering target's token id: ``token_id`` when given, else the first token of
    ``text`` under the model's tokenizer."""
    if token_id is not None:
        return int(token_id)
    tok = _tokenizer(model_dir)
    ids = tok(text, add_special_tokens=False)["input_ids"] if tok is not None else []
    if not ids:
        raise io.InputFileError(
            f"{model_dir}: cannot encode the steering target {text!r} (no usable tokenizer); "
            "set transformers.steering.target_id to a token id instead"
        )
    return int(ids[0])


def _random_units(d: int, n: int, seed: int) -> np.ndarray:
    R = np.random.default_rng(seed).standard_normal((n, d))
    return R / np.linalg.norm(R, axis=1, keepdims=True)


def steering_dataset(
    mw: ModelWeights,
    model_dir: str | Path,
    ids: np.ndarray,
    eta: float,
    cfg: Mapping[str, Any],
    seed: int,
    null_draws: int,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
) -> xr.Dataset:
    """Steer the last layer towards u for every (method, c) and measure the effect.

    Variables (dims): ``gamma_u`` (method, c, variant, token) = |cos(x_i, u)| after the
    last layer of the simplified model with real attention, variant original/steered;
    ``gamma_u_mean`` (method, c, variant, prompt) for the mean token; ``gamma_u_null``
    (method, c, variant, token): the same against random unit directions (averaged), the
    chance level; ``gamma_layers`` / ``rho_layers`` (method, c, layer, token / layer): the
    paper's per-layer gamma and rho of the steered model (Figures 3, 10);
    ``relative_change`` = |Delta W_O|_F / |W_O|_F, ``residual`` = |F' u - c r u| / |c r|,
    ``target_eigenvalue``, ``u_is_leading`` (method, c); for causal language models
    ``p_before``, ``p_after`` (method, c, prompt): the probability of the target token as
    the next token through the LM head, before and after the change (NaN otherwise).
    """
    token_id = target_token(model_dir, cfg["target_text"], cfg.get("target_id"))
    e = input_embedding(model_dir, mw, token_id)
    u = e / np.linalg.norm(e)
    hidden0 = propagate.real_forward_hidden_states(model_dir, ids, device=device)[0]
    methods, cs = list(cfg["methods"]), [float(c) for c in cfg["c"]]
    P, N = ids.shape
    R = _random_units(mw.d_model, null_draws, seed)
    base_final = propagate.simplified_forward(mw, hidden0, eta, "real")[-1]
    shape = (len(methods), len(cs))
    g_u = np.full((*shape, 2, P * N), np.nan)
    g_um = np.full((*shape, 2, P), np.nan)
    g_null = np.full((*shape, 2, P * N), np.nan)
    g_layers = np.full((*shape, mw.n_layers, P * N), np.nan)
    r_layers = np.full((*shape, mw.n_layers), np.nan)
    scalars = {
        k: np.full(shape, np.nan)
        for k in ("relative_change", "residual", "target_eigenvalue", "u_is_leading")
    }
    p_before = np.full((*shape, P), np.nan)
    p_after = np.full((*shape, P), np.nan)
    causal_lm = mw.family in ("gpt2", "gpt_neo")
    # loaded once: a large causal LM would otherwise be read again for every (method, c)
    lm = steer.load_causal_lm(model_dir, device) if causal_lm else None
    for i, method in enumerate(methods):
        for j, c in enumerate(cs):
            if progress:
                progress(f"steering: method={method} c={c:g}")
            steered, res = steer.steer_model_weights(mw, u, c, method=method)
            states = propagate.simplified_forward(steered, hidden0, eta, "real")
            for v, final in enumerate((base_final, states[-1])):
                g_u[i, j, v] = np.abs(propagate.correlation(final, u)).reshape(-1)
                g_um[i, j, v] = np.abs(propagate.correlation(final.mean(axis=1), u))
                g_null[i, j, v] = np.mean(
                    [np.abs(propagate.correlation(final, r)).reshape(-1) for r in R], axis=0
                )
            metrics = propagate.propagation_metrics(
                steered, {"steered": states}, n_null_draws=1, seed=seed
            )
            g_layers[i, j] = metrics["gamma"].sel(mode="steered").values
            r_layers[i, j] = metrics["rho"].sel(mode="steered").values
            scalars["relative_change"][i, j] = res.relative_change
            scalars["residual"][i, j] = res.residual
            scalars["target_eigenvalue"][i, j] = res.target_eigenvalue
            scalars["u_is_leading"][i, j] = float(res.u_is_leading)
            if causal_lm:
                change = steer.next_token_prob_change(
                    model_dir, ids, token_id, res.W_O, device=device, model=lm
                )
                p_before[i, j] = change["p_before"]
                p_after[i, j] = change["p_after"]
    coords = {
        "method": methods,
        "c": cs,
        "variant": ["original", "steered"],
        "token": np.arange(P * N),
        "prompt": np.arange(P),
        "layer": np.arange(1, mw.n_layers + 1),
    }
    mc = ("method", "c")
    ds = xr.Dataset(
        {
            "gamma_u": ((*mc, "variant", "token"), g_u),
            "gamma_u_mean": ((*mc, "variant", "prompt"), g_um),
            "gamma_u_null": ((*mc, "variant", "token"), g_null),
            "gamma_layers": ((*mc, "layer", "token"), g_layers),
            "rho_layers": ((*mc, "layer"), r_layers),
            **{k: (mc, v) for k, v in scalars.items()},
            "p_before": ((*mc, "prompt"), p_before),
            "p_after": ((*mc, "prompt"), p_after),
            "u": (("component",), u),
        },
        coords=coords,
    )
    ds.attrs.update(
        target_text=cfg["target_text"],
        target_id=token_id,
        eta=float(eta),
        family=mw.family,
        causal_lm=int(causal_lm),
        null_draws=int(null_draws),
    )
    return ds


# --------------------------------------------------------------------------- sphere


def sphere_dataset(cfg: Mapping[str, Any]) -> xr.Dataset:
    """The supplement's examples on S^{d-1} (Figures 13, 14) and its stability claims.

    F = Q diag(eigenvalues) Q^T with a seeded random orthogonal Q (symmetric, so every
    consensus point x_i = v_k is an equilibrium of the full-attention map); the 5-head
    example splits F into random symmetric heads summing to F, each with its own random
    bilinear attention form.
    """
    from specalign.transformers import sphere

    rng = np.random.default_rng(int(cfg["seed"]))
    d, n, H = int(cfg["d"]), int(cfg["n"]), int(cfg["heads"])
    eta, beta, steps = float(cfg["eta"]), float(cfg["beta"]), int(cfg["steps"])
    Q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    F = Q @ np.diag(np.asarray(cfg["eigenvalues"], dtype=float)) @ Q.T
    lam, V = sphere.consensus_points(F)
    v1 = V[:, 0]

    parts = rng.standard_normal((H, d, d))
    parts = (parts + parts.transpose(0, 2, 1)) / 2
    F_heads = F / H + parts - parts.mean(axis=0)
    B_heads = rng.standard_normal((H, d, d)) / np.sqrt(d)
    X0 = rng.standard_normal((n, d))

    single = sphere.simulate(X0, F, eta, steps, "softmax", None, beta)
    multi = sphere.simulate(X0, F_heads, eta, steps, "softmax", B_heads, beta)
    full = sphere.simulate(X0, F, eta, steps, "full")

    bip = sphere.bipartite_state(v1, n // 2, n - n // 2)
    perts = [float(p) for p in cfg["perturbations"]]
    bip_traj = []
    for p in perts:
        noise = rng.standard_normal((n, d))
        bip_traj.append(sphere.simulate(bip + p * noise, F, eta, steps, "softmax", None, beta))

    k_all = range(d)
    numeric, closed, supplement = [], [], []
    for k in k_all:
        X = sphere.consensus_state(V[:, k], n)
        J = sphere.tangent_jacobian(X, F, eta, "full")
        numeric.append(np.sort(np.abs(np.linalg.eigvals(J)))[::-1])
        closed.append(np.sort(np.abs(sphere.consensus_jacobian_eigenvalues(F, eta, k, n)))[::-1])
        supplement.append(
            np.sort(np.abs(sphere.supplement_consensus_eigenvalues(F, eta, k, n)))[::-1]
        )
    numeric_a, closed_a = np.array(numeric), np.array(closed)
    supp = np.full((d, n * d), np.nan)
    for k, s in enumerate(supplement):
        supp[k, : s.size] = s

    gamma_full = np.abs(full @ v1)  # (steps + 1, n): unit tokens, unit v1
    rate_measured = sphere.measured_convergence_rate(gamma_full[1:])
    ds = xr.Dataset(
        {
            "F": (("row", "col"), F),
            "eigenvalues": (("k",), lam),
            "eigenvectors": (("component", "k"), V),
            "traj_single": (("step", "token", "component"), single),
            "traj_multi": (("step", "token", "component"), multi),
            "traj_full": (("step", "token", "component"), full),
            "corr_v1_single": (("step", "token"), single @ v1),
            "corr_v1_multi": (("step", "token"), multi @ v1),
            "traj_bipartite": (("perturbation", "step", "token", "component"), np.stack(bip_traj)),
            "bipartite_distance": (
                ("perturbation", "step"),
                np.linalg.norm(np.stack(bip_traj) - bip, axis=(-2, -1)),
            ),
            "jacobian_numeric": (("k", "mode"), numeric_a),
            "jacobian_closed_form": (("k", "mode"), closed_a),
            "jacobian_supplement": (("k", "mode_supplement"), supp),
            "jacobian_max_abs_diff": (("k",), np.max(np.abs(numeric_a - closed_a), axis=1)),
            "jacobian_spectral_radius": (("k",), numeric_a[:, 0]),
            "stable": (("k",), (numeric_a[:, 0] < 1.0).astype(np.int8)),
            "gamma_full": (("step", "token"), gamma_full),
        },
        coords={"perturbation": perts, "k": np.arange(d), "step": np.arange(steps + 1)},
    )
    ds.attrs.update(
        d=d,
        n=n,
        heads=H,
        eta=eta,
        beta=beta,
        seed=int(cfg["seed"]),
        stepsize_bound=float(sphere.stepsize_bound(F)),
        eta_within_bound=int(eta < sphere.stepsize_bound(F)),
        rate_predicted=float(sphere.convergence_rate_prediction(F, eta)),
        rate_asymptotic=float(sphere.asymptotic_rate(F, eta, n)),
        rate_measured=float(rate_measured),
        note=(
            "jacobian_closed_form: the tangent-space eigenvalues (1 + eta l_h)/|1 + eta l_k| "
            "and 1/|1 + eta l_k|; jacobian_supplement adds the supplement's n radial values "
            "(1 - eta l + eta^2 l^2)/(1 + eta l), which are not modes of the dynamics on the "
            "sphere (see specalign.transformers.sphere)."
        ),
    )
    return ds
