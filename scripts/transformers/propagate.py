"""Token propagation through the simplified and the real model, with null levels."""

from specalign.io import write_netcdf
from specalign.runtime import torch_device
from specalign.transformers import contracts, propagate
from specalign.workflow import LogProgress, log, param_json, run_script


def main(smk):
    settings = param_json(smk, "settings")
    mw = contracts.read_weights_h5(smk.input.weights)
    model_dir = contracts.read_manifest(smk.input.manifest)["path"]
    device = torch_device(smk.resources.get("gpu", 0))
    ids = propagate.prompt_ids(model_dir, settings["prompts"])
    log.info("%d prompts of %d tokens on %s", *ids.shape, device)
    states = propagate.propagation_states(
        mw,
        model_dir,
        ids,
        settings["eta"],
        settings["propagation"],
        device,
        progress=LogProgress(5, "propagation modes", every=0.0),
    )
    for mode, s in states.items():
        log.info("mode %s: %d layers", mode, s.shape[0] - 1)
    ds = propagate.propagation_dataset(
        mw, states, settings["propagation"], seed=int(settings["prompts"]["seed"])
    )
    ds.attrs.update(model=smk.wildcards.model, eta=float(settings["eta"]))
    write_netcdf(smk.output[0], ds)


run_script(snakemake, main)  # noqa: F821
