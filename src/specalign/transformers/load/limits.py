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

from specalign.transformers.load.families import UnknownFamilyError, adapter_class


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
    from specalign.transformers.load.checkpoint import TOKENIZER_PATTERNS

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
        adapter = adapter_class(config.get("model_type"))(config)
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
    problems += _rope_problems(config, name, n_tokens)
    target_id = tcfg["steering"].get("target_id")
    vocab = config.get("vocab_size")
    if target_id is not None and vocab and not int(target_id) < int(vocab):
        problems.append(
            f"transformers.steering.target_id: {target_id} is outside the vocabulary of model "
            f"{name!r} (vocab_size {vocab}, config.json); fix: a token id below {vocab}"
        )
    return problems


#: Rotary scalings whose frequencies change with the sequence length: past
#: ``original_max_position_embeddings`` tokens transformers recomputes them in the
#: forward pass (``dynamic``: NTK scaling by the length; ``longrope``: the long factors
#: instead of the short ones), while weights.h5 holds the table of the model as built,
#: the one for shorter sequences. Within that length the table is exact.
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


def _rope_problems(config: Mapping[str, Any], name: str, n_tokens: int) -> list[str]:
    """A rope_scaling type whose frequencies at ``n_tokens`` differ from the table
    weights.h5 stores: refused naming the type (every other type is read from the
    family's own rotary module, exact at any length)."""
    rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
    if not isinstance(rope, Mapping):
        return []
    kind = rope.get("rope_type") or rope.get("type")
    if kind not in LENGTH_DEPENDENT_ROPE:
        return []
    original = (
        rope.get("original_max_position_embeddings")
        or config.get("original_max_position_embeddings")
        or config.get("max_position_embeddings")
    )
    if original is None or n_tokens <= int(original):
        return []
    return [
        f"transformers.prompts.n_tokens: {n_tokens} tokens, but model {name!r} has "
        f"rope_scaling type {kind!r}, whose frequencies change beyond "
        f"original_max_position_embeddings = {original} tokens (config.json): the "
        f"simplified model would use other rotary frequencies than the real one; fix: "
        f"n_tokens <= {original}"
    ]


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
    from specalign.transformers.load.sources import ModelSourceError, resolve_model_dir, source_spec

    problems = []
    for name, spec in sorted(tcfg.get("models", {}).items()):
        if (spec or {}).get("source") in ("local", "package"):
            try:
                resolve_model_dir(source_spec(spec))
            except ModelSourceError as exc:
                problems.append(f"transformers.models.{name}: {exc}")
            except (KeyError, ValueError):
                pass  # a spec without its field: reported by the config check by name
    # the prompts' text file (missing, empty, binary) is checked by the config validation
    prompts = tcfg.get("prompts", {})
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
    seen = {name}
    spec = models.get(name) or {}
    while spec.get("source") == "random" and spec.get("like") in models:
        if isinstance(spec.get("config"), Mapping):
            break
        if spec["like"] in seen:
            return None  # a cycle of like: references, named by the configuration check
        name = spec["like"]
        seen.add(name)
        spec = models.get(name) or {}
    if spec.get("source") == "random" and isinstance(spec.get("config"), Mapping):
        return spec["config"]
    path = config_json_path(name, models, cache)
    if path is None:
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a damaged folder: extraction names the file
    return config if isinstance(config, dict) else None


def config_json_path(
    name: str, models: Mapping[str, Any], cache: str, _seen: frozenset[str] = frozenset()
) -> Path | None:
    """The config.json of configured model ``name`` when it is on disk without a
    download, else None (a hub model not fetched yet, a missing folder or package, a
    cycle of ``like:`` references, which the configuration check names)."""
    from specalign.transformers.load.sources import ModelSourceError, resolve_model_dir, source_spec

    spec = models.get(name)
    if spec is None or name in _seen:
        return None
    if spec["source"] == "random":
        if spec.get("config_file"):
            path = Path(spec["config_file"])
            return path if path.is_file() else None
        if not spec.get("like"):
            return None
        return config_json_path(spec["like"], models, cache, _seen | {name})
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


def machine_mem_mb() -> int | None:
    """This machine's memory in MB: physical memory, or the cgroup's limit when lower
    (a container, a SLURM allocation); None when neither can be read."""
    import os

    found = []
    try:
        found.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:
            found.append(int(text))
    return int(min(found) // 10**6) if found else None


def memory_limit_problems(config: Mapping[str, Any], local: bool) -> list[str]:
    """:func:`memory_problems` of a validated configuration against the memory its jobs
    may use: ``resources.mem_mb_limit``, else this machine's where the jobs run here
    (``local``; a cluster's nodes are not this machine). What the workflow checks as it
    loads, and ``specalign analyze`` before it starts the workflow."""
    limit = config["resources"]["mem_mb_limit"]
    what = "resources.mem_mb_limit"
    if limit is None and local:
        limit, what = machine_mem_mb(), "this machine's memory"
    if not limit:
        return []
    return memory_problems(config["transformers"], int(limit), what, config["threads"])


def memory_problems(
    tcfg: Mapping[str, Any], limit_mb: int, limit_what: str, threads: int
) -> list[str]:
    """The transformer jobs whose computed memory request
    (:func:`specalign.transformers.load.resources.job_resources`) exceeds ``limit_mb``, one
    line each naming the key that drives it and both numbers: the prompts when the job
    of the model would fit with fewer (and how many fit), else the model."""
    from specalign.transformers.load.resources import RULES, Workload, job_resources, model_size

    problems: list[str] = []
    models = tcfg.get("models", {})
    cache = tcfg.get("cache", "resources/models")
    prompts = tcfg["prompts"]
    for name in sorted(models):
        config = _known_config(name, models, cache)
        if config is None:
            continue
        path = config_json_path(name, models, cache)
        try:
            size = model_size(config, path.parent if path is not None else None)
        except ValueError:
            continue  # an unsupported or inconsistent config.json: named elsewhere

        def request(rule: str, n_prompts: int, size=size) -> int:
            t = {**tcfg, "prompts": {**prompts, "n_prompts": n_prompts}}
            return job_resources(rule, size, Workload.from_config(t, size.n_layers), threads)[
                "mem_mb"
            ]

        rules = [r for r in RULES if r != "random_model" or models[name]["source"] == "random"]
        needs = {rule: request(rule, int(prompts["n_prompts"])) for rule in rules}
        over = [rule for rule in rules if needs[rule] > limit_mb]
        if not over:
            continue
        worst = max(over, key=needs.get)
        if any(request(rule, 1) > limit_mb for rule in over):
            problems.append(
                f"transformers.models.{name}: its {worst} job requests {needs[worst]} MB "
                f"(specalign.transformers.load.resources), more than the {limit_mb} MB of "
                f"{limit_what}, even with one prompt; fix: a machine or cluster node "
                "with more memory (resources.mem_mb_limit), or a smaller model"
            )
            continue
        fits = []
        for rule in over:
            lo, hi = 1, int(prompts["n_prompts"])  # request(lo) fits, request(hi) does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if request(rule, mid) <= limit_mb else (lo, mid)
            fits.append(lo)
        problems.append(
            f"transformers.prompts.n_prompts: {prompts['n_prompts']} prompts of "
            f"{prompts['n_tokens']} tokens make the {worst} job of model {name!r} request "
            f"{needs[worst]} MB (specalign.transformers.load.resources), more than the "
            f"{limit_mb} MB of {limit_what}; fix: n_prompts <= {min(fits)}, or "
            "resources.mem_mb_limit for jobs that run on larger nodes"
        )
    return problems
