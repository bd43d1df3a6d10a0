"""Resolve a hub/local/package model to a local folder and record it in a manifest."""

import json

from specalign.transformers import contracts, limits, sources
from specalign.workflow import log, run_script


def main(smk):
    spec = sources.source_spec(json.loads(smk.params.spec))
    model_dir = sources.resolve_model_dir(spec, cache_dir=smk.params.cache)
    info = sources.provenance(spec, model_dir)
    log.info("%s -> %s (%s)", smk.wildcards.model, model_dir, info)
    # A hub model's config.json exists only now: check the settings it limits before any
    # job uses them (the config validation did so for the models already on disk).
    config = json.loads((model_dir / "config.json").read_text())
    problems = limits.model_problems(
        smk.config["transformers"], smk.wildcards.model, config, model_dir
    )
    if problems:
        raise ValueError("invalid configuration for this model: " + "; ".join(problems))
    contracts.write_manifest(smk.output[0], model_dir, {**info, "spec": spec})


run_script(snakemake, main)  # noqa: F821
