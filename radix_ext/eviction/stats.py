"""RSBCM's tree metadata, read back through SGLang's internal state.

An AFTER hook on ``SchedulerInternalStateController.get_internal_state`` (installed by
``radix_ext.plugin``) adds ``rksc_cache`` to the readback (``Engine.get_server_info()
["internal_states"][0]``, HTTP ``/get_server_info``):

* ``cache_class`` and ``eviction_policy`` of the scheduler's tree cache, whatever it is;
* for ``RkscRadixCache``: ``score_reports`` (requests that carried a score since the last
  flush) and ``nodes``, a list of ``[depth, score, num_tokens]`` aggregated over the tree (depth
  and score null where unset);
* with ASKS on, ``asks``: its counters (``radix_ext.asks.decision.Counters``: decisions by outcome, reused
  tokens, signatures and their bytes), the bytes the live nodes really hold, tau and layers.

The same hook adds ``rksc_cgee``: the server's CGEE thresholds (``--cgee-*``), which is where
every client's ``verify()`` reads them when the program passes none (``rksc_sgl.cgee``).

Evicted-token totals are in ``rksc_kv_pool`` (``radix_ext.ops.introspection``). Only meaningful
while no request runs.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from radix_ext.ops.introspection import TARGET as STATE_TARGET  # the same readback hook point
from rksc_sgl.config import RkscConfig
from rksc_sgl.protocol import CGEE_KEY
from rksc_sgl.protocol import STATS_KEY as KEY


def node_metadata(cache) -> list[list[Any]]:
    """``[depth, score, num_tokens]`` per distinct (depth, score) over the tree's nodes."""
    from radix_ext.eviction.policy import node_depth, node_score

    tokens: dict[tuple, int] = collections.Counter()
    stack = list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        tokens[(node_depth(node), node_score(node))] += len(node.key)
        stack.extend(node.children.values())
    order = sorted(tokens, key=lambda k: (k[0] is None, k[0] or 0, k[1] is None, k[1] or 0.0))
    return [[depth, score, tokens[(depth, score)]] for depth, score in order]


def live_signature_bytes(cache) -> int:
    """ASKS signature bytes held by the tree's nodes (what ``signature_bytes`` must equal)."""
    from radix_ext.asks.decision import SIG_ATTR

    total, stack = 0, list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        signature = getattr(node, SIG_ATTR, None)
        total += signature.nbytes if signature is not None else 0
        stack.extend(node.children.values())
    return total


def cache_stats(cache) -> dict[str, Any]:
    from radix_ext.eviction.backend import RkscRadixCache

    stats = {
        "cache_class": f"{type(cache).__module__}.{type(cache).__qualname__}",
        "eviction_policy": getattr(cache, "eviction_policy", None),
    }
    if isinstance(cache, RkscRadixCache):
        stats["score_reports"] = cache.score_reports
        stats["nodes"] = node_metadata(cache)
        if cache.asks is not None:
            from radix_ext.asks.capture import CAPTURE_SECONDS

            stats["asks"] = {**dataclasses.asdict(cache.asks.counters), "capture_seconds": CAPTURE_SECONDS[0],
                             "live_signature_bytes": live_signature_bytes(cache),
                             "tau": cache.asks.gate.tau, "layers": list(cache.asks.gate.layers), "pooling": cache.asks.gate.pooling,
                             "background": cache.asks.gate.background is not None,
                             "mode": cache.asks.mode,
                             "blend": {**dataclasses.asdict(cache.asks.blend_counters),
                                       **dataclasses.asdict(cache.asks.blend),
                                       "indexed_groups": len(cache.asks.index.groups),
                                       "indexed_windows": cache.asks.index.windows}}
    return stats


def cgee_policy(config: RkscConfig) -> dict[str, Any]:
    """The server's CGEE thresholds, named as ``rksc_sgl.cgee.CgeeThresholds``'s fields."""
    return {f.name.removeprefix("cgee_"): getattr(config, f.name)
            for f in dataclasses.fields(config) if f.name.startswith("cgee_")}


def _add_cache_stats(result, controller, *args, **kwargs):
    result.internal_state[KEY] = cache_stats(controller.scheduler.tree_cache)
    result.internal_state[CGEE_KEY] = cgee_policy(RkscConfig.from_env())
    return result


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(STATE_TARGET, _add_cache_stats, HookType.AFTER)
