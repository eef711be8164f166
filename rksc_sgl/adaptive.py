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
``replay`` on a full run's answers gives where the rule stops.

With an ``answer_pattern`` (and ``answer_normalize``) the rule runs in the runtime instead (``radix_ext.stop.stopper``): every
branch is launched at once, tagged with one fresh group and the rule as the group's policy; once
the vote over the branches that finished is decided, the scheduler stops the others, which cost
only the tokens they had decoded (one round, no program round trips). The branches that finish
first are the shortest, not the first by index: ``replay_concurrent`` replays that on a full
run's answers and token counts. Torch- and SGLang-free (the fork needs our runtime).
"""

from __future__ import annotations

import collections
import dataclasses
import uuid
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from rksc_sgl.program_state import add_custom_params
from rksc_sgl.stop_options import GroupPolicy, GroupTag, stopped_by_runtime
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

    def decision(self, answers: dict[int, Hashable | None]) -> Hashable | None:
        """The decided answer over ``answers`` (branch index -> answer; any indices), or None."""
        if self.name == "none":
            return None
        return decide(self.name, answers, window=self.window, confidence=self.confidence, min_samples=self.min_samples)

    def group_policy(self, answer_pattern: str | Sequence[str], answer_normalize: str | None = None) -> GroupPolicy | None:
        """The rule as the runtime's group policy (``rksc_group_policy``), votes read with
        ``answer_pattern`` (one regex, or an ordered list) and ``answer_normalize``; None for ``none``."""
        if self.name == "none":
            return None
        patterns = answer_pattern if isinstance(answer_pattern, str) else tuple(answer_pattern)
        return GroupPolicy(patterns, self.name, window=self.window if self.name == "esc" else 3,
                           confidence=self.confidence if self.name == "beta" else 0.95, min_samples=self.min_samples,
                           answer_normalize=answer_normalize)

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


def replay_concurrent(rule: StopRule, answers: Sequence[Hashable | None], tokens: Sequence[int],
                      votes: Sequence[bool] | None = None) -> tuple[int, list[int]]:
    """The runtime group stop replayed on a full run's branches (answers and completion tokens,
    by index): all start together and decode one token per step, branch ``b`` finishing at step
    ``tokens[b]``; after each step the rule reads the vote over every branch finished so far (as
    the scheduler does: ``radix_ext.stop.stopper``), and once it is decided the others stop one
    token later. ``votes[b]`` False: branch ``b`` ends at ``tokens[b]`` without a vote (a trace
    stop). Returns the tokens decoded in all, and the indices that finished with a vote."""
    n = len(answers)
    votes = [True] * n if votes is None else list(votes)
    finished: dict[int, Hashable | None] = {}
    done = 0
    for step in sorted(set(tokens)):
        ending = [b for b in range(n) if tokens[b] == step]
        done += len(ending)
        finished |= {b: answers[b] for b in ending if votes[b]}
        if done < n and any(votes[b] for b in ending) and rule.decision(finished) is not None:
            return sum(min(t, step + 1) for t in tokens), sorted(finished)
    return sum(tokens), sorted(finished)


@dataclasses.dataclass(frozen=True)
class AdaptiveForks:
    forks: tuple[Any, ...]  # the finished branches' program states, by branch index (joined, readable)
    answers: tuple[Hashable | None, ...]  # per finished branch, its vote
    decided: bool  # the rule was decided (the vote is settled; later branches were not launched or were stopped)
    indices: tuple[int, ...] = ()  # each finished branch's index (rounds: 0..k-1; in the runtime: any)
    stopped: int = 0  # branches the runtime stopped (the vote was decided, or a trace stop): no vote

    def __len__(self) -> int:
        return len(self.forks)

    def __iter__(self):
        return iter(self.forks)


def adaptive_fork(s, num_branches: int, rule: StopRule | None, body: Callable[[Any, int], None],
                  answer: Callable[[Any], Hashable | None], *, answer_pattern: str | Sequence[str] | None = None,
                  answer_normalize: str | None = None) -> AdaptiveForks:
    """Fork ``s`` into at most ``num_branches`` branches until ``rule`` is decided (None: ``none``).

    ``body(fork, branch)`` adds branch ``branch``'s expressions to its fork, as after ``s.fork``;
    ``answer(fork)`` reads the branch's vote (it waits for the branch's generation). Each round's
    forks are joined once their answers are read; their text and variables stay readable.

    ``answer_pattern`` (a regex, or an ordered list of them, and ``answer_normalize``: the
    scheduler reads a branch's vote as ``rksc_sgl.stop_rules.read_answer`` does, which should be
    as ``answer`` reads it; a program's extractor's are ``programs.datasets.answers.answer_reading``):
    launch every branch at once and let the runtime stop the others once the vote over the
    finished ones is decided (our server or engine). The result holds the branches that finished
    by themselves, with their ``indices``; the stopped ones are counted.
    """
    rule = rule or StopRule()
    if answer_pattern is not None and rule.name != "none":
        return _fork_in_runtime(s, num_branches, rule, body, answer, rule.group_policy(answer_pattern, answer_normalize))
    forks, answers, indices, stopped = [], [], [], 0
    for branches in rule.rounds(num_branches):
        group = s.fork(len(branches))
        for fork, branch in zip(group, branches):
            body(fork, branch)
        votes = [answer(fork) for fork in group]
        group.join()  # ends the round's worker threads
        for state, branch, vote in zip(group.states, branches, votes):
            if _stopped(state):  # a trace stop the branch's own options asked for: no vote
                stopped += 1
                continue
            forks.append(state), answers.append(vote), indices.append(branch)
        if rule.decision(dict(zip(indices, answers))) is not None:
            return AdaptiveForks(tuple(forks), tuple(answers), True, tuple(indices), stopped)
    return AdaptiveForks(tuple(forks), tuple(answers), False, tuple(indices), stopped)


def _stopped(state) -> bool:
    """Whether the runtime stopped any gen of a (joined) fork early (``rksc_stop``)."""
    return any(stopped_by_runtime(m) for m in getattr(state.stream_executor, "meta_info", {}).values())


def _fork_in_runtime(s, num_branches: int, rule: StopRule, body, answer, policy: GroupPolicy) -> AdaptiveForks:
    group_id = uuid.uuid4().hex  # fresh per call: no other program's votes can reach this group
    forks = s.fork(num_branches)
    for branch, fork in enumerate(forks):
        add_custom_params(fork, {**GroupTag(group_id, branch).to_custom_params(), **policy.to_custom_params()})
        body(fork, branch)
    votes = [answer(fork) for fork in forks]  # waits for every branch, finished or stopped
    forks.join()
    states = forks.states
    stopped = {b for b, state in enumerate(states) if _stopped(state)}
    kept = [b for b in range(num_branches) if b not in stopped]
    decided = bool(stopped) or rule.decision({b: votes[b] for b in kept}) is not None
    return AdaptiveForks(tuple(states[b] for b in kept), tuple(votes[b] for b in kept), decided, tuple(kept),
                         len(stopped))
