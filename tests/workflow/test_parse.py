"""What Snakemake pays on every call before it runs anything: the package modules the
rule files import for the names their outputs are derived from."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _imported_by_rules() -> list[str]:
    pattern = re.compile(r"^(?:from (specalign[\w.]*) import|import (specalign[\w.]*))", re.M)
    found = set()
    for path in [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]:
        for m in pattern.finditer(path.read_text()):
            found.add(m.group(1) or m.group(2))
    return sorted(found)


def test_parsing_the_workflow_imports_no_plotting_or_table_library():
    """The figure and table modules name their figures and tables at import; matplotlib
    (about 1 s), pandas and xarray (0.6 s together on 2 AVX2 cores) are imported when a
    figure is drawn or a file read (specalign.lazy)."""
    modules = _imported_by_rules()
    assert "specalign.commutators.report.figures" in modules  # the case this guards
    code = (
        "import sys\n"
        f"for m in {modules!r}: __import__(m)\n"
        "heavy = ('seaborn', 'matplotlib', 'scipy.stats', 'pandas', 'xarray')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_lazy_module_imports_on_first_use():
    from specalign.lazy import LazyModule

    code = (
        "import sys\nfrom specalign.lazy import LazyModule\n"
        "m = LazyModule('colorsys')\nbefore = 'colorsys' in sys.modules\n"
        "print(before, m.rgb_to_hsv(1.0, 0.0, 0.0), 'colorsys' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "(0.0,", "1.0,", "1.0)", "True"]
    assert "not imported yet" in repr(LazyModule("a.module.that.is.never.read"))
