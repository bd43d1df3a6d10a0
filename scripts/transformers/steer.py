"""Steering: change the last layer's W_O so that a target direction is an eigenvector."""

from specalign.io import read_netcdf, write_netcdf
from specalign.runtime import torch_device
from specalign.transformers import lineage
from specalign.transformers.load import contracts, hf
from specalign.transformers.measure import spectra, steer
from specalign.workflow import log, param_json, run_script


def main(smk):
    settings = param_json(smk, "settings")
    manifest = contracts.read_manifest(smk.input.manifest)
    model_dir = manifest["path"]
    # before any work: weights.h5 and spectra.nc must be this model's
    lineage.check_model(smk.input.weights, smk.input.manifest, manifest)
    spectra_ds = read_netcdf(smk.input.spectra)
    lineage.check_model(smk.input.spectra, smk.input.manifest, manifest, spectra_ds.attrs)
    device = torch_device(smk.resources.get("gpu", 0))
    ids = hf.prompt_ids(model_dir, settings["prompts"])
    ds = steer.steering_dataset(
        # a path: the weights are read only while they are needed (see steering_dataset)
        smk.input.weights,
        model_dir,
        ids,
        settings["eta"],
        settings["steering"],
        seed=int(settings["prompts"]["seed"]),
        null_draws=int(settings["null_draws"]),
        device=device,
        progress=log.info,
        directions=spectra.block_directions(spectra_ds, smk.input.spectra),
        threads=smk.threads,
    )
    for i, method in enumerate(ds["method"].values):
        # positional: `method` is also a keyword argument of xarray's .sel()
        log.info(
            "%s: |dW_O|/|W_O| = %s, residual = %s for c = %s",
            method,
            ds["relative_change"].values[i].round(4),
            ds["residual"].values[i],
            ds["c"].values,
        )
    if ds.attrs["target_warning"]:
        log.warning("%s (steering table column target_warning)", ds.attrs["target_warning"])
    if ds.attrs["probs_warning"]:
        log.warning("%s", ds.attrs["probs_warning"])
    ds.attrs.update(
        model=smk.wildcards.model,
        prompts_requested=int(settings["prompts"]["n_prompts"]),
        prompts_used=int(ids.shape[0]),
        **lineage.result_attrs(smk.input.manifest, manifest, settings=settings),
    )
    write_netcdf(
        smk.output[0],
        ds,
        headline=("gamma_u",),
        hint=f"the steered token states are not finite: check {model_dir} for NaN or inf",
    )


run_script(snakemake, main)  # noqa: F821
