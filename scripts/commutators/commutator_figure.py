"""One of the paper's Figures 1-5 (a placeholder naming the missing runs when absent)."""

from pathlib import Path

from specalign import figstyle
from specalign.commutators import contracts
from specalign.commutators.report import figures
from specalign.output import save_figure, write_caption
from specalign.workflow import log, param_json, run_script


def main(smk):
    settings = param_json(smk, "plots")
    stem = smk.wildcards.figure
    figstyle.set_theme(settings["context"])
    made = figures.FIGURES[stem](contracts.load_experiments(smk.input))
    if made is None:
        log.warning("%s: %s are not in this configuration", stem, figures.FIGURE_NEEDS[stem])
        made = figures.not_run_figure(stem)
    fig, caption = made
    out_stem = Path(smk.output.figures[0]).with_suffix("")
    save_figure(fig, out_stem, formats=settings["formats"], dpi=settings["dpi"])
    write_caption(out_stem, caption)
    log.info("%s: %s", stem, caption)


run_script(snakemake, main)  # noqa: F821
