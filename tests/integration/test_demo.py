"""``make demo`` end to end, at its smallest: both engines, every workload, the report.

The report's own formatting is unit-tested on hand-made results (``tests/unit/test_demo_args.py``);
this test runs the glue between the workloads and the report on the real engines, which the unit
test cannot reach (a changed return shape of a workload fails here, not in a user's first command).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_the_demo_runs_every_workload_and_prints_each_speed_up_beside_its_agreement():
    argv = ["--sc-problems", "1", "--branches", "2", "--tot-problems", "1", "--bon-problems", "1",
            "--vote-problems", "2", "--vote-branches", "4"]  # every workload
    done = subprocess.run([sys.executable, "-m", "programs.demo", *argv], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for line in ("paraphrase self-consistency          ASKS", "tree of thoughts, pool < tree        RSBCM",
                 "self-consistency, n-sample requests  early stop", "best-of-4, verification              CGEE"):
        assert line in out, out
    assert "votes agree 1/1" in out or "votes agree 0/1" in out
    assert "decisions differ from full depth" in out and "ASKS (blend):" in out and "CGEE: skipped" in out
    assert "votes agree with the full vote" in out and "children once their problem's vote was decided" in out
