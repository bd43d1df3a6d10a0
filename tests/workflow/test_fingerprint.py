"""Rerun fingerprints follow the imports (specalign.fingerprint).

Unit tests read every import form and follow a fake package. Against the real workflow,
every job of the test run recorded the specalign modules it actually loaded
(tests/module_recorder); each of them must be in the static closure of the job's script,
and every script rule of the DAG must have run, so that a rule whose fingerprint misses
a module it reaches cannot go unnoticed.
"""

import ast
import json
from pathlib import Path

import pytest
from snakemake_helpers import (
    SERIES_RULES,
    not_in_fingerprint,
    recorded_jobs,
    recording_env,
    rule_scripts,
    run_snakemake,
)

from specalign.fingerprint import (
    FingerprintError,
    imported_names,
    module_closure,
    script_fingerprint,
    script_fingerprints,
)


def test_imported_names_reads_every_form():
    source = """
import specalign.a.b
import specalign.c as alias
from specalign.d import e, f
from . import g
from .h import i
from ..j import k
from .. import l as m
from numpy import array

def lazy():
    from specalign import late
    import specalign.later
"""
    names = imported_names(source, "specalign.pkg.sub.mod")
    assert {
        "specalign.a.b",
        "specalign.c",
        "specalign.d",
        "specalign.d.e",
        "specalign.d.f",
        "specalign.pkg.sub",
        "specalign.pkg.sub.g",
        "specalign.pkg.sub.h",
        "specalign.pkg.sub.h.i",
        "specalign.pkg.j",
        "specalign.pkg.j.k",
        "specalign.pkg",
        "specalign.pkg.l",
        "specalign",
        "specalign.late",
        "specalign.later",
    } <= names
    assert "numpy" in names  # filtered later: only files of the package are followed


def test_relative_import_in_a_package_init():
    # in pkg/__init__.py, "from . import x" means pkg.x, not the parent's x
    assert "specalign.pkg.x" in imported_names("from . import x", "specalign.pkg", True)
    with pytest.raises(FingerprintError, match="outside a package"):
        imported_names("from . import x", None)


