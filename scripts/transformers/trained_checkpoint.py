"""Record a point of a trained series: its manifest names the checkpoint folder."""

import json

from specalign import io
from specalign.transformers.load import contracts
from specalign.transformers.load.sources import trained_checkpoint
from specalign.workflow import log, run_script


def main(smk):
    spec = json.loads(smk.params.spec)
    series, step = spec["series"], int(spec["step"])
    run = io.read_netcdf(smk.input.run[0])
    diverged = int(run.attrs.get("diverged_step", -1))
    folder = trained_checkpoint(smk.input.checkpoints[0], series, step, diverged)
    log.info("%s -> %s", smk.wildcards.model, folder)
    contracts.write_manifest(
        smk.output[0],
        folder,
        {
            "source": "trained",
            "revision": f"step{step}",
            "series": series,
            "step": step,
            "family": str(run.attrs.get("family", "")),
            "spec": spec,
        },
    )


run_script(snakemake, main)  # noqa: F821
