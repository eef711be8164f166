"""RSBCM eviction: ``importance = branch_score / (depth + 1)``, lowest evicted first.

A strategy in SGLang's form (``sglang/srt/mem_cache/evict_policy.py``): ``get_priority(node)``
returns a sort key, and RadixCache's ``evict`` pops the evictable leaf with the smallest key. The
evict loop only ever sees unlocked leaves, so this strategy never has to think about locks.

Node metadata lives on SGLang's ``TreeNode`` as two plain attributes (it has no ``__slots__``):

* ``rksc_depth``: the fork level of the program branch that created the node's tokens, or None
  for tokens no branch claimed (shared prompts, zero-token prefix requests);
* ``rksc_score``: the branch's score in [0, 1] once the program reported it, else None.

Importance is

* ``score / (depth + 1)`` for a scored node;
* ``unscored_importance`` (default 0.5: an unjudged branch counts as a coin flip at the root)
  for an unscored one. One constant for all of them, so among themselves unscored nodes evict in
  plain LRU order; with no scores at all RSBCM *is* LRU.

Importance buys residency for a bounded time, and decays while a node sits idle. The key is

    key(node) = last_access_time + horizon_s * importance(node)

(lowest evicted first), the same order as an effective importance
``importance - (now - last_access_time) / horizon_s`` that falls by 1 per ``horizon_s`` seconds
idle. Scores lie in [0, 1] (the protocol refuses others), so nothing a client reports keeps a node
resident more than ``horizon_s`` seconds longer than a node scored 0 idle since the same moment,
or more than
``horizon_s * (1 - unscored_importance)`` longer than plain traffic used at the same time: a
client scoring everything 1.0 delays another client's evictions by at most that, never starves
it. Inside one program, whose nodes are touched within seconds of each other, the order is the
paper's (importance first) whenever importances differ by more than the time between the
touches over ``horizon_s``. ``horizon_s`` (default 60) is set with
``--radix-eviction-policy-config '{"horizon_s": 120}'``; ``"horizon_s": null`` is the paper's
unbounded order ``(importance, last_access_time)``, where a scored shallow node outlives every
unscored one for as long as the server runs.

Why unscored nodes rank above most scored ones, not below: in a reasoning program an unscored
node is mostly a branch waiting for its verdict or shared scaffolding (prompts), both needed
soon, while what the program knows to be dead it can say so (``score=0`` on a verifier fork,
see ``branch_options``). ``--radix-eviction-policy-config '{"unscored_importance": 0}'`` restores
"unscored first". End to end (``python -m benchmarks.rsbcm_compare --limit 20``, pool at 25% of the
working set, README "Benchmark"): the default computed 13-39% fewer prefill tokens than stock LRU
over runs.
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


DEFAULT_HORIZON_S = 60.0


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


class RSBCMStrategy(EvictionStrategy):
    """``last_access_time + horizon_s * importance``; unscored nodes weigh ``unscored_importance``."""

    def __init__(self, unscored_importance: float = 0.5, horizon_s: float | None = DEFAULT_HORIZON_S):
        if not _number(unscored_importance):
            raise ValueError(
                "--radix-eviction-policy-config: rsbcm's unscored_importance must be a finite "
                f"number, got {unscored_importance!r}"
            )
        if horizon_s is not None and not (_number(horizon_s) and horizon_s > 0):
            raise ValueError(
                "--radix-eviction-policy-config: rsbcm's horizon_s must be a positive number of "
                f"seconds or null (no ageing), got {horizon_s!r}"
            )
        self.unscored_importance = float(unscored_importance)
        self.horizon_s = None if horizon_s is None else float(horizon_s)

    def node_importance(self, node: Any) -> float:
        score = node_score(node)
        if score is None:
            return self.unscored_importance
        return importance(score, node_depth(node) or 0)

    def get_priority(self, node: Any) -> tuple[float, float]:
        if self.horizon_s is None:
            return (self.node_importance(node), node.last_access_time)
        return (node.last_access_time + self.horizon_s * self.node_importance(node), node.last_access_time)
