"""Test-only: record which specalign modules a process loaded, and which files it
opened from Python, at interpreter exit.

Put this folder on PYTHONPATH and set SPECALIGN_MODULE_LOG to a folder: every Python
process started with both (Snakemake's script jobs among them) writes
``{pid}.json`` there with its ``argv[0]``, the ``specalign`` modules in ``sys.modules``
and the absolute paths it opened through Python (the ``open`` audit event: ``open()``,
``os.open``, ``io.open_code``; a file opened by a C or Rust library, such as HDF5 or
safetensors' reader, raises no event), leaving out the interpreter's and the
environment's own files. tests/workflow/test_fingerprint.py compares the modules with
the static import closure of each rule's script; the content walk
(tests/workflow/test_faults_stale.py) compares the files with the rules' inputs.
"""

import atexit
import json
import os
import sys

_SKIP = tuple({os.path.join(p, "") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
_opened: set[str] = set()


def _audit(event: str, args: tuple) -> None:
    if event != "open" or not args or isinstance(args[0], int):
        return
    try:
        path = os.path.abspath(os.fsdecode(args[0]))
    except (TypeError, ValueError):
        return
    if not path.startswith(_SKIP) and not path.endswith((".py", ".pyc", ".so")):
        _opened.add(path)


def _record() -> None:
    folder = os.environ.get("SPECALIGN_MODULE_LOG")
    if not folder:
        return
    modules = sorted(m for m in sys.modules if m == "specalign" or m.startswith("specalign."))
    record = {
        "argv0": sys.argv[0] if sys.argv else "",
        "modules": modules,
        "opened": sorted(_opened),
    }
    with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as fh:
        json.dump(record, fh)


if os.environ.get("SPECALIGN_MODULE_LOG"):
    sys.addaudithook(_audit)
atexit.register(_record)
