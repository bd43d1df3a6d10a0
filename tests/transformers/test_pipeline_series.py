"""End to end: two tiny trained series (shared-weight ALBERT and GPT-2) through the DAG:
training.nc's contract, the report's section (7), and the rerun matrix (a new point
reruns that point and the cross-checkpoint outputs only; a training setting reruns the
training and what depends on it)."""

import json
import os

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml
from snakemake_helpers import (
    SERIES_RULES,
    not_in_fingerprint,
    planned_jobs,
    recorded_jobs,
    recording_env,
    rule_scripts,
    run_snakemake,
    undeclared_results,
)

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
    # every job records the specalign modules it loads (tests/module_recorder)
    run_snakemake(repo, workdir, env=recording_env(workdir))
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
        # the text trained on, by content, and the documents held out, by name
        with xr.open_dataset(workdir / f"results/transformers/series/{name}/run.nc") as run:
            from pydoc_data.topics import topics

            from specalign.transformers.train import training

            pydoc = training.corpus_identity({"kind": "pydoc_topics"})
            assert run.attrs["corpus_sha256"] == pydoc["sha256"]
            held = json.loads(run.attrs["heldout_documents"])
            assert held and set(held) <= set(topics)
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
    # each point described as what it is, from its manifest: in every result file and the
    # per-layer table (which `specalign analyze` prints); the reproduction text names the
    # points in section (7), by series, family and step
    layers = pd.read_csv(workdir / "results/tables/transformers/layers.csv")
    for name, run in series.items():
        for step in (0, 4):
            what = f"trained here: step {step} of the series {name} ({run['family']})"
            model = f"{name}_step{step}"
            for kind in ("spectra", "propagation", "steering"):
                with xr.open_dataset(workdir / f"results/transformers/{model}/{kind}.nc") as ds:
                    assert ds.attrs["weights"] == what, (model, kind)
            assert set(layers.loc[layers["model"] == model, "weights"]) == {what}


def test_the_report_describes_each_point_as_a_trained_checkpoint(repo, series_run, tmp_path):
    """Trained points were listed as "random weights with a configuration written in the
    config": each is the step of its series, with the series' family and length."""
    import html
    import json
    import re

    workdir, series = series_run
    out = tmp_path / "report.html"
    run_snakemake(repo, workdir, "--report", str(out), timeout=600)
    desc = re.search(r'var workflow_desc = ("(?:[^"\\]|\\.)*");', out.read_text()).group(1)
    intro = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", json.loads(desc))).split())
    for name, run in series.items():
        for step in (0, 4):
            assert (
                f"{name}_step{step} : trained here: step {step} of the series {name} "
                f"({run['family']}, {run['steps']} steps)"
            ) in intro, intro
    assert "written in the config" not in intro


def test_every_netcdf_file_reads_as_xarray_reads_it(series_run):
    """The series' own files (training.nc, the checkpoints' analyses) among them."""
    from reading import assert_read_as_xarray_reads

    # one file of each kind (each model's files hold the same variables)
    files = list({p.name: p for p in sorted((series_run[0] / "results").rglob("*.nc"))}.values())
    assert any(p.name == "training.nc" for p in files)
    for path in files:
        assert_read_as_xarray_reads(path)


def test_training_rules_load_only_what_their_fingerprint_covers(repo, series_run):
    """The series run's half of tests/workflow/test_fingerprint.py: each job of the
    training rules (and of the analysis of its checkpoints) loaded only specalign modules
    that its script's rerun fingerprint follows."""
    scripts = rule_scripts(repo)
    jobs = recorded_jobs(series_run[0])
    ran = {rule for rule, script in scripts.items() if script.name in jobs}
    assert SERIES_RULES <= ran
    assert not_in_fingerprint(scripts, jobs) == {}


def test_every_file_written_is_declared(repo, series_run):
    # series_training wrote training.html undeclared
    assert undeclared_results(repo, series_run[0]) == []


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
    # the torch threads are a training setting: the weights depend on them
    threads = {**series, "a": dict(series["a"], threads=2)}
    (workdir / "config.yaml").write_text(yaml.safe_dump(_config(threads)))
    jobs = planned_jobs(repo, workdir)
    assert jobs["train_model"] == 1 and jobs["trained_checkpoint"] == 2
    (workdir / "config.yaml").write_text(yaml.safe_dump(_config(series)))


