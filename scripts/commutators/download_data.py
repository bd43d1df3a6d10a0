"""Fetch one UCI workbook (copy from the mirror or the package, or download), sha256-verified."""

from pathlib import Path

from specalign.commutators.data import uci
from specalign.workflow import log, run_script


def main(smk):
    out = Path(smk.output[0])
    name = next(n for n, ds in uci.DATASETS.items() if ds.filename == out.name)
    mirror = smk.params.mirror
    origin = uci.fetch_origin(name, mirror=mirror)
    path = uci.fetch(name, out.parent, mirror=mirror)
    uci.record_fetched(path)  # the workflow's own copy: an output it may replace
    if smk.params.replaced:
        log.warning(
            "%s: the cached copy failed its SHA-256 check (kept as %s%s) and was replaced "
            "by the copy from %s (sha256 verified)",
            path,
            path.name,
            uci.FAILED_SUFFIX,
            origin,
        )
    else:
        log.info("%s ready at %s, from %s (sha256 verified)", name, path, origin)


run_script(snakemake, main)  # noqa: F821
