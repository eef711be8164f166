"""Stop rules on simulated vote sequences: when each is decided, what it never looks at, parsing."""

from __future__ import annotations

import random

import pytest

from rksc_sgl.stop_rules import StopRule, beta, esc, leader, leader_probability, replay


class TestEsc:
    def test_a_complete_window_of_one_answer_decides(self):
        assert esc(["A", "A", "A"], 3)
        assert esc(["A", "B", "C", "B", "B", "B"], 3)

    def test_a_mixed_window_or_an_incomplete_one_does_not(self):
        assert not esc(["A", "A", "B"], 3)
        assert not esc(["A", "A"], 3)
        assert not esc(["A", "B", "C", "B", "B"], 3)

    def test_windows_are_by_branch_index_not_sliding(self):
        assert not esc(["A", "B", "B", "B", "C", "D"], 3)  # B B B straddles windows [0,3) and [3,6)

    def test_none_answers_count_as_different(self):
        assert not esc([None, None, None], 3)
        assert not esc(["A", None, "A"], 3)


class TestBeta:
    def test_posterior_is_the_exact_beta_tail(self):
        # a = 3, b = 0: P(Beta(4, 1) > 1/2) = 1 - 0.5**4.
        assert leader_probability(["A", "A", "A"]) == pytest.approx(15 / 16)
        # a = 4, b = 1: P(Bin(6, 1/2) <= 4) = 57/64.
        assert leader_probability(["A", "B", "A", "A", "A"]) == pytest.approx(57 / 64)
        assert leader_probability(["A", "B"]) == pytest.approx(0.5)  # a tie
        assert leader_probability([None, None]) == 0.0

    def test_only_leader_and_runner_up_count_and_none_is_no_vote(self):
        assert leader_probability(["A", "A", "A", "B", "C", None]) == leader_probability(["A", "A", "A", "B"])

    def test_decided_at_confidence_and_not_before_min_samples(self):
        assert beta(["A", "A", "A"], 0.9, 3)
        assert not beta(["A", "A"], 0.9, 2)  # 7/8 < 0.9
        assert not beta(["A", "A", "A"], 0.9, 4)
        assert not beta(["A", "A", "A"], 0.95, 3)  # 15/16 < 0.95


class TestReplay:
    def test_stops_after_the_first_decided_round(self):
        assert replay(StopRule.parse("esc:3"), ["A", "B", "A", "C", "C", "C", "A", "A", "A"]) == 6
        assert replay(StopRule.parse("esc:3"), ["A", "B"] * 4) == 8  # never decided: every branch
        assert replay(StopRule.parse("none"), ["A"] * 8) == 8
        assert replay(StopRule.parse("beta:0.9:1"), ["A"] * 8) == 3

    def test_the_last_round_may_be_partial(self):
        assert [len(r) for r in StopRule.parse("esc:3").rounds(8)] == [3, 3, 2]
        assert [len(r) for r in StopRule.parse("none").rounds(8)] == [8]

    @pytest.mark.parametrize("spec", ["esc:2", "esc:3", "esc:5", "beta:0.6", "beta:0.9", "beta:0.99:1", "beta:0.8:3"])
    def test_never_looks_at_a_branch_beyond_those_sampled(self, spec):
        """Whatever the answers after the stop point, the rule stops at the same branch, and it
        is shown only the branches of completed rounds."""
        rule, rng = StopRule.parse(spec), random.Random(spec)
        for _ in range(200):
            answers = [rng.choice(["A", "A", "B", "C", None]) for _ in range(16)]
            stop = replay(rule, answers)
            changed = answers[:stop] + [rng.choice(["A", "B", "D", None]) for _ in range(16 - stop)]
            assert replay(rule, changed) == stop
            seen = []
            probe = StopRule(rule.name, rule.window, rule.confidence, rule.min_samples)
            object.__setattr__(probe, "decided", lambda a: seen.append(len(a)) or rule.decided(a))
            replay(probe, answers)
            assert max(seen) == stop and all(n in {r.stop for r in rule.rounds(16)} for n in seen)


def test_leader_is_the_most_frequent_answer_ties_to_the_first_seen():
    assert leader(["B", "A", "A", "B", None]) == "B"
    assert leader([None]) is None


class TestParse:
    def test_specs_round_trip(self):
        for spec in ("none", "esc:3", "beta:0.9", "beta:0.95:1"):
            assert StopRule.parse(spec).spec == spec
        rule = StopRule.parse("beta:0.9")
        assert (rule.window, rule.min_samples, rule.confidence) == (2, 2, 0.9)

    @pytest.mark.parametrize("spec, message", [
        ("esc", "expected none"), ("esc:1", "window must be >= 2, got 1"), ("esc:x", "not a number"),
        ("beta:1.2", "confidence must be in (0.5, 1), got 1.2"), ("beta:0.9:0", "window must be >= 1, got 0"),
        ("adaptive:3", "unknown rule 'adaptive'"), ("none:3", "expected none"),
    ])
    def test_bad_specs_name_the_bad_value(self, spec, message):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            StopRule.parse(spec)
