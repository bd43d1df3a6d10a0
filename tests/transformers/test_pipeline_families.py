"""Every family beyond the paper's four through the transformer study, at two costs.

* In one process, for every model of config/modern_test.yaml (a tiny random model of
  each family, today's checkpoints' structure at d_model 32-64, built from a
  configuration written in the config; no network): the kernels each rule's script
  calls, in the rules' order and with the configuration's settings (random model,
  extraction to weights.h5, spectra, propagation in every mode with its nulls, steering),
  and the same checks on the files as on a workflow run. Torch and transformers start
  once, not in each of 77 jobs.
* Through the whole workflow (Snakemake, every rule up to the reproduction report and
  the cross-model figures), for the models whose families take distinct paths through
  the rules (``WORKFLOW_MODELS``): a grouped-query model factored at r < d (a factored
  weights.h5, spectra through the r x r product) with a tied head, and its random twin
  (the null of a model built from a configuration). A dense encoder without a causal LM
  (no next-token probabilities) takes the workflow on MiniLM in every session
  (config/test.yaml; test_pipeline_transformers.py checks its files). The layouts that
  differ only inside the kernels (DistilBERT's names, OPT-350m's post-LN projection,
  Falcon's multi-query parallel block, ...) take the kernels' path above.
  A dry run plans the whole file. Per-model figures and tables are family-blind and
  covered by test_pipeline_transformers.py; they are left out here to keep the run short.

``SPECALIGN_PIPELINE_MODELS=a,b`` runs the workflow on those models of the file instead
(with the models their ``like:`` names), for a check of a new family beside one other;
the family coverage is then checked for the families of those models."""

import os
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import xarray as xr
import yaml
from snakemake_helpers import planned_jobs, run_snakemake

from specalign.config import load_yaml, validate_config
from specalign.io import DiskStack, write_netcdf
from specalign.transformers import lineage
from specalign.transformers.load import contracts, extract, hf, sources
from specalign.transformers.load.contracts import FORMAT_VERSION, MODES, read_weights_h5
from specalign.transformers.load.families import FAMILIES, adapter_class
from specalign.transformers.measure import propagate, spectra, steer
from specalign.transformers.report.figures import OVERVIEW_FIGURES
from specalign.transformers.report.paper import PAPER_FAMILIES

pytestmark = pytest.mark.pipeline


#: The models run through the whole workflow: one per distinct path through the rules.
WORKFLOW_MODELS = (
    "llama-3.2-1b_tiny",  # grouped-query, factored at r < d, tied head, llama3 rope
    "llama-3.2-1b_tiny_random",  # the null of a model built from a configuration
)


def _workflow_config(repo: Path) -> tuple[dict, dict]:
    cfg = yaml.safe_load((repo / "config" / "modern_test.yaml").read_text())
    models = cfg["transformers"]["models"]
    only = [m for m in os.environ.get("SPECALIGN_PIPELINE_MODELS", "").split(",") if m]
    unknown = set(only) - set(models)
    assert not unknown, f"SPECALIGN_PIPELINE_MODELS: {sorted(unknown)} not in modern_test"
    only = only or list(WORKFLOW_MODELS)
    only += [models[m]["like"] for m in only if models[m].get("like")]
    cfg["transformers"]["models"] = {m: spec for m, spec in models.items() if m in only}
    return cfg, models


