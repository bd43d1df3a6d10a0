"""Resolve a hub/local/package model to a local folder and record it in a manifest."""

import json

from specalign.transformers.load import (
    checkpoint,
    contracts,
    families,
    limits,
    sources,
)
from specalign.workflow import log, run_script


def main(smk):
    configured = json.loads(smk.params.spec)
    spec = sources.source_spec(configured)
    cache = sources.own_hub_cache(smk.params.cache) if spec["kind"] == "hub" else None
    model_dir = sources.resolve_model_dir(spec, cache_dir=cache)
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
    # Before any long job: damaged headers, integer or unscaled float8 weights, another
    # quantization scheme, a layer lacking a tensor (one line naming file and tensor).
    checkpoint.check_checkpoint(model_dir, families.adapter_for(config).n_blocks)
    checkpoint.check_transformers_can_load(config, model_dir / "config.json")
    # (every tensor against the parameter it fills: extract_weights, the first reader)
    # a point of a checkpoint series (transformers.series) says which, beside its commit
    point = {k: configured[k] for k in ("series", "step") if configured.get("series")}
    contracts.write_manifest(smk.output[0], model_dir, {**info, **point, "spec": spec})


run_script(snakemake, main)  # noqa: F821
