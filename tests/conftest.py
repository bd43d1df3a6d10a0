"""Shared test settings: no network, single-threaded numerics, headless plots."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# huggingface_hub reads these once, at import: a closed loopback port as the hub, so that
# nothing reaches huggingface.co (not even version 2's request for its agent registry),
# and a fresh HF_HOME without anyone's token or cache. Hub tests name their own server.
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="specalign-hf-home-")
atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
for _var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_CACHE", "HF_TOKEN_PATH"):
    os.environ.pop(_var, None)
os.environ.setdefault("MPLBACKEND", "Agg")
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The original UCI files beside the clone (../shared/data); tests skip without it."""
    path = Path(os.environ.get("SPECALIGN_TEST_DATA", REPO.parent / "shared" / "data"))
    if not (path / "Concrete_Data.xls").exists():
        pytest.skip(f"UCI test data not found in {path}")
    return path


@pytest.fixture(scope="session")
def finished_run(repo, tmp_path_factory):
    """The real workflow run once on config/test.yaml, shared by the pipeline tests.

    Every job records the specalign modules it loaded into ``module_log/`` (see
    tests/module_recorder), for the fingerprint test.
    """
    import shutil

    from snakemake_helpers import recording_env, run_snakemake

    workdir = tmp_path_factory.mktemp("pipeline")
    shutil.copy(repo / "config" / "test.yaml", workdir / "config.yaml")
    run_snakemake(repo, workdir, env=recording_env(workdir))
    return workdir
