# The transformer study (Li & Altafini, arXiv:2605.25619): model folders -> weights.h5
# -> spectra.nc; propagation.nc and steering.nc; sphere dynamics; tables, figures.


localrules:
    fetch_model,
    trained_checkpoint,


rule fetch_model:
    # A local rule: hub downloads need the internet, which compute nodes often lack.
    # package/local sources only record where the model folder is, whose files are
    # its inputs.
    input:
        model_source_inputs,
    output:
        f"{MODEL_CACHE}/{{model}}/manifest.json",
    wildcard_constraints:
        model=name_regex(FETCHED_MODELS),
    params:
        spec=lambda w: canonical_json(config["transformers"]["models"][w.model]),
        # hub snapshots share one Hugging Face cache beside the per-model manifests
        cache=lambda w, output: str(Path(output[0]).parents[1] / "hub"),
    conda:
        CONDA_ENV
    log:
        log_path("transformers/{model}/fetch_model.log"),
    script:
        "../scripts/transformers/fetch_model.py"


rule random_model:
    # The null baseline: the configuration of another model (or of a config.json file, or
    # written in the config) with random weights.
    input:
        unpack(random_model_inputs),
    output:
        f"{MODEL_CACHE}/{{model}}/manifest.json",
    wildcard_constraints:
        model=name_regex(RANDOM_MODELS),
    params:
        spec=lambda w: canonical_json(config["transformers"]["models"][w.model]),
    resources:
        **model_resources("random_model"),
    conda:
        CONDA_ENV
    log:
        log_path("transformers/{model}/random_model.log"),
    benchmark:
        benchmark_path("transformers/{model}/random_model.tsv")
    script:
        "../scripts/transformers/random_model.py"


checkpoint train_model:
    # A small transformer trained here, offline (transformers.series, source trained):
    # checkpoints at step 0 and log-spaced steps in the save_pretrained layout, and the
    # run's record (losses per step, held-out unigram entropy, divergence). A checkpoint
    # (Snakemake's): series_training reads run.nc's divergence after it ran and leaves
    # out the points the run never reached (usable_points).
    input:
        # a corpus file (corpus.kind file): editing it reruns the training
        corpus=lambda w: training_corpus_file(w.series),
    output:
        run=results_path(layout.series_file("{series}", "run.nc")),
        # the record of the checkpoints it wrote beside it (step folders); not the folder
        # itself, which keeps whatever a person put in it
        checkpoints=f"{MODEL_CACHE}/{{series}}.checkpoints/checkpoints.json",
    wildcard_constraints:
        series=name_regex(TRAINED_SERIES),
    params:
        run=lambda w: canonical_json(training_settings(w.series)),
        corpus=lambda w: canonical_json(training_corpus_identity(w.series)),
    # a training setting (the weights depend on it), not the config's threads
    threads: lambda w: config["transformers"]["series"][w.series]["threads"]
    # the longest jobs of a series, with every point waiting on them: started before the
    # short jobs ready beside them (the first runs' points), and the longest run first,
    # so that the last run does not start late and leave a core idle at the end
    priority: lambda w: training_priority(w.series)
    resources:
        **gpu_resources(),
    conda:
        CONDA_ENV
    log:
        log_path("transformers/series/{series}/train_model.log"),
    benchmark:
        benchmark_path("transformers/series/{series}/train_model.tsv")
    script:
        "../scripts/transformers/train_model.py"


rule trained_checkpoint:
    # A point of a trained series: its manifest names the checkpoint train_model wrote.
    input:
        unpack(trained_point_inputs),
    output:
        f"{MODEL_CACHE}/{{model}}/manifest.json",
    wildcard_constraints:
        model=name_regex(TRAINED_MODELS),
    params:
        spec=lambda w: canonical_json(config["transformers"]["models"][w.model]),
    conda:
        CONDA_ENV
    log:
        log_path("transformers/{model}/trained_checkpoint.log"),
    script:
        "../scripts/transformers/trained_checkpoint.py"


rule extract_weights:
    input:
        f"{MODEL_CACHE}/{{model}}/manifest.json",
    output:
        results_path(layout.model_file("{model}", "weights.h5")),
    # with two, a block is written while the next is read
    threads: model_threads("extract_weights")
    resources:
        **model_resources("extract_weights"),
    conda:
        CONDA_ENV
    log:
        log_path("transformers/{model}/extract_weights.log"),
    benchmark:
        benchmark_path("transformers/{model}/extract_weights.tsv")
    script:
        "../scripts/transformers/extract_weights.py"


