"""The transformer study's part of the configuration (``transformers``).

* :func:`prepare` adds the points of every checkpoint series (``transformers.series``)
  to ``transformers.models`` (:func:`series_models`, named :func:`series_point_name`);
* :func:`check` refuses what the schema cannot express, before any job: a model's keys
  against what its source reads (``load.sources.SOURCES``), ``like:`` cycles and chains,
  a hub id the hub refuses, a prompt file that cannot be read, a sphere step that would
  overflow, a series whose corpus or vocabulary cannot give a run, and a model whose
  config.json (already on disk) the run cannot fit (``load.limits``);
* :func:`random_likes` says which random model is the null (the twin) of which model.

Registered with :mod:`specalign.config` as the entry point ``transformers`` of the group
``specalign.studies`` (pyproject.toml). It stands above the stages and may import any of
them; no stage imports it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specalign.config import fill_defaults, read_text_setting
from specalign.kept import kept
from specalign.transformers.load.limits import model_config_problems
from specalign.transformers.load.sources import SOURCES, hub_id_problem
from specalign.transformers.train import training

#: The sphere dynamics square eta * lambda (the norm of x + eta F x, the supplement's
#: radial values): beyond sqrt(float64 max) ~ 1.3e154 they overflow. Kept well below.
MAX_SPHERE_STEP = 1e150


#: A model named ``<m><suffix>`` reads as the random twin of ``<m>``.
_TWIN_SUFFIXES = ("_random", "-random", ".random")


def series_steps(spec: Mapping[str, Any]) -> list[int]:
    """The steps of a checkpoint series (``transformers.series.<name>``): the N of its
    hub revisions ``step{N}``, or a trained run's ``points`` (all saved steps if null)."""
    if spec["source"] == "hub":
        return sorted(int(r[len("step") :]) for r in spec["revisions"])
    saved = training.checkpoint_steps(spec["steps"])
    return sorted(saved if spec.get("points") is None else spec["points"])


def series_point_name(series: str, step: int) -> str:
    """The model name of the point of ``series`` at ``step``."""
    return f"{series}_step{int(step)}"


