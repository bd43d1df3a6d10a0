"""Train one ensemble of bias-free ReLU networks (all seeds batched) and store snapshots."""

from specalign.commutators import contracts, train
from specalign.commutators.data.prepare import eval_split
from specalign.io import read_h5, require
from specalign.runtime import torch_device
from specalign.workflow import LogProgress, log, param_json, run_script


def main(smk):
    exp = param_json(smk, "experiment")
    data, data_attrs = read_h5(smk.input[0])
    require(data, ["X_train", "y_train"], smk.input[0])
    device = torch_device(smk.resources.get("gpu", 0))
    log.info("training %s on %s", exp, device)
    progress = LogProgress(exp["training"]["iterations"], "gradient descent")
    result = train.train_experiment(exp, data["X_train"], data["y_train"], device, progress)
    n_div = int(result.diverged.sum())
    if n_div:
        log.warning(
            "%d of %d seeds diverged (recorded, excluded from summaries)",
            n_div,
            len(result.diverged),
        )
    contracts.write_trajectories(
        smk.output[0], exp, data, result, eval_name=eval_split(data), data_attrs=data_attrs
    )


run_script(snakemake, main)  # noqa: F821
