"""``StopRule`` on simulated vote sequences: rounds, where a replay stops, what it never looks at, parsing."""

from __future__ import annotations

import random

import pytest

from rksc_sgl.adaptive import StopRule, leader, replay


class TestDecided:
    """``StopRule.decided`` applies ``rksc_sgl.stop_rules``'s decisions to branches 0..k-1."""

    def test_esc_needs_a_complete_window_by_index_with_one_answer(self):
        esc = StopRule.parse("esc:3")
        assert esc.decided(["A", "B", "C", "B", "B", "B"])
        assert not esc.decided(["A", "B", "B", "B", "C", "D"])  # B B B straddles two windows
        assert not esc.decided(["A", "A"]) and not esc.decided([None, None, None])

    def test_beta_decides_at_its_confidence_after_its_round(self):
        # a = 3, b = 0: P(Beta(4, 1) > 1/2) = 15/16 >= 0.9; a = 2: 7/8 < 0.9.
        assert StopRule.parse("beta:0.9:1").decided(["A", "A", "A"])
        assert not StopRule.parse("beta:0.9:1").decided(["A", "A", None])
        assert not StopRule.parse("beta:0.9:4").decided(["A", "A", "A"])  # min_samples = window = 4
        assert not StopRule.parse("beta:0.95:1").decided(["A", "A", "A"])

    def test_none_never_decides(self):
        assert not StopRule.parse("none").decided(["A"] * 16)


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


class TestReplayConcurrent:
    """The runtime's group stop: every branch at once, the shortest finish first, the others stop
    one token after the decision."""

    def test_the_shortest_branches_vote_first_and_the_rest_stop_one_token_later(self):
        from rksc_sgl.adaptive import replay_concurrent

        answers = ["B", "A", "A", "B", "A"]
        tokens = [50, 10, 12, 40, 14]  # A, A, A finish at steps 10, 12, 14: beta:0.9:1 decides at 14
        used, kept = replay_concurrent(StopRule.parse("beta:0.9:1"), answers, tokens)
        assert kept == [1, 2, 4] and used == 10 + 12 + 14 + 15 + 15

    def test_an_undecided_vote_decodes_every_branch(self):
        from rksc_sgl.adaptive import replay_concurrent

        used, kept = replay_concurrent(StopRule.parse("esc:2"), ["A", "B", "C"], [5, 6, 7])
        assert used == 18 and kept == [0, 1, 2]
        assert replay_concurrent(StopRule.parse("none"), ["A"] * 4, [3] * 4) == (12, [0, 1, 2, 3])

    def test_esc_waits_for_a_window_by_index_whatever_finishes_first(self):
        from rksc_sgl.adaptive import replay_concurrent

        # Branches 2 and 3 (window 1) finish first with one answer; window 0 (0, 1) finishes last.
        used, kept = replay_concurrent(StopRule.parse("esc:2"), ["A", "B", "C", "C"], [30, 31, 5, 6])
        assert kept == [2, 3] and used == 5 + 6 + 7 + 7

    def test_branches_finishing_at_one_step_are_read_together(self):
        from rksc_sgl.adaptive import replay_concurrent

        # beta:0.9 decides {A, A, A} but not {A, A, A, D}: all four end at step 6, so nothing is
        # decided there, whatever their indices; two more A at step 9 decide (5 to 1).
        rule = StopRule.parse("beta:0.9")
        for answers in (["A", "A", "A", "D", "A", "A", "B"], ["D", "A", "A", "A", "A", "A", "B"]):
            used, kept = replay_concurrent(rule, answers, [6, 6, 6, 6, 9, 9, 30])
            assert rule.decision({b: "A" for b in range(3)}) == "A"
            assert kept == [0, 1, 2, 3, 4, 5] and used == 6 * 4 + 9 * 2 + 10

    def test_the_group_policy_carries_the_rule(self):
        esc, beta = StopRule.parse("esc:3").group_policy("x"), StopRule.parse("beta:0.8:4").group_policy("x")
        assert (esc.rule, esc.window, esc.min_samples) == ("esc", 3, 1)
        assert (beta.rule, beta.confidence, beta.min_samples) == ("beta", 0.8, 4)
        assert StopRule.parse("none").group_policy("x") is None

    def test_the_group_policy_carries_ordered_patterns_and_the_normalisation(self):
        policy = StopRule.parse("beta:0.9").group_policy(["a(\\d)", "\\d"], "number")
        assert policy.answer_pattern == ("a(\\d)", "\\d") and policy.answer_normalize == "number"
