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
runs is still in the closure. A missed rerun cannot happen unless a module is loaded by a
computed name (``importlib.import_module(f"specalign.{x}")``), which this package does
not do; ``tests/workflow/test_fingerprint.py`` checks, for every job of a real run, that
each module the job actually loaded is in its closure.

The hash is of the code, not of the files: comments and docstrings do not enter it, and
an import of the package's own modules enters as the code it binds, not the module's
dotted name, so moving a module to another folder (with the imports that name it
changed to match) reruns nothing, while changing a statement anywhere in the closure, or
binding a name to another module's definition, reruns every job that reaches it.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
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


def _from_base(node: ast.ImportFrom, module: str | None, package: str) -> str:
    """The absolute name of the ``from`` part of ``node``, in ``module`` of ``package``."""
    if not node.level:
        return node.module or ""
    if not package:
        raise FingerprintError(f"relative import outside a package in {module}")
    parts = package.split(".")
    if node.level - 1 >= len(parts):
        raise FingerprintError(f"relative import beyond the top package in {module}")
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


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
            base = _from_base(node, module, package)
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


# --------------------------------------------------------------------------------------
# The hash: what the code does, not where it lies
# --------------------------------------------------------------------------------------

_SLOT = re.compile(r"\x00(\d+)\x00")


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            return body[1:] or [ast.Pass()]
    return body


def _target(name: str, root: Path) -> str | None:
    """The package module that an imported dotted ``name`` is (itself, or the package it
    is an attribute of), or ``None`` for a name outside the package."""
    if module_path(name, root) is not None:
        return name
    parent = name.rpartition(".")[0]
    return parent if parent and module_path(parent, root) is not None else None


class _Normalizer(ast.NodeTransformer):
    """Turns a file's syntax tree into what running it does, with the package's own import
    targets as numbered slots (filled in with the targets' hashes, not their names).

    Docstrings and comments are not code (no module of the package reads ``__doc__``;
    ``tests/workflow/test_fingerprint.py`` holds that); the absolute module path of an
    import is where a definition lives, which a move changes without changing what runs.
    """

    def __init__(self, module: str | None, is_package: bool, root: Path):
        self.module = module
        self.package = module if is_package else (module.rpartition(".")[0] if module else "")
        self.root = root
        self.targets: list[str] = []

    def _slot(self, name: str) -> str:
        self.targets.append(name)
        return f"\x00{len(self.targets) - 1}\x00"

    def _strip(self, node):
        node.body = _strip_docstring(node.body)
        return self.generic_visit(node)

    visit_Module = visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _strip

    def visit_Import(self, node: ast.Import) -> ast.AST:
        for alias in node.names:
            target = _target(alias.name, self.root)
            if target is not None and alias.asname:
                alias.name = self._slot(target)
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST:
        base = _from_base(node, self.module, self.package)
        holder = _target(base, self.root)
        if holder is None:
            return node
        for alias in node.names:
            member = f"{base}.{alias.name}"
            source = member if module_path(member, self.root) is not None else holder
            alias.name = self._slot(source) + alias.name
        node.module, node.level = "<package>", 0
        return node


@cache
def _normalized(
    path: Path, module: str | None, root: Path, mtime_ns: int, size: int
) -> tuple[str, tuple[str, ...]]:
    """The file's code as a string with its package import targets as slots, and the
    targets, or ``("", ())`` for a file that runs nothing (a docstring-only ``__init__``)."""
    tree = ast.parse(path.read_text())
    tree.body = [s for s in _strip_docstring(tree.body) if not isinstance(s, ast.Pass)]
    if not tree.body:
        return "", ()
    normalizer = _Normalizer(module, _is_package(path), root)
    tree = normalizer.visit(tree)
    return ast.dump(tree, annotate_fields=False), tuple(normalizer.targets)


def _labels(files: dict[str, tuple[str, tuple[str, ...]]]) -> dict[str, str]:
    """A hash for each file that depends on its code and, through its imports, on the code
    of what it imports, but not on any module's name.

    Colour refinement: a file's label is first the hash of its own code with import
    targets blank, then, round after round, the hash of its code with each target replaced
    by the target's label, until the labels stop telling more files apart. Cycles of
    imports are fine, and two modules that differ only in where they import from differ.
    """
    labels = {name: "" for name in files}
    distinct = 0
    for _ in range(len(files) + 1):
        new = {}
        for name, (code, targets) in files.items():
            filled = _SLOT.sub(lambda m, t=targets, old=labels: old.get(t[int(m[1])], "?"), code)
            new[name] = hashlib.sha256(filled.encode()).hexdigest()
        labels = new
        if len(set(labels.values())) == distinct:
            break
        distinct = len(set(labels.values()))
    return labels


def script_fingerprint(script: str | Path, root: Path = PACKAGE_DIR) -> str:
    """A short hash of what ``script`` and every module of the package in ``root`` it can
    load would run.

    It follows the code, not the files: moving a module (and changing the imports that
    name it to match) or editing a comment or docstring leaves it as it is; a change to
    any statement of a reached file, or an import bound to another module, changes it.
    Modules that run nothing (a docstring-only package ``__init__``) do not count.
    """
    script = Path(script).resolve()
    closure = module_closure(script, root)
    files = {"<script>": _normalized_file(script, None, root)}
    for name in closure:
        path = module_path(name, root)
        assert path is not None
        files[name] = _normalized_file(path, name, root)
    labels = _labels(files)
    parts = [labels["<script>"], *sorted(labels[n] for n in closure if files[n][0])]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _normalized_file(path: Path, module: str | None, root: Path) -> tuple[str, tuple[str, ...]]:
    try:
        stat = path.stat()
        return _normalized(path, module, root, stat.st_mtime_ns, stat.st_size)
    except OSError as exc:
        raise FingerprintError(f"cannot read {path}: {exc}") from exc
    except SyntaxError as exc:
        raise FingerprintError(f"cannot parse {path}: {exc}") from exc


def script_fingerprints(scripts: Iterable[str | Path], root: Path = PACKAGE_DIR) -> dict[str, str]:
    """:func:`script_fingerprint` of each of ``scripts`` (keyed by the path as given),
    kept on disk (:mod:`specalign.kept`) under the content of every file they can depend on.

    Every ``snakemake`` call, dry runs included, needs the fingerprints of all rule
    scripts; parsing the package for them costs about a second a call. The key is the
    bytes of the scripts and of every ``.py`` file of the package (with its path inside
    the package, and the Python version, whose syntax trees the hash is made of), so any
    edit anywhere in the package is a new key: reading the files is all a kept answer
    costs, and no answer outlives the code it was computed from.
    """
    from specalign.kept import kept

    scripts = [str(s) for s in scripts]
    digest = hashlib.sha256(f"python {sys.version_info[:2]}\n".encode())
    try:
        for script in scripts:
            digest.update(f"script {script}\n".encode() + Path(script).read_bytes())
        for path in sorted(root.rglob("*.py")):
            digest.update(f"\nmodule {path.relative_to(root).as_posix()}\n".encode())
            digest.update(path.read_bytes())
    except OSError as exc:
        raise FingerprintError(f"cannot read {exc.filename}: {exc.strerror}") from exc
    return kept(
        "fingerprints",
        f"root {root.name}\n{digest.hexdigest()}",
        lambda: {script: script_fingerprint(script, root) for script in scripts},
    )