@pytest.fixture(scope="module")
def families_run(repo, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("families")
    cfg, _ = _workflow_config(repo)
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    targets = ["results/reproduction.md"] + [
        f"results/figures/transformers/{stem}.png" for stem in OVERVIEW_FIGURES
    ]
    start = time.perf_counter()
    run_snakemake(repo, workdir, *targets, timeout=1800)
    print(f"families pipeline: {time.perf_counter() - start:.0f} s")
    return workdir, cfg["transformers"]["models"]


@pytest.fixture(scope="module")
def families_in_process(repo, tmp_path_factory):
    """Every model of modern_test.yaml through the kernels of random_model,
    extract_weights, spectra, propagate and steer (the scripts' calls, in order, with the
    validated configuration's settings), into the workflow's file layout."""
    workdir = tmp_path_factory.mktemp("families_in_process")
    cfg = validate_config(load_yaml(repo / "config" / "modern_test.yaml"))
    tcfg = cfg["transformers"]
    models = tcfg["models"]
    dirs: dict[str, Path] = {}
    # twins after the models they are like
    for name in sorted(models, key=lambda m: bool(models[m].get("like"))):
        spec = models[name]
        folder = workdir / "resources" / "models" / name
        config = dirs[spec["like"]] if spec.get("like") else spec["config"]
        dirs[name] = sources.make_random_model(config, folder / "random", seed=int(spec["seed"]))
        manifest_path = folder / "manifest.json"
        contracts.write_manifest(manifest_path, dirs[name], {"source": "random", "revision": ""})
        manifest = contracts.read_manifest(manifest_path)
        out = workdir / "results" / "transformers" / name
        extract.extract_to_h5(dirs[name], out / "weights.h5", source="random", revision="",
                              made_from=lineage.record(manifest_path, manifest))  # fmt: skip
        mw = contracts.read_weights_h5(out / "weights.h5", lazy=True)
        ds = spectra.spectra_dataset(mw, eta=float(tcfg["eta"]))
        write_netcdf(out / "spectra.nc", ds)
        directions = spectra.block_directions(ds, str(out / "spectra.nc"))
        ids = hf.prompt_ids(dirs[name], tcfg["prompts"])
        pcfg = tcfg["propagation"]
        with DiskStack() as hidden:  # as the rule: each state to disk as it comes
            hf.streamed_states(
                dirs[name], ids, hidden, device="cpu", dtype=hf.torch_dtype(pcfg["real_dtype"])
            )
            run = propagate.propagation_run(
                mw, hidden, tcfg["eta"], pcfg, seed=int(tcfg["prompts"]["seed"]),
                directions=directions,
            )  # fmt: skip
        write_netcdf(out / "propagation.nc", run.dataset)
        steered = steer.steering_dataset(
            out / "weights.h5", dirs[name], ids, tcfg["eta"], tcfg["steering"],
            seed=int(tcfg["prompts"]["seed"]), null_draws=int(pcfg["null_draws"]),
            directions=directions,
        )  # fmt: skip
        write_netcdf(out / "steering.nc", steered)
    return workdir, models


@pytest.fixture(scope="module", params=["in_process", "workflow"])
def family_files(request):
    """The files of both runs, checked alike."""
    return request.getfixturevalue(
        "families_in_process" if request.param == "in_process" else "families_run"
    )


def test_the_whole_file_plans_every_rule_for_every_model(repo, tmp_path):
    (tmp_path / "config.yaml").write_text((repo / "config" / "modern_test.yaml").read_text())
    jobs = planned_jobs(repo, tmp_path)
    n = len(_all_models())
    configured = sum("config" in spec for spec in _all_models().values())
    assert jobs["random_model"] == n and "fetch_model" not in jobs
    for rule in ("extract_weights", "spectra", "propagate", "steer"):
        assert jobs[rule] == n, rule
    assert configured == n - 1  # every family's twin, and one random twin of a twin


def test_the_workflow_takes_each_distinct_path(families_run):
    _, models = families_run
    if os.environ.get("SPECALIGN_PIPELINE_MODELS"):
        return
    all_models = _all_models()
    assert set(WORKFLOW_MODELS) <= set(all_models)
    types = {all_models[m]["config"]["model_type"] for m in models if "config" in all_models[m]}
    assert "llama" in types


def _all_models():
    path = Path(__file__).parents[2] / "config" / "modern_test.yaml"
    return yaml.safe_load(path.read_text())["transformers"]["models"]


def _files(workdir, model, name):
    return workdir / "results" / "transformers" / model / name


def test_every_supported_family_runs(family_files):
    workdir, models = family_files
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
    configured = {spec["config"]["model_type"] for spec in models.values() if spec.get("config")}
    assert set(seen) == configured
    if len(models) == len(_all_models()):
        assert set(seen) == set(FAMILIES) - set(PAPER_FAMILIES)
        assert sorted(seen["opt"]) == ["post", "pre"]  # OPT-350m's layout and OPT-125m's


def test_every_mode_and_the_residual_stream(family_files):
    workdir, models = family_files
    for model in models:
        with xr.open_dataset(_files(workdir, model, "propagation.nc")) as ds:
            assert list(ds["mode"].values) == list(MODES), model
            for mode in ("simplified_real", "real_model", "prolonged_real"):
                g = ds["gamma"].sel(mode=mode).values
                layers = np.isfinite(g).all(axis=1).sum()
                assert layers >= 2 and np.nanmax(g) <= 1 + 1e-12, (model, mode)
            assert np.isfinite(ds["gamma_null"].sel(mode="real_model")).any()


def test_steering_through_each_family(family_files):
    workdir, models = family_files
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
