"""``adaptive_fork``: fork a program state into branches, in rounds, until a stop rule is decided.

The branches are launched in rounds by branch index (``StopRule.rounds``); after each round the
rule sees the answers of every branch so far and, once decided, no further round is launched.
The body receives each branch's index, so a per-branch seed (``branch_options(f,
sampling_seed=seeds[b])``) makes branch ``b`` draw the same sample whether it ran in a round or
in one full fork: the finished branches of an early-stopped run are the full run's first ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

from rksc_sgl.stop_rules import StopRule


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
