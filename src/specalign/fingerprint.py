"""Code fingerprints of the workflow's rule scripts, derived from their imports.

Snakemake reruns a job when its script changes, but it does not know which modules the
script imports. Every rule therefore passes, as a ``params`` value, a hash of its script
and of every ``specalign`` module the script reaches (:func:`script_fingerprint`):
editing any of them changes the hash, and Snakemake's ``params`` trigger reruns the job.

The module set is read from the source, never listed by hand (a hand-kept list drifts
silently and a missed rerun is a wrong result nobody sees). :func:`module_closure`
follows ``import`` and ``from ... import`` statements anywhere in a file (including the
lazy imports inside functions), absolute and relative, ``from . import x`` included,
and adds the ``__init__`` of every package on the way, since Python runs those too. It
follows only this package's own modules: third-party packages are covered by
Snakemake's ``software-env`` trigger.

Static reading errs on the side of rerunning: a module imported on a branch that never
runs is still in the closure, and a change in a comment changes the hash (as it does for
Snakemake's own ``code`` trigger). A missed rerun cannot happen unless a module is loaded
by a computed name (``importlib.import_module(f"specalign.{x}")``), which this package
does not do; ``tests/workflow/test_fingerprint.py`` checks, for every job of a real run,
that each module the job actually loaded is in its closure.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Iterable
from functools import cache
from pathlib import Path

#: Where the source of the package whose modules are followed lies (its name is the
#: folder's).
PACKAGE_DIR = Path(__file__).resolve().parent


class FingerprintError(RuntimeError):
    """A script or module named by an import cannot be found or parsed."""


def module_path(name: str, root: Path = PACKAGE_DIR) -> Path | None:
    """The source file of module ``name`` of the package in ``root`` (a package's
    ``__init__.py``), or ``None`` when ``name`` is not a module of it (an attribute, a
    third-party name)."""
    parts = name.split(".")
    if parts[0] != root.name:
        return None
    base = root.joinpath(*parts[1:])
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _with_parents(name: str) -> list[str]:
    """``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``: importing a module runs every parent's
    ``__init__`` first."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def imported_names(source: str, module: str | None, is_package: bool = False) -> set[str]:
    """Every module name an import statement in ``source`` may load.

    ``module`` is the importing module's dotted name (``None`` for a script run as a
    file, which has no package and so no relative imports). For ``from X import y`` both
    ``X`` and ``X.y`` are returned, since ``y`` may be a submodule; callers keep the names
    that resolve to files. Names are absolute.
    """
    tree = ast.parse(source)
    package = module if is_package else (module.rpartition(".")[0] if module else "")
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if not package:
                    raise FingerprintError(f"relative import outside a package in {module}")
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    raise FingerprintError(f"relative import beyond the top package in {module}")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return names


def _direct_modules(path: Path, module: str | None, root: Path) -> frozenset[str]:
    """The package modules that the file ``path`` (module ``module``) imports directly,
    with their parent packages."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise FingerprintError(f"cannot read {path}: {exc}") from exc
    # every rule's script reaches the shared modules: parse each file once per version
    return _parsed(path, module, root, stat.st_mtime_ns, stat.st_size)


@cache
def _parsed(path: Path, module: str | None, root: Path, mtime_ns: int, size: int) -> frozenset[str]:
    try:
        source = path.read_text()
    except OSError as exc:
        raise FingerprintError(f"cannot read {path}: {exc}") from exc
    try:
        names = imported_names(source, module, _is_package(path))
    except SyntaxError as exc:
        raise FingerprintError(f"cannot parse {path}: {exc}") from exc
    found: set[str] = set()
    for name in names:
        for candidate in _with_parents(name):
            if module_path(candidate, root) is not None:
                found.add(candidate)
    return frozenset(found)


def module_closure(script: str | Path, root: Path = PACKAGE_DIR) -> list[str]:
    """Sorted names of every module of the package in ``root`` that running ``script``
    can load.

    The transitive closure over :func:`imported_names`, starting from the script (a file
    run by path, so its own imports are absolute).
    """
    script = Path(script).resolve()
    if not script.is_file():
        raise FingerprintError(f"script {script} does not exist")
    seen: set[str] = set()
    todo = list(_direct_modules(script, None, root))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = module_path(name, root)
        assert path is not None  # only resolvable names are queued
        todo.extend(_direct_modules(path, name, root) - seen)
    return sorted(seen)


def _digest(files: Iterable[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for label, path in files:
        h.update(label.encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def script_fingerprint(script: str | Path, root: Path = PACKAGE_DIR) -> str:
    """A short hash of ``script`` and of every module of the package in ``root`` it can
    load.

    Module files are labelled by their path inside the package, so the hash is the same
    for two copies of the workflow; the script is labelled ``<script>``.
    """
    script = Path(script).resolve()
    files = [("<script>", script)]
    for name in module_closure(script, root):
        path = module_path(name, root)
        assert path is not None
        files.append((str(path.relative_to(root)), path))
    return _digest(files)
