"""Build the training and diagnostic (synthetic) or train/test (benchmark) samples."""

from specalign.commutators.data import prepare
from specalign.io import write_h5
from specalign.workflow import log, param_json, run_script


def main(smk):
    exp = param_json(smk, "experiment")
    raw = smk.input.get("raw") if hasattr(smk.input, "get") else None
    arrays, attrs = prepare.experiment_data(exp, raw_path=raw)
    for key, arr in arrays.items():
        log.info("%s: shape %s", key, arr.shape)
    write_h5(smk.output[0], arrays, attrs={**attrs, "experiment": exp})


run_script(snakemake, main)  # noqa: F821
