"""Shared test settings: no network, single-threaded numerics, headless plots; the
workflow runs that several test modules read (one run each per session); the grouping
that keeps each run on one pytest-xdist worker.

Costs, as markers (pyproject.toml): ``pipeline`` tests run the workflow or the console
script (Snakemake and its jobs as subprocesses); ``slurm`` ones a real SLURM cluster.
``pytest -m "not pipeline and not slurm"`` is the inner loop (docs/development.md)."""

import atexit
import os
import shutil
import sys
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
# one folder of kept configuration facts (specalign.transformers.load.families.config_facts)
# for the session: made by the first process, inherited by the xdist workers and every
# Snakemake they start, so that each config.json is read through transformers once
if "SPECALIGN_CACHE" not in os.environ:
    os.environ["SPECALIGN_CACHE"] = tempfile.mkdtemp(prefix="specalign-cache-")
    atexit.register(shutil.rmtree, os.environ["SPECALIGN_CACHE"], ignore_errors=True)
for _var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_CACHE", "HF_TOKEN_PATH"):
    os.environ.pop(_var, None)
os.environ.setdefault("MPLBACKEND", "Agg")
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(autouse=True)
def _nothing_left_set_aside():
    """A test that leaves objects set aside from the garbage collector
    (``runtime.heap_set_aside`` never ended: a model's stream not closed, as a refused
    model's once was) fails itself, rather than a later test on the same worker that
    counts on the collector."""
    import gc

    before = gc.get_freeze_count()
    yield
    if before == 0 and gc.get_freeze_count():
        pytest.fail(
            f"{gc.get_freeze_count()} objects left set aside from the garbage collector "
            "(runtime.heap_set_aside not ended: a stream not closed?)"
        )


@pytest.fixture(scope="session")
def uci_data(tmp_path_factory) -> Path:
    """A folder laid out as a `data: mirror:` folder: the two UCI workbooks shipped with the
    package and their CSV conversions (tests/commutators/data, exact values, for the
    loaders' tests). A copy: tests may damage what they are given."""
    from specalign.commutators.data import uci

    folder = tmp_path_factory.mktemp("uci")
    for name in uci.DATASETS:
        shutil.copy2(uci.shipped_copy(name), folder)
    for csv in (REPO / "tests" / "commutators" / "data").glob("*.csv"):
        shutil.copy2(csv, folder)
    return folder


#: Session fixtures that run the workflow, read by tests of several modules. Every test
#: that uses one runs on the pytest-xdist worker that made it (group of that name).
SHARED_RUNS = ("finished_run", "gpt2_run", "gpt2_report")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n N`` (``--dist loadgroup``, pyproject.toml) a group runs on one
    worker: the tests of a shared run (:data:`SHARED_RUNS`) together, else those of one
    module together, so that each run and each module-scoped fixture is made once. The
    groups that make runs go first: a long group started last would leave a worker idle
    at the end. Of those, the SLURM group goes first of all: its 2-3 minutes are mostly
    waits between the plugin's status checks, which must overlap the other worker's
    work, not follow it (last, they were the suite's final 2 minutes on one worker)."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        used = [f for f in SHARED_RUNS if f in item.fixturenames]
        group = used[0] if used else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group, []).append(item)
    # a group stays in one piece, in its order: its module fixtures are made once
    heavy = [g for g, members in groups.items() if any(_costly(i) for i in members)]
    light = [g for g in groups if g not in heavy]
    heavy.sort(key=lambda g: not any(i.get_closest_marker("slurm") for i in groups[g]))
    items[:] = [item for g in heavy + light for item in groups[g]]


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_testnodedown(node: object, error: object) -> None:
    """pytest-xdist's controller: the ``FAULTS:`` rows a worker recorded
    (tests/workflow/test_faults.py, FaultLog), printed once at the end as without -n."""
    rows = getattr(node, "workeroutput", {}).get("faults")
    if rows:
        sys.path.insert(0, str(REPO / "tests" / "workflow"))
        from test_faults import fault_log

        fault_log(node.config).merge(rows)