rule spectra:
    input:
        weights=results_path(layout.model_file("{model}", "weights.h5")),
        # read to check that weights.h5 is this model's (specalign.transformers.lineage)
        manifest=f"{MODEL_CACHE}/{{model}}/manifest.json",
    output:
        results_path(layout.model_file("{model}", "spectra.nc")),
    params:
        eta=config["transformers"]["eta"],
    threads: model_threads("spectra")
    resources:
        # float64 eig of d x d matrices: tens of minutes per d = 4096 model on 2 cores
        **gpu_resources(),
        **model_resources("spectra"),
    conda:
        CONDA_ENV
    log:
        log_path("transformers/{model}/spectra.log"),
    benchmark:
        benchmark_path("transformers/{model}/spectra.tsv")
    script:
        "../scripts/transformers/spectra.py"


rule propagate:
    input:
        weights=results_path(layout.model_file("{model}", "weights.h5")),
        manifest=f"{MODEL_CACHE}/{{model}}/manifest.json",
        spectra=results_path(layout.model_file("{model}", "spectra.nc")),
        prompts=prompt_inputs,
    output:
        results_path(layout.model_file("{model}", "propagation.nc")),
    params:
        settings=canonical_json(
            {k: config["transformers"][k] for k in ("eta", "prompts", "propagation")}
        ),
    threads: model_threads("propagate")
    resources:
        **gpu_resources(),
        **model_resources("propagate"),
    conda:
        CONDA_ENV
    log:
        log_path("transformers/{model}/propagate.log"),
    benchmark:
        benchmark_path("transformers/{model}/propagate.tsv")
    script:
        "../scripts/transformers/propagate.py"


rule steer:
    input:
        weights=results_path(layout.model_file("{model}", "weights.h5")),
        manifest=f"{MODEL_CACHE}/{{model}}/manifest.json",
        spectra=results_path(layout.model_file("{model}", "spectra.nc")),
        prompts=prompt_inputs,
    output:
        results_path(layout.model_file("{model}", "steering.nc")),
    params:
        settings=canonical_json(
            {
                "eta": config["transformers"]["eta"],
                "prompts": config["transformers"]["prompts"],
                "steering": config["transformers"]["steering"],
                "null_draws": config["transformers"]["propagation"]["null_draws"],
            }
        ),
    threads: model_threads("steer")
    resources:
        **gpu_resources(),
        **model_resources("steer"),
    conda:
        CONDA_ENV
    log:
        log_path("transformers/{model}/steer.log"),
    benchmark:
        benchmark_path("transformers/{model}/steer.tsv")
    script:
        "../scripts/transformers/steer.py"


rule sphere_dynamics:
    output:
        results_path(layout.SPHERE),
    params:
        settings=canonical_json(config["transformers"]["sphere"]),
    threads: THREADS
    conda:
        CONDA_ENV
    log:
        log_path("transformers/sphere_dynamics.log"),
    script:
        "../scripts/transformers/sphere_dynamics.py"


rule transformer_model_figures:
    input:
        spectra=results_path(layout.model_file("{model}", "spectra.nc")),
        propagation=results_path(layout.model_file("{model}", "propagation.nc")),
        steering=results_path(layout.model_file("{model}", "steering.nc")),
        null_spectra=random_twin_spectra,
        null_propagation=random_twin_propagation,
    output:
        figures=reported(
            expand(
                results_path(layout.model_figure("{{model}}", "{stem}.{fmt}")),
                stem=MODEL_FIGURES,
                fmt=config["plots"]["formats"],
            ),
            caption=lambda stem: f"../report/transformers/{stem}.rst",
            category="Transformer study",
            subcategory="{model}",
            labels=lambda stem: {"model": "{model}", "figure": stem},
        ),
        # the data-driven captions, read by the report's captions
        captions=expand(
            results_path(layout.model_figure("{{model}}", "{stem}{suffix}")),
            stem=MODEL_FIGURES,
            suffix=CAPTION_SUFFIX,
        ),
    params:
        plots=canonical_json(config["plots"]),
        null_name=lambda w: random_twin(w.model) or "",
        like_of=lambda w: LIKE.get(w.model, ""),
    conda:
        CONDA_ENV
    log:
        log_path("transformers/{model}/figures.log"),
    script:
        "../scripts/transformers/transformer_model_figures.py"


