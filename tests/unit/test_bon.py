"""Best-of-N's per-mode summary: skip rate, exit layers, layer work and CGEE error (no engine)."""

from __future__ import annotations

import pytest

from benchmarks.bench.bon_verify import BonResult, summarize
from programs.datasets import Problem
from rksc_sgl.confidence import SkipDecision
from rksc_sgl.cgee import Candidate, VerifyResult

PROBLEM = Problem("arc-challenge", "q1", "?", ("x", "y"), "A")
CANDIDATES = (Candidate("", "A", (-0.1,)), Candidate("", "B", (-0.2,)))
NO_SKIP = SkipDecision(False, "A", 0.4, 0.3)


def verdict(mode: str, winner: int, exit_layer: int | None = None, layers_run: int | None = None) -> VerifyResult:
    return VerifyResult(mode, winner, CANDIDATES[winner].answer, False, (0.9, 0.8), NO_SKIP, (0.6, 0.4),
                        exit_layers=(exit_layer or 30,) * 2, layers_run=(layers_run or 30,) * 2)


def skipped(winner: int) -> VerifyResult:
    return VerifyResult("cgee", winner, CANDIDATES[winner].answer, True, (0.9, 0.8), SkipDecision(True, "A", 0.9, 0.0),
                        skip_reason="cgee")


class TestSummary:
    def test_counts_skips_exits_work_and_decisions_that_differ_from_full_depth(self):
        results = [
            BonResult(PROBLEM, CANDIDATES, {"full": verdict("full", 0), "cgee": skipped(0)}),
            BonResult(PROBLEM, CANDIDATES, {"full": verdict("full", 0), "cgee": verdict("cgee", 1, 12, 15)}),
        ]
        rows = {r["mode"]: r for r in summarize(results, {"full": 2.0, "cgee": 1.0}, "arc-challenge")}
        cgee, full = rows["cgee"], rows["full"]
        assert cgee["cgee_skip_rate"] == 0.5 and full["cgee_skip_rate"] == 0.0
        assert cgee["cgee_mean_exit_layer"] == 12 and cgee["cgee_mean_layers_run"] == 15
        assert cgee["layer_work_vs_full"] == pytest.approx((0 + 15 / 30) / 2)
        assert full["layer_work_vs_full"] == 1.0
        assert cgee["cgee_errors"] == 1 and full["cgee_errors"] == 0
        assert cgee["verify_time_ratio_vs_full"] == 0.5
        assert cgee["accuracy"] == 0.5 and full["accuracy"] == 1.0


class TestVoteSkip:
    def test_a_decided_vote_accepts_its_leader_unverified_with_its_own_reason(self):
        from rksc_sgl.cgee import verify

        candidates = (Candidate("", "B", (-2.0,)), Candidate("", "A", (-0.5,)), Candidate("", "B", (-0.1,)))
        # No backend is needed: nothing is sent when the vote is decided.
        result = verify(None, candidates, mode="full", vote_decided=True)
        assert (result.skipped, result.skip_reason, result.answer, result.winner) == (True, "vote", "B", 2)

    def test_vote_and_cgee_skips_are_counted_apart(self):
        vote = VerifyResult("full", 0, "A", True, (0.9, 0.8), NO_SKIP, skip_reason="vote")
        results = [BonResult(PROBLEM, CANDIDATES, {"full": vote}),
                   BonResult(PROBLEM, CANDIDATES, {"full": verdict("full", 0)})]
        (row,) = summarize(results, {"full": 1.0}, "arc-challenge")
        assert row["vote_skip_rate"] == 0.5 and row["cgee_skip_rate"] == 0.0 and row["verify_requests"] == 1

    def test_a_rule_decides_on_the_candidates_answers_and_none_never_does(self):
        from programs.bon import vote_decided
        from rksc_sgl.adaptive import StopRule

        same = (Candidate("", "A", ()), Candidate("", "A", ()))
        assert vote_decided(StopRule.parse("esc:2"), same)
        assert not vote_decided(StopRule.parse("esc:2"), CANDIDATES)
        assert not vote_decided(None, same) and not vote_decided(StopRule(), same)
