"""A real hub mirror for the tests: olah (PyPI ``olah``), offline, on 127.0.0.1.

olah serves model repositories from git work trees under its ``mirrors-path``
(``{mirrors}/models/{org}/{name}``, files read from the git objects of the requested
commit) with the hub's download protocol: ``/api/models/{repo}/revision/{rev}``,
``/api/models/{repo}/tree/{sha}``, HEAD/GET ``/{repo}/resolve/{rev}/{file}`` with
``X-Repo-Commit`` and ``ETag``. Branch, tag and commit revisions resolve as on the hub,
so a snapshot folder is named by the git commit. With ``[accessibility] offline = true``
it makes no outgoing connection. Its error answers are not the hub's (401 for an
unknown revision or file), so the error paths use ``hub_protocol.HubServer`` instead.

olah runs from its own virtual environment: it needs a newer huggingface_hub than the
oldest one the project supports, and an older psutil than snakemake. ``OLAH_CLI`` names
its ``olah-cli``; without it, the tests make that environment themselves, once, in
``.ci/olah-venv`` (pinned by ``.ci/olah-constraints.txt``; a package registry must be
reachable the first time), so that a fresh clone's ``pytest`` runs them too.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tiny_models import TINY_CONFIGS, save_tiny, save_tiny_pickled

ORG = "tiny"
# Fixed identity and dates: the commit hashes depend on the files only.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "specalign-tests",
    "GIT_AUTHOR_EMAIL": "tests@example.invalid",
    "GIT_COMMITTER_NAME": "specalign-tests",
    "GIT_COMMITTER_EMAIL": "tests@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}
_T0 = 1_700_000_000


REPO = Path(__file__).resolve().parents[1]
OLAH_VENV = REPO / ".ci" / "olah-venv"
OLAH_PIN = "olah==0.5.4"


def _olah_venv_cli() -> tuple[Path | None, str]:
    """``olah-cli`` of ``OLAH_VENV``, made now if absent (under a lock: xdist workers
    share it), or None and why it could not be made."""
    cli = OLAH_VENV / "bin" / "olah-cli"
    OLAH_VENV.parent.mkdir(exist_ok=True)
    with open(OLAH_VENV.parent / ".olah-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cli.is_file():
            return cli, ""
        steps = [
            [sys.executable, "-m", "venv", "--clear", str(OLAH_VENV)],
            [str(OLAH_VENV / "bin" / "pip"), "install", "--quiet",
             "--disable-pip-version-check", "-c", str(REPO / ".ci" / "olah-constraints.txt"),
             OLAH_PIN],
        ]  # fmt: skip
        for cmd in steps:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                shutil.rmtree(OLAH_VENV, ignore_errors=True)  # ours, half made
                last = (proc.stderr.strip().splitlines() or ["?"])[-1]
                return None, f"could not make {OLAH_VENV} ({' '.join(cmd[:3])}...: {last})"
    return cli, ""


def olah_cli() -> tuple[Path | None, str]:
    """The ``olah-cli`` to run: ``$OLAH_CLI`` when set, else ``.ci/olah-venv``'s (made on
    first use); ``(None, why)`` when there is none."""
    named = os.environ.get("OLAH_CLI")
    if named:
        if Path(named).is_file():
            return Path(named), ""
        return None, f"OLAH_CLI={named} is not a file"
    return _olah_venv_cli()


def require_olah() -> Path:
    """``olah-cli`` for a test; without one the test skips with the reason (fails under
    CI, which must run every hub test)."""
    import pytest

    cli, why = olah_cli()
    if cli is None:
        message = f"hub-mirror test needs olah: {why}; fix: set OLAH_CLI to an olah-cli"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return cli


@dataclasses.dataclass
class MirrorRepo:
    """One served repository: ``refs`` maps each branch and tag to its commit."""

    repo_id: str
    path: Path
    model_type: str
    refs: dict[str, str]

    def git_file(self, commit: str, name: str) -> bytes:
        """The bytes of ``name`` at ``commit``, straight from git."""
        return _git(self.path, "show", f"{commit}:{name}", text=False)


def _git(repo: Path, *args: str, date: int = _T0, text: bool = True) -> str | bytes:
    env = dict(os.environ, **_GIT_ENV)
    env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"{date} +0000"
    out = subprocess.run(
        ["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=text
    ).stdout
    return out.strip() if text else out


def _new_repo(mirrors: Path, name: str) -> Path:
    repo = mirrors / "models" / ORG / name
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    return repo


def _commit(repo: Path, message: str, date: int) -> str:
    _git(repo, "add", "-A", date=date)
    _git(repo, "commit", "-q", "-m", message, date=date)
    return _git(repo, "rev-parse", "HEAD")


def _refs(repo: Path) -> dict[str, str]:
    fmt = "%(refname:short) %(objectname) %(*objectname)"
    refs = {}
    for line in _git(repo, "for-each-ref", f"--format={fmt}").splitlines():
        name, obj, *peeled = line.split()
        refs[name] = peeled[0] if peeled else obj  # an annotated tag names its commit
    return refs


def build_mirrors(mirrors: Path) -> dict[str, MirrorRepo]:
    """Git repositories of tiny random models under ``{mirrors}/models/tiny/``.

    One per family (``tiny/{model_type}``): commit A (seed 0) tagged ``v1.0``, ``main``
    = A then B (seed 1), branch ``dev`` = A then C (seed 2); three revisions with
    different weights, each as safetensors and, as many hub repositories hold them
    beside, as pickled pytorch_model.bin. ``tiny/gpt2-sharded``: a sharded checkpoint
    with its index, tagged ``v1.0``. ``tiny/gpt2-pickled``: config.json and
    pytorch_model.bin only.
    """

    def save_both(model_type: str, repo: Path, seed: int) -> Path:
        save_tiny_pickled(model_type, repo, seed)
        return save_tiny(model_type, repo, seed)

    out = {}
    for model_type in TINY_CONFIGS:
        repo = _new_repo(mirrors, model_type)
        first = _commit(save_both(model_type, repo, seed=0), "seed 0", _T0)
        _git(repo, "tag", "v1.0", first)
        _commit(save_both(model_type, repo, seed=1), "seed 1", _T0 + 60)
        _git(repo, "checkout", "-q", "-b", "dev", first)
        _commit(save_both(model_type, repo, seed=2), "seed 2", _T0 + 120)
        _git(repo, "checkout", "-q", "main")
        out[model_type] = MirrorRepo(f"{ORG}/{model_type}", repo, model_type, _refs(repo))
    repo = _new_repo(mirrors, "gpt2-sharded")
    sharded = _commit(save_tiny("gpt2", repo, seed=3, max_shard_size="50KB"), "sharded", _T0)
    _git(repo, "tag", "v1.0", sharded)
    out["sharded"] = MirrorRepo(f"{ORG}/gpt2-sharded", repo, "gpt2", _refs(repo))
    repo = _new_repo(mirrors, "gpt2-pickled")
    _commit(save_tiny_pickled("gpt2", repo, seed=4), "pickled weights only", _T0)
    out["pickled"] = MirrorRepo(f"{ORG}/gpt2-pickled", repo, "gpt2", _refs(repo))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_config(root: Path, port: int) -> Path:
    # The upstream hub is a closed loopback port: offline mode never calls it, and a
    # code path that did would fail here instead of reaching huggingface.co.
    config = root / "olah.toml"
    config.write_text(
        f"""[basic]
