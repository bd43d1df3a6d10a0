"""The workflow as a module of another workflow: a second workflow in a temporary folder
imports it (`module specalign: snakefile: ...`, `use rule * from specalign`) and runs the
transformer half there, on the smallest configuration that takes every one of its rules
(a tiny GPT-2 built from a configuration written in the config)."""

import subprocess
import sys

import pandas as pd
import pytest
import yaml

pytestmark = pytest.mark.pipeline

IMPORTING_SNAKEFILE = """\
configfile: "config/config.yaml"


module specalign:
    snakefile:
        {snakefile!r}
    config:
        config


use rule * from specalign


# A rule of the importing workflow reading the module's per-layer table.
rule n_layers:
    input:
        "results/tables/transformers/layers.csv",
    output:
        "n_layers.txt",
    run:
        import pandas as pd

        df = pd.read_csv(input[0])
        with open(output[0], "w") as fh:
            fh.write(str(len(df)))
"""


def test_imported_as_module_runs_the_transformer_part(repo, tmp_path):
    tiny = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 64,
            "n_positions": 32}  # fmt: skip
    cfg = {
        "threads": 1,
        "commutators": {"experiments": {}},  # the transformer half only
        "transformers": {
            "models": {"tiny": {"source": "random", "config": tiny, "seed": 0}},
            "prompts": {"kind": "random", "n_prompts": 2, "n_tokens": 4, "seed": 0},
            "propagation": {"prolonged_layers": 4, "null_draws": 2},
            "steering": {"target_id": 37, "c": [2.0], "methods": ["min_norm"]},
            "sphere": {"steps": 20},
        },
        "plots": {"formats": ["png"], "dpi": 30},
    }
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "Snakefile").write_text(
        IMPORTING_SNAKEFILE.format(snakefile=str(repo / "Snakefile"))
    )
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "--directory", str(tmp_path)]
    cmd += ["--snakefile", str(tmp_path / "Snakefile")]
    proc = subprocess.run([*cmd, "all", "n_layers.txt"], capture_output=True, text=True,
                          timeout=1800)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-6000:]
    models = sorted(cfg["transformers"]["models"])
    for model in models:
        for stem in ("weights.h5", "spectra.nc", "propagation.nc", "steering.nc"):
            assert (tmp_path / "results" / "transformers" / model / stem).is_file()
    layers = pd.read_csv(tmp_path / "results" / "tables" / "transformers" / "layers.csv")
    assert sorted(layers["model"].unique()) == models
    assert (tmp_path / "n_layers.txt").read_text() == str(len(layers))
    assert (tmp_path / "results" / "reproduction.md").is_file()
    assert not (tmp_path / "results" / "commutators").exists()
    # the module's code fingerprints are its own: a second run does nothing
    again = subprocess.run([*cmd, "all", "n_layers.txt", "--dry-run"], capture_output=True,
                           text=True, timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stderr[-4000:]
    assert "Nothing to be done" in again.stdout + again.stderr
