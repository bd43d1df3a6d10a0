# results/reproduction.md: every number of both papers beside ours.


rule reproduction:
    input:
        diagnostics=diagnostics_files(),
        tables=expand("results/tables/commutators/{table}.csv", table=TABLES)
        if EXPERIMENTS
        else [],
        spectra=expand("results/transformers/{model}/spectra.nc", model=MODELS),
        propagation=expand("results/transformers/{model}/propagation.nc", model=MODELS),
        steering=expand("results/transformers/{model}/steering.nc", model=MODELS),
        sphere=["results/transformers/sphere/sphere.nc"] if MODELS else [],
    output:
        report(
            "results/reproduction.md",
            caption="../report/reproduction.rst",
            category="Reproduction report",
            labels={"document": "reproduction.md"},
        ),
    params:
        models=MODELS,
        like=canonical_json(LIKE),
    conda:
        CONDA_ENV
    log:
        "logs/reproduction.log",
    script:
        "../scripts/reproduction.py"