def series_models(cfg: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{model name: model spec}`` of every point of every configured series, derived
    from ``transformers.series`` (hub points fetch revision step{N}; trained points are
    the checkpoints the rule train_model writes)."""
    out: dict[str, dict[str, Any]] = {}
    for name, spec in sorted(cfg.get("transformers", {}).get("series", {}).items()):
        for step in series_steps(spec):
            model: dict[str, Any] = {"source": spec["source"], "series": name, "step": step}
            if spec["source"] == "hub":
                model.update(id=spec["id"], revision=f"step{step}")
            out[series_point_name(name, step)] = model
    return out


def prepare(cfg: dict[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Check ``transformers.series`` and add its points to ``transformers.models``
    (default-filled like hand-written models). Idempotent: a validated config validates
    to itself."""
    tcfg = cfg.get("transformers", {})
    problems = _series_problems(tcfg)
    if problems:
        return problems
    models = tcfg.setdefault("models", {})
    model_schema = schema["$defs"]["model"]
    for name, spec in series_models(cfg).items():
        fill_defaults(spec, model_schema, schema)
        old = models.get(name)
        if old is not None and old != spec:
            problems.append(
                f"transformers.models.{name}: the name of point step{spec['step']} of series "
                f"{spec['series']!r}; fix: rename the model"
            )
            continue
        models[name] = spec
    derived = set(series_models(cfg))
    for name, spec in sorted(models.items()):
        if (spec.get("series") or spec.get("source") == "trained") and name not in derived:
            problems.append(
                f"transformers.models.{name}: series/source trained are set by the workflow "
                "on the points of transformers.series; configure a series instead"
            )
    return problems


def _series_problems(tcfg: Mapping[str, Any]) -> list[str]:
    """Checks of ``transformers.series`` a schema cannot express; the corpus is read here
    (before any job) so that a missing or empty corpus, or a vocabulary larger than it
    allows, fails at once."""
    problems: list[str] = []
    models = tcfg.get("models", {})
    n_tokens = tcfg.get("prompts", {}).get("n_tokens", 0)
    for name, spec in sorted(tcfg.get("series", {}).items()):
        key = f"transformers.series.{name}"
        if name in models and not models[name].get("series"):
            problems.append(f"{key}: a model of that name is configured too; rename one")
        if spec["source"] == "hub":
            if not spec["id"]:
                problems.append(f"{key}.id: required for source 'hub'")
            else:
                problems += _hub_id_problems(f"{key}.id", spec["id"])
            if not spec["revisions"]:
                problems.append(f"{key}.revisions: at least one step{{N}} revision")
            continue
        if spec["d_model"] % spec["n_heads"]:
            problems.append(
                f"{key}.n_heads: d_model = {spec['d_model']} is not a multiple of "
                f"n_heads = {spec['n_heads']}"
            )
        if n_tokens > spec["seq_len"]:
            problems.append(
                f"transformers.prompts.n_tokens: {n_tokens} tokens per prompt, but series "
                f"{name!r} trains with seq_len = {spec['seq_len']} positions"
            )
        if spec["family"] == "gpt2" and spec["vocab_size"] < 257:
            problems.append(
                f"{key}.vocab_size: {spec['vocab_size']}; byte-level BPE needs at least 257 "
                "(256 bytes and <|endoftext|>)"
            )
        saved = training.checkpoint_steps(spec["steps"])
        for step in spec.get("points") or []:
            if step not in saved:
                problems.append(
                    f"{key}.points: step {step} is not saved by a run of {spec['steps']} steps "
                    f"(saved: {', '.join(map(str, saved))})"
                )
        corpus = spec["corpus"]
        if corpus["kind"] == "file":
            # the job's own reader, so that validation refuses what the job would
            try:
                training.corpus_documents(corpus)
            except training.TrainingError as exc:
                problems.append(f"{key}.{exc}")
                continue
        try:
            limit = _vocabulary_limit(
                corpus["kind"],
                str(corpus.get("path") or ""),
                spec["family"],
                spec["vocab_size"],
                spec["heldout_fraction"],
                spec["split_seed"],
            )
        except training.TrainingError as exc:
            problems.append(f"{key}.{exc}")
            continue
        if limit is not None:
            problems.append(
                f"{key}.vocab_size: {spec['vocab_size']} pieces, but the tokenizer of "
                f"{spec['family']} learns at most {limit} from the training split of the "
                f"corpus; fix: vocab_size <= {limit} or a larger corpus"
            )
    return problems


_LIMITS: dict[tuple, int | None] = {}


def _vocabulary_limit(
    kind: str, path: str, family: str, vocab_size: int, heldout_fraction: float, split_seed: int
) -> int | None:
    """None when the run's tokenizer can learn ``vocab_size`` pieces from its training
    split, else the most it can learn. Found by training that tokenizer, so the check is
    the job's own, not a bound beside it; kept on disk (:mod:`specalign.kept`) by the
    corpus's content, the settings and the tokenizers version, since on the shipped
    plays it takes seconds and every ``snakemake`` call validates the configuration."""
    from importlib.metadata import version

    mtime = Path(path).stat().st_mtime_ns if kind == "file" else 0
    key = (kind, path, mtime, training.FAMILIES[family], vocab_size, heldout_fraction, split_seed)
    if key not in _LIMITS:
        corpus = {"kind": kind, "path": path or None}
        identity = training.corpus_identity(corpus)["sha256"]

        def compute() -> dict[str, int | None]:
            docs = training.load_corpus(corpus)
            train_docs, _ = training.split_documents(docs, heldout_fraction, split_seed)
            return {"limit": training.vocabulary_limit(train_docs, family, vocab_size)}

        text = json.dumps(
            [identity, training.FAMILIES[family], vocab_size, heldout_fraction, split_seed,
             version("tokenizers")]
        )  # fmt: skip
        _LIMITS[key] = kept("vocabulary-limits", text, compute)["limit"]
    return _LIMITS[key]


def _source_problems(key: str, spec: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """A model's keys against what its ``source`` reads (``transformers.sources.SOURCES``):
    the keys it requires, and keys only other sources read given with other than their
    schema default (they would be ignored without a word)."""
    kind = spec["source"]
    source = SOURCES[kind]
    problems: list[str] = []
    if source.one_of:
        given = [f for f in source.one_of if spec.get(f)]
        if len(given) != 1:
            problems.append(
                f"{key}: a {kind} model needs exactly one of {', '.join(source.one_of)} "
                f"(got {', '.join(given) or 'none'})"
            )
    for field in source.required:
        if not spec.get(field):
            problems.append(f"{key}.{field}: required for source {kind!r}")
    if kind == "hub" and spec.get("id"):
        problems += _hub_id_problems(f"{key}.id", spec["id"])
    for other, reads in SOURCES.items():
        foreign = [
            f
            for f in reads.fields
            if f not in source.fields and f in spec and spec[f] != defaults.get(f)
        ]
        if foreign:
            verb = "applies" if len(foreign) == 1 else "apply"
            problems.append(f"{key}: {'/'.join(foreign)} only {verb} to source {other!r}")
    return problems


def _hub_id_problems(key: str, repo_id: str) -> list[str]:
    problem = hub_id_problem(repo_id)
    return [f"{key}: {problem}"] if problem else []


def check(cfg: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    tcfg = cfg.get("transformers", {})
    models = tcfg.get("models", {})
    defaults = {
        field: sub.get("default") for field, sub in schema["$defs"]["model"]["properties"].items()
    }
    cycles: set[tuple[str, ...]] = set()
    for name, spec in models.items():
        key = f"transformers.models.{name}"
        if spec["source"] == "trained":
            continue  # a checkpoint of train_model (checked in _series_problems)
        problems += _source_problems(key, spec, defaults)
        cycle = like_cycle(models, name)
        if cycle is not None:
            start = cycle.index(min(cycle[:-1]))  # each cycle named once, from its first name
            canonical = tuple(cycle[start:-1] + cycle[:start] + [cycle[start]])
            if canonical not in cycles:
                cycles.add(canonical)
                problems.append(
                    f"transformers.models.{canonical[0]}.like: the like: references form a "
                    f"cycle, {' -> '.join(canonical)}; fix: name a model that is not a random "
                    "copy (a local, package or hub model, or one built from config:)"
                )
            continue
        if spec["source"] == "random" and spec.get("like"):
            like = models.get(spec["like"])
            if like is None:
                problems.append(f"{key}.like: no configured model named {spec['like']!r}")
            elif like["source"] == "random" and like.get("like"):
                # a twin of a model built from a configuration is fine; chains are not
                problems.append(
                    f"{key}.like: {spec['like']!r} is itself a random model copying "
                    f"{like['like']!r}; copy that one"
                )
            named = _named_twin_of(name, models)
            if named is not None and named != spec["like"]:
                problems.append(
                    f"{key}.like: {spec['like']!r}, but the name {name!r} reads as the random "
                    f"twin of {named!r}; the null of a model is the random model whose like: "
                    f"names it, so {named!r} would have none and {spec['like']!r} this one; "
                    f"fix: set like: {named}, or rename the model"
                )
    prompts = tcfg.get("prompts", {})
    if prompts.get("kind") == "text" and not prompts.get("text_file"):
        problems.append("transformers.prompts.text_file: required for kind 'text'")
    elif prompts.get("kind") == "text":
        problem = _text_file_problem(Path(prompts["text_file"]))
        if problem:
            problems.append(f"transformers.prompts.text_file: {prompts['text_file']} {problem}")
    if prompts.get("kind") == "dataset" and not prompts.get("dataset"):
        problems.append("transformers.prompts.dataset: required for kind 'dataset'")
    sphere = tcfg.get("sphere", {})
    if sphere and len(sphere.get("eigenvalues", [])) != sphere.get("d"):
        problems.append(
            f"transformers.sphere.eigenvalues: needs d = {sphere.get('d')} values, "
            f"got {len(sphere.get('eigenvalues', []))}"
        )
    if sphere:
        step = sphere["eta"] * max((abs(v) for v in sphere.get("eigenvalues", [])), default=1.0)
        if not step <= MAX_SPHERE_STEP:
            problems.append(
                f"transformers.sphere.eta: {sphere['eta']:g} times the largest |eigenvalue| is "
                f"{step:g}; above {MAX_SPHERE_STEP:g} the dynamics overflow float64 (they "
                "square eta * lambda); fix: a smaller eta"
            )
    problems += model_config_problems(tcfg)
    return problems


def like_cycle(models: Mapping[str, Any], name: str) -> list[str] | None:
    """The cycle that model ``name``'s ``like:`` references run into, as the names in
    order with the first repeated at the end (``["a", "b", "a"]``), or None when they
    end at a model that copies none."""
    path: list[str] = []
    current = name
    while True:
        spec = models.get(current) or {}
        if spec.get("source") != "random" or not spec.get("like"):
            return None
        if current in path:
            return [*path[path.index(current) :], current]
        path.append(current)
        current = spec["like"]


def _text_file_problem(path: Path) -> str:
    """Why ``path`` cannot be read as prompt lines ("" when it can): what any text-file
    setting is checked for (:func:`specalign.config.read_text_setting`), then a prompt file's
    own rules: no NUL bytes, and a line with a character other than white space."""
    text, problem = read_text_setting(path)
    if problem:
        return problem
    if "\x00" in text:
        return "is not readable UTF-8 text (NUL bytes); fix: a text file, one prompt per line"
    if not text.strip():
        return "is empty (no line with text); fix: one prompt per line"
    return ""


def _named_twin_of(name: str, models: Mapping[str, Any]) -> str | None:
    """The configured model whose random twin ``name`` reads as (``<m>_random``), or None."""
    for suffix in _TWIN_SUFFIXES:
        base = name[: -len(suffix)]
        if name.endswith(suffix) and base in models:
            return base
    return None


def random_likes(cfg: Mapping[str, Any]) -> dict[str, str]:
    """``{random model: the model its like: names}`` of a validated config.

    The null of a model ``m`` (its random-weight twin) is the random model whose ``like:``
    names ``m``: derived from this, never guessed from the names. A random model built
    from a configuration (``config:``, ``config_file:``) copies no configured model: it is
    not a twin, and stands for the checkpoint whose configuration it has.
    """
    models = cfg.get("transformers", {}).get("models", {})
    return {
        n: s["like"] for n, s in sorted(models.items()) if s["source"] == "random" and s["like"]
    }
