"""Per-model tables: eigenvalues per layer, gamma/psi/rho per layer, steering."""

from pathlib import Path

from specalign import io, transformer_tables
from specalign.workflow import run_script


def main(smk):
    transformer_tables.write_model_tables(
        Path(smk.output[0]).parent,
        smk.wildcards.model,
        spectra=io.read_netcdf(smk.input.spectra),
        prop=io.read_netcdf(smk.input.propagation),
        steer=io.read_netcdf(smk.input.steering),
    )


run_script(snakemake, main)  # noqa: F821
