"""One pipeline run over config/modern_test.yaml: a tiny random model of every family
beyond the paper's four (today's checkpoints' structure at d_model 32-64), each built
from a configuration written in the config, through every analysis of the
transformer study up to the reproduction report and the cross-model figures (no
network: HF_HUB_OFFLINE=1). Per-model figures and tables are family-blind and covered by
test_pipeline_transformers.py; they are left out here to keep the run short.

``SPECALIGN_PIPELINE_MODELS=a,b`` runs only those models of the file (with the models
their ``like:`` names), for a quick check of a new family beside one other; the family
coverage is then checked for the families of those models."""

import os
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import xarray as xr
import yaml
from snakemake_helpers import run_snakemake

from specalign.transformers.contracts import FORMAT_VERSION, MODES, read_weights_h5
from specalign.transformers.families import FAMILIES, adapter_class
from specalign.transformers.figures import OVERVIEW_FIGURES
from specalign.transformers.paper import PAPER_FAMILIES

pytestmark = pytest.mark.pipeline


@pytest.fixture(scope="module")
def families_run(repo, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("families")
    cfg = yaml.safe_load((repo / "config" / "modern_test.yaml").read_text())
    models = cfg["transformers"]["models"]
    only = [m for m in os.environ.get("SPECALIGN_PIPELINE_MODELS", "").split(",") if m]
    if only:
        unknown = set(only) - set(models)
        assert not unknown, f"SPECALIGN_PIPELINE_MODELS: {sorted(unknown)} not in modern_test"
        only += [models[m]["like"] for m in only if models[m].get("like")]
        cfg["transformers"]["models"] = {m: spec for m, spec in models.items() if m in only}
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    targets = ["results/reproduction.md"] + [
        f"results/figures/transformers/{stem}.png" for stem in OVERVIEW_FIGURES
    ]
    start = time.perf_counter()
    # 77 jobs, each starting Python with torch: 852 s on two cores shared with a
    # benchmark (load 4-6), past 900 s under load 8; the default timeout is for one model
    run_snakemake(repo, workdir, *targets, timeout=1800)
    print(f"all-families pipeline: {time.perf_counter() - start:.0f} s")
    return workdir, cfg["transformers"]["models"]


def _all_models():
    path = Path(__file__).parents[2] / "config" / "modern_test.yaml"
    return yaml.safe_load(path.read_text())["transformers"]["models"]


def _files(workdir, model, name):
    return workdir / "results" / "transformers" / model / name


def test_every_supported_family_runs(families_run):
    workdir, models = families_run
    seen = {}
    for model in models:
        with h5py.File(_files(workdir, model, "weights.h5")) as f:
            assert f.attrs["format_version"] == FORMAT_VERSION
            seen.setdefault(f.attrs["family"], []).append(str(f.attrs["ln_position"]))
            kv, heads = int(f.attrs["n_kv_heads"]), int(f.attrs["n_heads"])
            d, d_head = int(f.attrs["d_model"]), int(f.attrs["d_head"])
            factored = kv * d_head < d  # grouped-query at rank r < d: factors, no F
            assert ("F" in f) != factored, model
            mw = read_weights_h5(_files(workdir, model, "weights.h5"))
            for b in range(int(f.attrs["n_blocks"])):
                W_V = f[f"blocks/{b}/W_V"][()]
                assert heads % kv == 0 and W_V.shape[0] == kv * d_head
                F = mw.blocks[b].W_O @ mw.blocks[b].W_V  # the expanded form read back
                if factored:
                    W_O = f[f"blocks/{b}/W_O_grouped"][()]
                    np.testing.assert_allclose(W_O @ W_V, F, rtol=1e-12, atol=1e-14)
                else:
                    # would include a grouped-query block at full rank (n_kv_heads *
                    # d_head = d), whose W_V has n_kv_heads rows but whose F is stored
                    np.testing.assert_allclose(F, f["F"][b], rtol=1e-12, atol=1e-14)
            assert ("rotary" in f) == (f.attrs["rotary"] != "none")
    configured = {spec["config"]["model_type"] for spec in models.values() if "config" in spec}
    assert set(seen) == configured
    if len(models) == len(_all_models()):
        assert set(seen) == set(FAMILIES) - set(PAPER_FAMILIES)
        assert sorted(seen["opt"]) == ["post", "pre"]  # OPT-350m's layout and OPT-125m's


def test_every_mode_and_the_residual_stream(families_run):
    workdir, models = families_run
    for model in models:
        with xr.open_dataset(_files(workdir, model, "propagation.nc")) as ds:
            assert list(ds["mode"].values) == list(MODES), model
            for mode in ("simplified_real", "real_model", "prolonged_real"):
                g = ds["gamma"].sel(mode=mode).values
                layers = np.isfinite(g).all(axis=1).sum()
                assert layers >= 2 and np.nanmax(g) <= 1 + 1e-12, (model, mode)
            assert np.isfinite(ds["gamma_null"].sel(mode="real_model")).any()


def test_steering_through_each_family(families_run):
    workdir, models = families_run
    for model in models:
        with xr.open_dataset(_files(workdir, model, "steering.nc")) as ds:
            assert float(ds["residual"].max()) < 1e-10, model  # u an exact eigenvector
            causal_lm = adapter_class(ds.attrs["family"]).causal_lm
            assert bool(ds.attrs["causal_lm"]) == causal_lm
            p = ds["p_before"].values
            assert np.isfinite(p).all() if causal_lm else np.isnan(p).all(), model


def test_reproduction_and_cross_model_figures_take_every_family(families_run):
    workdir, models = families_run
    text = (workdir / "results" / "reproduction.md").read_text()
    for model in models:
        assert model in text
    assert "no: ours, beyond the paper" in text
    assert "Families the paper does not study:" in text
    for stem in OVERVIEW_FIGURES:
        assert (workdir / "results" / "figures" / "transformers" / f"{stem}.png").exists()
    if "llama-3.2-1b_tiny_random" not in models:  # a run of some models only
        return
    assert "| llama " in text
    twin = _files(workdir, "llama-3.2-1b_tiny_random", "spectra.nc")
    with (
        xr.open_dataset(twin) as ds,
        xr.open_dataset(_files(workdir, "llama-3.2-1b_tiny", "spectra.nc")) as base,
    ):
        assert ds.attrs["family"] == base.attrs["family"] == "llama"
        assert ds.sizes == base.sizes
        assert not np.allclose(ds["eigenvalues_real"], base["eigenvalues_real"])
