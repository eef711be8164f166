"""CGEE level 1: a branch's generation confidence, the winner's, and the rule that skips verification.

The measure, from the token log-probabilities SGLang returns with ``return_logprob``:

* a branch's confidence is its geometric-mean token probability ``c = exp(mean_t log p_t)`` in
  (0, 1]: length-normalised (a sum or product of log-probabilities would favour short branches)
  and available without top-k log-probabilities;
* an answer's confidence is its likelihood-weighted vote share ``C(a) = sum_{i: a_i = a} c_i / N``
  over all N branches. Agreement between independently sampled branches is the strongest cheap
  correctness signal (self-consistency); weighting each vote by ``c_i`` discounts agreement among
  branches the model itself found unlikely, and branches with no answer count in N, so
  truncated or off-format samples lower the confidence instead of being ignored. ``C`` is 1 only
  when all branches agree and each token was certain, and equals the vote share when all c = 1.

Skip rule: the winner ``w = argmax C`` is accepted without verification iff ``C(w) >= tau_conf``
and ``(C(w) - C(r)) / C(w) >= margin``, ``r`` being the runner-up (``C(r) = 0`` if there is none).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Sequence

import torch


def branch_confidence(token_logprobs: Sequence[float] | torch.Tensor) -> float:
    """``exp(mean log p)`` of one branch's generated tokens; 0 for a branch with no tokens."""
    logprobs = torch.as_tensor(token_logprobs, dtype=torch.float64)
    if logprobs.numel() == 0:
        return 0.0
    return float(torch.exp(logprobs.mean()))


def answer_confidences(answers: Sequence[Hashable | None], confidences: Sequence[float]) -> dict[Hashable, float]:
    """``C(a)`` for each answer seen, in first-seen order (None answers only count in N)."""
    if len(answers) != len(confidences):
        raise ValueError(f"{len(answers)} answers but {len(confidences)} confidences")
    totals: dict[Hashable, float] = {}
    for answer, confidence in zip(answers, confidences):
        if answer is not None:
            totals[answer] = totals.get(answer, 0.0) + confidence
    n = len(answers)
    return {a: total / n for a, total in totals.items()}


@dataclasses.dataclass(frozen=True)
class SkipDecision:
    skip: bool
    winner: Hashable | None  # the answer with the highest C (None when no branch has one)
    winner_confidence: float
    runner_up_confidence: float

    @property
    def relative_margin(self) -> float:
        if self.winner_confidence <= 0:
            return 0.0
        return (self.winner_confidence - self.runner_up_confidence) / self.winner_confidence


def skip_decision(answer_confidence: dict[Hashable, float], tau_conf: float, margin: float) -> SkipDecision:
    """Apply the skip rule; ties go to the answer seen first."""
    ranked = sorted(answer_confidence.items(), key=lambda item: -item[1])  # stable: first seen wins ties
    if not ranked:
        return SkipDecision(False, None, 0.0, 0.0)
    winner, best = ranked[0]
    second = ranked[1][1] if len(ranked) > 1 else 0.0
    decision = SkipDecision(False, winner, best, second)
    skip = best >= tau_conf and decision.relative_margin >= margin and math.isfinite(best)
    return dataclasses.replace(decision, skip=skip)
