"""End to end: the transformer half of the DAG on the packaged MiniLM (the session's run of
config/test.yaml, ``finished_run``) and a tiny local random GPT-2 (``gpt2_run``, both in
conftest.py), checking the weights.h5, spectra.nc, propagation.nc and steering.nc
contracts (no network: HF_HUB_OFFLINE=1)."""

import shutil

import h5py
import numpy as np
import pytest
import xarray as xr
import yaml
from snakemake_helpers import planned_jobs

pytestmark = pytest.mark.pipeline


def _check_weights(workdir, name, layers, blocks, d, family):
    with h5py.File(workdir / "results" / "transformers" / name / "weights.h5") as f:
        assert f["F"].shape == (blocks, d, d)
        assert f["layer_block"].shape == (layers,)
        for key in ("source", "revision", "family", "d_model", "n_heads", "n_layers", "shared"):
            assert key in f.attrs, key
        assert f.attrs["family"] == family
        W_O, W_V = f["blocks/0/W_O"][()], f["blocks/0/W_V"][()]
        np.testing.assert_allclose(W_O @ W_V, f["F"][0], rtol=1e-12, atol=1e-14)


def test_weights_contract(gpt2_run):
    _check_weights(gpt2_run[0], "tiny_gpt2", 2, 2, 32, "gpt2")


def test_weights_contract_minilm(finished_run):
    _check_weights(finished_run, "minilm", 6, 6, 384, "bert")


def test_spectra_contract(finished_run):
    workdir = finished_run
    with xr.open_dataset(workdir / "results/transformers/minilm/spectra.nc") as ds:
        assert ds["eigenvalues_real"].dims == ("block", "eig")
        assert ds["eigenvalues_imag"].dims == ("block", "eig")
        re = ds["eigenvalues_real"].values
        assert (np.diff(re, axis=1) <= 1e-12).all()  # sorted by real part, descending


def test_propagation_contract(gpt2_run):
    _check_propagation(*gpt2_run)


def test_propagation_contract_minilm(finished_run):
    _check_propagation(finished_run, yaml.safe_load((finished_run / "config.yaml").read_text()))


def _check_propagation(workdir, cfg):
    for name in cfg["transformers"]["models"]:
        with xr.open_dataset(workdir / f"results/transformers/{name}/propagation.nc") as ds:
            assert ds["gamma"].dims == ("mode", "layer", "token")
            assert ds["psi"].dims == ("mode", "layer", "token")
            assert ds["rho"].dims == ("mode", "layer")
            assert {"gamma_null", "rho_null", "psi_null"} <= set(ds.data_vars)
            assert {"simplified_real", "simplified_full", "real_model"} <= set(ds["mode"].values)
            prompts = cfg["transformers"]["prompts"]
            assert ds.sizes["token"] == prompts["n_prompts"] * prompts["n_tokens"]
            g = ds["gamma"].sel(mode="simplified_real").values
            assert np.nanmin(g) >= 0 and np.nanmax(g) <= 1 + 1e-12


def test_steering_contract(gpt2_run):
    workdir, _ = gpt2_run
    with xr.open_dataset(workdir / "results/transformers/tiny_gpt2/steering.nc") as ds:
        assert float(ds["residual"].max()) < 1e-10  # u is an exact eigenvector
        assert np.isfinite(ds["p_before"].values).all()  # causal LM: next-token probability
        assert "gamma_u_null" in ds


def test_steering_contract_encoder(finished_run):
    with xr.open_dataset(finished_run / "results/transformers/minilm/steering.nc") as ds:
        assert float(ds["residual"].max()) < 1e-10
        assert np.isnan(ds["p_before"].values).all()  # not a causal LM


def test_sphere_contract(gpt2_run):
    workdir, _ = gpt2_run
    with xr.open_dataset(workdir / "results/transformers/sphere/sphere.nc") as ds:
        assert float(ds["jacobian_max_abs_diff"].max()) < 1e-10


def test_figures_tables_report(gpt2_run):
    from specalign.transformers.report.figures import MODEL_FIGURES

    workdir, cfg = gpt2_run
    res = workdir / "results"
    for name in cfg["transformers"]["models"]:
        for stem in MODEL_FIGURES:
            assert (res / "figures" / "transformers" / name / f"{stem}.png").exists(), stem
        for table in ("eigenvalues", "propagation", "steering"):
            assert (res / "tables" / "transformers" / name / f"{table}.csv").exists()
    for stem in ("figure7_spectra", "figure9_eigvec_continuity", "figure13", "figure14"):
        assert (res / "figures" / "transformers" / f"{stem}.png").exists()
    text = (res / "reproduction.md").read_text()
    assert "Li & Altafini" in text and "tiny_gpt2" in text


def test_second_run_does_nothing(repo, gpt2_run):
    workdir, _ = gpt2_run
    assert planned_jobs(repo, workdir) == {}


def test_eta_change_reruns_transformer_rules_only(repo, gpt2_run, tmp_path):
    workdir, cfg = gpt2_run
    work = tmp_path / "w"
    shutil.copytree(workdir, work, symlinks=True)
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["transformers"]["eta"] = 0.5
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(repo, work)
    assert "extract_weights" not in jobs and "fetch_model" not in jobs
    n = len(cfg["transformers"]["models"])
    assert jobs.get("spectra") == n and jobs.get("propagate") == n and jobs.get("steer") == n
    assert "sphere_dynamics" not in jobs  # its eta is transformers.sphere.eta


def test_report_builds_with_captions(gpt2_report):
    _, html = gpt2_report
    assert "Transformer study" in html
    assert "Paper <strong>Figure 13</strong>" in html
    assert "Model <strong>tiny_gpt2</strong>" in html  # wildcards rendered in captions
