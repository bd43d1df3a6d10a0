"""What a model's config.json allows of the configuration, checked before any job runs.

A prompt longer than the model's position embeddings fails deep inside torch (an
IndexError or a size mismatch), and a steering ``target_id`` outside the vocabulary
fails with an IndexError, both long after the workflow started. Both limits are in the
model's config.json, which is known before any job runs for local, package and random
models (a random model copies the configuration of its ``like:`` model, of its
``config_file:`` or the one written in its ``config:``) and for hub models fetched
earlier (their manifest names the snapshot). The limits are read through the family
adapter, i.e. through transformers' configuration class of the family, so that every
family's spelling (``n_positions``, DistilBERT's ``dim`` keys) and class defaults count,
and RoBERTa's positions that start past the padding id. ``model_config_problems`` is
called by :func:`specalign.config.validate_config`; a hub model fetched for the first
time is checked by the ``fetch_model`` rule as soon as its folder exists
(:func:`model_problems`).

The same check covers what a later rule needs from the model folder or the disk: the
tokenizer files that ``steer`` (a ``target_text``) and ``propagate`` (text or dataset
prompts) use, a local or package folder that is a complete model, and the prompts' text
file (:func:`input_problems`), so that none of them fails hours into a run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specalign.transformers.families import UnknownFamilyError, family


def tokenizer_uses(tcfg: Mapping[str, Any]) -> list[str]:
    """What in ``tcfg`` (the ``transformers`` section) needs each model's tokenizer, one
    phrase each naming the key and the rule; empty when no rule tokenizes anything
    (random prompts and a ``steering.target_id``)."""
    uses = []
    steering = tcfg.get("steering", {})
    if steering.get("target_id") is None:
        uses.append(
            f"transformers.steering.target_text {steering.get('target_text')!r} is encoded by "
            "the model's tokenizer (rule steer)"
        )
    kind = tcfg.get("prompts", {}).get("kind")
    if kind in ("text", "dataset"):
        uses.append(
            f"transformers.prompts.kind {kind!r} prompts are tokenized (rules propagate, steer)"
        )
    return uses


def has_tokenizer(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` holds any tokenizer file (the patterns the hub download and
    a random model's copy of its source folder use)."""
    from specalign.transformers.sources import TOKENIZER_PATTERNS

    return any(any(Path(model_dir).glob(p)) for p in TOKENIZER_PATTERNS)


def tokenizer_problems(tcfg: Mapping[str, Any], name: str, model_dir: Path | None) -> list[str]:
    """The settings that need model ``name``'s tokenizer when its folder ``model_dir``
    (None: it has no folder to copy one from, a random model written in ``config:``) has
    no tokenizer file: ``steer`` would fail on them after every earlier job has run."""
    uses = tokenizer_uses(tcfg)
    if not uses or (model_dir is not None and has_tokenizer(model_dir)):
        return []
    where = (
        f"{model_dir} has no tokenizer files"
        if model_dir is not None
        else "it is built from a configuration written in config: and has no tokenizer"
    )
    return [
        f"transformers.models.{name}: {where}, but {'; '.join(uses)}; fix: set "
        "transformers.steering.target_id to a token id and use random prompts, or give the "
        "model a folder with its tokenizer files"
    ]


def model_problems(
    tcfg: Mapping[str, Any],
    name: str,
    config: Mapping[str, Any],
    model_dir: str | Path | None = None,
) -> list[str]:
    """The settings of ``tcfg`` (the ``transformers`` section) that model ``name``, with
    config.json ``config``, cannot run; one line each, naming the key. With its folder
    ``model_dir``, also the settings that need a tokenizer the folder lacks."""
    problems: list[str] = []
    if model_dir is not None:
        problems += tokenizer_problems(tcfg, name, Path(model_dir))
    try:
        adapter = family(config.get("model_type"))(config)
    except UnknownFamilyError as exc:
        return [f"transformers.models.{name}: {exc}"]
    except ValueError as exc:  # an inconsistent config.json: extraction names the file
        return [f"transformers.models.{name}: config.json {exc}"]
    n_tokens = int(tcfg["prompts"]["n_tokens"])
    if adapter.max_positions is not None and n_tokens > adapter.max_positions:
        problems.append(
            f"transformers.prompts.n_tokens: {n_tokens} tokens per prompt, but model {name!r} "
            f"has {adapter.max_positions} positions (config.json); fix: n_tokens <= "
            f"{adapter.max_positions}"
        )
    target_id = tcfg["steering"].get("target_id")
    vocab = config.get("vocab_size")
    if target_id is not None and vocab and not int(target_id) < int(vocab):
        problems.append(
            f"transformers.steering.target_id: {target_id} is outside the vocabulary of model "
            f"{name!r} (vocab_size {vocab}, config.json); fix: a token id below {vocab}"
        )
    return problems


