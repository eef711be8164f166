"""``benchmarks.bench`` end to end at its smallest, on the real engine: the table's workload
(best-of-N with the verifier) in a stock and an rksc mode writes its rows, and so do the agent
workloads (a chain of agents; best-of-N with a grader, in its steady state). A workload whose result
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


def test_sc_group_stop_sets_the_runtimes_saving_beside_its_replay(tmp_path):
    """``group-stop`` and ``group-stop+trace`` against ``exact`` on one problem; a trace threshold
    no window stays above stops every trace that reaches a full window (8 tokens), so the runtime's
    saving and its replay on exact's recorded confidences must agree."""
    argv = ["--workload", "sc", "--datasets", "arc-challenge", "--limit", "1", "--shots", "0", "--num-branches", "4",
            "--max-new-tokens", "24", "--modes", "exact,group-stop,group-stop+trace", "--stop-rule", "beta:0.6:1",
            "--trace-stop", "100", "--output-dir", str(tmp_path)]
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench", *argv], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    exact, stopped, traced = [json.loads(line) for line in (tmp_path / "sc.jsonl").read_text().splitlines()]
    assert (exact["mode"], stopped["mode"], stopped["stop_applied_by"]) == ("exact", "group-stop", "scheduler")
    assert len(exact["branch_answers"][0]) == 4 and len(exact["branch_conf_minima"][0]) == 4
    assert len(exact["branch_policy_answers"][0]) == 4  # what the scheduler's pattern reads, for the replay
    assert stopped["branches_sampled"] == len(stopped["branch_indices"][0]) >= 1
    assert stopped["replay_token_saving"] is not None and stopped["token_saving"] is not None
    assert stopped["branch_answer_agreement_vs_exact"] is not None
    assert traced["trace_stop"] == 100 and abs(traced["token_saving"] - traced["replay_token_saving"]) <= 0.05
    curve = json.loads((tmp_path / "sc_stop_curve.json").read_text())
    assert curve["datasets"]["arc-challenge"]["trace_points"]
    assert {p["applied_by"] for p in curve["datasets"]["arc-challenge"]["points"]} == {"rounds", "scheduler"}


def run_bench(tmp_path, argv: list[str]) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench", *argv, "--output-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    workload = argv[argv.index("--workload") + 1]
    return [json.loads(line) for line in (tmp_path / f"{workload}.jsonl").read_text().splitlines()]


def test_agents_rows_carry_ttft_per_agent_quality_and_blends_relay(tmp_path):
    """Two chains of four agents, 8 tokens each, exact and blend: every request timed to its first
    token, each agent's outputs against exact's, and no stop-rule curve (agents do not vote)."""
    rows = run_bench(tmp_path, ["--workload", "agents", "--datasets", "gsm8k", "--limit", "2", "--max-new-tokens", "8",
                                "--modes", "exact,asks-only"])
    exact, blend = rows
    assert [len(b) for b in exact["branch_answers"]] == [4, 4] and len(exact["answers"]) == 2
    for r in rows:
        assert r["ttft_requests"] == 8 and 0 < r["ttft_median_s"] <= r["ttft_p90_s"]
        assert 0 < r["ttft_median_s"] <= r["latency_median_s"] and set(r["ttft_median_s_by_agent"]) == {
            "planner", "solver", "critic", "answer"}
    assert "agent_output_identical_vs_exact" not in exact  # exact is the reference
    assert set(blend["agent_output_identical_vs_exact"]) == {"planner", "solver", "critic", "answer"}
    assert blend["quality_branches"] == 8 and blend["ttft_median_vs_exact"] > 0
    assert sum((blend["asks_outcomes"] or {}).values()) == 8  # every agent's request reported by blend
    assert not (tmp_path / "agents_stop_curve.json").exists()


def test_bon_grader_steady_measures_the_second_half_with_the_warm_up_apart(tmp_path):
    """Two problems, two candidates each: the first warms the cache untimed (its tokens counted
    apart), the second is measured; the grader's picks and verification time are in the rows."""
    rows = run_bench(tmp_path, ["--workload", "bon-grader-steady", "--datasets", "gsm8k", "--limit", "2",
                                "--shots", "1", "--num-branches", "2", "--max-new-tokens", "8",
                                "--modes", "exact,asks-only"])
    exact, blend = rows
    for r in rows:
        assert r["n_problems"] == 1 and r["reference_prefill_tokens"] > 0  # the warm-up half, apart
        assert len(r["grader_picks"]) == 1 and r["grader_picks"][0] in (0, 1) and r["verify_s"] > 0
        assert r["ttft_requests"] == 2 and r["verify_prefill_tokens"] > 0 and len(r["branch_tokens"][0]) == 2
    assert blend["grader_same_pick_vs_exact"] in (0.0, 1.0) and blend["grader_p_yes_abs_diff_vs_exact"] is not None
    assert blend["branch_text_agreement_vs_exact"] is not None and blend["first_token_kl_median"] is not None
