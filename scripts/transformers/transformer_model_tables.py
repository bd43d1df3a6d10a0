"""Per-model tables: eigenvalues per layer, gamma/psi/rho per layer, steering."""

from pathlib import Path

from specalign import io
from specalign.transformers import lineage
from specalign.transformers.report import tables
from specalign.workflow import run_script


def main(smk):
    data = {key: io.read_netcdf(path) for key, path in smk.input.items()}
    # the three files of one model, never a mix of two
    lineage.check_same({smk.input[key]: ds.attrs for key, ds in data.items()})
    tables.write_model_tables(Path(smk.output[0]).parent, smk.wildcards.model, data)


run_script(snakemake, main)  # noqa: F821
