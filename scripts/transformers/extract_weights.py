"""Attention weights of every distinct layer to weights.h5 (lazy, one tensor at a time)."""

from specalign.transformers import lineage
from specalign.transformers.load import contracts, extract
from specalign.workflow import log, run_script


def main(smk):
    manifest = contracts.read_manifest(smk.input[0])
    # streamed block by block into the file: peak memory of the order of one layer
    mw = extract.extract_to_h5(
        manifest["path"],
        smk.output[0],
        source=manifest["source"],
        revision=manifest["revision"],
        made_from=lineage.record(smk.input[0], manifest),
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
