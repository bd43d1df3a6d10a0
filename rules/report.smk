# results/reproduction.md: every number of both papers beside ours.


rule reproduction:
    input:
        diagnostics=diagnostics_files(),
        tables=rules.commutator_tables.output.csv if EXPERIMENTS else [],
        spectra=expand(rules.spectra.output[0], model=STUDY_MODELS),
        propagation=expand(rules.propagate.output[0], model=STUDY_MODELS),
        steering=expand(rules.steer.output[0], model=STUDY_MODELS),
        sphere=rules.sphere_dynamics.output if STUDY_MODELS else [],
        series=expand(rules.series_training.output.data, series=SERIES),
    output:
        md=results_path(f"{layout.REPORT}.md"),
        # the same text as a page, which the report shows in place
        html=report(
            results_path(f"{layout.REPORT}.html"),
            caption="../report/reproduction.rst",
            category="Reproduction report",
            labels={"document": "reproduction"},
        ),
    params:
        models=STUDY_MODELS,
        series=SERIES,
        like=canonical_json(LIKE),
    conda:
        CONDA_ENV
    log:
        log_path("reproduction.log"),
    script:
        "../scripts/reproduction.py"
