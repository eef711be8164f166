"""``benchmarks.bench`` end to end at its smallest, on the real engine: the table's workload
(best-of-N with the verifier) in a stock and an rksc mode writes its rows. A workload whose result
shape drifts from what the bench reads fails here, not an hour into a table run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_bon_verify_writes_a_row_per_mode_with_cgee_columns_and_the_reference_pass_apart(tmp_path):
    argv = ["--workload", "bon-verify", "--datasets", "arc-challenge", "--limit", "1", "--shots", "1",
            "--max-new-tokens", "8", "--modes", "exact,rksc", "--output-dir", str(tmp_path)]
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench", *argv], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "bon-verify.jsonl").read_text().splitlines()]
    assert [r["mode"] for r in rows] == ["exact", "rksc"]
    exact, rksc = rows
    assert exact["cgee_errors"] is None and exact["reference_prefill_tokens"] is None
    assert rksc["cgee_errors"] in (0, 1) and rksc["cgee_thresholds"] is not None
    assert rksc["reference_prefill_tokens"] > 0  # the full-depth reference, counted apart from the mode's own
    assert all(len(r["branch_tokens"][0]) == 4 and r["verify_prefill_tokens"] is not None for r in rows)
