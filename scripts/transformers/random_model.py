"""Random-weight model with the configuration of another model (the null baseline)."""

from pathlib import Path

from specalign.transformers import contracts, sources
from specalign.workflow import log, run_script


def main(smk):
    like = contracts.read_manifest(smk.input[0])
    out_dir = Path(smk.output[0]).parent / "random"
    path = sources.make_random_model(like["path"], out_dir, seed=int(smk.params.seed))
    log.info("random model like %s written to %s", like["path"], path)
    contracts.write_manifest(
        smk.output[0],
        path,
        {"source": f"random:like={like['source']}", "revision": f"seed={smk.params.seed}"},
    )


run_script(snakemake, main)  # noqa: F821
