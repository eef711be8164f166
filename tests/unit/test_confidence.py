"""CGEE level 1: branch confidence, answer confidence and the skip rule (no engine)."""

from __future__ import annotations

import math

import pytest
import torch

from rksc_sgl.confidence import answer_confidences, branch_confidence, skip_decision
from rksc_sgl.config import RkscConfig
from rksc_sgl.cgee import Candidate, CgeeThresholds, verify, yes_probability


def logprobs(*probs: float) -> torch.Tensor:
    return torch.log(torch.tensor(probs, dtype=torch.float64))


def candidate(answer, *probs: float) -> Candidate:
    return Candidate(context="", answer=answer, token_logprobs=tuple(logprobs(*probs).tolist()))


THRESHOLDS = CgeeThresholds(tau_conf=0.6, margin=0.5, theta=1.0, epsilon=0.2, min_layer=8)


class TestBranchConfidence:
    def test_is_the_geometric_mean_token_probability(self):
        assert branch_confidence(logprobs(0.5, 0.5)) == pytest.approx(0.5)
        assert branch_confidence(logprobs(0.9, 0.1)) == pytest.approx(math.sqrt(0.09))

    def test_does_not_favour_short_branches(self):
        assert branch_confidence(logprobs(*[0.8] * 100)) == pytest.approx(branch_confidence(logprobs(0.8)))

    def test_certain_tokens_give_one_and_no_tokens_give_zero(self):
        assert branch_confidence(torch.zeros(7)) == pytest.approx(1.0)
        assert branch_confidence([]) == 0.0

    def test_accepts_plain_lists(self):
        assert branch_confidence([math.log(0.25)] * 3) == pytest.approx(0.25)


class TestAnswerConfidence:
    def test_is_the_likelihood_weighted_vote_share(self):
        conf = answer_confidences(["7", "7", "9", "7"], [1.0, 0.5, 1.0, 0.5])
        assert conf == pytest.approx({"7": 0.5, "9": 0.25})

    def test_branches_without_an_answer_count_against_every_answer(self):
        assert answer_confidences(["7", None, None, None], [1.0] * 4) == pytest.approx({"7": 0.25})

    def test_equals_the_vote_share_when_every_branch_is_certain(self):
        assert answer_confidences(["a", "b", "a"], [1.0] * 3) == pytest.approx({"a": 2 / 3, "b": 1 / 3})

    def test_rejects_mismatched_lengths(self):
        with pytest.raises(ValueError):
            answer_confidences(["a"], [1.0, 1.0])


class TestSkipRule:
    def test_unanimous_confident_winner_is_skipped(self):
        decision = skip_decision({"7": 0.9}, tau_conf=0.6, margin=0.5)
        assert decision.skip and decision.winner == "7"
        assert decision.relative_margin == pytest.approx(1.0)

    def test_winner_below_tau_is_verified(self):
        assert not skip_decision({"7": 0.55}, tau_conf=0.6, margin=0.0).skip

    def test_winner_without_a_relative_margin_is_verified(self):
        decision = skip_decision({"7": 0.7, "9": 0.4}, tau_conf=0.6, margin=0.5)
        assert decision.relative_margin == pytest.approx(3 / 7)
        assert not decision.skip
        assert skip_decision({"7": 0.7, "9": 0.3}, tau_conf=0.6, margin=0.5).skip

    def test_ties_go_to_the_answer_seen_first_and_are_never_skipped_with_a_margin(self):
        decision = skip_decision({"9": 0.5, "7": 0.5}, tau_conf=0.1, margin=0.1)
        assert decision.winner == "9" and not decision.skip

    def test_no_answer_means_no_winner_and_no_skip(self):
        decision = skip_decision({}, tau_conf=0.0, margin=0.0)
        assert decision.winner is None and not decision.skip


class TestVerifySkipPath:
    def test_a_confident_winner_is_accepted_without_any_request(self):
        candidates = [candidate("7", 0.95, 0.9), candidate("7", 0.99), candidate("9", 0.3), candidate("7", 0.9)]
        result = verify(None, candidates, mode="cgee", thresholds=THRESHOLDS)  # None: no backend needed
        assert result.skipped and result.answer == "7" and result.scores is None
        assert result.winner == 1  # the most confident branch with the winning answer
        assert result.decision == "7"

    def test_unknown_mode_is_refused(self):
        with pytest.raises(ValueError, match="mode"):
            verify(None, [candidate("7", 0.9)], mode="fast", thresholds=THRESHOLDS)


class TestYesProbability:
    def test_normalises_over_the_yes_and_no_spellings(self):
        lp = {1: math.log(0.2), 2: math.log(0.1), 3: math.log(0.1), 4: math.log(0.6)}
        assert yes_probability(lp, yes_ids=(1, 2), no_ids=(3,)) == pytest.approx(0.75)

    def test_is_one_half_without_evidence(self):
        assert yes_probability({}, (1,), (2,)) == 0.5


class TestCommittedDefaults:
    def test_rksc_config_defaults_are_the_committed_calibration(self):
        from pathlib import Path

        path = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cgee_thresholds.json"
        assert CgeeThresholds.from_config(RkscConfig()) == CgeeThresholds.load(str(path))

    def test_a_dataset_gets_its_own_thresholds_where_the_file_has_them(self, tmp_path):
        import json

        pooled = {"tau_conf": 0.2, "margin": 0.8, "theta": 0.1, "epsilon": 0.02, "min_layer": 30}
        strict = {**pooled, "tau_conf": 1.0, "margin": 1.0}
        path = tmp_path / "t.json"
        path.write_text(json.dumps({"thresholds": pooled, "per_dataset": {"mmlu-stem": {"thresholds": strict}}}))
        assert CgeeThresholds.load(str(path), "mmlu-stem") == CgeeThresholds(**strict)
        assert CgeeThresholds.load(str(path), "gsm8k") == CgeeThresholds(**pooled)
        assert CgeeThresholds.load(str(path)) == CgeeThresholds(**pooled)
        bad = {"mmlu-stem": {"thresholds": {**strict, "margin": 7}}}
        path.write_text(json.dumps({"thresholds": pooled, "per_dataset": bad}))
        with pytest.raises(ValueError, match="--cgee-margin"):  # another dataset's bad entry fails too
            CgeeThresholds.load(str(path), "gsm8k")

    def test_bad_thresholds_name_the_flag(self):
        with pytest.raises(ValueError, match="--cgee-margin"):
            RkscConfig(cgee_margin=1.5)
        with pytest.raises(ValueError, match="--cgee-min-layer"):
            RkscConfig(cgee_min_layer=1)
