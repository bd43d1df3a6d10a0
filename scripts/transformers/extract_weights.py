"""Attention weights of every distinct layer to weights.h5 (lazy, one tensor at a time)."""

from specalign.transformers import lineage
from specalign.transformers.load import contracts, extract, hf, sources
from specalign.workflow import log, run_script


def main(smk):
    manifest = contracts.read_manifest(smk.input[0])
    if not sources.made_by_workflow(manifest):
        # Every reader of a model waits on this job, so a checkpoint from outside is checked
        # here, before anything reads it: each tensor against the parameter it fills, the
        # tokenizer's ids against the vocabulary. (fetch_model, which would otherwise
        # import torch and transformers for it alone, stays a second's job.)
        hf.check_checkpoint_fits(manifest["path"], manifest.get("content"))
    # streamed block by block into the file: peak memory of the order of one layer
    mw = extract.extract_to_h5(
        manifest["path"],
        smk.output[0],
        source=manifest["source"],
        revision=manifest["revision"],
        made_from=lineage.record(smk.input[0], manifest),
        threads=smk.threads,
    )
    log.info(
        "%s: %s, %d layers, %d distinct blocks, d_model %d, %d heads",
        smk.wildcards.model,
        mw.family,
        mw.n_layers,
        len(set(mw.layer_block.tolist())),
        mw.d_model,
        mw.n_heads,
    )


run_script(snakemake, main)  # noqa: F821
