"""ASKS blend, the tree side: which of a request's tokens its group already computed after another opening.

A request of substitution group ``g`` leaves the cached path at position ``x`` (its own opening,
a role, a document order). Its later tokens may exist in the radix tree below an *anchor* of
``g``: the end of a prefill-only commit of the group (``paraphrase_fork``'s opener commits,
``share_chunks``' head commit), under which a sibling of the group computed the same text after
its own opening. Nodes a group's request computed carry the group (``MARK_ATTR``); anchors are
kept per group on the cache's ``AsksState`` (``radix_ext.asks.decision``).

``find_segments`` (read-only, at the forward): from ``x`` to the request's last ``fresh_tail``
tokens, each position looks for the longest run of the request's tokens continuing below one of
``g``'s anchors, through ``g``'s nodes; a run of at least ``MIN_SEGMENT`` tokens is a *segment*
``(start, donor slots, delta)``, ``delta`` being the request's position minus the donor's.
The search starts at the end of the request's own anchor when its cached prefix runs past it
(``anchor_end``): an earlier request with the same opening may have left the first tokens of
the text below that opening, so that the request leaves the cache inside the text, where no
anchor's child begins; the run found from the anchor is cut at ``x``.
What is done with a segment's KV is ``radix_ext.asks.blend``'s.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import torch

from rksc_sgl.protocol import AsksOptions

MARK_ATTR = "rksc_blend_group"  # on a TreeNode: the group whose request computed it
ANCHOR_ATTR = "rksc_blend_anchor"  # on a TreeNode: (group, end position) of a commit that ended there
MEMBER_ATTR = "rksc_blend_member"  # on a Req: its group (it marks the nodes it computes)
OPTIONS_ATTR = "rksc_blend_options"  # on a Req that may blend: its AsksOptions

MIN_SEGMENT = 8  # a shorter run below an anchor is a coincidence of common tokens, not a text
# Bounds on what one group's commits can make the scheduler walk at a member's prefill: anchors
# kept per group (the oldest dropped first), and anchor children tried per position.
MAX_ANCHORS_PER_GROUP = 1024
MAX_HEADS_PER_TOKEN = 32
MAX_WALKS_PER_REQUEST = 4096  # continuations tried for one member; past it, the rest is computed

# rid -> Req of every live request that may blend (registered at creation, read at its prefill).
members: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()


@dataclasses.dataclass(frozen=True)
class Segment:
    start: int  # request position of the segment's first token
    donor_slots: torch.Tensor  # [length] int64 KV-pool slots of the donor's tokens
    delta: int  # request position - donor position

    @property
    def length(self) -> int:
        return int(self.donor_slots.shape[0])



def register_member(req, options: AsksOptions) -> None:
    """``req`` (a generating request of group ``options.group``) may blend at its prefill."""
    setattr(req, OPTIONS_ATTR, options)
    setattr(req, MEMBER_ATTR, options.group)
    members[req.rid] = req


def register_commit(req, group: str) -> None:
    """``req`` (a prefill-only commit of ``group``) leaves an anchor where it ends."""
    setattr(req, MEMBER_ATTR, group)
    setattr(req, ANCHOR_ATTR, group)


def on_checkpoint(cache, req, own_start: int) -> None:
    """After ``req``'s tokens went into the tree: mark the nodes it computed with its group, and
    make a commit's last node an anchor of its group."""
    group = getattr(req, MEMBER_ATTR, None)
    if group is None:
        return
    node, path = req.last_node, []
    while node is not None and node is not cache.root_node:
        path.append(node)
        node = node.parent
    end = sum(len(n.key) for n in path)
    if getattr(req, ANCHOR_ATTR, None) is not None and path:
        anchors = cache.asks.anchors.setdefault(group, {})  # insertion-ordered: the oldest first
        if path[0] not in anchors:
            anchors[path[0]] = None
            setattr(path[0], ANCHOR_ATTR, (group, end))
            if len(anchors) > MAX_ANCHORS_PER_GROUP:
                oldest = next(iter(anchors))
                del anchors[oldest]
                setattr(oldest, ANCHOR_ATTR, None)
    for n in path:
        start = end - len(n.key)
        if start < own_start:
            break
        if getattr(n, MARK_ATTR, None) is None:
            setattr(n, MARK_ATTR, group)
        end = start


def on_delete(cache, node) -> None:
    anchor = getattr(node, ANCHOR_ATTR, None)
    if anchor is not None and cache.asks is not None:
        anchors = cache.asks.anchors.get(anchor[0])
        if anchors is not None:
            anchors.pop(node, None)
            if not anchors:  # a program's group goes with its last anchor
                del cache.asks.anchors[anchor[0]]


def on_split(child, new_node) -> None:
    """The upper part of a split node was computed by the same request: it keeps the mark (the
    anchor stays on the lower part, which still ends where the commit ended)."""
    mark = getattr(child, MARK_ATTR, None)
    if mark is not None:
        setattr(new_node, MARK_ATTR, mark)


def _continuation(child, key, pos: int, limit: int, group: str) -> tuple[int, list[torch.Tensor]]:
    """How many of ``key[pos:limit]`` continue from ``child`` down through ``group``'s nodes, and
    their KV slots."""
    matched, parts, node = 0, [], child
    while node is not None and pos < limit and getattr(node, MARK_ATTR, None) == group:
        m = min(node.key.match_at(key, pos), limit - pos)
        if m <= 0:
            break
        parts.append(node.value[:m])
        matched, pos = matched + m, pos + m
        if m < len(node.key) or pos >= limit:
            break
        node = node.children.get(key.child_key_at(pos))
    return matched, parts


def anchor_end(node, group: str) -> int | None:
    """Where the deepest anchor of ``group`` on the path from the root to ``node`` ends (None:
    no anchor of ``group`` on it)."""
    while node is not None:
        anchor = getattr(node, ANCHOR_ATTR, None)
        if anchor is not None and anchor[0] == group:
            return anchor[1]
        node = node.parent
    return None


def find_segments(anchors, key, start: int, limit: int, group: str, search_from: int | None = None) -> list[Segment]:
    """The reusable runs of ``key[start:limit]`` below ``anchors`` (nodes of ``group``, oldest
    first), greedy from the left, longest first at each position (of the ``MAX_HEADS_PER_TOKEN``
    newest anchor children starting with that position's token). Runs are looked for from
    ``search_from`` (default ``start``; the end of the request's own anchor) and cut at ``start``."""
    heads: dict[Any, list[tuple[int, Any]]] = {}
    for anchor in reversed(list(anchors)):
        _group, end = getattr(anchor, ANCHOR_ATTR)
        for child_key, child in anchor.children.items():
            if getattr(child, MARK_ATTR, None) == group:
                found = heads.setdefault(child_key, [])
                if len(found) < MAX_HEADS_PER_TOKEN:
                    found.append((end, child))
    pos = start if search_from is None else min(search_from, start)
    segments, walks = [], 0
    while heads and max(pos, start) + MIN_SEGMENT <= limit and walks < MAX_WALKS_PER_REQUEST:
        best = (0, None, None)
        for end, child in heads.get(key.child_key_at(pos), ()):
            walks += 1
            matched, parts = _continuation(child, key, pos, limit, group)
            if pos + matched - max(pos, start) > best[0]:
                best = (pos + matched - max(pos, start), parts, end)
        reused, parts, donor_start = best
        if reused >= MIN_SEGMENT:
            first = max(pos, start)
            slots = torch.cat(parts).to(torch.int64)
            segments.append(Segment(first, slots[first - pos:], pos - donor_start))
            pos = first + reused
        else:
            pos += 1
    return segments
