"""ASKS blend, relay through blended requests: a finished blended request's approximate KV stays, for its group only.

A blended request's KV from its first reused token on is approximate, so it never enters the
tree where prefix matching reads (``RkscRadixCache.checkpoint`` inserts its exact part only).
Without more, the text it generated is lost to its group: in a chain of agents, each agent's
output is read by the next, and once an agent blends, nothing computed its output exactly, so
the next agent computes it in full.

With ``--asks-blended-donors`` (on by default), when a blended request of group ``g`` finishes,
the rest of its row (its approximate prompt tokens and its output, ``[cache_protected_len,
up_to)``) is kept as a *private node*: a leaf hung under the node where its exact part ends,
whose key carries a namespace of its own (``extra_key`` = this process's secret and the
request's id). So:

* prefix matching never reaches it: a child is looked up by ``(extra_key, token)``, and no client
  can send the secret (it is drawn at start-up and never leaves the process); a request of the
  private node's own ``extra_key`` would start at the root, not under the exact node;
* blend reaches it only through ``g``'s content index (``GROUPS_ATTR`` = ``{g}``): its windows are
  indexed for ``g`` alone, and ``find_segments`` reads the base ``extra_key`` (``segments.BASE_KEY_ATTR``)
  so that only requests of the blended request's own namespace match it;
* it is an ordinary evictable leaf: the allocator's slots pass from the request's row to the tree
  (``cache_protected_len`` moves to its end, so the release frees nothing of it), eviction frees
  them and drops its windows (``segments.on_delete``), and the no-leak count holds;
* a member blending from it recomputes what its gate selects, as from any donor: approximate KV
  is reused again only where it stays within ``--asks-max-deviation`` of the member's own at the
  check layer.

Not kept: an aborted request, one of no group, a page size above 1, or a tail shorter than a
window. ``BlendCounters.kept_tokens`` counts what was kept.
"""

from __future__ import annotations

import secrets
from array import array

import torch

from radix_ext.asks import segments

PRIVATE_PREFIX = "rksc-asks-private:"
_SECRET = secrets.token_hex(16)  # per process: no client can name a private namespace


def namespace(rid: str) -> str:
    """The ``extra_key`` of request ``rid``'s private node."""
    return f"{PRIVATE_PREFIX}{_SECRET}:{rid}"


def keep(cache, req, up_to: int) -> int:
    """At the release of blended request ``req`` (its exact part already in the tree, ``req.last_node``
    its end): keep tokens ``[cache_protected_len, up_to)`` as a private node of its group. Returns
    the tokens kept (0: nothing)."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT
    from sglang.srt.mem_cache.radix_cache import RadixKey, TreeNode

    group = getattr(req, segments.MEMBER_ATTR, None)
    start = req.kv.cache_protected_len
    if (group is None or cache.disable or cache.page_size != 1 or up_to - start < segments.WINDOW
            or isinstance(req.finished_reason, FINISH_ABORT)):
        return 0
    parent = req.last_node
    if parent is None or _depth(parent, cache.root_node) != start:
        return 0  # the row's tree-owned part does not end at a node: nothing to hang it under
    ids = req.full_untruncated_fill_ids[start:up_to]
    slots = cache.req_to_token_pool.req_to_token[req.kv.req_pool_idx, start:up_to].to(torch.int64, copy=True)
    key = RadixKey(array("q", ids), extra_key=namespace(req.rid), cache_salt=req.cache_salt)
    child_key = key.child_key(cache.page_size)
    if child_key in parent.children:
        return 0
    node = TreeNode(priority=req.priority or 0)
    node.parent, node.key, node.value = parent, key, slots
    parent.children[child_key] = node
    cache.evictable_size_ += len(key)
    cache._update_leaf_status(parent)
    cache._update_leaf_status(node)
    cache.kv_events.record_store(node)
    setattr(node, segments.BASE_KEY_ATTR, req.extra_key)
    setattr(node, segments.GROUPS_ATTR, {group})
    setattr(node, segments.START_ATTR, start)
    tokens = list(ids)
    cache.asks.index.add(group, ((node, start + i, segments.digest_of(tokens[i: i + segments.WINDOW]))
                                 for i in range(len(tokens) - segments.WINDOW + 1)))
    req.kv.cache_protected_len = up_to  # the tree owns these slots now: the release frees none of them
    return len(key)


def _depth(node, root) -> int:
    depth = 0
    while node is not None and node is not root:
        depth += len(node.key)
        node = node.parent
    return depth
