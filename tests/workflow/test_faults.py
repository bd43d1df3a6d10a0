"""Faults and bad input, each with nothing lost.

One tiny configuration (``FAULT_CONFIG``: an ensemble whose training takes a few
seconds and one whose learning rate blows up) is run once, uninterrupted, and reused:

* a second uninterrupted run in another folder must be bit-identical (determinism);
* a run killed with SIGKILL in the middle of training must leave no complete-looking
  output of the killed job, and its resumption must be bit-identical to the reference;
* a truncated or overwritten HDF5 input, or a truncated netCDF input, of a finished run
  must fail the consuming rule with the file named, and nothing downstream may run;
* the diverging ensemble must be recorded as diverged and left out of every summary,
  with its count;
* dataset, mirror, model-family and offline-hub problems give one-line errors that name
  the thing and say the fix.

Every test records what it tried and what happened in a session summary (lines starting
with ``FAULTS:``); with ``SPECALIGN_FAULTS_MD=docs/faults.md`` the summary is also
written as the markdown table of ``docs/faults.md``.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import signal
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

from specalign.compare import compare_files, compare_trees

pytestmark = pytest.mark.pipeline

SNAKEMAKE = [sys.executable, "-m", "snakemake"]
TIMEOUT = 600  # seconds, for every snakemake call (a hung run fails instead of blocking)
TARGET = "results/tables/commutators/table1.csv"  # data -> training -> diagnostics -> tables

#: ``slow`` trains long enough (a few seconds) to be killed in the middle; ``blowup``
#: has a learning rate that blows up most seeds (H = 3, width 32, c = 1: the
#: network of paper Table 6, so the tables summarise it at t = 100).
FAULT_CONFIG: dict[str, Any] = {
    "threads": 1,
    "commutators": {
        "training": {
            "lr": 0.05,
            "iterations": 2500,
            "risk_levels": [0.1, 0.01, 0.001],
            "times": [15],
        },
        "experiments": {
            "slow": {"kind": "synthetic", "hidden": 4, "width": 32, "seeds": 3}
            | {"n_train": 40, "n_diag": 64},
            "blowup": {
                "kind": "synthetic",
                "hidden": 3,
                "width": 32,
                "seeds": 6,
                "n_train": 40,
                "n_diag": 64,
                # 5 of the 6 seeds blow up past 1e6 R(0) (two of them would then
                # collapse to a dead constant network, three overflow); seed 2 converges
                "training": {"lr": 0.5, "iterations": 200, "risk_levels": [0.1]}
                | {"times": [0, 100]},
            },
        },
    },
    "plots": {"formats": ["png"], "dpi": 40},
}


# --------------------------------------------------------------------------------------
# Session summary of what was tried (shared with test_fuzz.py)
# --------------------------------------------------------------------------------------

FAULTS_PLUGIN = "specalign-faults"
#: Row order of the summary and of docs/faults.md.
FAULT_ORDER = [
    "determinism",
    "kill",
    "corrupt_h5",
    "corrupt_nc",
    "h5_bitflip",
    "diverge",
    "messages",
    "fuzz_invalid",
    "fuzz_snakemake_invalid",
    "fuzz_valid",
    "fuzz_valid_runs",
    # the held-out pass of issue 10 (test_faults_silent_or_late.py)
    "twin",
    "cache_checksum",
    "orphan",
    "collapse",
    "nonfinite",
    "model_folders",
    "late_errors",
    "reported_inputs",
    "file_modes",
    # the third pass, issue 18 (test_faults_stale.py)
    "content_inputs",
    "content_walk",
    "foreign_results",
    "workbook_ownership",
    "memory_request",
]

#: Issue 18's cases checked without a workflow run: (case, what happens now, test).
UNIT_ROWS = [
    (
        "Qwen3 checkpoint in the hub's block-wise FP8 layout (`quantization_config` fp8, "
        "`weight_block_size` [16, 16], float8 codes with `weight_scale_inv`)",
        "dequantized W = q x s per block (exactly, float64); \\|F\\| within 5 % of the "
        "unquantized model's (it was the codes: 1e4-1e7 x too large); the streamed "
        "real-model passes do not dequantize: fetch_model refuses it for them naming the "
        "scheme, before any long job",
        "`tests/transformers/test_checkpoints.py::test_fp8_block_quantized_weights_are_dequantized`",
    ),
    (
        "float8 codes whose `_scale_inv` is missing; gptq, awq, bitsandbytes, per-tensor "
        "fp8 (4 schemes)",
        "one line naming the file and tensor, or config.json and the scheme, before any "
        "tensor is read",
        "`test_fp8_codes_without_their_scales_are_refused`, "
        "`test_other_quantization_schemes_are_refused_naming_the_scheme`",
    ),
    (
        "a weight stored as int8, uint8, int32 (3 dtypes); int64 `position_ids` buffer",
        "weights: one line naming file and tensor; buffers accepted",
        "`test_integer_weight_tensor_is_an_error_naming_file_and_tensor`, "
        "`test_integer_buffers_are_not_weights`",
    ),
    (
        "a layer lacking `k_proj`; the last layer missing; an index naming a deleted shard",
        "one line naming the tensor (or the shard) and the file, at fetch_model and extraction",
        "`test_a_layer_lacking_a_tensor_is_named`, `test_a_missing_last_layer_is_named`, "
        "`test_index_naming_a_missing_shard_is_one_line_naming_it`",
    ),
    (
        "Mistral's `consolidated.safetensors` beside the shards (with and without index); on a hub",
        "counted once (parameters equal the shards'); never downloaded",
        "`test_consolidated_safetensors_beside_the_shards_is_counted_once`, "
        "`tests/transformers/test_hub.py::test_download_fetches_data_files_only`",
    ),
    (
        "safetensors header truncated, length 2^40, 5-byte file, not JSON, data past the "
        "end (5 cases)",
        "one line naming the file (header length bounded by 100 MB and the file size); the "
        "resource estimate falls back to config.json's counts, so `snakemake -n` goes on",
        "`test_damaged_header_is_named_and_bounded`, "
        "`test_a_2_to_the_40_header_length_is_refused_without_reading_it`",
    ),
    (
        "tokenizer.json truncated",
        "an error naming the file (random prompts no longer change silently)",
        "`test_a_damaged_tokenizer_json_is_an_error_naming_it`",
    ),
    (
        "`auto_map` to tokenizer code in the folder, `yes` on stdin (2 cases); hub patterns",
        "code never runs (`trust_remote_code=False`; the family's class is used); "
        "tokenizer.py/vocab.py never fetched",
        "`test_tokenizer_code_in_the_model_folder_never_runs`, "
        "`test_download_fetches_data_files_only`",
    ),
    (
        "prompts.text_file missing, empty, white space only, binary (4 cases)",
        "rejected at validation naming the key and the file",
        "`tests/workflow/test_faults_stale.py::test_prompt_text_file_fails_at_validation`",
    ),
    (
        "a prompt file whose lines hold U+2028, U+2029, U+0085, form feeds or the "
        "separators U+001C-U+001E; CRLF and CR line ends (8 separators, 3 line ends)",
        "one prompt per line as written: a line ends at a line feed or carriage return only "
        "(`hf.prompt_lines`; str.splitlines cut one prompt into two)",
        "`tests/transformers/test_dynamics.py::test_prompt_lines_end_at_line_feeds_only`",
    ),
    (
        "sphere.steps 1 to 4; a sphere run whose gamma reaches 1 in one step (eigenvalues "
        "[1, 0, 0], eta 1e5)",
        "steps below `sphere.rate_min_steps()` (5, the schema's minimum) refused at "
        "validation naming the key; where the data leave too few layers for a fit, "
        "rate_measured is NaN, `rate_note` says why, and the report calls the rate "
        'undecided (the job failed late: "too few layers ... to measure a rate")',
        "`tests/transformers/test_outputs.py::test_sphere_steps_at_least_what_a_rate_needs`",
    ),
    (
        "steering.c 0 (u sent into the null space of F')",
        "the residual is relative to r, the old spectral radius, where \\|c r\\| is 0: "
        'round-off (it read 2e291 against the smallest float, and the verdict "u is not an '
        'eigenvector"); other c unchanged',
        "`tests/transformers/test_steering.py::test_steering_to_zero_is_measured_against_the_spectral_radius`",
    ),
    (
        "a commutator experiment's trajectories.h5 trained under other settings (another "
        "width, depth, seed count, learning rate)",
        "the diagnostics job compares the settings recorded in the file with those the "
        "configuration asks for and refuses a mismatch before any work, naming the file and "
        "each setting with both values (it reported the other ensemble as this one)",
        "`tests/commutators/test_pipeline_commutators.py::test_diagnostics_refuse_trajectories_of_other_settings`",
    ),
    (
        "`specalign analyze` with a hub id the hub library refuses (`nobody/bad..name`, "
        "`nobody/-name`; offline and online), `--out` under a file, `--profile` of a "
        "missing folder, `--prompts 100000000` (beyond this machine's memory); a hub id the "
        "hub refuses in `transformers.models` or `.series`",
        "status 2 and one line naming the id, the folder, the profile or n_prompts (with "
        "the largest count that fits), before any job (each was status 1: a traceback, or "
        "Snakemake's error); the configuration refuses the id naming its key. One mechanism "
        "each: `sources.hub_id_problem` (the hub library's validator) for the CLI and the "
        "configuration, `limits.memory_limit_problems` for the workflow and the CLI",
        "`tests/test_cli.py::test_bad_input_exits_2_with_one_line`, "
        "`tests/workflow/test_config.py::test_bad_config_names_the_key`",
    ),
    (
        "`specalign analyze ./a/m ./b/m_random ./c/m_random_random`",
        "every model keeps its own twin: a name that reads as another's twin takes its "
        "folder (`b--m_random`), so no twin is replaced by a model the user named (the "
        "user's m_random was written over m's twin and reported as it)",
        "`tests/test_cli.py::test_twin_names_never_collide_with_a_model_named`",
    ),
    (
        "`~/...`, `$VAR/...` and `${VAR}/...` at every path setting (found by walking the "
        "schema for `format: path`); a variable that is not set",
        "expanded once at validation, so that checks and jobs read the same path (`~` was "
        "expanded by some checks only, and never for the jobs; `$VAR` nowhere); an unset "
        "variable refused naming the key",
        "`tests/workflow/test_fuzz.py::test_every_path_setting_expanded_once`",
    ),
    (
        "steering.c 1e308, -1e300, 1e200",
        "rejected at validation (\\|c\\| <= 1e6, schema)",
        "`test_huge_steering_strength_is_refused`",
    ),
    (
        "rope_scaling dynamic, longrope beyond original_max_position_embeddings; llama3, "
        "linear, yarn",
        "the first two refused naming the type and n_tokens; the others exact (the family's "
        "own table)",
        "`test_length_dependent_rope_scaling_refused_beyond_its_original_length`",
    ),
    (
        "n_prompts 2e6 against 24000 MB; a 500 MB limit",
        "refused naming n_prompts (with the largest count that fits) or the model, and both "
        "numbers",
        "`test_memory_request_beyond_the_limit_is_refused_naming_the_key`",
    ),
    (
        "a base model's checkpoint without its output head (a Pythia-style hub repository "
        "of `GPTNeoXModel`) under steering",
        "the head is not drawn at random (it was, unseeded: other probabilities at every "
        "run); the simplified steering is measured, the next-token probabilities stay NaN, "
        "and `probs_warning` says why in steering.nc, the job's log, the steering table's "
        "caption and the reproduction report",
        "`tests/transformers/test_streaming.py::test_steering_a_base_checkpoint_draws_no_head`",
    ),
]

_MD_HEAD = """\
# Faults and bad input

