"""``rksc_sgl.stop_rules``: trace confidence over a sliding window, and the ESC and Beta
(Adaptive-Consistency) votes over branch answers by index."""

from __future__ import annotations

import math
import random

import pytest

from rksc_sgl import stop_rules
from rksc_sgl.stop_rules import (WindowConfidence, beta_decision, decide, esc_decision, leader_stays_probability,
                                 should_stop_trace, token_confidence)


class TestTraceConfidence:
    def test_token_confidence_is_minus_the_mean_of_the_first_k_logprobs(self):
        assert token_confidence([-0.1, -2.0, -3.9, -9.0], 3) == pytest.approx(2.0)

    def test_a_peaked_step_is_more_confident_than_a_flat_one(self):
        peaked = [math.log(0.97), math.log(0.01), math.log(0.01)]
        flat = [math.log(0.34), math.log(0.33), math.log(0.33)]
        assert token_confidence(peaked, 3) > token_confidence(flat, 3)

    def test_no_logprob_is_refused(self):
        with pytest.raises(ValueError):
            token_confidence([], 3)

    def test_the_window_judges_only_once_full_and_then_the_last_window_tokens(self):
        window = WindowConfidence(3)
        assert [window.push(c) for c in (1.0, 2.0)] == [None, None]
        assert window.push(3.0) == pytest.approx(2.0)
        assert window.push(7.0) == pytest.approx(4.0)  # (2 + 3 + 7) / 3

    def test_the_running_mean_matches_a_direct_mean_over_a_long_trace(self):
        rng = random.Random(0)
        values = [rng.uniform(0, 20) for _ in range(5000)]
        window = WindowConfidence(64)
        means = [window.push(v) for v in values]
        assert means[-1] == pytest.approx(sum(values[-64:]) / 64, rel=1e-12)

    def test_a_trace_stops_only_below_the_threshold(self):
        assert should_stop_trace(1.9, 2.0)
        assert not should_stop_trace(2.0, 2.0)
        assert not should_stop_trace(None, 2.0)


class TestEsc:
    def test_the_first_complete_unanimous_window_decides(self):
        answers = {0: "4", 1: "5", 2: "4", 3: "7", 4: "7", 5: "7"}
        assert esc_decision(answers, window=3) == "7"

    def test_an_incomplete_window_does_not_decide(self):
        assert esc_decision({0: "7", 1: "7"}, window=3) is None
        assert esc_decision({3: "7", 4: "7", 6: "7"}, window=3) is None  # window [3, 6) lacks 5

    def test_windows_are_by_index_not_by_finishing_order(self):
        assert esc_decision({1: "7", 2: "7", 3: "7"}, window=3) is None  # 1..3 spans two windows

    def test_no_answer_is_never_unanimous(self):
        assert esc_decision({0: None, 1: None, 2: None}, window=3) is None

    def test_min_samples_holds_the_decision(self):
        answers = {0: "7", 1: "7"}
        assert esc_decision(answers, window=2, min_samples=3) is None
        assert esc_decision({**answers, 5: "1"}, window=2, min_samples=3) == "7"


class TestBeta:
    def test_the_posterior_is_the_beta_tail_above_one_half(self):
        assert leader_stays_probability(1, 0) == pytest.approx(0.75)  # Beta(2, 1): 1 - 0.5**2
        assert leader_stays_probability(4, 0) == pytest.approx(31 / 32)
        assert leader_stays_probability(3, 3) == pytest.approx(0.5)

    def test_the_posterior_matches_a_numeric_integral_of_the_beta_density(self):
        a, b = 7, 3  # votes
        steps = 200_000
        density = lambda x: x**a * (1 - x) ** b  # noqa: E731
        xs = [(i + 0.5) / steps for i in range(steps)]
        total = sum(density(x) for x in xs)
        above = sum(density(x) for x in xs if x > 0.5)
        assert leader_stays_probability(a, b) == pytest.approx(above / total, abs=1e-6)

    def test_four_unanimous_votes_decide_at_095_three_do_not(self):
        assert beta_decision({0: "7", 1: "7", 2: "7"}, confidence=0.95) is None
        assert beta_decision({0: "7", 1: "7", 2: "7", 3: "7"}, confidence=0.95) == "7"

    def test_a_contested_vote_needs_a_wider_lead(self):
        answers = {i: a for i, a in enumerate(["7", "3", "7", "3", "7"])}
        assert beta_decision(answers, confidence=0.9) is None
        answers.update({5: "7", 6: "7", 7: "7", 8: "7"})  # 7 against 2
        assert beta_decision(answers, confidence=0.9) == "7"

    def test_branches_without_an_answer_do_not_vote(self):
        assert beta_decision({0: None, 1: None, 2: None, 3: None}, confidence=0.6) is None
        assert beta_decision({0: None, 1: "7", 2: None, 3: "7"}, confidence=0.85) == "7"  # 2 vs 0: 0.875


def test_decide_dispatches_on_the_rule_and_refuses_an_unknown_one():
    answers = {0: "7", 1: "7", 2: "7", 3: "7"}
    assert decide("esc", answers, window=2) == "7"
    assert decide("beta", answers, confidence=0.9) == "7"
    with pytest.raises(ValueError, match="unknown stop rule 'x'"):
        decide("x", answers)
    assert stop_rules.RULES == ("esc", "beta")


class TestWindowMinima:
    def test_every_threshold_stops_where_a_step_by_step_window_would(self):
        rng = random.Random(5)
        for _ in range(200):
            confidences = [rng.uniform(0.0, 3.0) for _ in range(rng.randint(1, 40))]
            window = rng.randint(1, 6)
            minima = stop_rules.window_minima(confidences, window)
            for threshold in (0.5, 1.0, 1.5, 2.0, 2.5):
                tracker, expected = WindowConfidence(window), None
                for k, c in enumerate(confidences, start=1):
                    if stop_rules.should_stop_trace(tracker.push(c), threshold):
                        expected = k
                        break
                assert stop_rules.first_stop(minima, threshold) == expected

    def test_minima_fall_and_a_trace_shorter_than_its_window_has_none(self):
        minima = stop_rules.window_minima([3.0, 1.0, 2.0, 0.5, 4.0], 2)
        assert minima == [(2, 2.0), (3, 1.5), (4, 1.25)]  # 0.5 + 4.0 at k = 5 is no new low
        assert stop_rules.window_minima([1.0], 2) == [] and stop_rules.first_stop([], 9.0) is None
