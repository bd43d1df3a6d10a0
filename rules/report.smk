# results/reproduction.md: every number of both papers beside ours.


rule reproduction:
    input:
        diagnostics=diagnostics_files(),
        tables=rules.commutator_tables.output.csv if EXPERIMENTS else [],
        spectra=expand(rules.spectra.output[0], model=MODELS),
        propagation=expand(rules.propagate.output[0], model=MODELS),
        steering=expand(rules.steer.output[0], model=MODELS),
        sphere=rules.sphere_dynamics.output if MODELS else [],
    output:
        md=results_path("reproduction.md"),
        # the same text as a page, which the report shows in place
        html=report(
            results_path("reproduction.html"),
            caption="../report/reproduction.rst",
            category="Reproduction report",
            labels={"document": "reproduction"},
        ),
    params:
        models=MODELS,
        like=canonical_json(LIKE),
    conda:
        CONDA_ENV
    log:
        log_path("reproduction.log"),
    script:
        "../scripts/reproduction.py"