What the fault-injection tests (`tests/workflow/test_faults.py`,
`tests/workflow/test_fuzz.py`, the held-out pass in
`tests/workflow/test_faults_silent_or_late.py` and the pass on stale inputs and checkpoints in
`tests/workflow/test_faults_stale.py`, with the comparison tool `specalign.compare`
tested in `tests/workflow/test_compare.py`) do to the workflow, and what happened. Every
row is a test that passes; the counts are those of the last regeneration of this file:

```bash
SPECALIGN_FAULTS_MD=docs/faults.md pytest -q tests/workflow/test_faults.py \
    tests/workflow/test_fuzz.py tests/workflow/test_faults_silent_or_late.py \
    tests/workflow/test_faults_stale.py
```

The same counts are printed at the end of every run of these tests (lines starting
with `FAULTS:`).

| fault | what was tried | what happened | counts |
| --- | --- | --- | --- |
"""

_MD_TAIL = """
Notes

* Comparisons are bitwise (`python -m specalign.compare DIR_A DIR_B`): every dataset,
  variable and attribute of every `.h5` and `.nc` file, NaN equal to the same NaN;
  tables (`.csv`, `.md`) are compared byte for byte.
* After a SIGKILL, Snakemake's own lock stays behind: the next run stops with
  `LockException` and the advice to run `snakemake --unlock`; after that the rerun
  (with `--rerun-incomplete` from `profiles/default`) completes.
