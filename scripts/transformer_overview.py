"""Cross-model figures (paper Fig. 7, our reading of Fig. 9) and the sphere (Figs 13, 14)."""

from pathlib import Path

import seaborn as sns

from specalign import io, transformer_tables
from specalign.plots import transformers as plots
from specalign.workflow import log, param_json, run_script


def main(smk):
    settings = param_json(smk, "plots")
    sns.set_theme(context=settings["context"], style="whitegrid")
    spectra = {
        m: io.read_netcdf(p) for m, p in zip(smk.params.models, smk.input.spectra, strict=True)
    }
    sphere = io.read_netcdf(smk.input.sphere)
    made = {
        "figure7_spectra": plots.spectrum_overview_figure(spectra),
        "figure9_eigvec_continuity": plots.eigvec_continuity_figure(spectra),
        "figure13": plots.sphere_figure13(sphere),
        "figure14": plots.sphere_figure14(sphere),
    }
    outdir = Path(smk.output.figures[0]).parent
    for stem, fig_caption in made.items():
        if fig_caption is None:
            fig_caption = plots.unavailable_figure(stem, "no model spectra in this run")
        fig, caption = fig_caption
        plots.save_figure(fig, outdir / stem, formats=settings["formats"], dpi=settings["dpi"])
        log.info("%s: %s", stem, caption)
    transformer_tables.write_sphere_table(Path(smk.output.sphere_table[0]).with_suffix(""), sphere)


run_script(snakemake, main)  # noqa: F821