def test_diverged_run_recorded_and_later_points_left_out(repo, tmp_path):
    """A run whose loss turns NaN/inf: training.nc is still built from the points below
    the divergence, records the step and the points left out, and the report names it;
    the left-out points' own jobs fail with one line each (the run goes on with
    --keep-going, as for a hub revision that does not exist)."""
    # lr 1e20 without clipping: the first update throws the weights to inf, so step 1's
    # checkpoint is not finite or step 2's loss is not
    run = dict(RUN, family="gpt2", vocab_size=300, lr=1e20, clip=1e20, warmup=0,
               points=[0, 1, 2, 4])  # fmt: skip
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(_config({"d": run})))
    out = run_snakemake(repo, tmp_path, "--keep-going", check=False)
    with xr.open_dataset(tmp_path / "results/transformers/series/d/run.nc") as rec:
        diverged = int(rec.attrs["diverged_step"])
    assert 1 <= diverged <= 2, out[-3000:]
    with xr.open_dataset(tmp_path / "results/transformers/series/d/training.nc") as ds:
        assert int(ds.attrs["diverged_step"]) == diverged
        assert list(ds["step"].values) == [s for s in (0, 1, 2, 4) if s < diverged]
        unused = [s for s in (0, 1, 2, 4) if s >= diverged]
        assert ds.attrs["unused_steps"] == ", ".join(map(str, unused))
        assert np.isfinite(ds["heldout_loss"].values).all()
    for step in unused:
        assert not (tmp_path / f"resources/models/d_step{step}/manifest.json").exists()
        assert f"checkpoint step {step} was not written and is not used" in out
    report = (tmp_path / "results/reproduction.md").read_text()
    assert f"**diverged** at step {diverged}" in report
    assert f"points not analysed: steps {', '.join(map(str, unused))}" in report


def test_training_nc_values_are_the_points_values(series_run):
    """training.nc's cross-checkpoint metrics, read back against each point's own
    spectra.nc, propagation.nc and steering.nc (not the same code path: the values are
    recomputed here from the per-point files with xarray)."""
    workdir, series = series_run
    for name in series:
        with xr.open_dataset(workdir / f"results/transformers/series/{name}/training.nc") as ds:
            ds = ds.load()
        n_layers = ds.sizes["layer"]
        for step in ds["step"].values:
            at = ds.sel(step=step)
            point = workdir / f"results/transformers/{name}_step{int(step)}"
            with xr.open_dataset(point / "spectra.nc") as spec:
                lb = spec["layer_block"].values.astype(int)
                radius = spec["spectral_radius"].values[lb]
                np.testing.assert_allclose(at["spectral_radius"].values, radius[:n_layers])
            with xr.open_dataset(point / "propagation.nc") as prop:
                for mode in ds["mode"].values:
                    pm = prop.sel(mode=mode)
                    # the layers this mode has: where its random-direction null is defined
                    has = np.isfinite(pm["gamma_null"]).any("token").values
                    layers = pm.isel(layer=np.flatnonzero(has))
                    np.testing.assert_allclose(
                        float(at["gamma"].sel(mode=mode)),
                        float(layers["gamma"].mean(skipna=True)),
                        rtol=1e-12,
                    )
                    psi = layers["psi"].mean("token", skipna=True).values[:n_layers]
                    np.testing.assert_allclose(
                        at["psi_layer"].sel(mode=mode).values[: len(psi)], psi, rtol=1e-12
                    )
                    excess = (layers["rho"] - layers["rho_null"]).values[:n_layers]
                    np.testing.assert_allclose(
                        at["rho_minus_null_layer"].sel(mode=mode).values[: len(excess)],
                        excess,
                        rtol=1e-12,
                    )
            with xr.open_dataset(point / "steering.nc") as steer:
                for method in ds["method"].values:
                    for c in ds["c"].values:
                        # a mapping: `method` is also .sel's own keyword
                        g = steer["gamma_u"].sel({"method": method, "c": c})
                        gain = (g.sel(variant="steered") - g.sel(variant="original")).mean(
                            skipna=True
                        )
                        np.testing.assert_allclose(
                            float(at["steer_gain"].sel({"method": method, "c": c})), float(gain),
                            rtol=1e-12,
                        )  # fmt: skip
        with xr.open_dataset(workdir / f"results/transformers/series/{name}/run.nc") as run:
            ck = list(run["checkpoint"].values)
            for step in ds["step"].values:
                np.testing.assert_allclose(
                    float(ds["heldout_loss"].sel(step=step)),
                    float(run["heldout_loss"].values[ck.index(step)]),
                )


