"""One of the paper's Figures 1-5 (a placeholder naming the missing runs when absent)."""

from pathlib import Path

import seaborn as sns

from specalign import tables
from specalign.plots import commutators as plots
from specalign.workflow import log, param_json, run_script


def main(smk):
    settings = param_json(smk, "plots")
    stem = smk.wildcards.figure
    sns.set_theme(context=settings["context"], style="whitegrid")
    experiments = tables.load_experiments(smk.input)
    made = plots.FIGURES[stem](experiments)
    if made is None:
        log.warning("%s: %s are not in this configuration", stem, plots.FIGURE_NEEDS[stem])
        made = plots.not_run_figure(stem)
    fig, caption = made
    out_stem = Path(smk.output[0]).with_suffix("")
    plots.save_figure(fig, out_stem, formats=settings["formats"], dpi=settings["dpi"])
    log.info("%s: %s", stem, caption)


run_script(snakemake, main)  # noqa: F821
