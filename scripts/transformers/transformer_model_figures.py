"""Every per-model figure of the transformer study, each with its null level."""

from pathlib import Path

from specalign import figstyle, io
from specalign.output import save_figure, write_caption
from specalign.transformers import lineage
from specalign.transformers.report import figures
from specalign.workflow import log, param_json, run_script


def main(smk):
    settings = param_json(smk, "plots")
    figstyle.set_theme(settings["context"])
    model = smk.wildcards.model
    null = io.read_netcdf(smk.input.null_spectra[0]) if smk.input.null_spectra else None
    data = {key: io.read_netcdf(smk.input[key]) for key in ("spectra", "propagation", "steering")}
    # the three files of one model, never a mix of two (the null is its twin's)
    lineage.check_same({smk.input[key]: ds.attrs for key, ds in data.items()})
    null_prop = (
        io.read_netcdf(smk.input.null_propagation[0]) if smk.input.null_propagation else None
    )
    made = figures.model_figures(
        model,
        spectra=data["spectra"],
        prop=data["propagation"],
        steer=data["steering"],
        null_spectra=null,
        null_name=smk.params.null_name or None,
        like_of=smk.params.like_of or None,
        null_prop=null_prop,
    )
    outdir = Path(smk.output.figures[0]).parent
    for stem in figures.MODEL_FIGURES:
        if stem in made:
            fig, caption = made[stem]
        else:
            fig, caption = figures.unavailable_figure(
                f"{model}: {stem}",
                "this model's files hold nothing for it (a per-mode figure: its mode is not "
                "in propagation.nc)",
            )
        save_figure(fig, outdir / stem, formats=settings["formats"], dpi=settings["dpi"])
        write_caption(outdir / stem, caption)
        log.info("%s: %s", stem, caption)


run_script(snakemake, main)  # noqa: F821
