"""results/reproduction.md: every number of both papers beside ours."""

from specalign import io, tables, transformer_tables
from specalign.workflow import run_script

HEADER = """# Reproduction report

Every number the two papers publish, beside ours, with the difference; where ours differ,
the text says so plainly. These are measurements, not targets: nothing was tuned to match.

"""


def main(smk):
    parts = [HEADER]
    if smk.input.diagnostics:
        experiments = tables.load_experiments(smk.input.diagnostics)
        parts.append(tables.reproduction_markdown(experiments))
    if smk.params.models:
        models = list(smk.params.models)

        def load(paths):
            return {m: io.read_netcdf(p) for m, p in zip(models, paths, strict=True)}

        parts.append(
            transformer_tables.reproduction_markdown(
                load(smk.input.spectra),
                load(smk.input.propagation),
                load(smk.input.steering),
                io.read_netcdf(smk.input.sphere[0]),
            )
        )
    io.write_text(smk.output[0], "\n\n".join(p.rstrip() for p in parts) + "\n")


run_script(snakemake, main)  # noqa: F821
