"""The tidy per-layer table of every model: results/tables/transformers/layers.csv."""

from pathlib import Path

from specalign import io
from specalign.output import write_table
from specalign.transformers.report.summary import layer_table, layer_table_caption
from specalign.workflow import param_json, run_script


def main(smk):
    models = list(smk.params.models)
    spectra = {m: io.read_netcdf(p) for m, p in zip(models, smk.input.spectra, strict=True)}
    prop = {m: io.read_netcdf(p) for m, p in zip(models, smk.input.propagation, strict=True)}
    stem = Path(smk.output[0]).with_suffix("")
    write_table(layer_table(spectra, prop, param_json(smk, "like")), stem, layer_table_caption())


run_script(snakemake, main)  # noqa: F821
