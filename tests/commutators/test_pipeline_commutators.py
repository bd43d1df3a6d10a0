"""End to end: the real Snakefile on config/test.yaml in a temporary working directory.

Checks the data contracts of trajectories.h5 and diagnostics.nc, that a second run does
nothing, and that a config change reruns only what depends on it.
"""

import shutil

import h5py
import numpy as np
import pytest
import xarray as xr
import yaml
from snakemake_helpers import planned_jobs, run_snakemake

pytestmark = pytest.mark.pipeline


def test_diagnostics_refuse_trajectories_of_other_settings(finished_run):
    """Issue 29 (4): trajectories.h5 records the training settings it was made with and
    the diagnostics job checks them against the ones the configuration asks for (every
    diagnostics job of the finished run passed that check); an ensemble of another
    depth, width, seeds or schedule is refused naming the file and each setting that
    differs, with both values."""
    from specalign.commutators.contracts import check_trajectories_config, read_trajectories
    from specalign.io import InputFileError

    cfg = yaml.safe_load((finished_run / "config.yaml").read_text())
    for name in cfg["commutators"]["experiments"]:
        path = finished_run / "results" / "commutators" / name / "trajectories.h5"
        traj = read_trajectories(path)
        asked = dict(traj["config"])
        check_trajectories_config(traj, asked)
        for key, value in (("width", asked["width"] + 1), ("hidden", asked["hidden"] + 1),
                           ("seeds", asked["seeds"] * 2)):  # fmt: skip
            with pytest.raises(InputFileError) as err:
                check_trajectories_config(traj, {**asked, key: value})
            message = str(err.value)
            assert (
                str(path) in message
                and f"{key} {asked[key]} (the configuration: {value})" in message
            )
            assert "\n" not in message
        training = {**asked["training"], "lr": asked["training"]["lr"] * 2}
        with pytest.raises(InputFileError, match="training"):
            check_trajectories_config(traj, {**asked, "training": training})


def test_trajectories_contract(finished_run):
    cfg = yaml.safe_load((finished_run / "config.yaml").read_text())
    for name, exp in cfg["commutators"]["experiments"].items():
        path = finished_run / "results" / "commutators" / name / "trajectories.h5"
        with h5py.File(path) as f:
            S = exp["seeds"]
            iteration = f["checkpoints/iteration"][()]
            labels = [s.decode() if isinstance(s, bytes) else s for s in f["checkpoints/label"][()]]
            C = len(labels)
            assert iteration.shape == (S, C) and iteration.dtype.kind == "i"
            widths = [f["X_train"].shape[1]] + [exp["width"]] * exp["hidden"] + [1]
            for layer in range(exp["hidden"] + 1):
                W = f[f"weights/W{layer}"]
                assert W.shape == (S, C, widths[layer + 1], widths[layer])
                assert W.dtype == np.float64
                unreached = iteration == -1
                assert np.isnan(W[()][unreached]).all()
                assert np.isfinite(W[()][~unreached]).all()
            assert f["risk/train"].shape[0] == S
            assert "config" in f.attrs
            if exp["kind"] == "synthetic":
                assert "X_diag" in f
            else:
                assert "X_test" in f and "y_test" in f
            assert any(lbl.startswith("r<=") for lbl in labels)
            assert any(lbl.startswith("t=") for lbl in labels)


def test_diagnostics_contract(finished_run):
    cfg = yaml.safe_load((finished_run / "config.yaml").read_text())
    for name, exp in cfg["commutators"]["experiments"].items():
        path = finished_run / "results" / "commutators" / name / "diagnostics.nc"
        with xr.open_dataset(path, engine="h5netcdf") as ds:
            for var in [
                "G_D",
                "G_Q",
                "G_S",
                "e_tr",
                "e_imb",
                "e_fluc",
                "e_gate",
                "rho_tr_imb",
                "I_tr_imb",
                "chi",
                "res_recursion",
                "res_transport",
            ]:
                assert ds[var].dims == ("seed", "checkpoint", "layer"), var
            for var in ["q_D", "q_Q_av", "q_S_av"]:
                assert ds[var].dims[:3] == ("seed", "checkpoint", "layer")
            assert ds.sizes["layer"] == exp["hidden"]
            assert ds.sizes["seed"] == exp["seeds"]
            assert float(ds["res_recursion"].max()) < 1e-12
            assert float(ds["res_transport"].max()) < 1e-10
            # The last hidden layer has no downstream commutator: rho_tr_imb undefined.
            assert np.isnan(ds["rho_tr_imb"].isel(layer=-1)).all()


def test_tables_figures_report(finished_run):
    for t in range(1, 7):
        assert (finished_run / "results" / "tables" / "commutators" / f"table{t}.csv").exists()
        assert (finished_run / "results" / "tables" / "commutators" / f"table{t}.md").exists()
    for f in range(1, 6):
        assert (finished_run / "results" / "figures" / "commutators" / f"figure{f}.png").exists()
    text = (finished_run / "results" / "reproduction.md").read_text()
    assert "Table 2" in text


def test_second_run_does_nothing(repo, finished_run):
    assert planned_jobs(repo, finished_run) == {}


def test_config_change_reruns_only_dependants(repo, finished_run, tmp_path):
    work = tmp_path / "w"
    shutil.copytree(finished_run, work, symlinks=True)
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["commutators"]["experiments"]["tiny_rescale"]["seeds"] = 3
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(repo, work)
    # The rescale ensemble retrains and is re-diagnosed; its data are unchanged;
    # the other experiments are untouched; summaries that read it are redone.
    assert jobs.get("train_ensemble") == 1
    assert jobs.get("diagnostics") == 1
    assert "prepare_data" not in jobs
    assert jobs.get("commutator_tables") == 1

    cfg["plots"]["dpi"] = 61
    cfg["commutators"]["experiments"]["tiny_rescale"]["seeds"] = 2
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(repo, work)
    # a plot setting redraws every figure of both studies and nothing else
    assert set(jobs) == {"commutator_figure", "transformer_model_figures", "transformer_overview"}


def test_report_builds_with_captions(repo, finished_run, tmp_path):
    out = tmp_path / "report.html"
    run_snakemake(repo, finished_run, "--report", str(out))
    html = out.read_text()
    assert "Commutator study" in html
    assert "Paper <strong>Table 2</strong>" in html  # a caption, rendered
    assert "Paper <strong>Figure 1</strong>" in html
