"""Attention weights of every distinct layer to weights.h5 (lazy, one tensor at a time)."""

from specalign.transformers import extract, study
from specalign.workflow import log, run_script


def main(smk):
    manifest = study.read_manifest(smk.input[0])
    mw = extract.extract(manifest["path"], source=manifest["source"], revision=manifest["revision"])
    log.info(
        "%s: %s, %d layers, %d distinct blocks, d_model %d, %d heads",
        smk.wildcards.model,
        mw.family,
        mw.n_layers,
        len(mw.blocks),
        mw.d_model,
        mw.n_heads,
    )
    extract.write_weights_h5(smk.output[0], mw)


run_script(snakemake, main)  # noqa: F821
