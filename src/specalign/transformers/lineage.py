"""What each result file of the transformer study was made from, checked by its readers.

A result copied from another model's folder (``results/transformers/b/weights.h5`` over
``a``'s), or left from another configuration, would otherwise be read as this model's:
Snakemake sees only paths and times. Every result file therefore records, in the root
attribute ``made_from`` (JSON), the identity of the model it was computed from and the
settings that decide it:

* ``model_id``: a digest of the model's manifest entries that fix its weights
  (``source``, ``revision`` and ``content``, the content digest of its folder,
  :func:`specalign.transformers.load.checkpoint.model_digest`), with ``source`` and
  ``manifest`` (the path of the manifest it was read through) for the error messages;
* ``settings``: the settings of the configuration that decide the file (``eta`` for
  spectra.nc, the prompts, propagation and steering settings for the others), as
  canonical JSON.

Every result file also says in words what its model is (root attribute ``weights``,
:func:`describe`), from the same manifest: a trained checkpoint as its series, family and
step, a random model as whose configuration it copies, a hub model by id and commit.

Readers call :func:`check_model` against the manifest they read (or :func:`check_same`
between the result files they combine) before any use; a mismatch is an
``InputFileError`` naming both files and the fix.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specalign.io import InputFileError

ATTR = "made_from"
#: the root attribute that describes the model in words (:func:`describe`)
DESCRIPTION_ATTR = "weights"


def model_id(manifest: Mapping[str, Any]) -> str:
    """The digest of what fixes a model's weights: its manifest's source, revision and
    content digest (never its path: a copied working directory is the same model)."""
    key = {k: manifest.get(k, "") for k in ("source", "revision", "content")}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def record(manifest_path: str | Path, manifest: Mapping[str, Any], settings: Any = None) -> str:
    """The ``made_from`` attribute of a result made from the model of ``manifest``."""
    out = {
        "model_id": model_id(manifest),
        "source": str(manifest.get("source", "")),
        "manifest": str(manifest_path),
    }
    if settings is not None:
        out["settings"] = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return json.dumps(out, sort_keys=True)


def describe(manifest: Mapping[str, Any]) -> str:
    """What a model is, in words, from its manifest (``resources/models/{model}/
    manifest.json``): where its weights come from, and for a point of a checkpoint series
    (``transformers.series``) which series, family and step. The one description that
    the report, the reproduction text, the tables and ``specalign analyze`` show."""
    source = str(manifest.get("source", ""))
    revision = str(manifest.get("revision", ""))
    kind, _, what = source.partition(":")
    series, step = manifest.get("series"), manifest.get("step")
    point = f"step {step} of the series {series}" if series else ""
    family = str(manifest.get("family", ""))
    if kind == "trained":
        return f"trained here: {point}" + (f" ({family})" if family else "")
    if kind == "hub":
        text = f"hub {what} at commit {revision}" if revision else f"hub {what}"
        return f"{text}, {point}" if point else text
    if kind == "package":
        return f"package {what} {revision}".rstrip()
    if kind == "local":
        return f"local folder {what}"
    if kind == "random":
        how, _, value = what.partition("=")
        seed = f" ({revision.replace('=', ' ')})" if revision else ""
        copied = {
            "like": f"the configuration of {manifest.get('like') or value}",
            "config_file": f"the configuration file {value}",
            "config": f"a {value} configuration written in the config",
        }.get(how, what)
        return f"random weights with {copied}{seed}"
    return source or "unknown"


def result_attrs(
    manifest_path: str | Path, manifest: Mapping[str, Any], settings: Any = None
) -> dict[str, str]:
    """The root attributes of a result made from the model of ``manifest``: its
    ``made_from`` record (:func:`record`) and its description (:func:`describe`)."""
    return {
        ATTR: record(manifest_path, manifest, settings),
        DESCRIPTION_ATTR: describe(manifest),
    }


def read_record(path: str | Path, attrs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``made_from`` record of a result file (``attrs``: its root attributes when the
    caller has them); InputFileError naming the file when it has none."""
    path = Path(path)
    if attrs is None:
        import h5py

        try:
            with h5py.File(path, "r") as f:
                attrs = {ATTR: f.attrs.get(ATTR)}
        except OSError as exc:
            raise InputFileError(f"{path}: not a readable HDF5/netCDF file ({exc})") from exc
    raw = attrs.get(ATTR)
    if isinstance(raw, bytes):
        raw = raw.decode()
    try:
        rec = json.loads(raw) if raw is not None else None
    except (TypeError, ValueError):
        rec = None
    if not isinstance(rec, dict) or "model_id" not in rec:
        raise InputFileError(
            f"{path}: no record of the model it was made from (attribute {ATTR!r}); it was "
            "written by an older version or elsewhere; fix: delete it and rerun"
        )
    return rec


def check_model(
    result: str | Path,
    manifest_path: str | Path,
    manifest: Mapping[str, Any],
    attrs: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """InputFileError naming both files unless ``result`` was made from the model of
    ``manifest``; returns the result's record."""
    rec = read_record(result, attrs)
    if rec["model_id"] != model_id(manifest):
        raise InputFileError(
            f"{result}: made from {rec.get('source', '?')} (manifest {rec.get('manifest', '?')}"
            f"), but {manifest_path} names {manifest.get('source', '?')}"
            + (" with other weights" if rec.get("source") == manifest.get("source") else "")
            + f": the file is another model's result (copied over, or left from an earlier "
            f"model); fix: delete {result} and rerun"
        )
    return rec


def check_same(files: Mapping[str, Mapping[str, Any]]) -> None:
    """InputFileError naming two of ``files`` ({path: root attributes}) unless all were
    made from one model."""
    recs = {path: read_record(path, attrs) for path, attrs in files.items()}
    first, want = next(iter(recs.items()))
    for path, rec in recs.items():
        if rec["model_id"] != want["model_id"]:
            raise InputFileError(
                f"{path}: made from {rec.get('source', '?')} (manifest "
                f"{rec.get('manifest', '?')}), but {first} from {want.get('source', '?')} "
                f"(manifest {want.get('manifest', '?')}): results of two models are mixed; "
                f"fix: delete both and rerun"
            )


def check_settings(path: str | Path, rec: Mapping[str, Any], settings: Any, key: str) -> None:
    """InputFileError naming the file unless it was made with ``settings`` (the config's
    ``key``), for a reader that depends on them."""
    want = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    if "settings" in rec and rec["settings"] != want:
        raise InputFileError(
            f"{path}: made with {key} = {rec['settings']}, but the configuration has {want}; "
            f"fix: delete {path} and rerun"
        )
