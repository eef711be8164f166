"""RSBCM eviction: ``importance = branch_score / (depth + 1)``, lowest evicted first.

A strategy in SGLang's form (``sglang/srt/mem_cache/evict_policy.py``): ``get_priority(node)``
returns a sort key, and RadixCache's ``evict`` pops the evictable leaf with the smallest key. The
evict loop only ever sees unlocked leaves, so this strategy never has to think about locks.

Node metadata lives on SGLang's ``TreeNode`` as two plain attributes (it has no ``__slots__``):

* ``rksc_depth``: the fork level of the program branch that created the node's tokens, or None
  for tokens no branch claimed (shared prompts, zero-token prefix requests);
* ``rksc_score``: the branch's score in [0, 1] once the program reported it, else None.

The key is ``(importance, last_access_time)``, like SGLang's ``PriorityStrategy``:

* a scored node's importance is ``score / (depth + 1)``;
* an unscored node's importance is ``unscored_importance`` (default 0.0): unscored nodes rank
  with the worst scored ones and among themselves they evict in plain LRU order, because a
  single constant ties them and ``last_access_time`` breaks the tie;
* equal importance falls back to LRU, so with no scores at all RSBCM *is* LRU.

Why unscored nodes go first by default: in a reasoning program most unscored leaves are
scaffolding that is dead once used (verifier prompts, zero-token probes, final answers after
the vote), while a score is the program's explicit claim that a branch may be extended. A
branch waiting for its verdict is unscored too, but it is locked while its verifier runs.
``--radix-eviction-policy-config '{"unscored_importance": 0.25}'`` moves unscored nodes above
the branches the program rated worse than that.
"""

from __future__ import annotations

import math
from typing import Any

from sglang.srt.mem_cache.evict_policy import EvictionStrategy

POLICY_NAME = "rsbcm"
DEPTH_ATTR = "rksc_depth"
SCORE_ATTR = "rksc_score"


def node_depth(node: Any) -> int | None:
    return getattr(node, DEPTH_ATTR, None)


def node_score(node: Any) -> float | None:
    return getattr(node, SCORE_ATTR, None)


def importance(score: float, depth: int) -> float:
    """The paper's omega: keep high-scoring shallow branches, drop deep low-confidence ones."""
    return score / (depth + 1)


class RSBCMStrategy(EvictionStrategy):
    """``(importance, last_access_time)``; unscored nodes weigh ``unscored_importance``."""

    def __init__(self, unscored_importance: float = 0.0):
        if isinstance(unscored_importance, bool) or not isinstance(unscored_importance, (int, float)) \
                or not math.isfinite(unscored_importance):
            raise ValueError(
                "--radix-eviction-policy-config: rsbcm's unscored_importance must be a finite "
                f"number, got {unscored_importance!r}"
            )
        self.unscored_importance = float(unscored_importance)

    def node_importance(self, node: Any) -> float:
        score = node_score(node)
        if score is None:
            return self.unscored_importance
        return importance(score, node_depth(node) or 0)

    def get_priority(self, node: Any) -> tuple[float, float]:
        return (self.node_importance(node), node.last_access_time)
