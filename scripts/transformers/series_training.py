"""One series' points side by side along the step: training.nc, its table and figure."""

from pathlib import Path

from specalign import figstyle, io
from specalign.output import save_figure, write_caption, write_table
from specalign.transformers.report import series
from specalign.transformers.report.figures import training
from specalign.workflow import log, param_json, run_script


def main(smk):
    settings = param_json(smk, "plots")
    figstyle.set_theme(settings["context"])
    read = [io.read_netcdf(p) for p in smk.input.spectra]
    prop = [io.read_netcdf(p) for p in smk.input.propagation]
    steer = [io.read_netcdf(p) for p in smk.input.steering]
    run = io.read_netcdf(smk.input.run[0]) if "run" in smk.input.keys() else None
    name = smk.wildcards.series
    ds = series.series_dataset(
        name,
        list(smk.params.steps),
        read,
        prop,
        steer,
        run=run,
        source=smk.params.source,
        unused_steps=list(smk.params.unused),
    )
    io.write_netcdf(smk.output.data, ds)
    table = series.series_table(ds)
    write_table(
        table,
        Path(smk.output.tables[0]).with_suffix(""),
        f"Series {name}: each claim's metric against the checkpoint step (step 0 = the null).",
    )
    fig, caption = training.series_figure(ds)
    stem = Path(smk.output.figures[0]).with_suffix("")
    save_figure(fig, stem, formats=settings["formats"], dpi=settings["dpi"])
    write_caption(stem, caption)  # the report's caption includes it
    log.info("%s: %s", name, caption)


run_script(snakemake, main)  # noqa: F821