def model_config_problems(tcfg: Mapping[str, Any]) -> list[str]:
    """:func:`model_problems` of every configured model whose config.json is on disk,
    and :func:`input_problems`: what a later rule would fail on, found before any job."""
    problems: list[str] = input_problems(tcfg)
    models = tcfg.get("models", {})
    cache = tcfg.get("cache", "resources/models")
    for name in sorted(models):
        config = _known_config(name, models, cache)
        if config is None:
            continue
        spec = models[name] or {}
        if spec.get("source") == "random" and isinstance(spec.get("config"), Mapping):
            problems += model_problems(tcfg, name, config)
            problems += tokenizer_problems(tcfg, name, None)
            continue
        path = config_json_path(name, models, cache)
        problems += model_problems(tcfg, name, config, path.parent if path else None)
    return problems


def input_problems(tcfg: Mapping[str, Any]) -> list[str]:
    """Inputs of later rules that are missing now, one line each naming the key: a local
    or package model folder that is not a complete model (``fetch_model``, the first job,
    would stop on it), the prompts' text file (``propagate``), the ``datasets`` package
    for dataset prompts. A hub model is checked by ``fetch_model`` once downloaded."""
    from specalign.transformers.sources import ModelSourceError, resolve_model_dir, source_spec

    problems = []
    for name, spec in sorted(tcfg.get("models", {}).items()):
        if (spec or {}).get("source") in ("local", "package"):
            try:
                resolve_model_dir(source_spec(spec))
            except ModelSourceError as exc:
                problems.append(f"transformers.models.{name}: {exc}")
            except (KeyError, ValueError):
                pass  # a spec without its field: reported by the config check by name
    prompts = tcfg.get("prompts", {})
    text_file = prompts.get("text_file")
    if prompts.get("kind") == "text" and text_file:
        path = Path(text_file).expanduser()
        if not path.is_file():
            problems.append(
                f"transformers.prompts.text_file: {text_file} does not exist (or is not a file)"
            )
        else:
            try:
                path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                problems.append(
                    f"transformers.prompts.text_file: {text_file} is not readable UTF-8 text "
                    f"({exc.__class__.__name__})"
                )
    if prompts.get("kind") == "dataset":
        import importlib.util

        if importlib.util.find_spec("datasets") is None:
            problems.append(
                "transformers.prompts.kind: 'dataset' needs the `datasets` package "
                "(pip install datasets) and network access; offline, use kind 'text' with "
                "a local file"
            )
    return problems


def _known_config(name: str, models: Mapping[str, Any], cache: str) -> Mapping[str, Any] | None:
    """The configuration of model ``name`` when known without a download: the one written
    in a random model's ``config:``, else its config.json on disk; None otherwise."""
    spec = models.get(name) or {}
    if spec.get("source") == "random" and isinstance(spec.get("config"), Mapping):
        return spec["config"]
    if spec.get("source") == "random" and spec.get("like") in models:
        return _known_config(spec["like"], models, cache)
    path = config_json_path(name, models, cache)
    if path is None:
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a damaged folder: extraction names the file
    return config if isinstance(config, dict) else None


def config_json_path(name: str, models: Mapping[str, Any], cache: str) -> Path | None:
    """The config.json of configured model ``name`` when it is on disk without a
    download, else None (a hub model not fetched yet, a missing folder or package)."""
    from specalign.transformers.sources import ModelSourceError, resolve_model_dir, source_spec

    spec = models.get(name)
    if spec is None:
        return None
    if spec["source"] == "random":
        if spec.get("config_file"):
            path = Path(spec["config_file"])
            return path if path.is_file() else None
        return config_json_path(spec.get("like", ""), models, cache) if spec.get("like") else None
    if spec["source"] in ("hub", "trained"):
        try:
            manifest = json.loads((Path(cache) / name / "manifest.json").read_text())
            path = Path(manifest["path"]) / "config.json"
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return path if path.is_file() else None
    try:
        return resolve_model_dir(source_spec(spec)) / "config.json"
    except ModelSourceError:
        return None
