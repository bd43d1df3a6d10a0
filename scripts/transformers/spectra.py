"""Eigen-spectra of every distinct F = W_O W_V (shared blocks once)."""

from specalign.io import write_netcdf
from specalign.transformers import contracts, spectra
from specalign.workflow import log, run_script


def main(smk):
    mw = contracts.read_weights_h5(smk.input[0])
    ds = spectra.spectra_dataset(mw, eta=float(smk.params.eta), threads=smk.threads)
    log.info("Re lambda_1 per block: %s", ds["eigenvalues_real"].isel(eig=0).values.round(4))
    write_netcdf(smk.output[0], ds)


run_script(snakemake, main)  # noqa: F821
