"""Hub downloads through a real hub protocol, on 127.0.0.1 only.

* Against olah, the hub mirror that air-gapped sites run (``tests/hub_mirror.py``),
  serving tiny random models of every supported family: what ``fetch_model`` and
  ``extract_weights`` call, for every family pinned by branch, tag and commit (the
  commit is what is recorded); then the workflow itself (Snakemake, subprocess):
  ``fetch_model`` -> ``extract_weights`` for a branch, a tag (a sharded checkpoint) and
  a commit (a repository with pickled weights only), the commit in the manifest and in
  ``weights.h5``, and a second ``fetch_model`` with ``HF_HUB_OFFLINE=1`` and the mirror
  stopped, served from the cache. (Each Snakemake job costs seconds of start-up, hence
  the family matrix in-process.)
* Every error path against a server that answers as the hub does
  (``tests/hub_protocol.py``): unknown repository, unknown revision, a missing file, a
  gated repository without or with a wrong token, the server dying mid-download, no
  server at all. Each is one line naming the repository and the fix, leaves no partial
  snapshot folder, and a rerun completes once the cause is gone.

The root conftest points ``HF_ENDPOINT`` at a closed loopback port and ``HF_HOME`` at a
temporary folder before huggingface_hub is imported, so nothing reaches huggingface.co.
olah runs from its own virtual environment (``OLAH_CLI``, else ``.ci/olah-venv``, made
on first use by ``hub_mirror.require_olah``): where it cannot be made the mirror tests
skip saying why, except under CI, where they fail.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from hub_mirror import OlahServer, build_mirrors, require_olah
from hub_protocol import Cut, HubServer
from snakemake_helpers import run_snakemake
from tiny_models import TINY_CONFIGS, save_tiny

from specalign.transformers.load.contracts import read_weights_h5
from specalign.transformers.load.extract import extract
from specalign.transformers.load.families import FAMILIES
from specalign.transformers.load.sources import (
    ModelSourceError,
    check_model_dir,
    provenance,
    resolve_model_dir,
)


@pytest.fixture
def online(monkeypatch):
    """huggingface_hub online in this process (the suite runs with HF_HUB_OFFLINE=1, which
    huggingface_hub read at import); returns a setter for ``HF_ENDPOINT``."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return lambda endpoint: monkeypatch.setenv("HF_ENDPOINT", endpoint)


# ------------------------------------------------------------------ through the mirror


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """olah serving the tiny repositories of ``hub_mirror.build_mirrors``."""
    cli = require_olah()
    root = tmp_path_factory.mktemp("olah")
    repos = build_mirrors(root / "mirrors")
    server = OlahServer(cli, root, probe_repo=repos["gpt2"].repo_id).start()
    yield server, repos
    server.stop()


def _spec(repo_id: str, revision: str) -> dict[str, str]:
    return {"kind": "hub", "id": repo_id, "revision": revision}


def _F(mw) -> np.ndarray:
    return np.stack([block.F for block in mw.blocks])


@pytest.mark.pipeline
def test_every_family_pinned_by_branch_tag_and_commit(mirror, online, tmp_path):
    """What fetch_model and extract_weights call, for every family and every kind of pin."""
    server, repos = mirror
    online(server.endpoint)
    assert set(TINY_CONFIGS) == set(FAMILIES)
    for model_type in FAMILIES:
        served = repos[model_type]
        # the commit of main is named by neither the branch nor the tag
        pins = {"dev": served.refs["dev"], "v1.0": served.refs["v1.0"]}
        pins[served.refs["main"]] = served.refs["main"]
        weights = []
        for revision, commit in pins.items():
            spec = _spec(served.repo_id, revision)
            folder = resolve_model_dir(spec, tmp_path)
            info = provenance(spec, folder)
            assert (folder.name, info["revision"]) == (commit, commit), (model_type, revision)
            files = sorted(p.name for p in folder.iterdir())
            # the repositories hold pickled weights beside the safetensors: never fetched
            assert files == ["config.json", "model.safetensors"], files
            for name in files:
                assert (folder / name).read_bytes() == served.git_file(commit, name)
            mw = extract(folder, **info)
            assert (mw.family, mw.revision) == (model_type, commit)
            weights.append(_F(mw))
        # three pins, three commits with different weights
        assert not np.array_equal(weights[0], weights[1])
        assert not np.array_equal(weights[1], weights[2])


def _workflow_env(endpoint: str, **extra: str) -> dict[str, str]:
    drop = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "HF_ENDPOINT": endpoint, **extra}


