"""results/reproduction.md: every number of both papers beside ours."""

from specalign import io
from specalign.commutators import contracts
from specalign.commutators.report import reproduction as commutators
from specalign.output import markdown_html
from specalign.transformers.report import reproduction as transformers
from specalign.workflow import param_json, run_script

HEADER = """# Reproduction report

Every number the two papers publish, beside ours, with the difference; where ours differ,
the text says so plainly. These are measurements, not targets: nothing was tuned to match.

"""


def main(smk):
    parts = [HEADER]
    if smk.input.diagnostics:
        experiments = contracts.load_experiments(smk.input.diagnostics)
        parts.append(commutators.reproduction_markdown(experiments))
    if smk.params.models:
        models = list(smk.params.models)

        def load(paths):
            return {m: io.read_netcdf(p) for m, p in zip(models, paths, strict=True)}

        parts.append(
            transformers.reproduction_markdown(
                load(smk.input.spectra),
                load(smk.input.propagation),
                load(smk.input.steering),
                io.read_netcdf(smk.input.sphere[0]),
                like=param_json(smk, "like"),
            )
        )
    if smk.params.series:
        datasets = {
            name: io.read_netcdf(path)
            for name, path in zip(smk.params.series, smk.input.series, strict=True)
        }
        parts.append("\n".join(transformers.training_section(datasets)))
    text = "\n\n".join(p.rstrip() for p in parts) + "\n"
    io.write_text(smk.output.md, text)
    io.write_text(smk.output.html, markdown_html(text, "Reproduction report"))


run_script(snakemake, main)  # noqa: F821
