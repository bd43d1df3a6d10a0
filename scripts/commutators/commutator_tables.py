"""The paper's Tables 1-6 (plus its text numbers and identity residuals), ours beside theirs."""

from pathlib import Path

from specalign.commutators import contracts
from specalign.commutators.report import tables
from specalign.output import write_table
from specalign.workflow import log, run_script


def main(smk):
    experiments = contracts.load_experiments(smk.input)
    built = tables.paper_tables(experiments, include_absent=True)
    for csv in smk.output.csv:
        stem = Path(csv).with_suffix("")
        df, caption = built[stem.name]
        write_table(df, stem, caption)
        log.info("%s: %d rows", stem.name, len(df))


run_script(snakemake, main)  # noqa: F821
