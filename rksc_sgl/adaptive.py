"""Adaptive sampling for programs: ``StopRule`` and ``adaptive_fork``, forking in rounds until the
vote is decided.

The decisions themselves are ``rksc_sgl.stop_rules``'s pure functions, shared with the
scheduler side: ESC (a complete window of W consecutive branches, by index, with one answer;
a ``None`` answer matches nothing) and Adaptive-Consistency's Beta rule (with ``a`` votes for the
leader and ``b`` for the runner-up, ``P(X > 1/2)`` for ``X ~ Beta(a + 1, b + 1)``, a uniform prior,
reaches the confidence c; exactly ``sum_{k<=a} C(a+b+1, k) / 2^(a+b+1)``).

A program's branches are launched in rounds by branch index (``StopRule.rounds``); after each
round the rule sees the answers of every branch so far and, once decided, no further round is
launched. The body receives each branch's index, so a per-branch seed (``branch_options(f,
sampling_seed=seeds[b])``) makes branch ``b`` draw the same sample whether it ran in a round or in
one full fork: the finished branches of an early-stopped run are the full run's first ones, and
``replay`` on a full run's answers gives where the rule stops. Torch- and SGLang-free.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from rksc_sgl.stop_rules import RULES, decide

NAMES = ("none", *RULES)
BETA_WINDOW = 2  # beta's default branches per round


@dataclasses.dataclass(frozen=True)
class StopRule:
    """A stop rule and its parameters. ``window``: branches launched per round (for ``esc`` also
    its window W); the rule is checked after each round, so no branch beyond the round in flight
    is ever sampled. ``confidence``, ``min_samples``: ``beta``'s c and its minimum sample count."""

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
        """``none``, ``esc:W`` or ``beta:C[:W]`` (W branches per round, default 2, and at least W
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
        """Whether the vote over ``answers`` (branches 0..k-1, by index) is decided."""
        if self.name == "none":
            return False
        return decide(self.name, dict(enumerate(answers)), window=self.window, confidence=self.confidence,
                      min_samples=self.min_samples) is not None

    def rounds(self, num_branches: int) -> list[range]:
        """The branch indices launched together, in order (``none``: all at once)."""
        step = num_branches if self.name == "none" else self.window
        return [range(start, min(start + step, num_branches)) for start in range(0, num_branches, step)]


def leader(answers: Sequence[Hashable | None]) -> Hashable | None:
    """The majority answer: the most frequent non-None answer, ties to the one seen first."""
    votes = collections.Counter(a for a in answers if a is not None)
    if not votes:
        return None
    best = max(votes.values())
    return next(a for a in answers if a is not None and votes[a] == best)


def replay(rule: StopRule, answers: Sequence[Hashable | None]) -> int:
    """How many of a full run's branches (by index) ``rule`` samples: the end of the first round
    after which it is decided, else all. The rule sees only the branches of completed rounds."""
    for branches in rule.rounds(len(answers)):
        if rule.decided(answers[:branches.stop]):
            return branches.stop
    return len(answers)


@dataclasses.dataclass(frozen=True)
class AdaptiveForks:
    forks: tuple[Any, ...]  # the finished branches' program states, by branch index (joined, readable)
    answers: tuple[Hashable | None, ...]  # per finished branch, its vote
    decided: bool  # the rule was decided (the vote is settled; later branches were not launched)

    def __len__(self) -> int:
        return len(self.forks)

    def __iter__(self):
        return iter(self.forks)


def adaptive_fork(s, num_branches: int, rule: StopRule | None, body: Callable[[Any, int], None],
                  answer: Callable[[Any], Hashable | None]) -> AdaptiveForks:
    """Fork ``s`` into at most ``num_branches`` branches until ``rule`` is decided (None: ``none``).

    ``body(fork, branch)`` adds branch ``branch``'s expressions to its fork, as after ``s.fork``;
    ``answer(fork)`` reads the branch's vote (it waits for the branch's generation). Each round's
    forks are joined once their answers are read; their text and variables stay readable.
    """
    rule = rule or StopRule()
    forks, answers = [], []
    for branches in rule.rounds(num_branches):
        group = s.fork(len(branches))
        for fork, branch in zip(group, branches):
            body(fork, branch)
        answers += [answer(fork) for fork in group]
        group.join()  # ends the round's worker threads
        forks += group.states
        if rule.decided(answers):
            return AdaptiveForks(tuple(forks), tuple(answers), True)
    return AdaptiveForks(tuple(forks), tuple(answers), False)
