# Helpers shared by the rule files (validated config, targets, resources, fingerprints).

import json
from pathlib import Path

from specalign.commutators.data.uci import DATASETS
from specalign.commutators.figures import FIGURES
from specalign.commutators.tables import TABLES
from specalign.config import ConfigError, canonical_json, experiment_config, validate_config
from specalign.fingerprint import script_fingerprint
from specalign.transformers.figures import MODEL_FIGURES, OVERVIEW_FIGURES
from specalign.transformers.tables import MODEL_TABLES

try:
    _validated = validate_config(config, schema=None)
except ConfigError as _err:
    raise WorkflowError(str(_err)) from None
config.clear()
config.update(_validated)

EXPERIMENTS = sorted(config["commutators"]["experiments"])

CONDA_ENV = "../envs/specalign.yaml"
THREADS = config["threads"]
MODEL_CACHE = config["transformers"]["cache"]
MODELS = sorted(config["transformers"]["models"])
RANDOM_MODELS = [m for m in MODELS if config["transformers"]["models"][m]["source"] == "random"]
FETCHED_MODELS = [m for m in MODELS if m not in RANDOM_MODELS]
GPU = config["resources"]["gpu"]
GPU_MODEL = config["resources"]["gpu_model"]
MEM_MB = config["resources"]["mem_mb"]


def name_regex(names):
    """A wildcard constraint matching exactly the given names (never an empty regex)."""
    import re

    return "|".join(re.escape(n) for n in names) if names else "(?!)"


def fingerprint_scripts(rules):
    """Give each script rule the parameter ``code``, the fingerprint of its script and of
    every specalign module the script can import (specalign.fingerprint).

    Snakemake tracks neither, so without it an edited kernel would not rerun the jobs
    that use it; the module set is read from the imports, never listed by hand.
    """
    rule_files = Path(workflow.basedir) / "rules"  # scripts are given relative to them
    for each in rules:
        if each.script:
            each.set_params(code=script_fingerprint(rule_files / each.script))


def exp_cfg(wildcards):
    return experiment_config(config, wildcards.experiment)


def exp_json(part):
    """Params function: canonical JSON of the settings a step of an experiment reads."""

    def _get(wildcards):
        exp = exp_cfg(wildcards)
        if part == "data":
            keys = ["kind", "dataset", "source", "n_train", "n_diag", "data_seed",
                    "test_fraction", "split_seed"]
        elif part == "train":
            keys = ["name", "kind", "hidden", "width", "seeds", "seed_start", "rescale", "training",
                    "dataset", "source"]
        else:
            raise ValueError(part)
        return canonical_json({k: exp[k] for k in keys if k in exp})

    return _get


def uci_file(dataset):
    from specalign.commutators.data.uci import DATASETS

    return str(Path(config["data"]["cache"]) / DATASETS[dataset].filename)


def data_inputs(wildcards):
    exp = exp_cfg(wildcards)
    if exp["kind"] == "benchmark" and exp["source"] == "uci":
        return {"raw": uci_file(exp["dataset"])}
    return {}


def gpu_resources():
    """Resources of torch rules: the SLURM executor plugin reads gpu / gpu_model."""
    res = {"gpu": GPU, "mem_mb": MEM_MB}
    if GPU_MODEL:
        res["gpu_model"] = GPU_MODEL
    return res


def reported(paths, caption, category, subcategory=None, labels=None):
    """Flag the PNG figures and CSV tables among ``paths`` for `snakemake --report`.

    ``caption`` is a .rst path relative to rules/, or a function of a path's file stem.
    PDFs and Markdown twins stay out of the report (they are the same content).
    """
    out = []
    for path in paths:
        if path.endswith((".png", ".csv")):
            stem = Path(path).stem
            cap = caption(stem) if callable(caption) else caption
            path = report(
                path,
                caption=cap,
                category=category,
                subcategory=subcategory,
                labels=labels(stem) if callable(labels) else labels,
            )
        out.append(path)
    return out


def diagnostics_files(names=None):
    names = EXPERIMENTS if names is None else names
    return [f"results/commutators/{e}/diagnostics.nc" for e in names]


def commutator_targets():
    if not EXPERIMENTS:
        return []
    return (
        diagnostics_files()
        + [f"results/tables/commutators/{t}.csv" for t in TABLES]
        + expand(
            "results/figures/commutators/{figure}.{fmt}",
            figure=FIGURES,
            fmt=config["plots"]["formats"],
        )
    )


def random_model_inputs(wildcards):
    """The manifest of the model a random model copies (``like``), or its config.json
    file; nothing for a configuration written in the config."""
    spec = config["transformers"]["models"][wildcards.model]
    if spec["like"]:
        return {"like": f"{MODEL_CACHE}/{spec['like']}/manifest.json"}
    return {"config_file": spec["config_file"]} if spec["config_file"] else {}


def random_twin_spectra(wildcards):
    """The spectra of the model's random-weight twin (`{model}_random`), if configured."""
    twin = f"{wildcards.model}_random"
    return [f"results/transformers/{twin}/spectra.nc"] if twin in MODELS else []


def transformer_targets():
    if not MODELS:
        return []
    per_model = ["weights.h5", "spectra.nc", "propagation.nc", "steering.nc"]
    fmts = config["plots"]["formats"]
    return (
        [f"results/transformers/{m}/{f}" for m in MODELS for f in per_model]
        + expand("results/figures/transformers/{m}/{s}.{f}", m=MODELS, s=MODEL_FIGURES, f=fmts)
        + expand(
            "results/tables/transformers/{m}/{t}.csv",
            m=MODELS,
            t=MODEL_TABLES,
        )
        + expand("results/figures/transformers/{s}.{f}", s=OVERVIEW_FIGURES, f=fmts)
        + ["results/tables/transformers/sphere.csv"]
    )


def all_targets():
    targets = commutator_targets() + transformer_targets()
    return targets + ["results/reproduction.md"] if targets else []
