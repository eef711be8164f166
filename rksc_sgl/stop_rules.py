"""Stop rules of adaptive sampling: when a vote over the branches sampled so far is decided.

Pure functions of the answers of branches ``0 .. k-1`` (by branch index, ``None`` = the branch
gave no answer), free of torch and SGLang, shared by the programs (``rksc_sgl.adaptive``), the
benchmark's offline replay and the scheduler side:

* ``esc(answers, window)``: Early-Stopping Self-Consistency (Li et al., 2024). The branches fall
  into windows ``[0, W), [W, 2W), ...``; the vote is decided once a complete window's answers are
  identical (a ``None`` answer differs from everything, itself included).
* ``beta(answers, confidence, min_samples)``: Adaptive-Consistency (Aggarwal et al., 2023) with
  its Beta stopping criterion. With ``a`` votes for the leader and ``b`` for the runner-up
  (``b = 0`` if there is none; ``None`` answers are no votes), the leader's share ``p`` of the
  two has posterior ``Beta(a + 1, b + 1)`` under a uniform prior, and the vote is decided once
  ``P(p > 1/2) >= confidence`` and at least ``min_samples`` branches were sampled. For integer
  parameters ``P(p > 1/2) = P(Binomial(a + b + 1, 1/2) <= a) = sum_{k<=a} C(a+b+1, k) / 2^(a+b+1)``
  (the Beta-Binomial identity), computed exactly.
* ``none``: never decided (every branch is sampled).

``StopRule`` is the validated value a flag or a program carries; ``StopRule.parse("esc:3")``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Hashable, Sequence

NAMES = ("none", "esc", "beta")
BETA_WINDOW = 2  # beta's default branches per round (checked after each round)


def esc(answers: Sequence[Hashable | None], window: int) -> bool:
    """A complete window of ``window`` consecutive branches (by index) has one answer."""
    for start in range(0, len(answers) - window + 1, window):
        part = answers[start:start + window]
        if part[0] is not None and all(a == part[0] for a in part):
            return True
    return False


def leader(answers: Sequence[Hashable | None]) -> Hashable | None:
    """The majority answer: the most frequent non-None answer, ties to the one seen first."""
    votes = collections.Counter(a for a in answers if a is not None)
    if not votes:
        return None
    best = max(votes.values())
    return next(a for a in answers if a is not None and votes[a] == best)


def leader_probability(answers: Sequence[Hashable | None]) -> float:
    """Posterior probability that the leader's share beats the runner-up's (module docstring)."""
    counts = sorted(collections.Counter(a for a in answers if a is not None).values(), reverse=True)
    if not counts:
        return 0.0
    a, b = counts[0], counts[1] if len(counts) > 1 else 0
    n = a + b + 1
    return sum(math.comb(n, k) for k in range(a + 1)) / 2 ** n


def beta(answers: Sequence[Hashable | None], confidence: float, min_samples: int) -> bool:
    return len(answers) >= min_samples and leader_probability(answers) >= confidence


@dataclasses.dataclass(frozen=True)
class StopRule:
    """A stop rule and its parameters. ``window``: branches launched per round (for ``esc``
    also its window W); the rule is checked after each round, so no branch beyond the round in
    flight is ever sampled. ``confidence``/``min_samples``: ``beta``'s c and minimum samples."""

    name: str = "none"
    window: int = 1
    confidence: float = 0.9
    min_samples: int = 1

    def __post_init__(self) -> None:
        if self.name not in NAMES:
            raise ValueError(f"stop rule: unknown rule {self.name!r}; valid: {', '.join(NAMES)}")
        if self.name == "esc" and self.window < 2:
            raise ValueError(f"stop rule esc: window must be >= 2, got {self.window}")
        if self.window < 1:
            raise ValueError(f"stop rule {self.name}: window must be >= 1, got {self.window}")
        if self.name == "beta" and not 0.5 < self.confidence < 1:
            raise ValueError(f"stop rule beta: confidence must be in (0.5, 1), got {self.confidence}")
        if self.min_samples < 1:
            raise ValueError(f"stop rule {self.name}: min_samples must be >= 1, got {self.min_samples}")

    @classmethod
    def parse(cls, spec: str) -> "StopRule":
        """``none``, ``esc:W`` or ``beta:C[:W]`` (W branches per round, default 2; at least W
        samples before a decision); ValueError naming the bad part."""
        name, *params = spec.strip().split(":")
        if name not in NAMES:
            raise ValueError(f"stop rule {spec!r}: unknown rule {name!r}; valid: {', '.join(NAMES)}")
        try:
            if name == "none" and not params:
                return cls()
            if name == "esc" and len(params) == 1:
                return cls("esc", window=int(params[0]))
            if name == "beta" and len(params) in (1, 2):
                window = int(params[1]) if len(params) == 2 else BETA_WINDOW
                return cls("beta", window=window, confidence=float(params[0]), min_samples=window)
        except ValueError as e:
            if "stop rule" in str(e):
                raise
            raise ValueError(f"stop rule {spec!r}: not a number where one is expected ({e})") from e
        raise ValueError(f"stop rule {spec!r}: expected none, esc:W or beta:C[:W]")

    @property
    def spec(self) -> str:
        if self.name == "esc":
            return f"esc:{self.window}"
        if self.name == "beta":
            return f"beta:{self.confidence:g}" + ("" if self.window == BETA_WINDOW else f":{self.window}")
        return "none"

    def decided(self, answers: Sequence[Hashable | None]) -> bool:
        """Whether the vote over ``answers`` (branches 0..k-1) is decided."""
        if self.name == "esc":
            return esc(answers, self.window)
        if self.name == "beta":
            return beta(answers, self.confidence, self.min_samples)
        return False

    def rounds(self, num_branches: int) -> list[range]:
        """The branch indices launched together, in order (``none``: all at once)."""
        step = num_branches if self.name == "none" else self.window
        return [range(start, min(start + step, num_branches)) for start in range(0, num_branches, step)]


def replay(rule: StopRule, answers: Sequence[Hashable | None]) -> int:
    """How many of a full run's branches (by index) ``rule`` samples before it stops: the end of
    the first round after which it is decided, else all of them. Only the branches of completed
    rounds are shown to the rule."""
    for branches in rule.rounds(len(answers)):
        if rule.decided(answers[:branches.stop]):
            return branches.stop
    return len(answers)
