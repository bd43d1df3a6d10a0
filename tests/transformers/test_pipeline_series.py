"""End to end: two tiny trained series (shared-weight ALBERT and GPT-2) through the DAG:
training.nc's contract, the report's section (7), and the rerun matrix (a new point
reruns that point and the cross-checkpoint outputs only; a training setting reruns the
training and what depends on it)."""

import numpy as np
import pytest
import xarray as xr
import yaml
from snakemake_helpers import planned_jobs, run_snakemake

pytestmark = pytest.mark.pipeline

RUN = dict(source="trained", family="albert", d_model=16, n_layers=2, n_heads=2, d_ff=32,
           seq_len=16, batch_size=4, steps=4, vocab_size=200, heldout_blocks=8,
           points=[0, 4])  # fmt: skip


def _config(series):
    return {
        "threads": 1,
        "transformers": {
            "models": {},
            "series": series,
            "prompts": {"kind": "random", "n_prompts": 3, "n_tokens": 6, "seed": 0},
            "propagation": {"prolonged_layers": 6, "null_draws": 2},
            "steering": {"target_text": "the", "c": [2.0], "methods": ["min_norm"]},
        },
        "plots": {"formats": ["png"], "dpi": 40},
    }


@pytest.fixture(scope="module")
def series_run(repo, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("series")
    series = {"a": dict(RUN), "g": dict(RUN, family="gpt2", vocab_size=300)}
    (workdir / "config.yaml").write_text(yaml.safe_dump(_config(series)))
    run_snakemake(repo, workdir)
    return workdir, series


def test_training_nc_contract(series_run):
    workdir, series = series_run
    for name in series:
        path = workdir / f"results/transformers/series/{name}/training.nc"
        with xr.open_dataset(path) as ds:
            assert list(ds["step"].values) == [0, 4]
            assert ds["rho_minus_null"].dims == ("step", "mode")
            assert ds["psi_layer"].dims == ("step", "mode", "layer")
            assert list(ds["layer"].values) == [1, 2]
            for v in ds.data_vars:
                assert ds[v].attrs.get("description"), v
            assert np.isfinite(ds["heldout_loss"].values).all()
            assert float(ds["heldout_unigram_entropy"]) > 0
        manifest = yaml.safe_load((workdir / f"resources/models/{name}_step4/manifest.json")
                                  .read_text())  # fmt: skip
        assert manifest["source"] == "trained"
        assert manifest["series"] == name and manifest["step"] == 4
    assert (workdir / "results/figures/transformers/series/a/training.png").is_file()
    # the figure's data-derived caption, beside it for the report's caption to include
    caption = (workdir / "results/figures/transformers/series/a/training.caption.rst").read_text()
    assert caption.startswith("Series a: ") and "step" in caption
    report = (workdir / "results/reproduction.md").read_text()
    assert "(7) Over training" in report and "**a** (trained, albert)" in report


def test_reruns(repo, series_run):
    workdir, series = series_run
    more = {**series, "a": dict(series["a"], points=[0, 2, 4])}
    (workdir / "config.yaml").write_text(yaml.safe_dump(_config(more)))
    jobs = planned_jobs(repo, workdir)
    assert "train_model" not in jobs
    assert jobs["trained_checkpoint"] == 1 and jobs["spectra"] == 1
    assert jobs["series_training"] == 1 and jobs["reproduction"] == 1
    changed = {**series, "a": dict(series["a"], lr=0.001)}
    (workdir / "config.yaml").write_text(yaml.safe_dump(_config(changed)))
    jobs = planned_jobs(repo, workdir)
    assert jobs["train_model"] == 1
    assert jobs["trained_checkpoint"] == 2 and jobs["series_training"] == 1
    (workdir / "config.yaml").write_text(yaml.safe_dump(_config(series)))
