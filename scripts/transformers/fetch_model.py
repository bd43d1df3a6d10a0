"""Resolve a hub/local/package model to a local folder and record it in a manifest."""

import json

from specalign.transformers import contracts, sources
from specalign.workflow import log, run_script


def main(smk):
    spec = sources.source_spec(json.loads(smk.params.spec))
    model_dir = sources.resolve_model_dir(spec, cache_dir=smk.params.cache)
    info = sources.provenance(spec, model_dir)
    log.info("%s -> %s (%s)", smk.wildcards.model, model_dir, info)
    contracts.write_manifest(smk.output[0], model_dir, {**info, "spec": spec})


run_script(snakemake, main)  # noqa: F821