def _write_config(workdir: Path, models: dict[str, dict]) -> list[str]:
    """A config with only these hub models; the weights.h5 targets."""
    hub_models = {name: {"source": "hub", **spec} for name, spec in models.items()}
    # the tiny repositories have no tokenizer: fetch_model refuses the default
    # steering.target_text for them (steer would fail on it), so a token id instead
    tcfg = {"cache": "models", "models": hub_models, "steering": {"target_id": 1}}
    cfg = {"threads": 1, "transformers": tcfg}
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    return [f"results/transformers/{name}/weights.h5" for name in models]


def _recorded(workdir: Path, name: str) -> tuple[dict, dict, np.ndarray]:
    """The manifest, the weights.h5 attributes and F of a model of a workflow run."""
    manifest = json.loads((workdir / "models" / name / "manifest.json").read_text())
    # a snapshot in transformers.cache lies in the working directory: named relative to it
    assert not Path(manifest["path"]).is_absolute(), manifest["path"]
    manifest["path"] = str(workdir / manifest["path"])
    path = workdir / "results" / "transformers" / name / "weights.h5"
    with h5py.File(path) as f:
        attrs = dict(f.attrs)
    # a grouped-query model with r < d stores no F (format 3): F = W_O W_V as read back
    mw = read_weights_h5(path)
    return manifest, attrs, np.stack([block.F for block in mw.blocks])


@pytest.fixture(scope="module")
def mirror_run(repo, mirror, tmp_path_factory):
    """The workflow's fetch_model -> extract_weights through olah: a branch, a tag (a
    sharded checkpoint) and a commit (pickled weights only). Model name -> commit."""
    server, repos = mirror
    pinned = {
        "branch": (repos["albert"].repo_id, "dev", repos["albert"].refs["dev"]),
        "sharded": (repos["sharded"].repo_id, "v1.0", repos["sharded"].refs["v1.0"]),
        "pickled": (repos["pickled"].repo_id,) + (repos["pickled"].refs["main"],) * 2,
    }
    workdir = tmp_path_factory.mktemp("hub_run")
    models = {name: {"id": repo_id, "revision": rev} for name, (repo_id, rev, _) in pinned.items()}
    targets = _write_config(workdir, models)
    run_snakemake(repo, workdir, *targets, env=_workflow_env(server.endpoint))
    return workdir, {name: commit for name, (*_, commit) in pinned.items()}


@pytest.mark.pipeline
def test_workflow_records_the_commit(mirror_run):
    workdir, commits = mirror_run
    for name, commit in commits.items():
        manifest, attrs, _ = _recorded(workdir, name)
        assert Path(manifest["path"]).name == manifest["revision"] == commit, name
        assert attrs["revision"] == commit and attrs["source"] == manifest["source"]


