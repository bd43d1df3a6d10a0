"""Per-model tables: eigenvalues per layer, gamma/psi/rho per layer, steering."""

from pathlib import Path

from specalign import io
from specalign.transformers import tables
from specalign.workflow import run_script


def main(smk):
    tables.write_model_tables(
        Path(smk.output[0]).parent,
        smk.wildcards.model,
        {key: io.read_netcdf(path) for key, path in smk.input.items()},
    )


run_script(snakemake, main)  # noqa: F821