rule transformer_model_tables:
    input:
        spectra=results_path(layout.model_file("{model}", "spectra.nc")),
        propagation=results_path(layout.model_file("{model}", "propagation.nc")),
        steering=results_path(layout.model_file("{model}", "steering.nc")),
    output:
        reported(
            expand(
                results_path(layout.model_table("{{model}}", "{table}.{ext}")),
                table=list(MODEL_TABLES),
                ext=TABLE_FORMATS,
            ),
            caption=lambda stem: f"../report/transformers/table_{stem}.rst",
            category="Transformer study",
            subcategory="{model}",
            labels=lambda stem: {"model": "{model}", "table": stem},
        ),
    conda:
        CONDA_ENV
    log:
        log_path("transformers/{model}/tables.log"),
    script:
        "../scripts/transformers/transformer_model_tables.py"


rule transformer_layers:
    # The tidy table of every model and layer, twin beside (specalign.transformers.report.summary).
    input:
        spectra=expand(rules.spectra.output[0], model=MODELS),
        propagation=expand(rules.propagate.output[0], model=MODELS),
    output:
        reported(
            expand(results_path(layout.table("transformers", "layers.{ext}")), ext=TABLE_FORMATS),
            caption="../report/transformers/table_layers.rst",
            category="Transformer study",
            subcategory="All models and sphere dynamics",
            labels={"table": "layers"},
        ),
    params:
        models=MODELS,
        like=canonical_json(LIKE),
    conda:
        CONDA_ENV
    log:
        log_path("transformers/layers.log"),
    script:
        "../scripts/transformers/transformer_layers.py"


rule transformer_overview:
    # Cross-model figures (paper Figs 7 and our reading of 9) and the sphere (13, 14).
    input:
        spectra=expand(results_path(layout.model_file("{model}", "spectra.nc")), model=STUDY_MODELS),
        sphere=results_path(layout.SPHERE),
    output:
        figures=reported(
            expand(
                results_path(layout.figure("transformers", "{stem}.{fmt}")),
                stem=OVERVIEW_FIGURES,
                fmt=config["plots"]["formats"],
            ),
            caption=lambda stem: f"../report/transformers/{stem}.rst",
            category="Transformer study",
            subcategory="All models and sphere dynamics",
            labels=lambda stem: {"figure": stem},
        ),
        captions=expand(
            results_path(layout.figure("transformers", "{stem}{suffix}")),
            stem=OVERVIEW_FIGURES,
            suffix=CAPTION_SUFFIX,
        ),
        sphere_table=reported(
            expand(results_path(layout.table("transformers", "sphere.{ext}")), ext=TABLE_FORMATS),
            caption="../report/transformers/table_sphere.rst",
            category="Transformer study",
            subcategory="All models and sphere dynamics",
            labels={"table": "sphere"},
        ),
    params:
        plots=canonical_json(config["plots"]),
        models=STUDY_MODELS,
        like=canonical_json(LIKE),
    conda:
        CONDA_ENV
    log:
        log_path("transformers/overview.log"),
    script:
        "../scripts/transformers/transformer_overview.py"


rule series_training:
    # One series' points side by side along the step: results/transformers/series/
    # {series}/training.nc, its table and its figure (metric against log step).
    input:
        unpack(series_inputs),
    output:
        data=results_path(layout.series_file("{series}", "training.nc")),
        tables=reported(
            expand(
                results_path(layout.series_table("{{series}}", "training.{ext}")),
                ext=TABLE_FORMATS,
            ),
            caption="../report/transformers/table_training.rst",
            category="Transformer study",
            subcategory="Over training",
            labels={"series": "{series}", "table": "training"},
        ),
        figures=reported(
            expand(
                results_path(layout.series_figure("{{series}}", "training.{fmt}")),
                fmt=config["plots"]["formats"],
            ),
            caption="../report/transformers/training.rst",
            category="Transformer study",
            subcategory="Over training",
            labels={"series": "{series}", "figure": "training"},
        ),
        # the data-driven caption, read by the report's caption
        caption=results_path(layout.series_figure("{series}", f"training{CAPTION_SUFFIX}")),
    wildcard_constraints:
        series=name_regex(SERIES),
    params:
        steps=lambda w: [
            config["transformers"]["models"][m]["step"] for m in usable_points(w.series)
        ],
        unused=lambda w: [
            config["transformers"]["models"][m]["step"]
            for m in SERIES_POINTS[w.series]
            if m not in usable_points(w.series)
        ],
        source=lambda w: config["transformers"]["series"][w.series]["source"],
        plots=canonical_json(config["plots"]),
    conda:
        CONDA_ENV
    log:
        log_path("transformers/series/{series}/series_training.log"),
    script:
        "../scripts/transformers/series_training.py"
