"""Stop rules replayed on a full run's branches: savings, vote agreement, threshold choice."""

from __future__ import annotations

from benchmarks.stop_replay import CURVE, choose, curve, replay_rule
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
    assert [p["rule"] for p in points] == list(CURVE)
    assert CURVE[0] == "esc:2" and CURVE[4] == "esc:6" and CURVE[5] == "beta:0.6" and CURVE[-1] == "beta:0.99"


def test_choose_takes_the_largest_saving_that_reaches_the_target():
    points = [{"rule": "esc:2", "token_saving": 0.5, "vote_agreement": 0.9},
              {"rule": "esc:3", "token_saving": 0.3, "vote_agreement": 0.96},
              {"rule": "esc:4", "token_saving": 0.2, "vote_agreement": 1.0},
              {"rule": "beta:0.6", "token_saving": 0.6, "vote_agreement": 0.5}]
    assert choose(points, 0.95) == {"esc": "esc:3", "beta": None}
