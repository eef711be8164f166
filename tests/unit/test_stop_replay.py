"""Stop rules replayed on a full run's branches: savings, vote agreement, threshold choice."""

from __future__ import annotations

from benchmarks.bench.stop_replay import CURVE, choose, curve, replay_rule
from rksc_sgl.adaptive import StopRule

# Two problems x 6 branches: the first settles on A at once, the second only at the end.
ANSWERS = [["A", "A", "A", "B", "A", "A"], ["A", "B", "C", "B", "B", "B"]]
TOKENS = [[10, 10, 10, 10, 10, 10], [20, 20, 20, 20, 20, 20]]


def test_savings_count_the_branches_and_tokens_after_the_stop():
    point = replay_rule(StopRule.parse("esc:3"), ANSWERS, TOKENS)
    # Problem 1 stops after 3 branches (30 of 60 tokens), problem 2 after 6 (all 120).
    assert point["branches_sampled"] == 9 and point["branches_full"] == 12
    assert point["sample_saving"] == 0.25 and point["token_saving"] == round(1 - 150 / 180, 4)
    assert point["vote_agreement"] == 1.0


def test_an_early_vote_that_differs_from_the_full_one_lowers_agreement():
    answers = [["C", "C", "A", "A", "A", "A"]]  # esc:2 stops on C C; the full vote is A
    assert replay_rule(StopRule.parse("esc:2"), answers, [[1] * 6])["vote_agreement"] == 0.0
    assert replay_rule(StopRule.parse("none"), answers, [[1] * 6])["vote_agreement"] == 1.0


def test_the_curve_covers_esc_windows_2_to_6_and_beta_from_0_6_to_0_99():
    points = curve(ANSWERS, TOKENS)
    assert [p["rule"] for p in points] == list(CURVE) and {p["applied_by"] for p in points} == {"rounds"}
    both = curve(ANSWERS, TOKENS, branch_read=ANSWERS)
    assert [(p["rule"], p["applied_by"]) for p in both] == [
        *((r, "rounds") for r in CURVE), *((r, "scheduler") for r in CURVE)]
    assert CURVE[0] == "esc:2" and CURVE[4] == "esc:6" and CURVE[5] == "beta:0.6" and CURVE[-1] == "beta:0.99"


def test_choose_takes_the_largest_saving_that_reaches_the_target():
    points = [{"rule": "esc:2", "token_saving": 0.5, "vote_agreement": 0.9},
              {"rule": "esc:3", "token_saving": 0.3, "vote_agreement": 0.96},
              {"rule": "esc:4", "token_saving": 0.2, "vote_agreement": 1.0},
              {"rule": "beta:0.6", "token_saving": 0.6, "vote_agreement": 0.5}]
    assert choose(points, 0.95) == {"esc": "esc:3", "beta": None}
    scheduler = [{**p, "applied_by": "scheduler"} for p in points[:2]]
    assert choose(points + scheduler, 0.95) == {"esc": "esc:3", "beta": None, "esc (scheduler)": "esc:3",
                                               "beta (scheduler)": None}


def test_the_group_stop_replay_keeps_the_branches_that_finish_first():
    from benchmarks.bench.stop_replay import replay_group_stop

    # Problem 1: the three short A's decide beta:0.9:1 at step 3; the 3 others stop at 4 tokens.
    point = replay_group_stop(StopRule.parse("beta:0.9:1"), [["A", "A", "A", "B", "B", "B"]], [[1, 2, 3, 9, 9, 9]])
    assert point["branches_sampled"] == 3 and point["token_saving"] == round(1 - (6 + 12) / 33, 4)
    assert point["vote_agreement"] == 1.0  # the full vote is a tie A/B, A seen first


def test_the_group_stop_decides_on_the_answers_the_scheduler_reads():
    from benchmarks.bench.stop_replay import replay_group_stop

    # The program's extractor reads A in the three short texts, the scheduler's pattern only in
    # one: nothing is decided at step 3, every branch decodes to its end.
    answers, read, tokens = [["A", "A", "A", "B", "B", "B"]], [["A", None, None, "B", "B", "B"]], [[1, 2, 3, 9, 9, 9]]
    assert replay_group_stop(StopRule.parse("beta:0.9:1"), answers, tokens)["token_saving"] > 0
    point = replay_group_stop(StopRule.parse("beta:0.9:1"), answers, tokens, read)
    assert point["token_saving"] == 0 and point["branches_sampled"] == 6


class TestTraceStop:
    # One problem, 4 branches: branch 3's confidence falls below 1.0 at token 2 (a wrong answer).
    ANSWERS = [["A", "A", "A", "B"]]
    TOKENS = [[10, 10, 10, 10]]
    MINIMA = [[[[4, 2.0]], [[4, 2.5]], [[4, 3.0]], [[2, 1.5], [3, 0.5]]]]

    def test_a_stopped_trace_costs_one_token_past_its_stop_and_casts_no_vote(self):
        from benchmarks.bench.stop_replay import replay_trace_stop

        point = replay_trace_stop(StopRule.parse("none"), self.ANSWERS, self.TOKENS, self.MINIMA, 1.0, False)
        assert point["traces_stopped"] == 1 and point["branches_voting"] == 3
        assert point["token_saving"] == round(1 - 34 / 40, 4) and point["vote_agreement"] == 1.0
        untouched = replay_trace_stop(StopRule.parse("none"), self.ANSWERS, self.TOKENS, self.MINIMA, 0.1, False)
        assert untouched["traces_stopped"] == 0 and untouched["token_saving"] == 0.0

    def test_on_top_of_a_rule_in_rounds_and_in_the_scheduler(self):
        from benchmarks.bench.stop_replay import replay_trace_stop

        rounds = replay_trace_stop(StopRule.parse("esc:2"), self.ANSWERS, self.TOKENS, self.MINIMA, 1.0, False)
        assert rounds["branches_voting"] == 2 and rounds["token_saving"] == 0.5  # decided after round 1
        tokens = [[10, 10, 12, 12]]  # branches 0, 1 finish first and decide esc:2; 2 stops at 11
        at_once = replay_trace_stop(StopRule.parse("esc:2"), self.ANSWERS, tokens, self.MINIMA, 1.0, True)
        assert at_once["branches_voting"] == 2 and at_once["token_saving"] == round(1 - (10 + 10 + 11 + 4) / 44, 4)

    def test_the_curve_puts_t_at_percentiles_of_the_lowest_confidences(self):
        from benchmarks.bench.stop_replay import lowest_confidences, percentile_threshold, trace_curve

        assert lowest_confidences(self.MINIMA) == [2.0, 2.5, 3.0, 0.5]
        assert percentile_threshold([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
        assert percentile_threshold([1.0], 50) is None
        points = trace_curve(self.ANSWERS, self.TOKENS, self.MINIMA, "esc:2", percentiles=(50,))
        assert [(p["rule"], p["applied_by"]) for p in points] == [("none", "rounds"), ("esc:2", "rounds"),
                                                                    ("esc:2", "scheduler")]