def test_reruns_on_the_corpus(repo, series_run):
    """The corpus is a training setting: another corpus reruns the training of that series
    (and what depends on it), and so does an edit of a corpus file's text."""
    import time

    from specalign.transformers.train import training

    workdir, series = series_run
    corpus = workdir / "corpus.txt"
    docs = training.load_corpus({"kind": "pydoc_topics"})[:30]
    corpus.write_text("\n\n".join(docs) + "\n")
    moved = {**series, "a": dict(series["a"], corpus={"kind": "file", "path": str(corpus)})}
    (workdir / "config.yaml").write_text(yaml.safe_dump(_config(moved)))
    jobs = planned_jobs(repo, workdir)
    assert jobs["train_model"] == 1 and jobs["trained_checkpoint"] == 2
    assert jobs["series_training"] == 1
    # a person's files in the checkpoints' folder: kept when the run is retrained
    # (Snakemake removed the whole folder, a directory() output, before the job ran)
    ckpts = workdir / "resources/models/a.checkpoints"
    (ckpts / "important.txt").write_text("mine\n")
    (ckpts / "step99").mkdir()
    (ckpts / "step99" / "notes.txt").write_text("mine too\n")
    # (last in this module: it leaves series a trained on the file)
    run_snakemake(repo, workdir, "results/transformers/series/a/run.nc")
    assert (ckpts / "important.txt").read_text() == "mine\n"
    assert (ckpts / "step99" / "notes.txt").read_text() == "mine too\n"
    record = json.loads((ckpts / "checkpoints.json").read_text())
    assert sorted(record["checkpoints"], key=int) == ["0", "1", "2", "4"]
    # published with the modes the umask gives any new folder and file (mkdtemp's
    # 0700 and safetensors' 0600 were left on them)
    from specalign.io import new_file_mode

    for step in record["checkpoints"]:
        folder = ckpts / f"step{step}"
        assert folder.stat().st_mode & 0o777 == new_file_mode(folder=True), folder
        for file in folder.iterdir():
            assert file.stat().st_mode & 0o777 == new_file_mode(), file
    assert "train_model" not in planned_jobs(repo, workdir)
    # the text edited in place, its modification time set back (cp -p, rsync -a)
    st = corpus.stat()
    corpus.write_text("\n\n".join(docs[1:]) + "\n")
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns))
    jobs = planned_jobs(repo, workdir)
    assert jobs["train_model"] == 1 and jobs["series_training"] == 1
    time.sleep(1.1)  # a later modification time than run.nc's
    corpus.write_text("\n\n".join(reversed(docs)) + "\n")
    jobs = planned_jobs(repo, workdir)
    assert jobs["train_model"] == 1 and jobs["series_training"] == 1
    # a person's folder where a longer run would write its step 8: refused when
    # planning, in one line naming it, not when the training job starts
    (ckpts / "step8").mkdir()
    longer = {**moved, "a": dict(moved["a"], steps=8, points=[0, 8])}
    (workdir / "config.yaml").write_text(yaml.safe_dump(_config(longer)))
    out = run_snakemake(repo, workdir, "-n", check=False)
    assert "a.checkpoints/step8: not written by this workflow" in out, out[-3000:]
    assert "transformers.series.a:" in out and "Traceback" not in out
    (ckpts / "step8").rmdir()
    (workdir / "config.yaml").write_text(yaml.safe_dump(_config(series)))
