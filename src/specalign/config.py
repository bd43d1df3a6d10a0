"""Loading, validating and resolving the workflow configuration (one place for all).

The JSON schema in ``config/schema.yaml`` is the single source of truth for keys, types,
ranges, descriptions and defaults. ``validate_config`` checks a config against it (so a
bad config fails before any job runs, with a message naming the key), fills in the
defaults and applies the few checks a schema cannot express, including those that need
a model's config.json where it is already on disk (prompt length against the model's
positions, a token id against its vocabulary).

This module knows no study: each study registers its own part of the validation
(:func:`studies`; ``specalign.transformers.settings``, ``specalign.commutators.settings``),
which also resolves that study's entries (an experiment's settings, a series' points,
which random model is the null of which).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from specalign.layout import results_folder
from specalign.schema import SCHEMA_PATH, ConfigError, load_schema  # noqa: F401 (re-exported)


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


def fill_defaults(instance: Any, schema: Mapping[str, Any], root: Mapping[str, Any]) -> None:
    """Insert schema defaults into ``instance`` in place, recursing into objects (not
    into a setting marked ``x-defaults-from``, whose defaults come from another key)."""
    if "$ref" in schema:
        ref = schema["$ref"].split("/")[-1]
        merged = {**root["$defs"][ref], **{k: v for k, v in schema.items() if k != "$ref"}}
        schema = merged
    if not isinstance(instance, dict):
        return
    for key, sub in schema.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        # a setting whose defaults come from another key keeps only what is written
        if key in instance and "x-defaults-from" not in sub:
            fill_defaults(instance[key], sub, root)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key, value in instance.items():
            if key not in schema.get("properties", {}):
                fill_defaults(value, extra, root)


#: An environment variable reference that ``os.path.expandvars`` left in place: unset.
_UNSET_VARIABLE = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def _expand_paths(
    instance: Any,
    schema: Mapping[str, Any],
    root: Mapping[str, Any],
    problems: list[str],
    path: tuple = (),
    checks: list[tuple[str, str, str]] | None = None,
) -> Any:
    """``instance`` with every path setting (a string whose schema says ``format: path``)
    expanded once, in place: ``~`` and environment variables, so that every check and
    every job reads the same path (relative ones stay relative to the working directory,
    where every job runs). A variable that is not set is a problem naming the key. Each
    expanded setting whose schema says what it names (``x-path``) is added to ``checks``
    as (key, path, kind), for :func:`path_problem`."""
    schema = _resolve(schema, root)
    if isinstance(instance, str) and instance and schema.get("format") == "path":
        expanded = os.path.expandvars(os.path.expanduser(instance))
        unset = _UNSET_VARIABLE.search(expanded)
        if unset:
            problems.append(
                f"{_key_path(path)}: {instance!r} names the environment variable "
                f"{unset.group(0)}, which is not set; fix: set it, or give the path"
            )
        elif schema.get("x-path") and checks is not None:
            checks.append((_key_path(path), expanded, schema["x-path"]))
        return expanded
    if isinstance(instance, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, value in instance.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                instance[key] = _expand_paths(value, sub, root, problems, (*path, key), checks)
    return instance


#: What a path setting names (its schema's ``x-path``), checked at validation.
PATH_KINDS = {
    "out-folder": "a folder the workflow writes in (it may not exist yet)",
    "in-folder": "an existing folder the workflow reads",
    "text-file": "an existing UTF-8 text file",
    "json-file": "an existing JSON file holding an object",
}


def path_problem(kind: str, path: Path) -> str | None:
    """What is wrong with ``path`` as a setting of ``kind`` (:data:`PATH_KINDS`), or None.
    Nothing is created or changed: a folder to be written is checked through its
    nearest existing parent."""
    if kind not in PATH_KINDS:
        raise ValueError(f"unknown x-path kind {kind!r} in the schema")
    if kind == "out-folder":
        if path.exists() and not path.is_dir():
            return "is a file, not a folder; fix: name a folder"
        parent = next((p for p in (path, *path.parents) if p.exists()), None)
        if parent is None or not parent.is_dir():
            return f"cannot be created ({parent} is not a folder); fix: name a folder"
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"cannot be written ({parent} is not writable); fix: name a folder of yours"
        return None
    if kind == "in-folder":
        if not path.exists():
            return _missing(kind, path)
        if not path.is_dir():
            return "is not a folder; fix: name the folder"
        if not os.access(path, os.R_OK | os.X_OK):
            return "is not readable; fix: make it readable, or name another folder"
        return None
    text, problem = read_text_setting(path, kind)
    if problem:
        return problem
    if kind == "json-file":
        try:
            value = json.loads(text)
        except ValueError as err:
            return f"is not valid JSON ({err}); fix: give a JSON file"
        if not isinstance(value, dict):
            return "holds no JSON object; fix: give a JSON object"
    return None


def read_text_setting(path: Path, kind: str = "text-file") -> tuple[str | None, str | None]:
    """``(text, None)`` for a setting naming a readable UTF-8 file, else ``(None, what
    is wrong)`` in :func:`path_problem`'s words: the text-file check, keeping what it read,
    for the readers whose own rules follow (prompt files, training corpora)."""
    if not path.exists():
        return None, _missing(kind, path)
    if not path.is_file():
        return None, "is not a file; fix: name " + PATH_KINDS[kind].replace("an existing", "a")
    try:
        return path.read_bytes().decode("utf-8"), None
    except OSError as err:
        return None, f"cannot be read ({err.strerror}); fix: make it readable"
    except UnicodeDecodeError as err:
        return None, f"is not readable UTF-8 text (byte {err.start}); fix: save it as UTF-8"


def _missing(kind: str, path: Path) -> str:
    where = "" if path.is_absolute() else f" (relative to the working directory {Path.cwd()})"
    return f"does not exist{where}; fix: give the path of {PATH_KINDS[kind]}"


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


def _tree_copy(value: Any) -> Any:
    """A copy of nested mappings and lists in which no two places share an object (YAML
    anchors and merge keys make shared ones; ``copy.deepcopy`` keeps them shared), so
    that filling one setting's defaults never changes another's."""
    if isinstance(value, Mapping):
        return {k: _tree_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_tree_copy(v) for v in value]
    return copy.deepcopy(value)


def validate_config(config: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> dict:
    """Validate ``config`` against the schema and return a copy with defaults filled.

    Raises ``ConfigError`` listing every violation, each naming the offending key. The
    settings a schema marks ``x-defaults-from`` (an experiment's ``training``
    overrides) are validated but not default-filled: they inherit from the key it names
    (``specalign.commutators.settings.experiment_config``). Each study then adds what it
    derives and checks what the schema cannot express (:func:`studies`).
    """
    import jsonschema

    schema = dict(schema or load_schema())
    cfg = _tree_copy(dict(config))
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
    fill_defaults(cfg, schema, schema)
    path_problems: list[str] = []
    path_checks: list[tuple[str, str, str]] = []
    _expand_paths(cfg, schema, schema, path_problems, checks=path_checks)
    if path_problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(path_problems))
    registered = studies()
    problems = [p for study in registered.values() for p in study.prepare(cfg, schema)]
    if problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))
    problems = [p for study in registered.values() for p in study.check(cfg, schema)]
    try:
        results_folder(cfg)
    except ConfigError as exc:
        problems.append(str(exc))
    # every path setting against what it names (x-path), after the studies' own checks,
    # whose message about a key (a setting that does not apply, a folder lacking its
    # config.json) says more than that the path is wrong
    for key, value, kind in path_checks:
        owner = key.rsplit(".", 1)[0]
        if any(f"{key}:" in p or f"{key} " in p or f"{owner}:" in p for p in problems):
            continue
        problem = path_problem(kind, Path(value))
        if problem:
            problems.append(f"{key}: {value!r} {problem}")
    if problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))
    return cfg


#: The entry-point group under which each study registers its part of the validation.
STUDY_GROUP = "specalign.studies"


@functools.cache
def studies() -> dict[str, Any]:
    """Each study's part of the validation, by name (sorted): the modules registered as
    entry points of :data:`STUDY_GROUP` (pyproject.toml), each with ``prepare(cfg,
    schema)`` (entries it derives, such as a series' points; its problems) and
    ``check(cfg, schema)`` (its problems a schema cannot express, each naming its key).

    This module imports no study: a study joins the validation by registering, and a
    configuration is never validated with a study missing (an install without the entry
    points is refused)."""
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group=STUDY_GROUP)}
    if not found:
        raise ConfigError(
            f"no study is registered under the entry points {STUDY_GROUP!r}: the package "
            "is not installed; fix: pip install -e . in the project folder"
        )
    return {name: found[name].load() for name in sorted(found)}


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


def canonical_json(obj: Any) -> str:
    """Key-sorted compact JSON: equal settings give equal strings (rule params)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
