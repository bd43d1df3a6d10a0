"""Fetch one UCI workbook (download, or copy from the mirror), sha256-verified."""

from pathlib import Path

from specalign.commutators.data import uci
from specalign.workflow import log, run_script


def main(smk):
    out = Path(smk.output[0])
    name = next(n for n, ds in uci.DATASETS.items() if ds.filename == out.name)
    path = uci.fetch(name, out.parent, mirror=smk.params.mirror)
    log.info("%s ready at %s (sha256 verified)", name, path)


run_script(snakemake, main)  # noqa: F821
