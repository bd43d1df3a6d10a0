# specalign: spectral alignment inside neural networks, as a Snakemake workflow.
#
#   snakemake --cores 2                                   # default study (offline)
#   snakemake --cores 2 --configfile config/paper.yaml    # full paper reproduction
#   snakemake --cores 2 --config plots='{dpi: 300}'       # the default, one key changed
#   snakemake --profile profiles/slurm                    # on a SLURM cluster
#
# The DAG runs one way: data -> trained ensembles -> diagnostics -> tables/figures.
# Targets come from the config (rules/common.smk), so configurations differ in data only.

from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")


# A --configfile replaces the default instead of being merged into it, so that
# paper.yaml's experiments are not added to the default ones; values given with
# --config apply on top of the default, or of the --configfiles (Snakemake merges them).
CONFIGFILES = [str(p) for p in workflow.overwrite_configfiles] or [
    str(Path(workflow.basedir) / "config" / "config.yaml")
]
if not workflow.overwrite_configfiles:

    configfile: CONFIGFILES[0]


report: "report/workflow.rst"


include: "rules/common.smk"


wildcard_constraints:
    experiment=name_regex(EXPERIMENTS),
    model=name_regex(MODELS),


include: "rules/commutators.smk"
include: "rules/transformers.smk"
include: "rules/report.smk"


# Reruns after code edits: every script rule gets the fingerprint of its script and of
# the specalign modules it imports, derived from the imports (rules/common.smk).
fingerprint_scripts(workflow.rules)
# Reruns after a person's file changes in place: every rule gets the content digest of
# its inputs that no rule makes, derived from each job's inputs (rules/common.smk).
track_inputs_by_content(workflow)


onstart:
    warn_stale_results()


rule all:
    input:
        all_targets(),
    default_target: True
