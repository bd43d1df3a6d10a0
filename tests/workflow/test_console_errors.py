"""A failed job says so in one line on the console, with its log's path; the traceback
is in the job's log (issue 17: one failed fetch_model printed 189 lines, 8 tracebacks and
its message 4 times)."""

import subprocess
import sys
import textwrap

import pytest
import yaml
from snakemake_helpers import run_snakemake

_JOB = textwrap.dedent(
    """
    import sys
    from types import SimpleNamespace
    from specalign.workflow import run_script

    def main(smk):
        def deep():
            raise ValueError("the input x.h5 is damaged\\nsecond line")
        deep()

    smk = SimpleNamespace(log=[sys.argv[1]], threads=1, rule="fake",
                          wildcards={"model": "m1"})
    run_script(smk, main)
    """
)


def test_a_failed_script_prints_one_line_and_logs_the_traceback(tmp_path):
    log = tmp_path / "logs" / "fake.log"
    proc = subprocess.run(
        [sys.executable, "-c", _JOB, str(log)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1, proc.stderr
    assert errors[0].endswith(
        "rule fake (model=m1) failed: ValueError: the input x.h5 is damaged | second line "
        f"[traceback in {log}]"
    )
    assert "Traceback" not in proc.stderr and "deep()" not in proc.stderr
    text = log.read_text()
    assert text.count("Traceback (most recent call last)") == 1 and "in deep" in text
    assert "rule fake (model=m1) failed: ValueError" in text


@pytest.mark.pipeline
def test_a_failed_fetch_model_is_one_line_on_the_console(repo, tmp_path):
    cfg = {
        "threads": 1,
        "transformers": {
            "models": {"nothere": {"source": "hub", "id": "specalign-test/not-cached"}},
            "steering": {"target_id": 1},
        },
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    out = run_snakemake(
        repo, tmp_path, "results/transformers/nothere/weights.h5", check=False, timeout=600
    )
    log = tmp_path / "logs" / "transformers" / "nothere" / "fetch_model.log"
    assert "Traceback" not in out, out[-4000:]
    lines = [line for line in out.splitlines() if "is not in the cache" in line]
    assert len(lines) == 1, out[-4000:]
    assert "rule fetch_model (model=nothere) failed: ModelSourceError" in lines[0]
    assert "[traceback in logs/transformers/nothere/fetch_model.log]" in lines[0]
    assert "Traceback (most recent call last)" in log.read_text()
