"""Eigen-spectra of every distinct F = W_O W_V (shared blocks once), on CUDA if granted."""

from specalign.io import write_netcdf
from specalign.runtime import torch_device
from specalign.transformers import lineage
from specalign.transformers.load import contracts
from specalign.transformers.measure import spectra
from specalign.workflow import log, run_script


def main(smk):
    manifest = contracts.read_manifest(smk.input.manifest)
    lineage.check_model(smk.input.weights, smk.input.manifest, manifest)
    mw = contracts.read_weights_h5(smk.input.weights, lazy=True)  # a block at a time
    device = torch_device(smk.resources.get("gpu", 0))
    log.info(
        "%d blocks of d = %d on %s, %s",
        len(mw.blocks),
        mw.d_model,
        device,
        f"factored: r x r products, r = {mw.rank_bound}" if mw.factored else "dense geev of F",
    )
    ds = spectra.spectra_dataset(mw, eta=float(smk.params.eta), device=device, threads=smk.threads)
    log.info("Re lambda_1 per block: %s", ds["eigenvalues_real"].isel(eig=0).values.round(4))
    log.info("eigenpair residual / radius, max over blocks: %.2e",
             float(ds["eigenpair_residual"].max()))  # fmt: skip
    ds.attrs.update(
        lineage.result_attrs(smk.input.manifest, manifest, settings={"eta": float(smk.params.eta)})
    )
    write_netcdf(smk.output[0], ds)


run_script(snakemake, main)  # noqa: F821
