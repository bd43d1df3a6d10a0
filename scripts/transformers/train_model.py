"""Train one small transformer offline (transformers.series, source trained): its
checkpoints in the save_pretrained layout and the run's record (run.nc)."""

import json
from pathlib import Path

import numpy as np

from specalign import io
from specalign.runtime import torch_device
from specalign.transformers.load.sources import trained_record
from specalign.transformers.train import training
from specalign.workflow import log, run_script


def main(smk):
    run = json.loads(smk.params.run)
    # the checkpoints' folder keeps whatever a person put in it: only the step folders
    # an earlier run wrote are removed, and one of theirs in the way is an error
    out = Path(smk.output.checkpoints).parent
    made_here = not out.exists() or not any(out.iterdir())
    out.mkdir(parents=True, exist_ok=True)
    if made_here:
        io.mark_owned(out, f"checkpoints of the training run {smk.wildcards.series}")
    for folder in training.clear_checkpoints(out, run["steps"]):
        log.info("removed %s (an earlier run's checkpoint)", folder)
    if smk.threads < run["threads"]:
        log.warning(
            "training on %d torch threads (transformers.series.%s.threads) on %d granted "
            "cores: fewer threads would train other weights",
            run["threads"],
            smk.wildcards.series,
            smk.threads,
        )
    planned = json.loads(smk.params.corpus)["sha256"]
    found = training.corpus_identity(run["corpus"])["sha256"]
    if found != planned:  # the text changed after Snakemake planned this job
        raise training.TrainingError(
            f"corpus: the text (sha256 {found}) is not the one this job was planned for "
            f"({planned}); run snakemake again"
        )
    device = torch_device(smk.resources.get("gpu", 0))
    log.info("%s: training on %s", smk.wildcards.series, device)
    result = training.train_run(run, out, log=log, device=device)
    log.info(
        "%s: %d parameters; final held-out loss %.4f vs held-out unigram entropy %.4f nats/token%s",
        smk.wildcards.series,
        result.n_params,
        result.heldout_loss[np.isfinite(result.heldout_loss)][-1],
        result.heldout_unigram_entropy,
        "" if result.diverged_step is None else f"; diverged at step {result.diverged_step}",
    )
    ds = training.history_dataset(result, smk.wildcards.series, run)
    io.write_netcdf(smk.output.run, ds)
    # what each point's manifest is made from: read back by trained_checkpoint
    record = trained_record(out, smk.wildcards.series, training.checkpoint_steps(run["steps"]))
    io.write_json(smk.output.checkpoints, record)


run_script(snakemake, main)  # noqa: F821