def _fake_package(root: Path) -> Path:
    pkg = root / "specalign"
    files = {
        "__init__.py": '"""top"""\n',
        "sub/__init__.py": "from .helper import HELP\n",
        "sub/helper.py": "HELP = 1\n",
        "sub/a.py": "from . import b\n",
        "sub/b.py": "def f():\n    from ..c import x\n    return x\n",
        "c.py": "x = 1\n",
        "unused.py": "y = 2\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    script = root / "script.py"
    script.write_text("from specalign.sub import a\nimport numpy\n")
    return pkg


def test_closure_follows_imports_and_package_inits(tmp_path):
    pkg = _fake_package(tmp_path)
    closure = module_closure(tmp_path / "script.py", pkg)
    assert closure == [
        "specalign",
        "specalign.c",
        "specalign.sub",
        "specalign.sub.a",
        "specalign.sub.b",
        "specalign.sub.helper",
    ]


@pytest.mark.parametrize(
    "edited, changes",
    [
        ("__init__.py", True),
        ("sub/__init__.py", True),
        ("sub/helper.py", True),  # reached only through the package's __init__
        ("sub/b.py", True),
        ("c.py", True),  # reached only through a lazy relative import
        ("unused.py", False),
    ],
)
def test_fingerprint_changes_with_every_reached_file(tmp_path, edited, changes):
    pkg = _fake_package(tmp_path)
    script = tmp_path / "script.py"
    before = script_fingerprint(script, pkg)
    path = pkg / edited
    path.write_text(path.read_text() + "EDITED = 1\n")
    assert (script_fingerprint(script, pkg) != before) is changes


def test_kept_fingerprints_are_the_computed_ones_and_follow_every_edit(tmp_path, monkeypatch):
    """Every snakemake call reads the rule scripts' fingerprints from the kept folder
    (specalign.kept): what it reads is what computing gives, and an edit of any file of
    the package (even one no script reaches, or a comment: the key is the bytes) or of a
    script is a new key, never an old answer."""
    monkeypatch.setenv("SPECALIGN_CACHE", str(tmp_path / "kept"))
    pkg = _fake_package(tmp_path)
    script = tmp_path / "script.py"

    def computed() -> dict[str, str]:
        return {str(script): script_fingerprint(script, pkg)}

    first = computed()
    assert script_fingerprints([script], pkg) == first
    assert len(list((tmp_path / "kept" / "fingerprints").iterdir())) == 1

    def not_again(*_args):
        raise AssertionError("computed again although kept")

    # kept: a second call computes nothing
    with monkeypatch.context() as patched:
        patched.setattr("specalign.fingerprint.script_fingerprint", not_again)
        assert script_fingerprints([script], pkg) == first
    for edited in ("c.py", "unused.py", "sub/b.py"):
        path = pkg / edited
        path.write_text(path.read_text() + "EDITED = 1\n")
        assert script_fingerprints([script], pkg) == computed(), edited
    script.write_text(script.read_text() + "\nEDITED = 2\n")
    assert script_fingerprints([script], pkg) == computed()
    assert len(list((tmp_path / "kept" / "fingerprints").iterdir())) == 5


def test_kept_fingerprints_of_a_missing_script_name_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECALIGN_CACHE", str(tmp_path / "kept"))
    pkg = _fake_package(tmp_path)
    with pytest.raises(FingerprintError, match=r"cannot read .*nope\.py"):
        script_fingerprints([tmp_path / "nope.py"], pkg)


@pytest.mark.parametrize(
    "edited, addition",
    [
        ("sub/b.py", "# a comment\n"),
        ("c.py", "\n\n"),
        ("sub/helper.py", None),  # a docstring put in front
        ("__init__.py", None),  # the docstring rewritten
    ],
)
def test_comments_and_docstrings_rerun_nothing(tmp_path, edited, addition):
    pkg = _fake_package(tmp_path)
    script = tmp_path / "script.py"
    before = script_fingerprint(script, pkg)
    path = pkg / edited
    text = path.read_text()
    if addition is None:
        body = text.split('"""')[-1] if text.startswith('"""') else text
        text = '"""Another docstring, with words."""\n' + body
    else:
        text += addition
    path.write_text(text)
    assert script_fingerprint(script, pkg) == before


def test_a_module_moved_reruns_nothing(tmp_path):
    # c.py moves into a new package (a docstring-only __init__), and b's import follows it
    pkg = _fake_package(tmp_path)
    script = tmp_path / "script.py"
    before = script_fingerprint(script, pkg)
    (pkg / "stage").mkdir()
    (pkg / "stage/__init__.py").write_text('"""A stage: what it holds."""\n')
    (pkg / "c.py").rename(pkg / "stage/c.py")
    (pkg / "sub/b.py").write_text("def f():\n    from ..stage.c import x\n    return x\n")
    assert "specalign.stage.c" in module_closure(script, pkg)
    assert script_fingerprint(script, pkg) == before
    # the same move with a changed statement reruns
    (pkg / "stage/c.py").write_text("x = 2\n")
    assert script_fingerprint(script, pkg) != before


def test_an_import_bound_to_another_module_reruns(tmp_path):
    # two modules define the same name; switching the import between them is a change,
    # even though both files are in the closure before and after
    pkg = _fake_package(tmp_path)
    script = tmp_path / "script.py"
    (pkg / "d.py").write_text("x = 3\n")
    (pkg / "sub/a.py").write_text("from . import b\nfrom .. import d\n")
    before = script_fingerprint(script, pkg)
    (pkg / "sub/b.py").write_text("def f():\n    from ..d import x\n    return x\n")
    (pkg / "sub/a.py").write_text("from . import b\nfrom .. import c\n")
    assert set(module_closure(script, pkg)) >= {"specalign.c", "specalign.d"}
    assert script_fingerprint(script, pkg) != before


def test_no_module_reads_docstrings(repo):
    # the hash leaves docstrings out: that is only sound while no code reads them
    for path in (repo / "src/specalign").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node, "attr", None) or getattr(node, "id", None)
            assert name not in {"__doc__", "getdoc", "getcomments"}, path


def test_fingerprint_changes_with_the_script_and_a_new_import(tmp_path):
    pkg = _fake_package(tmp_path)
    script = tmp_path / "script.py"
    before = script_fingerprint(script, pkg)
    script.write_text(script.read_text() + "import specalign.unused\n")
    assert "specalign.unused" in module_closure(script, pkg)
    assert script_fingerprint(script, pkg) != before


def test_missing_script_is_an_error(tmp_path):
    with pytest.raises(FingerprintError, match="does not exist"):
        module_closure(tmp_path / "nope.py")


# --------------------------------------------------------------------------------------
# The real workflow
# --------------------------------------------------------------------------------------


@pytest.mark.pipeline
def test_every_loaded_module_is_in_the_fingerprint(repo, finished_run, uci_data, tmp_path):
    scripts = rule_scripts(repo)
    assert len({p.name for p in scripts.values()}) == len(scripts), "script names must be unique"
    jobs = recorded_jobs(finished_run)
    # download_data needs the UCI files: run it alone on a mirror of them
    work = tmp_path / "download"
    work.mkdir()
    cfg = {"data": {"mirror": str(uci_data), "cache": "cache"}}
    (work / "config.yaml").write_text(json.dumps(cfg))
    run_snakemake(repo, work, "cache/ENB2012_data.xlsx", env=recording_env(work))
    for name, modules in recorded_jobs(work).items():
        jobs.setdefault(name, set()).update(modules)

    # the training rules' jobs are checked on the series run (SERIES_RULES)
    assert SERIES_RULES <= set(scripts), "a training rule was renamed: update SERIES_RULES"
    by_name = {p.name: rule for rule, p in scripts.items()}
    ran = {by_name[name] for name in jobs}
    assert ran | SERIES_RULES == set(scripts), "every script rule of the DAG must have run"
    assert not_in_fingerprint(scripts, jobs) == {}