host = "127.0.0.1"
port = {port}
repos-path = "{root / "olah-repos"}"
mirrors-path = ["{root / "mirrors"}"]
hf-scheme = "http"
hf-netloc = "127.0.0.1:9"
hf-lfs-netloc = "127.0.0.1:9"
mirror-scheme = "http"
mirror-netloc = "127.0.0.1:{port}"
mirror-lfs-netloc = "127.0.0.1:{port}"

[accessibility]
offline = true
"""
    )
    return config


class OlahServer:
    """olah serving ``{root}/mirrors`` on 127.0.0.1 at a free port, until ``stop``."""

    def __init__(self, cli: Path, root: Path, probe_repo: str, timeout: float = 30.0) -> None:
        self.cli, self.root, self.probe_repo, self.timeout = cli, Path(root), probe_repo, timeout
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.startup_s = float("nan")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OlahServer:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env["HF_HUB_OFFLINE"] = "1"  # olah imports huggingface_hub itself
        for _attempt in range(3):  # the free port may be taken before olah binds it
            self.port = _free_port()
            config = _write_config(self.root, self.port)
            start = time.monotonic()
            with open(self.root / "olah.out", "ab") as out:
                self.proc = subprocess.Popen(
                    [str(self.cli), "-c", str(config), "--log-path", str(self.root / "logs")],
                    cwd=self.root,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            if self._ready():
                self.startup_s = time.monotonic() - start
                return self
            self.stop()
        tail = (self.root / "olah.out").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"olah did not start:\n{tail}")

    def _ready(self) -> bool:
        # GET / answers 500 in olah 0.5.4; a revision lookup proves the mirror path too.
        url = f"{self.endpoint}/api/models/{self.probe_repo}/revision/main"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    if answer.status == 200 and json.load(answer).get("sha"):
                        return True
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
