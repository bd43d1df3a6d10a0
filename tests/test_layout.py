"""The package's layout rules, read from every import statement of ``src/specalign``
(lazy imports inside functions included), so that the drawing in each package's
``__init__`` stays true:

* each study's stages (``specalign.transformers.STAGES``,
  ``specalign.commutators.STAGES``: the data's order through the DAG) import no later
  stage, and a study's common modules (the modules directly in its folder, but for its
  ``settings``) import no stage;
* nothing imports a study's ``settings`` but the workflow and the entry points, since a
  study's settings stand above its stages;
* a shared module (``specalign/*.py``) imports no study: only the entry points (the
  console script ``cli`` and the Python API ``api``) stand above the studies;
* the two studies import nothing of each other;
* no module imports itself back through others (no circle).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specalign import commutators, transformers
from specalign.fingerprint import PACKAGE_DIR, imported_names, module_path

ENTRY_POINTS = {"specalign.cli", "specalign.api"}
STUDIES = ("specalign.transformers", "specalign.commutators")
#: Each study's stages, in order.
STAGES = {
    "specalign.transformers": transformers.STAGES,
    "specalign.commutators": commutators.STAGES,
}
#: Each study's common ground: the modules directly in its folder that every stage reads.
COMMON = {
    "specalign.transformers": {"weights", "variables", "metric_table", "lineage"},
    "specalign.commutators": {"contracts"},
}


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """The package modules ``name`` imports directly (not the packages on the way)."""
    found = set()
    for target in imported_names(path.read_text(), name, path.name == "__init__.py"):
        if module_path(target) is not None and target != name:
            found.add(target)
    # "from a.b import c" names both a.b and a.b.c: keep the deepest module only
    return {t for t in found if not any(o.startswith(t + ".") for o in found)}


IMPORTS = {name: _imports(name, path) for name, path in _modules().items()}


def _study(name: str) -> str | None:
    return next((st for st in STUDIES if name.startswith(st + ".")), None)


def _stage(name: str) -> str | None:
    """The stage of its study a module is in; "" for the study's common modules; None
    outside the stages (another package, the study's settings or its __init__)."""
    study = _study(name)
    if study is None or name == f"{study}.settings":
        return None
    first = name[len(study) + 1 :].split(".")[0]
    return first if first in STAGES[study] else ""


@pytest.mark.parametrize("study", STUDIES)
def test_every_stage_says_what_it_may_import_and_every_module_is_in_one(study):
    base = PACKAGE_DIR / study.split(".")[1]
    for stage in STAGES[study]:
        # a stage is a package, or a module when it is one module
        init = base / stage / "__init__.py"
        path = init if init.is_file() else base / f"{stage}.py"
        assert path.is_file(), f"{study}: stage {stage} is neither a package nor a module"
        assert "May import" in path.read_text(), f"{path} must say what the stage may import"
    loose = {p.stem for p in base.glob("*.py")} - {"__init__", "settings", *STAGES[study]}
    assert loose == COMMON[study], (
        f"a module directly in {base} is common ground of every stage; "
        f"put a stage's module in its stage: {sorted(loose - COMMON[study])}"
    )


@pytest.mark.parametrize("name", sorted(n for n in IMPORTS if _stage(n) is not None))
def test_no_stage_imports_a_later_one(name):
    here, study = _stage(name), _study(name)
    rank = {"": -1, **{s: i for i, s in enumerate(STAGES[study])}}
    for target in IMPORTS[name]:
        there = _stage(target) if _study(target) == study else None
        if there is None:
            assert not target.endswith(".settings"), f"{name} imports {target}"
            continue
        assert rank[there] <= rank[here], (
            f"{name} (stage {here or 'common'}) imports {target} "
            f"(stage {there or 'common'}, later)"
        )


@pytest.mark.parametrize("name", sorted(n for n in IMPORTS if n.count(".") == 1))
def test_shared_modules_import_no_study(name):
    if name in ENTRY_POINTS or name.startswith(STUDIES):
        return
    reached = {t for t in IMPORTS[name] if t.startswith(STUDIES)}
    assert not reached, f"the shared module {name} imports a study: {sorted(reached)}"


def test_the_studies_import_nothing_of_each_other():
    for name, targets in IMPORTS.items():
        for own, other in (STUDIES, STUDIES[::-1]):
            if name.startswith(own):
                crossing = {t for t in targets if t.startswith(other)}
                assert not crossing, f"{name} imports {sorted(crossing)}"


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (module -> the modules it imports), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        for nxt in sorted(graph.get(node, set())):
            if nxt in path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in done and (found := visit(nxt, [*path, nxt])):
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done and (found := visit(start, [start])):
            return found
    return None


def test_no_import_circle():
    circle = _circle(IMPORTS)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_the_rules_catch_a_violation():
    """The checks above read imports as written: a later stage imported lazily inside a
    function is found."""
    source = "def f():\n    from specalign.transformers.report import tables\n"
    targets = {
        t
        for t in imported_names(source, "specalign.transformers.measure.spectra")
        if module_path(t) is not None
    }
    assert "specalign.transformers.report.tables" in targets
    assert _stage("specalign.transformers.report.tables") == "report"
    assert _stage("specalign.transformers.weights") == ""
    assert _stage("specalign.transformers.settings") is None
    assert _stage("specalign.commutators.train") == "train"
    assert _stage("specalign.commutators.report.tables") == "report"
    assert _stage("specalign.commutators.contracts") == ""
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None
