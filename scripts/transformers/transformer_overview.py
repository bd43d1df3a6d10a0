"""Cross-model figures (paper Fig. 7, our reading of Fig. 9) and the sphere (Figs 13, 14)."""

from pathlib import Path

from specalign import figstyle, io
from specalign.output import save_figure, write_caption
from specalign.transformers.report import figures, tables
from specalign.workflow import log, param_json, run_script


def main(smk):
    settings = param_json(smk, "plots")
    figstyle.set_theme(settings["context"])
    spectra = {
        m: io.read_netcdf(p) for m, p in zip(smk.params.models, smk.input.spectra, strict=True)
    }
    sphere = io.read_netcdf(smk.input.sphere)
    like = param_json(smk, "like")  # random model -> the model its like: names
    outdir = Path(smk.output.figures[0]).parent
    for stem, make in figures.OVERVIEW_FIGURES.items():
        made = make(spectra, sphere, like)
        if made is None:
            made = figures.unavailable_figure(stem, "no model spectra in this run")
        fig, caption = made
        save_figure(fig, outdir / stem, formats=settings["formats"], dpi=settings["dpi"])
        write_caption(outdir / stem, caption)
        log.info("%s: %s", stem, caption)
    tables.write_sphere_table(Path(smk.output.sphere_table[0]).with_suffix(""), sphere)


run_script(snakemake, main)  # noqa: F821