* Every numeric dataset of our HDF5 and netCDF outputs carries a Fletcher-32 checksum:
  a flipped bit inside a dataset's bytes fails the read (row `h5_bitflip`), as do
  truncation and a damaged file header.
* When only the main Snakemake process dies (row `orphan`), its running jobs were
  started as its children: each job remembers the Snakemake processes it descends from
  (PID and start time), a watchdog thread stops the job within half a second of their
  loss, and every atomic rename checks them first, so an orphan never publishes.
  Recovery: `snakemake --unlock`, then rerun with any settings.
* Rows `twin` to `file_modes` are the held-out pass: each was a case where a
  result was silently wrong, data was lost, or an error came late without naming its
  cause; each row says what happens now.

Mechanisms

Each kind of bad input or fault goes through one mechanism, tested over every key or
rule rather than case by case:

* **One configuration gate** (`specalign.config.validate_config`, the JSON schema plus
  one pass of its own over it): every entry point (`snakemake`, `--config`,
  `specalign analyze`, the Python API, modules) validates through it before any job.
  Duplicate YAML keys are refused naming both lines (`load_yaml`), non-finite numbers
  naming the key, paths expanded once (`_expand_paths`) and each checked against what
  the schema says it names (`x-path`: a folder to write in, a folder or a UTF-8 text
  or JSON file to read; `config.path_problem`, walked over every site by
  `test_fuzz.py::test_every_path_setting_is_checked_for_what_it_names`), `like:`
  cycles named once.
  Property test (row `fuzz_property`, in `tests/workflow/test_fuzz.py`):
  `test_any_value_at_any_key_is_accepted_or_refused_naming_the_key`, beside the
  schema walks (rows `fuzz_invalid`, `fuzz_snakemake_invalid`).