@pytest.mark.pipeline
def test_workflow_sharded_checkpoint_through_its_index(mirror_run, tmp_path):
    workdir, _ = mirror_run
    manifest, _, F = _recorded(workdir, "sharded")
    snapshot = Path(manifest["path"])
    index = json.loads((snapshot / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) >= 2 and shards == {p.name for p in snapshot.glob("*.safetensors")}
    # the same model (the mirror built it from seed 3) saved in one file
    np.testing.assert_array_equal(F, _F(extract(save_tiny("gpt2", tmp_path / "one", seed=3))))


@pytest.mark.pipeline
def test_workflow_pickled_weights_when_no_safetensors(mirror_run, tmp_path):
    workdir, _ = mirror_run
    manifest, _, F = _recorded(workdir, "pickled")
    files = sorted(p.name for p in Path(manifest["path"]).iterdir())
    assert files == ["config.json", "pytorch_model.bin"]
    # read with torch.load(weights_only=True): the weights of the same seed's safetensors
    np.testing.assert_array_equal(F, _F(extract(save_tiny("gpt2", tmp_path / "st", seed=4))))


@pytest.mark.pipeline
def test_workflow_second_run_offline_from_the_cache(repo, mirror, mirror_run):
    """fetch_model again with HF_HUB_OFFLINE=1 and the mirror stopped: the same
    snapshots (extract_weights reads the folder a manifest names, so its weights are
    those checked above)."""
    server, _ = mirror
    workdir, commits = mirror_run
    manifests = {name: workdir / "models" / name / "manifest.json" for name in commits}
    before = {name: json.loads(path.read_text()) for name, path in manifests.items()}
    server.stop()
    for path in manifests.values():
        path.unlink()
    env = _workflow_env(server.endpoint, HF_HUB_OFFLINE="1")
    targets = [str(path.relative_to(workdir)) for path in manifests.values()]
    out = run_snakemake(repo, workdir, *targets, env=env)
    assert out.count("localrule fetch_model:") == len(commits)
    for name, path in manifests.items():
        assert json.loads(path.read_text()) == before[name]
        assert before[name]["revision"] == commits[name]


# ------------------------------------------------------------ error paths, hub answers


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    return save_tiny("gpt2", tmp_path_factory.mktemp("tiny") / "gpt2", seed=5)


@pytest.fixture
def hub(tiny_folder, online):
    """A hub-protocol server holding ``org/model`` and the gated ``org/gated``."""
    server = HubServer()
    server.add_folder("org/model", tiny_folder)
    server.add_folder("org/gated", tiny_folder, gated=True)
    server.repos["org/gated"].tokens.add("hf_granted")
    online(server.start().endpoint)
    yield server
    server.stop()


def _fetch(
    cache: Path, repo_id: str = "org/model", revision: str = "main", own: bool = True
) -> Path:
    """Fetch into ``cache``, as fetch_model does: a cache the workflow made and marked
    (``own``), or a person's, whose snapshot folders are never removed."""
    from specalign.io import is_owned, mark_owned

    if own and not is_owned(cache):
        cache.mkdir(parents=True, exist_ok=True)
        mark_owned(cache, "the test's hub cache")
    return resolve_model_dir({"kind": "hub", "id": repo_id, "revision": revision}, cache)


def _fails(cache: Path, repo_id: str, revision: str, *needles: str) -> str:
    """Fetch, expect a one-line error with ``needles``, and no partial snapshot left."""
    with pytest.raises(ModelSourceError) as err:
        _fetch(cache, repo_id, revision)
    msg = str(err.value)
    assert "\n" not in msg, msg
    for needle in (repr(repo_id), repr(revision), "fix: ", *needles):
        assert needle in msg, (needle, msg)
    for snapshot in cache.glob("models--*/snapshots/*"):
        check_model_dir(snapshot)  # every snapshot folder left is a complete model
    return msg


def _completes(cache: Path, repo_id: str, revision: str, tiny_folder: Path) -> Path:
    folder = _fetch(cache, repo_id, revision)
    for file in tiny_folder.iterdir():
        assert (folder / file.name).read_bytes() == file.read_bytes(), file.name
    return folder


def test_unknown_repository(hub, tiny_folder, tmp_path):
    _fails(tmp_path, "org/nope", "main", "repository not found", "`id:`", "HF_TOKEN")
    hub.add_folder("org/nope", tiny_folder)
    _completes(tmp_path, "org/nope", "main", tiny_folder)


@pytest.mark.parametrize("revision", ["nope", "0123456789abcdef0123456789abcdef01234567"])
def test_unknown_revision(hub, tiny_folder, tmp_path, revision):
    _fails(tmp_path, "org/model", revision, "not found", "branch, tag or full 40-character")
    served = hub.repos["org/model"]
    if len(revision) == 40:  # the commit arrives (a mirror catching up)
        served.commits[revision] = served.commits[served.refs["main"]]
    else:  # the branch is created
        served.refs[revision] = served.refs["main"]
    _completes(tmp_path, "org/model", revision, tiny_folder)


def test_missing_file(hub, tiny_folder, tmp_path):
    hub.withheld.add(("org/model", "model.safetensors"))
    _fails(tmp_path, "org/model", "main", "'model.safetensors'", "missing on the server")
    hub.withheld.clear()
    _completes(tmp_path, "org/model", "main", tiny_folder)


def test_gated_repository_needs_a_token(hub, tiny_folder, tmp_path, monkeypatch):
    msg = _fails(tmp_path, "org/gated", "main", "gated repository", "no valid token")
    assert "HF_TOKEN" in msg and f"{hub.endpoint}/org/gated" in msg
    monkeypatch.setenv("HF_TOKEN", "hf_refused")
    _fails(tmp_path, "org/gated", "main", "gated repository", "has no access", "HF_TOKEN")
    monkeypatch.setenv("HF_TOKEN", "hf_granted")
    _completes(tmp_path, "org/gated", "main", tiny_folder)


def test_server_dies_mid_download(hub, tiny_folder, tmp_path, monkeypatch):
    from huggingface_hub import constants

    hub.cuts.append(Cut("org/model", "model.safetensors", after=10_000, die=True))
    _fails(tmp_path, "org/model", "main", "download failed", "rerun")
    assert not list(tmp_path.glob("models--*/snapshots/*"))  # config.json had been linked
    # offline, the partial download is not taken for a model either
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _fails(tmp_path, "org/model", "main", "HF_HUB_OFFLINE=1", "fetch_model")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub.start()  # back, on the same ports
    _completes(tmp_path, "org/model", "main", tiny_folder)


def test_a_persons_hub_cache_keeps_its_snapshot_folders(hub, tiny_folder, tmp_path):
    """A download that dies in a cache the workflow did not make (the person's own
    Hugging Face cache, or one of theirs named as the cache) leaves their snapshot
    folder where it was: the error still names the failure, and a rerun completes it."""
    mine = tmp_path / "their_cache"
    mine.mkdir()
    hub.cuts.append(Cut("org/model", "model.safetensors", after=10_000, die=True))
    with pytest.raises(ModelSourceError, match="download failed"):
        _fetch(mine, own=False)
    assert list(mine.glob("models--*/snapshots/*"))  # kept: config.json had been linked
    hub.start()
    folder = _fetch(mine, own=False)
    assert (folder / "model.safetensors").read_bytes() == (
        tiny_folder / "model.safetensors"
    ).read_bytes()


def test_no_server_at_all(hub, tiny_folder, tmp_path):
    hub.stop()
    _fails(tmp_path, "org/model", "main", "cannot be reached", "HF_ENDPOINT")
    hub.start()
    _completes(tmp_path, "org/model", "main", tiny_folder)


@pytest.mark.pipeline
def test_workflow_gated_repository_then_a_token(repo, hub, tmp_path):
    """What a researcher sees: the one-line error in the fetch_model log, no manifest."""
    _write_config(tmp_path, {"gated": {"id": "org/gated", "revision": "main"}})
    target = "models/gated/manifest.json"
    manifest = tmp_path / target
    out = run_snakemake(repo, tmp_path, target, check=False, env=_workflow_env(hub.endpoint))
    assert "Error in rule fetch_model" in out
    log = (tmp_path / "logs" / "transformers" / "gated" / "fetch_model.log").read_text()
    # the error's one line (the log holds the traceback as logged and as printed)
    (error,) = {line for line in log.splitlines() if line.startswith("specalign.")}
    assert error.startswith(
        "specalign.transformers.load.sources.ModelSourceError: hub model 'org/gated'"
    )
    assert "gated repository and no valid token" in error and "HF_TOKEN" in error
    assert not manifest.exists() and not list(tmp_path.glob("models/hub/*/snapshots/*"))
    env = _workflow_env(hub.endpoint, HF_TOKEN="hf_granted")
    run_snakemake(repo, tmp_path, target, env=env)
    assert json.loads(manifest.read_text())["revision"] == hub.repos["org/gated"].refs["main"]


def test_shards_without_their_index_are_not_a_model(tmp_path):
    """Shards are downloaded in parallel: a cut can leave some without the index."""
    folder = save_tiny("gpt2", tmp_path / "sharded", seed=3, max_shard_size="50KB")
    (folder / "model.safetensors.index.json").unlink()
    with pytest.raises(ModelSourceError, match="without their index"):
        check_model_dir(folder)


class _Payload:
    """A pickle that would create a file when unpickled by plain ``torch.load``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickled_weights_never_run_code(tmp_path):
    """pytorch_model.bin is read with torch.load(weights_only=True): code is refused."""
    import torch

    from specalign.io import InputFileError

    folder = save_tiny("gpt2", tmp_path / "model", seed=0)
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "code-ran"
    torch.save({"h.0.attn.c_attn.weight": _Payload(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(InputFileError, match="pytorch_model.bin"):
        extract(folder)
    assert not marker.exists()


def test_download_fetches_data_files_only(online, tmp_path):
    """A Mistral-style repository: the HF checkpoint, Mistral's consolidated.safetensors
    beside it (the same weights again) and tokenizer code (tokenization_x.py,
    tokenizer.py, vocab.py, which an auto_map would run): only the data files arrive."""
    folder = save_tiny("mistral", tmp_path / "repo", seed=0)
    (folder / "consolidated.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    for code in ("tokenizer.py", "vocab.py", "tokenization_x.py"):
        (folder / code).write_text("raise SystemExit('model code ran')\n")
    (folder / "tokenizer_config.json").write_text('{"model_max_length": 64}')
    (folder / "vocab.json").write_text("{}")
    server = HubServer()
    server.add_folder("org/mistral", folder)
    online(server.start().endpoint)
    try:
        got = _fetch(tmp_path / "cache", "org/mistral")
    finally:
        server.stop()
    names = {p.name for p in got.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json", "vocab.json"} <= names
    assert not names & {"consolidated.safetensors", "tokenizer.py", "vocab.py",
                        "tokenization_x.py"}, names  # fmt: skip


# ------------------------------------------------------- a checkpoint series, Pythia-named


@pytest.fixture(scope="module")
def pythia_like(tmp_path_factory):
    """olah serving ``tiny/pythia-like``: a tiny GPT-NeoX (Pythia's family) with one
    branch per training step, named as EleutherAI names Pythia's (``step0``, ``step1``,
    ``step8``), each its own commit with its own weights. Branch -> commit."""
    cli = require_olah()
    from hub_mirror import _T0, _commit, _git, _new_repo, _refs

    root = tmp_path_factory.mktemp("olah_series")
    repo = _new_repo(root / "mirrors", "pythia-like")
    _commit(save_tiny("gpt_neox", repo, seed=100), "main", _T0)
    for k, step in enumerate((0, 1, 8)):
        _git(repo, "checkout", "-q", "-b", f"step{step}", "main")
        _commit(save_tiny("gpt_neox", repo, seed=step), f"step {step}", _T0 + 60 * (k + 1))
    _git(repo, "checkout", "-q", "main")
    server = OlahServer(cli, root, probe_repo="tiny/pythia-like").start()
    yield server, {k: v for k, v in _refs(repo).items() if k.startswith("step")}
    server.stop()


@pytest.mark.pipeline
def test_workflow_hub_series_end_to_end(repo, pythia_like, tmp_path):
    """``{source: hub, id, revisions: [step8, step0]}`` end to end through the mirror:
    every point's manifest records its series, step and resolved commit, and training.nc
    sets them along the step, in step order. A second series naming a branch the
    repository lacks: that point fails with one line naming the revision; its other point
    is still fetched and extracted."""
    server, branches = pythia_like
    series = {
        "py": {"source": "hub", "id": "tiny/pythia-like", "revisions": ["step8", "step0"]},
        "gone": {"source": "hub", "id": "tiny/pythia-like", "revisions": ["step1", "step404"]},
    }
    tcfg = {
        "cache": "models",
        "models": {},
        "series": series,
        "steering": {"target_id": 1, "c": [2.0], "methods": ["min_norm"]},
        "prompts": {"kind": "random", "n_prompts": 3, "n_tokens": 6, "seed": 0},
        "propagation": {"prolonged_layers": 4, "null_draws": 2},
    }
    cfg = {"threads": 1, "transformers": tcfg, "plots": {"formats": ["png"], "dpi": 40}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    # the series' own outputs and the other series' points (not every per-model table)
    targets = [
        "results/transformers/series/py/training.nc",
        "results/transformers/gone_step1/weights.h5",
        "models/gone_step404/manifest.json",
    ]
    out = run_snakemake(
        repo, tmp_path, *targets, "--keep-going", check=False,
        env=_workflow_env(server.endpoint), timeout=1800,
    )  # fmt: skip
    for step in (0, 8):
        manifest = json.loads((tmp_path / f"models/py_step{step}/manifest.json").read_text())
        assert (manifest["series"], manifest["step"]) == ("py", step)
        assert manifest["revision"] == branches[f"step{step}"], manifest
        assert Path(manifest["path"]).name == branches[f"step{step}"]
    import xarray as xr

    with xr.open_dataset(tmp_path / "results/transformers/series/py/training.nc") as ds:
        assert list(ds["step"].values) == [0, 8]
        assert ds.attrs["source"] == "hub"
        # two commits, two models: the spectra differ from step to step
        radius = ds["spectral_radius"].values
        assert np.isfinite(radius).all() and not np.allclose(radius[0], radius[1])
    # the revision that does not exist: one line naming it (olah answers an unknown
    # revision as an unknown repository; the hub's own answer is test_unknown_revision's)
    assert "Error in rule fetch_model" in out
    log = (tmp_path / "logs/transformers/gone_step404/fetch_model.log").read_text()
    (error,) = {line for line in log.splitlines() if line.startswith("specalign.")}
    assert "'tiny/pythia-like'" in error and "'step404'" in error, error
    assert not (tmp_path / "models/gone_step404/manifest.json").exists()
    gone1 = json.loads((tmp_path / "models/gone_step1/manifest.json").read_text())
    assert gone1["revision"] == branches["step1"]
    assert (tmp_path / "results/transformers/gone_step1/weights.h5").is_file()
