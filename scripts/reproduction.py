"""results/reproduction.md: every number of the papers beside ours."""

from specalign import tables
from specalign.workflow import run_script


def main(smk):
    experiments = tables.load_experiments(smk.input.diagnostics)
    tables.write_reproduction(experiments, smk.output[0])


run_script(snakemake, main)  # noqa: F821
