# Reproduction report: every paper number beside ours.


rule reproduction:
    input:
        diagnostics=diagnostics_files(),
        tables=expand("results/tables/commutators/{table}.csv", table=TABLES),
    output:
        "results/reproduction.md",
    params:
        kernel=kernel_hash("tables"),
    conda:
        CONDA_ENV
    log:
        "logs/reproduction.log",
    script:
        "../scripts/reproduction.py"
