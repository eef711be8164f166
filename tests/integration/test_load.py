"""The load command, short: many forking programs at once against a server whose KV pool holds a
fraction of their working set, clients walking away mid-request. Nothing may crash, hang or leak."""

from __future__ import annotations

import json

import pytest

from benchmarks.serving import load

pytestmark = pytest.mark.integration


def test_forking_programs_under_pool_pressure_all_complete_and_the_pool_balances(tmp_path, capsys):
    out = tmp_path / "load.jsonl"
    status = load.main(["--programs", "8", "--forks", "4", "--max-new-tokens", "8", "--disconnects", "2",
                        "--pool-fraction", "0.25", "--timeout-s", "600", "--output", str(out)])
    report = json.loads(out.read_text().splitlines()[-1])
    assert status == 0, report
    assert report["programs_completed"] == 8 and report["programs_failed"] == 0 and report["programs_hung"] == 0
    assert report["kv_balanced"] and report["server_serving"]
    assert report["requests"] >= 8 * 5  # per program: the prefix commit and its forks
    assert report["pool_tokens"] < report["working_set_tokens"]  # the pool was under pressure
    assert report["kv_pool"]["evicted_tokens"] > 0
    assert report["program_latency_s"]["p50"] <= report["program_latency_s"]["p99"]
    assert len(report["disconnects"]) == 2 and "hung" not in report["disconnects"]
    assert '"programs_completed": 8' in capsys.readouterr().out  # the report is printed