* **Every input a person can change, by content**: `track_inputs_by_content`
  (rules/common.smk) gives every rule the content digest (`specalign.contents`) of each
  input of the job that no rule makes, derived from the job's inputs; the files a job
  reads from a person (model folders and tokenizers, prompt files, config files,
  corpora, workbooks) are its inputs. Test: the walk over every such input of every
  job of a run of both studies (row `content_walk`).
* **Nothing removed that the workflow did not make**: one ownership marker
  (`specalign.io.OWNER_MARKER`) on every folder the workflow makes (random models, the
  hub cache, a series' checkpoints and each step folder), the writer's metadata in
  every figure (`specalign.output.written_here`), a marker on each results folder
  (`specalign.workflow.RESULTS_MARKER`); a removal asks them first. Tests: rows
  `model_folders` and `workbook_ownership`;
  `test_training.py::test_clearing_checkpoints_removes_only_what_a_run_wrote`,
  `test_pipeline_series.py::test_reruns_on_the_corpus`,
  `tests/workflow/test_results_folder.py` (figures, nested results folders),
  `test_hub.py::test_a_persons_hub_cache_keeps_its_snapshot_folders` (the last three
  in `tests/transformers/`).
* **A result only from what it names**: every file a later rule reads records what it
  was made from (`specalign.transformers.lineage`: the model manifest and the settings;
  a series' checkpoints.json: each checkpoint's content), and every reader checks it
  (row `foreign_results`).
"""


class FaultLog:
    """What each fault test tried and what happened, printed as ``FAULTS:`` lines."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, str, dict[str, Any]]] = {}

    def record(self, key: str, tried: str, outcome: str, **counts: Any) -> None:
        self.rows[key] = (tried, outcome, counts)

    def _ordered(self) -> list[str]:
        known = [k for k in FAULT_ORDER if k in self.rows]
        return known + sorted(k for k in self.rows if k not in FAULT_ORDER)

    def lines(self) -> list[str]:
        out = []
        for key in self._ordered():
            counts = " ".join(f"{k}={v}" for k, v in self.rows[key][2].items())
            out.append(f"FAULTS: {key} {counts}".rstrip())
        return out

    def markdown(self) -> str:
        rows = []
        for key in self._ordered():
            tried, outcome, counts = self.rows[key]
            text = ", ".join(f"`{k}={v}`" for k, v in counts.items())
            rows.append(f"| `{key}` | {tried} | {outcome} | {text} |")
        unit = [f"| {case} | {outcome} | {test} |" for case, outcome, test in UNIT_ROWS]
        return (
            _MD_HEAD
            + "\n".join(rows)
            + "\n\nStale inputs and checkpoints, the cases checked without a workflow run "
            "(each a test that passes):\n\n"
            "| case | what happens now | test |\n| --- | --- | --- |\n"
            + "\n".join(unit)
            + "\n"
            + _MD_TAIL
        )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """On a pytest-xdist worker: hand the rows to the controller, which prints them
        (tests/conftest.py, pytest_testnodedown)."""
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput["faults"] = json.dumps(self.rows, default=str)

    def merge(self, rows_json: str) -> None:
        """Rows a worker recorded (:meth:`pytest_sessionfinish`)."""
        for key, (tried, outcome, counts) in json.loads(rows_json).items():
            self.record(key, tried, outcome, **counts)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.rows:
            return
        terminalreporter.section("fault injection")
        for line in self.lines():
            terminalreporter.write_line(line)
        target = os.environ.get("SPECALIGN_FAULTS_MD")
        if target:
            Path(target).write_text(self.markdown())
            terminalreporter.write_line(f"FAULTS: table written to {target}")


def fault_log(config: pytest.Config) -> FaultLog:
    """The session's FaultLog (registered as a plugin on first use)."""
    plugin = config.pluginmanager.get_plugin(FAULTS_PLUGIN)
    if plugin is None:
        plugin = FaultLog()
        config.pluginmanager.register(plugin, FAULTS_PLUGIN)
    return plugin


@pytest.fixture
def faults(request: pytest.FixtureRequest) -> FaultLog:
    return fault_log(request.config)


# --------------------------------------------------------------------------------------
# Running the workflow
# --------------------------------------------------------------------------------------


def snakemake_cmd(repo: Path, workdir: Path, *args: str, cores: int = 2) -> list[str]:
    return [
        *SNAKEMAKE,
        "-s",
        str(repo / "Snakefile"),
        "-d",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--cores",
        str(cores),
        *args,
    ]


def run_concurrently(
    repo: Path, workdirs: list[Path], *args: str, cores: int = 1, ok: bool = True
) -> list[str]:
    """Run snakemake in several working directories at once (each with ``cores``); all
    must end within TIMEOUT and succeed (``ok``) or fail. Returns each run's stdout and
    stderr (also in its snakemake.txt)."""
    started = []
    deadline = time.monotonic() + TIMEOUT
    try:
        for workdir in workdirs:
            with open(workdir / "snakemake.txt", "w") as out:
                proc = subprocess.Popen(
                    snakemake_cmd(repo, workdir, *args, cores=cores),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started.append(proc)
        for proc in started:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in started:
            if proc.poll() is None:  # timed out or interrupted: take its jobs down too
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
    outs = [(w / "snakemake.txt").read_text() for w in workdirs]
    for workdir, proc, out in zip(workdirs, started, outs, strict=True):
        if ok and proc.returncode != 0:
            raise AssertionError(
                f"snakemake failed in {workdir} ({proc.returncode}):\n{out[-6000:]}"
            )
        if not ok and proc.returncode == 0:
            raise AssertionError(f"snakemake should have failed in {workdir}:\n{out[-6000:]}")
    return outs


def run_snakemake(repo: Path, workdir: Path, *args: str, ok: bool = True) -> str:
    """Run snakemake (timeout TIMEOUT); returns stdout + stderr, asserts the exit status."""
    proc = subprocess.run(
        snakemake_cmd(repo, workdir, *args), capture_output=True, text=True, timeout=TIMEOUT
    )
    out = proc.stdout + proc.stderr
    if ok and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{out[-6000:]}")
    if not ok and proc.returncode == 0:
        raise AssertionError(f"snakemake should have failed:\n{out[-6000:]}")
    return out


def new_workdir(factory: pytest.TempPathFactory, name: str, config: dict[str, Any]) -> Path:
    workdir = factory.mktemp(name)
    (workdir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return workdir


def compare_outputs(a: Path, b: Path) -> tuple[list[str], dict[str, int]]:
    """HDF5/netCDF of two workdirs' results/ compared bitwise (specalign.compare), every
    other result file (tables, report) byte for byte. Returns differences and counts."""
    ra, rb = a / "results", b / "results"
    diffs = compare_trees(ra, rb)
    data_files = sorted(p.relative_to(ra) for p in ra.rglob("*") if p.suffix in (".h5", ".nc"))
    others_a = {p.relative_to(ra) for p in ra.rglob("*") if p.is_file()} - set(data_files)
    others_b = {p.relative_to(rb) for p in rb.rglob("*") if p.is_file()}
    others_b -= {p for p in others_b if p.suffix in (".h5", ".nc")}
    for rel in sorted(others_a ^ others_b):
        diffs.append(f"{rel}: only in {ra if rel in others_a else rb}")
    for rel in sorted(others_a & others_b):
        if not filecmp.cmp(ra / rel, rb / rel, shallow=False):
            diffs.append(f"{rel}: bytes differ")
    n_items = 0
    for rel in data_files:
        with h5py.File(ra / rel, "r") as f:
            n_items += _count_datasets(f)
    same_bytes = sum(
        filecmp.cmp(ra / rel, rb / rel, shallow=False) for rel in data_files if (rb / rel).exists()
    )
    counts = {
        "data_files": len(data_files),
        "datasets_and_variables": n_items,
        "data_files_byte_identical": same_bytes,
        "other_files": len(others_a),
    }
    return diffs, counts


def _count_datasets(f: h5py.File) -> int:
    n = [0]

    def visit(_name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset):
            n[0] += 1

    f.visititems(visit)
    return n[0]


@pytest.fixture(scope="module")
def two_runs(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two uninterrupted runs of FAULT_CONFIG in two folders, side by side."""
    workdirs = [new_workdir(tmp_path_factory, f"faults_{n}", FAULT_CONFIG) for n in "AB"]
    run_concurrently(repo, workdirs, TARGET, cores=1)
    return workdirs[0], workdirs[1]


@pytest.fixture(scope="module")
def reference(two_runs: tuple[Path, Path]) -> Path:
    """The uninterrupted run every test of this module compares with or damages."""
    return two_runs[0]


def _keep_mtime(path: Path, damage) -> None:
    """Apply ``damage(path)`` but keep the file's times, as if it rotted on disk: the
    mtime trigger then does not rerun its producer."""
    st = path.stat()
    damage(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _zero_header(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.write(b"\0" * 64)  # the HDF5 superblock signature and addresses


# --------------------------------------------------------------------------------------
# Determinism
# --------------------------------------------------------------------------------------


def test_two_runs_are_bit_identical(two_runs, faults):
    reference, other = two_runs
    diffs, counts = compare_outputs(reference, other)
    assert diffs == [], "\n".join(diffs)
    # the command-line tool agrees
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "specalign.compare",
            str(reference / "results"),
            str(other / "results"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    faults.record(
        "determinism",
        "the same config run twice on the CPU in two working directories",
        "every HDF5 dataset and netCDF variable bit-identical (attributes included); "
        "tables byte-identical",
        **counts,
        differences=len(diffs),
    )


# --------------------------------------------------------------------------------------
# SIGKILL in the middle of training
# --------------------------------------------------------------------------------------


def _wait_for_line(path: Path, needle: str, proc: subprocess.Popen, limit: float) -> str:
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if path.exists():
            for line in path.read_text().splitlines():
                if needle in line:
                    return line
        if proc.poll() is not None:
            raise AssertionError(f"snakemake ended ({proc.returncode}) before {needle!r}")
        time.sleep(0.05)
    raise AssertionError(f"no {needle!r} in {path} within {limit} s")


def _group_gone(pgid: int, limit: float = 10.0) -> bool:
    start = time.monotonic()
    while time.monotonic() - start < limit:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_sigkill_during_training_then_resume(repo, reference, tmp_path_factory, faults):
    work = new_workdir(tmp_path_factory, "faults_kill", FAULT_CONFIG)
    traj = work / "results" / "commutators" / "slow" / "trajectories.h5"
    train_log = work / "logs" / "commutators" / "slow" / "train_ensemble.log"
    with open(work / "killed_run.txt", "w") as out:
        proc = subprocess.Popen(
            snakemake_cmd(repo, work, TARGET),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the job dies with it
        )
        try:
            line = _wait_for_line(train_log, "gradient descent:", proc, limit=TIMEOUT)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:  # pragma: no cover - only when the wait failed
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert _group_gone(proc.pid), "a process of the killed run survived"
    killed_at = line.split("gradient descent:")[1].split(",")[0].strip()

    # Nothing of the killed job looks complete: writers are atomic, so there is no file
    # at the final path; every HDF5/netCDF file that does exist is whole and identical
    # to the uninterrupted run's.
    assert not traj.exists()
    leftovers = sorted(p.name for p in (work / "results").rglob("*.part"))
    present = sorted(p for p in (work / "results").rglob("*") if p.suffix in (".h5", ".nc"))
    for path in present:
        rel = path.relative_to(work)
        assert compare_files(reference / rel, path) == [], rel
    incomplete = list((work / ".snakemake" / "incomplete").glob("*"))
    assert incomplete, "snakemake should have marked the running jobs' outputs incomplete"
    # A kill during a write leaves that write's partial (a kill runs no cleanup), which
    # the rerun of its job must remove. Whether this kill caught a write depends on the
    # timing, so one is planted for the killed run's PID, as its writer would have named it.
    from specalign.runtime import writer_tag

    host = writer_tag().split("p")[0]
    planted = traj.with_name(f".{traj.name}.{host}p{proc.pid}s0.planted.part")
    planted.write_bytes(b"half a file")

    # Snakemake's lock survives a SIGKILL: the next run says how to remove it.
    out = run_snakemake(repo, work, TARGET, ok=False)
    assert "LockException" in out and "--unlock" in out
    run_snakemake(repo, work, TARGET, "--unlock")
    out = run_snakemake(repo, work, TARGET)
    assert "profiles/default" in out  # the profile that sets rerun-incomplete
    diffs, counts = compare_outputs(reference, work)
    assert diffs == [], "\n".join(diffs)
    assert not planted.exists()
    faults.record(
        "kill",
        "SIGKILL to the snakemake process group at the first training progress line "
        "(`gradient descent: ...`), then rerun",
        "no trajectories.h5 at the final path, files present were whole; rerun refused "
        "until `--unlock` (Snakemake's lock), then completed bit-identical to an "
        "uninterrupted run, the killed writes' partials (one planted) removed",
        killed_at=killed_at.replace(" ", ""),
        files_present_after_kill=len(present),
        part_files_left=len(leftovers),
        incomplete_markers=len(incomplete),
        differences_after_resume=len(diffs),
        data_files_compared=counts["data_files"],
    )


# --------------------------------------------------------------------------------------
# Corrupt inputs of a finished run
# --------------------------------------------------------------------------------------


def _mtimes(paths: list[Path]) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in paths if p.exists()}


def test_corrupt_trajectories_fail_the_consumer(repo, reference, tmp_path, faults):
    work = tmp_path / "w"
    shutil.copytree(reference, work, symlinks=True)  # copy2: times are kept
    damage = {"slow": _truncate, "blowup": _zero_header}
    trajs = {e: work / "results" / "commutators" / e / "trajectories.h5" for e in damage}
    for exp, fn in damage.items():
        _keep_mtime(trajs[exp], fn)
        (work / "results" / "commutators" / exp / "diagnostics.nc").unlink()
    sizes = {e: p.stat().st_size for e, p in trajs.items()}
    tables = sorted((work / "results" / "tables").rglob("*.*"))
    before = _mtimes(tables)

    # Deleting an intermediate file does not make Snakemake rerun it while the tables
    # built from it are present and newer: ask for the diagnostics explicitly.
    targets = [f"results/commutators/{e}/diagnostics.nc" for e in damage]
    out = run_snakemake(repo, work, *targets, TARGET, "--keep-going", ok=False)
    named = 0
    for exp in damage:
        rel = f"results/commutators/{exp}/trajectories.h5"
        log = (work / "logs" / "commutators" / exp / "diagnostics.log").read_text()
        assert rel in log and "InputFileError" in log, log[-2000:]
        assert rel in out  # the failed job's one console line names it
        named += 1
        assert not (work / "results" / "commutators" / exp / "diagnostics.nc").exists()
        # the producer was not rerun: the damaged file is still there, untouched
        assert trajs[exp].stat().st_size == sizes[exp]
    assert "rule train_ensemble:" not in out
    assert "rule commutator_tables:" not in out
    assert _mtimes(tables) == before  # no table was rebuilt
    faults.record(
        "corrupt_h5",
        "trajectories.h5 of a finished run truncated to half (one experiment) or its "
        "first 64 bytes zeroed (the other), mtime kept, diagnostics.nc deleted",
        "rule `diagnostics` failed for both with an InputFileError naming the file; "
        "producer not rerun; tables not rebuilt",
        files_damaged=len(damage),
        jobs_failed_naming_file=named,
        tables_rebuilt=sum(_mtimes(tables)[p] != before[p] for p in before),
    )


def test_corrupt_diagnostics_fail_the_tables(repo, reference, tmp_path, faults):
    work = tmp_path / "w"
    shutil.copytree(reference, work, symlinks=True)
    nc = work / "results" / "commutators" / "slow" / "diagnostics.nc"
    _keep_mtime(nc, _truncate)
    (work / "results" / "tables" / "commutators" / "table1.csv").unlink()  # force the rule
    tables = sorted((work / "results" / "tables").rglob("*.*"))
    before = _mtimes(tables)

    out = run_snakemake(repo, work, TARGET, ok=False)
    rel = "results/commutators/slow/diagnostics.nc"
    log = (work / "logs" / "commutators" / "tables.log").read_text()
    assert rel in log and "InputFileError" in log, log[-2000:]
    assert rel in out
    assert "rule diagnostics:" not in out  # the producer was not rerun
    after = _mtimes(tables)
    rebuilt = [p for p in after if after[p] != before.get(p)]
    assert rebuilt == [], rebuilt  # removed by Snakemake as outputs of a failed job, or kept
    assert not (work / "results" / "tables" / "commutators" / "table1.csv").exists()
    faults.record(
        "corrupt_nc",
        "diagnostics.nc of a finished run truncated to half, mtime kept, a table deleted "
        "to force the table rule",
        "rule `commutator_tables` failed with an InputFileError naming the file; no table written",
        files_damaged=1,
        jobs_failed_naming_file=1,
        tables_rebuilt=len(rebuilt),
    )


def test_bitflip_in_dataset_is_caught_by_checksum(reference, tmp_path, faults):
    """Datasets carry a Fletcher-32 checksum: a flipped bit fails the read, naming the file."""
    from specalign.commutators.contracts import read_trajectories
    from specalign.io import InputFileError

    src = reference / "results" / "commutators" / "slow" / "trajectories.h5"
    bad = tmp_path / "trajectories.h5"
    shutil.copy(src, bad)
    with h5py.File(bad, "r") as f:
        offset = f["weights/W1"].id.get_chunk_info(0).byte_offset
    raw = bytearray(bad.read_bytes())
    raw[offset + 3] ^= 0x01
    bad.write_bytes(bytes(raw))
    with pytest.raises(InputFileError) as err:
        read_trajectories(bad)
    assert str(bad) in str(err.value)
    faults.record(
        "h5_bitflip",
        "one bit flipped inside the stored bytes of weights/W1 of a trajectories.h5",
        "the workflow's reader fails with InputFileError naming the file (Fletcher-32 "
        "checksum of the dataset)",
        detected_by_reader=1,
    )


# --------------------------------------------------------------------------------------
# Divergence
# --------------------------------------------------------------------------------------


def test_diverged_seeds_recorded_and_excluded(reference, faults):
    from specalign.commutators.report.runs import seed_values
    from specalign.commutators.train import DIVERGENCE_FACTOR

    exp = "blowup"
    base = reference / "results" / "commutators" / exp
    with h5py.File(base / "trajectories.h5", "r") as f:
        diverged = f["risk/diverged"][()]
        diverged_at = f["risk/diverged_at"][()]
        risk = f["risk/train"][()]
        iteration = f["checkpoints/iteration"][()]
        labels = [s.decode() for s in f["checkpoints/label"][()]]
    n_div, S = int(diverged.sum()), diverged.size
    assert 0 < n_div < S, "the setting should split the ensemble"
    for s in np.flatnonzero(diverged):
        k = diverged_at[s]
        limit = DIVERGENCE_FACTOR * risk[s, 0]  # or not finite
        assert np.isfinite(risk[s, :k]).all() and (risk[s, :k] <= limit).all()
        assert not risk[s, k] <= limit
        assert np.isnan(risk[s, k + 1 :]).all()
        # no checkpoint after the divergence was taken
        assert ((iteration[s] == -1) | (iteration[s] < k)).all()
    assert (
        "diverged" in (reference / "logs" / "commutators" / exp / "train_ensemble.log").read_text()
    )

    ds = xr.open_dataset(base / "diagnostics.nc", engine="h5netcdf").load()
    np.testing.assert_array_equal(ds["diverged"].values, diverged)
    final = "t=100"
    assert final in labels
    defects = [
        v
        for v in ds.data_vars
        if ds[v].dims[:3] == ("seed", "checkpoint", "layer") and ds[v].dtype.kind == "f"
    ]
    nan_cells = 0
    for v in defects:
        after = ds[v].sel(checkpoint=final).values[diverged]
        assert np.isnan(after).all(), v  # NaN after the divergence, never a number
        nan_cells += after.size
    assert not ds["reached"].sel(checkpoint=final).values[diverged].any()
    # Before diverging, the seeds have finite diagnostics (t = 0) ...
    g0 = ds["G_D"].sel(checkpoint="t=0", layer=0).values
    assert np.isfinite(g0[diverged]).all()
    # ... and still never enter a summary:
    sv = seed_values(ds, "G_D", "t=0", 0)
    assert sv.n_diverged == n_div and set(sv.seeds) == set(ds.seed.values[~diverged])

    # The tables: the run is paper Table 6's c = 1 network; each row counts the
    # diverged seeds and its mean is over the others only.
    t6 = pd.read_csv(reference / "results" / "tables" / "commutators" / "table6.csv")
    rows = t6[t6["matched"] == exp]
    assert len(rows) > 0
    for _, row in rows.iterrows():
        assert row["n_diverged"] == n_div
        values = ds[row["quantity"]].sel(checkpoint=row["checkpoint"], layer=row["layer"])
        alive = values.values[~diverged]
        alive = alive[~np.isnan(alive)]
        assert row["n"] == alive.size
        if alive.size:
            assert np.isclose(row["ours"], alive.mean(), rtol=1e-12, atol=0)
        else:
            assert np.isnan(row["ours"])
    faults.record(
        "diverge",
        "learning rate 0.5 for 200 steps on an H=3, width-32 ensemble (risk blows up)",
        "risk/diverged and diverged_at recorded (risk above 1e6 R(0) or not finite); every "
        "diagnostic NaN after the divergence; "
        "table rows count them in n_diverged and average the other seeds only",
        seeds=S,
        diverged=n_div,
        nan_cells_after_divergence=nan_cells,
        table6_rows_checked=len(rows),
    )


# --------------------------------------------------------------------------------------
# One-line errors with the fix
# --------------------------------------------------------------------------------------


def _one_line(exc: BaseException, *needles: str) -> str:
    msg = str(exc)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


def test_clear_one_line_errors(repo, tmp_path, monkeypatch, faults):
    from huggingface_hub import constants

    from specalign.commutators.data import uci
    from specalign.transformers.load.extract import extract
    from specalign.transformers.load.families import UnknownFamilyError
    from specalign.transformers.load.sources import ModelSourceError, resolve_model_dir

    checked = []
    # a checksum mismatch: a damaged copy of the workbook in the mirror
    mirror, dest = tmp_path / "mirror", tmp_path / "data"
    mirror.mkdir()
    original = repo.parent / "shared" / "data" / "Concrete_Data.xls"
    data = bytearray(original.read_bytes() if original.exists() else b"not a workbook" * 64)
    data[100] ^= 0xFF
    (mirror / "Concrete_Data.xls").write_bytes(bytes(data))
    with pytest.raises(uci.ChecksumMismatchError) as err:
        uci.fetch("concrete", dest, mirror=mirror)
    checked.append(_one_line(err.value, "Concrete_Data.xls", "SHA-256 mismatch", "fix: replace"))
    assert not (dest / "Concrete_Data.xls").exists()

    # a missing mirror file
    with pytest.raises(uci.MirrorFileMissingError) as err:
        uci.fetch("energy", dest, mirror=mirror)
    checked.append(_one_line(err.value, "'ENB2012_data.xlsx'", str(mirror), "fix: copy"))

    # a failed download (no network): the mirror is the fix
    with pytest.raises(uci.DownloadError) as err:
        uci.fetch("energy", dest, url=(tmp_path / "nowhere.xlsx").as_uri(), timeout=5)
    checked.append(_one_line(err.value, "could not download", "data: mirror:"))

    # an unknown model family
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama-unknown"}))
    with pytest.raises(UnknownFamilyError) as err:
        extract(model)
    checked.append(_one_line(err.value, "'llama-unknown'", "supported: ", "fix: "))

    # a hub model that is not cached, offline
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    spec = {"kind": "hub", "id": "specalign-test/not-cached", "revision": "main"}
    with pytest.raises(ModelSourceError) as err:
        resolve_model_dir(spec, tmp_path / "empty_cache")
    checked.append(
        _one_line(
            err.value,
            "'specalign-test/not-cached'",
            "HF_HUB_OFFLINE=1",
            "fix: fetch it first",
            "fetch_model",
            "source: local",
        )
    )
    # the rule named in the fix exists
    assert "rule fetch_model:" in (repo / "rules" / "transformers.smk").read_text()
    faults.record(
        "messages",
        "checksum mismatch (damaged mirror copy), missing mirror file, failed download, "
        "model_type `llama-unknown`, hub model not cached with HF_HUB_OFFLINE=1",
        "each a one-line error naming the file/family/model and saying the fix",
        errors_checked=len(checked),
        one_line=sum("\n" not in m for m in checked),
        max_length=max(len(m) for m in checked),
    )
