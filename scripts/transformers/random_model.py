"""Random-weight model with the configuration of another model, of a config.json file,
or of a configuration written in the config (the null baseline, or an offline twin)."""

from pathlib import Path

from specalign.transformers.load import contracts, sources
from specalign.workflow import log, param_json, run_script


def main(smk):
    spec = param_json(smk, "spec")
    if spec["like"]:
        like = contracts.read_manifest(smk.input.like)
        config, what = like["path"], f"like={like['source']}"
    elif spec["config_file"]:
        config, what = smk.input.config_file, f"config_file={spec['config_file']}"
    else:
        config, what = spec["config"], f"config={spec['config']['model_type']}"
    out_dir = Path(smk.output[0]).parent / "random"
    path = sources.make_random_model(config, out_dir, seed=int(spec["seed"]))
    log.info("random model (%s) written to %s", what, path)
    # `like`: the name of the model it copies, for its description (lineage.describe)
    info = {"source": f"random:{what}", "revision": f"seed={spec['seed']}", "like": spec["like"]}
    contracts.write_manifest(smk.output[0], path, info)


run_script(snakemake, main)  # noqa: F821
