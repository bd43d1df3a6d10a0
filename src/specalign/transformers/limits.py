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
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specalign.transformers.families import UnknownFamilyError, family


def model_problems(tcfg: Mapping[str, Any], name: str, config: Mapping[str, Any]) -> list[str]:
    """The settings of ``tcfg`` (the ``transformers`` section) that model ``name``, with
    config.json ``config``, cannot run; one line each, naming the key."""
    problems: list[str] = []
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
    """:func:`model_problems` of every configured model whose config.json is on disk."""
    problems: list[str] = []
    models = tcfg.get("models", {})
    for name in sorted(models):
        config = _known_config(name, models, tcfg.get("cache", "resources/models"))
        if config is not None:
            problems += model_problems(tcfg, name, config)
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
