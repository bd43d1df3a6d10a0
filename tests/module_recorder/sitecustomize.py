"""Test-only: record which specalign modules a process loaded, at interpreter exit.

Put this folder on PYTHONPATH and set SPECALIGN_MODULE_LOG to a folder: every Python
process started with both (Snakemake's script jobs among them) writes
``{pid}.json`` there with its ``argv[0]`` and the ``specalign`` modules in
``sys.modules``. tests/workflow/test_fingerprint.py compares them with the static import
closure of each rule's script.
"""

import atexit
import json
import os
import sys


def _record() -> None:
    folder = os.environ.get("SPECALIGN_MODULE_LOG")
    if not folder:
        return
    modules = sorted(m for m in sys.modules if m == "specalign" or m.startswith("specalign."))
    record = {"argv0": sys.argv[0] if sys.argv else "", "modules": modules}
    with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as fh:
        json.dump(record, fh)


atexit.register(_record)