class _GroupsTookEffect:
    """On a pytest-xdist worker under ``--dist loadgroup``: every node id must carry its
    group (``@group``, which xdist appends). pytest 9.2 builds node ids in a way that
    xdist 3.8's suffix no longer reaches: the groups then silently scatter, and every
    worker makes every shared run again."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list) -> None:
        if getattr(config.option, "loadgroup", False) and any("@" not in i.nodeid for i in items):
            raise pytest.UsageError(
                f"pytest {pytest.__version__}: pytest-xdist's --dist loadgroup has no effect "
                "(node ids carry no group), so each shared workflow run would be made on "
                "every worker; fix: pip install 'pytest<9.2' (the test extra pins it)"
            )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_GroupsTookEffect(), "specalign-xdist-groups")


def _costly(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) for m in ("pipeline", "slurm"))


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


@pytest.fixture(scope="session")
def gpt2_run(repo, tmp_path_factory):
    """Both studies at their smallest: a tiny local GPT-2 (no tokenizer) and its random
    twin through every rule of the transformer half, beside one tiny synthetic commutator
    experiment; read by the transformer pipeline tests and the report tests."""
    import torch
    import yaml
    from snakemake_helpers import run_snakemake
    from transformers import GPT2Config, GPT2LMHeadModel

    workdir = tmp_path_factory.mktemp("gpt2_run")
    torch.manual_seed(0)
    tiny = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    GPT2LMHeadModel(tiny).save_pretrained(workdir / "tiny_gpt2")
    cfg = {
        "threads": 1,
        "commutators": {
            "training": {"lr": 0.05, "iterations": 200, "risk_levels": [0.1], "times": [5]},
            "experiments": {
                "tiny_synthetic": {
                    "kind": "synthetic",
                    "hidden": 2,
                    "width": 8,
                    "seeds": 2,
                    "n_train": 20,
                    "n_diag": 16,
                },
            },
        },  # fmt: skip
        "transformers": {
            "models": {
                "tiny_gpt2": {"source": "local", "path": str(workdir / "tiny_gpt2")},
                "tiny_gpt2_random": {"source": "random", "like": "tiny_gpt2", "seed": 1},
            },
            "prompts": {"kind": "random", "n_prompts": 4, "n_tokens": 6, "seed": 0},
            "propagation": {"prolonged_layers": 9, "null_draws": 3},
            # the tiny GPT-2 has no tokenizer: a token id inside both vocabularies
            "steering": {"target_id": 37, "c": [1.0, 2.0]},
            "sphere": {"steps": 40},
        },
        "plots": {"formats": ["png"], "dpi": 50},
    }
    (workdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    run_snakemake(repo, workdir)
    return workdir, cfg


@pytest.fixture(scope="session")
def gpt2_report(repo, gpt2_run, tmp_path_factory):
    """``snakemake --report`` of :func:`gpt2_run`: its folder and the page's text."""
    from snakemake_helpers import run_snakemake

    workdir, _ = gpt2_run
    out = tmp_path_factory.mktemp("gpt2_report") / "report.html"
    run_snakemake(repo, workdir, "--report", str(out), timeout=600)
    return workdir, out.read_text()


#: What a test starts that makes it a ``pipeline`` test: Snakemake or the console script,
#: whose jobs each start Python with the numerical libraries.
_PIPELINE_COMMANDS = ("snakemake", "specalign", "specalign.cli")


@pytest.fixture(autouse=True)
def _marked_by_cost(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that starts Snakemake or ``specalign`` without the ``pipeline`` (or
    ``slurm``) marker fails, naming the command: the markers are what the inner loop
    (``-m "not pipeline and not slurm"``) trusts to leave the slow tests out."""
    if _costly(request.node):
        return
    import subprocess

    original = subprocess.Popen.__init__

    def guarded(self, args, *a, **kw):
        argv = str(args).split() if isinstance(args, str | bytes) else list(map(str, args))
        text = " ".join(argv)
        started = Path(argv[0]).name if argv else ""
        if "-m" in argv[1:2]:  # python -m <module>
            started = argv[2] if len(argv) > 2 else ""
        if started in _PIPELINE_COMMANDS:
            pytest.fail(
                f"{request.node.nodeid} starts {text[:120]!r} but is not marked pipeline: "
                "mark it @pytest.mark.pipeline (its cost), or keep the work in-process"
            )
        original(self, args, *a, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
