"""Hugging Face access of the transformer study: the model's tokenizer and prompts,
the model loaded whole or streamed, and its hidden states (Li & Altafini,
arXiv:2605.25619, Figures 11-12: the real model beside the simplified one).

Propagation and steering read the model only through this module (and, for what only
a streamed model can do, such as replacing a weight while the model runs, through
:mod:`specalign.transformers.load.streaming`, which runs a ``transformers`` model from its
checkpoint one unit at a time). Every load is local (``local_files_only``: never the
network) and runs no code from the model folder (``trust_remote_code=False``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from specalign.io import DiskStack, InputFileError
from specalign.runtime import heap_set_aside
from specalign.transformers.load import streaming
from specalign.transformers.load.checkpoint import tokenizer_files
from specalign.transformers.load.families import adapter_class

__all__ = [
    "load_base_model",
    "load_causal_lm",
    "load_tokenizer",
    "model_hidden_states",
    "prompt_ids",
    "prompt_lines",
    "random_prompts",
    "real_forward_hidden_states",
    "streamed_states",
    "text_prompts",
    "torch_dtype",
]


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


def prompt_lines(path: str | os.PathLike[str]) -> list[str]:
    """The lines of a prompt file (UTF-8, one prompt per line). A line ends at a line
    feed, a carriage return or both (as written on any system), and nowhere else:
    ``str.splitlines`` also ends lines at U+2028 and U+2029, U+0085, form feeds and the
    separators U+001C-U+001E, which would cut one prompt of a text into two."""
    with open(path, encoding="utf-8", newline=None) as f:  # "\r\n" and "\r" read as "\n"
        return f.read().split("\n")


def check_checkpoint_fits(model_dir: str | Path, content: str | None = None) -> None:
    """The check of a checkpoint from outside the workflow against its model, before
    anything reads it (extract_weights): every tensor's shape
    (:func:`specalign.transformers.load.streaming.check_against_model`), and the
    tokenizer's ids against the input embedding's rows: a tokenizer with more ids than
    the table has rows would index past it. InputFileError naming both sizes.

    With ``content``, the folder's digest as its manifest records it (and
    :func:`~specalign.transformers.load.contracts.read_manifest` verified), a check that
    passed is kept (:mod:`specalign.kept`) under that digest, the versions of the
    libraries that build the model and the code of this check: the same folder checked
    again (another working directory, a rerun after an unrelated edit) costs no import of
    torch and transformers. A failed check is never kept."""
    if content is None:
        _check_fits(model_dir)
        return
    from importlib.metadata import version

    from specalign.fingerprint import script_fingerprints
    from specalign.kept import kept

    libraries = " ".join(f"{n} {version(n)}" for n in ("torch", "transformers", "tokenizers"))
    code = script_fingerprints([Path(__file__)])[str(Path(__file__))]
    key = f"content {content}\n{libraries}\ncode {code}"

    def check() -> dict[str, bool]:
        _check_fits(model_dir)  # raises when it does not fit: nothing kept
        return {"fits": True}

    kept("checkpoint-fits", key, check)


def _check_fits(model_dir: str | Path) -> None:
    rows = streaming.check_against_model(model_dir)
    tokenizer = load_tokenizer(model_dir)
    if tokenizer is not None and rows is not None and len(tokenizer) > rows:
        raise InputFileError(
            f"{model_dir}: the tokenizer has {len(tokenizer)} ids, but the input embedding "
            f"only {rows} rows (vocab_size); fix: the tokenizer of this checkpoint"
        )


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
    files = tokenizer_files(model_dir)
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
        lines = prompt_lines(cfg["text_file"])
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


# --------------------------------------------------------------------------- models


def torch_dtype(name: str) -> Any:
    """The torch dtype of a config name (``propagation.real_dtype``)."""
    import torch

    return {"float32": torch.float32, "float64": torch.float64}[name]


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


def load_causal_lm(
    model_dir: str | os.PathLike[str], device: str = "cpu", dtype: Any = None
) -> Any:
    """The causal LM of a local model folder (eager attention, eval mode, float32 unless
    ``dtype`` says otherwise), for steering's next-token probabilities
    (:func:`specalign.transformers.measure.steer.next_token_prob_change`)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), local_files_only=True, attn_implementation="eager",
        trust_remote_code=False,
    )  # fmt: skip
    return model.to(device=device, dtype=dtype or torch.float32).eval()


# its streamed units are collected as they go: scan only what it makes
# (runtime.heap_set_aside)
@heap_set_aside()
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
    (:func:`specalign.transformers.load.streaming.streamed_model`: peak memory one layer in
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


def streamed_states(
    model_dir: str | os.PathLike[str],
    input_ids: np.ndarray,
    out: DiskStack,
    device: str = "cpu",
    dtype: Any = None,
    mem_limit: int | None = None,
) -> DiskStack:
    """:func:`real_forward_hidden_states` (``final_norm=False``) of the streamed model,
    each state appended to ``out`` as its layer produces it: the input of the first
    layer, then every layer's output, the residual stream. transformers' own tuple of
    hidden states is not asked for, so no state stays in memory: at Llama-3-70B's width
    the float32 states are 33 MB a layer, 2.6 GB at 80 layers, which sat beside the
    streamed layer (3.4 GB) and made propagate's peak grow with depth. Returns ``out``."""
    import torch

    ids = np.ascontiguousarray(input_ids)  # torch takes no negative strides
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be (n_prompts, n_tokens), got {ids.shape}")
    model = streaming.streamed_model(model_dir, "base", device, dtype, mem_limit=mem_limit)
    stream = model.specalign_stream
    layers = model.get_submodule(streaming.layers_path(model, stream.adapter))
    to_host = torch.float64 if stream.dtype == torch.float64 else torch.float32

    def keep(X: Any) -> None:
        out.append(X.detach().to("cpu", to_host).numpy())

    start = len(out)

    def first(_m: Any, args: tuple, kwargs: Mapping[str, Any]) -> None:
        if len(out) == start:  # ALBERT calls its one layer group for every layer
            keep(args[0] if args else kwargs["hidden_states"])

    hooks = [layers[0].register_forward_pre_hook(first, with_kwargs=True)]
    hooks += [
        layer.register_forward_hook(lambda _m, _a, o: keep(o[0] if isinstance(o, tuple) else o))
        for layer in layers
    ]
    try:
        with torch.no_grad():
            t_ids = torch.as_tensor(ids, dtype=torch.long, device=device)
            model(input_ids=t_ids, attention_mask=torch.ones_like(t_ids))
    finally:
        for h in hooks:
            h.remove()
        streaming.close_stream(model)
    return out


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

    ids = np.ascontiguousarray(input_ids)  # torch takes no negative strides
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
