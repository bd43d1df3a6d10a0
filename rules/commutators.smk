# The commutator study (Nyström, arXiv:2608.22910, Sections 3-5, 9, 10):
# data -> batched training -> commutator diagnostics -> tables, figures.

# Output names come from the package (TABLES: paper Tables 1-6, the numbers quoted in
# its text and the Sec. 10.7 identity residuals; FIGURES: paper Figures 1-5).


localrules:
    download_data,


rule download_data:
    # A local rule: compute nodes of clusters often have no internet. With
    # `data: mirror:` set, the file is copied from the mirror instead.
    output:
        str(Path(config["data"]["cache"]) / "{filename}"),
    wildcard_constraints:
        # only absent workbooks and the workflow's own copies: a file of the user's in
        # data.cache is never an output (neither replaced nor deleted)
        filename=name_regex(FETCHABLE_WORKBOOKS),
    params:
        mirror=config["data"]["mirror"],
        # the workflow's own copies that failed their checksum (moved aside at startup)
        replaced=lambda w: w.filename in REPLACED_WORKBOOKS,
    conda:
        CONDA_ENV
    log:
        log_path("download_data/{filename}.log"),
    script:
        "../scripts/commutators/download_data.py"


rule prepare_data:
    input:
        unpack(data_inputs),
    output:
        results_path(layout.experiment_file("{experiment}", "data.h5")),
    params:
        experiment=exp_json("data"),
    conda:
        CONDA_ENV
    log:
        log_path("commutators/{experiment}/prepare_data.log"),
    script:
        "../scripts/commutators/prepare_data.py"


rule train_ensemble:
    input:
        results_path(layout.experiment_file("{experiment}", "data.h5")),
    output:
        results_path(layout.experiment_file("{experiment}", "trajectories.h5")),
    params:
        experiment=exp_json("train"),
    threads: THREADS
    resources:
        **gpu_resources(),
    conda:
        CONDA_ENV
    log:
        log_path("commutators/{experiment}/train_ensemble.log"),
    benchmark:
        benchmark_path("commutators/{experiment}/train_ensemble.tsv")
    script:
        "../scripts/commutators/train_ensemble.py"


# Named `commutators` until 2026-12-01 (also the study, the package and the folder). Its
# script keeps its old file name: Snakemake reruns a script rule whose script file is
# newer than its outputs, and a renamed file is new wherever it is checked out.
rule diagnostics:
    input:
        results_path(layout.experiment_file("{experiment}", "trajectories.h5")),
    output:
        results_path(layout.experiment_file("{experiment}", "diagnostics.nc")),
    params:
        diagnostics=canonical_json(config["commutators"]["diagnostics"]),
        # what trajectories.h5 must have been trained with (checked by the job)
        experiment=exp_json("train"),
    threads: THREADS
    resources:
        mem_mb=MEM_MB,
    conda:
        CONDA_ENV
    log:
        log_path("commutators/{experiment}/diagnostics.log"),
    benchmark:
        benchmark_path("commutators/{experiment}/diagnostics.tsv")
    script:
        "../scripts/commutators/commutators.py"


rule commutator_tables:
    input:
        diagnostics_files(),
    output:
        csv=expand(results_path(layout.table("commutators", "{table}.csv")), table=TABLES),
        md=expand(results_path(layout.table("commutators", "{table}.md")), table=TABLES),
        html=reported(
            expand(results_path(layout.table("commutators", "{table}.html")), table=TABLES),
            caption=lambda stem: f"../report/commutators/{stem}.rst",
            category="Commutator study",
            subcategory="Tables",
            labels=lambda stem: {"table": stem},
        ),
    conda:
        CONDA_ENV
    log:
        log_path("commutators/tables.log"),
    script:
        "../scripts/commutators/commutator_tables.py"


rule commutator_figure:
    input:
        diagnostics_files(),
    output:
        figures=reported(
            expand(
                results_path(layout.figure("commutators", "{{figure}}.{fmt}")),
                fmt=config["plots"]["formats"],
            ),
            caption="../report/commutators/figure.rst",
            category="Commutator study",
            subcategory="Figures",
            labels={"figure": "{figure}"},
        ),
        # the data-driven caption, read by the report's caption
        caption=results_path(layout.figure("commutators", f"{{figure}}{CAPTION_SUFFIX}")),
    wildcard_constraints:
        figure=name_regex(FIGURES),
    params:
        plots=canonical_json(config["plots"]),
    conda:
        CONDA_ENV
    log:
        log_path("commutators/{figure}.log"),
    script:
        "../scripts/commutators/commutator_figure.py"
