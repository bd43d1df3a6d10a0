"""Record a point of a trained series: its manifest names the checkpoint folder."""

import json
from pathlib import Path

from specalign import io
from specalign.transformers.load import contracts
from specalign.transformers.load.checkpoint import model_digest
from specalign.transformers.load.sources import ModelSourceError
from specalign.workflow import log, run_script


def main(smk):
    spec = json.loads(smk.params.spec)
    series, step = spec["series"], int(spec["step"])
    run = io.read_netcdf(smk.input.run[0])
    diverged = int(run.attrs.get("diverged_step", -1))
    record_path = Path(smk.input.checkpoints[0])
    record = json.loads(record_path.read_text())
    folder = record_path.parent / f"step{step}"
    if diverged >= 0 and step >= diverged:
        raise ModelSourceError(
            f"series {series!r} diverged at step {diverged} (loss not finite; run.nc): "
            f"checkpoint step {step} was not written and is not used; fix: a smaller lr or "
            "more warm-up, or points below the divergence"
        )
    written = record["checkpoints"].get(str(step))
    if written is None or not (folder / "config.json").is_file():
        raise ModelSourceError(f"series {series!r}: checkpoint {folder} is missing")
    found = model_digest(folder)
    if found != written["content"]:
        raise ModelSourceError(
            f"{folder}: not the checkpoint the training run wrote (content {found}, "
            f"{record_path} records {written['content']}); fix: rerun train_model "
            f"(snakemake --forcerun train_model)"
        )
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
