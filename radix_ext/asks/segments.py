"""ASKS blend, the tree side: where a member's tokens already stand in its group's exact KV, found by content.

Every request of substitution group ``g`` (``custom_params["rksc_asks"]["group"]``) whose KV
enters the tree exactly (a generating member that found no donor or recomputed everything, a
prefill-only commit) makes its whole path *visible* to ``g`` (``GROUPS_ATTR``, a set: a label
that another group computed first is still ``g``'s text once a request of ``g`` read it), prompt
and generated tokens alike, and adds the path's ``WINDOW``-token windows to ``g``'s
``ContentIndex``: window hash -> the newest ``MAX_OCCURRENCES`` places (node, position) it
starts at. Nothing else is visible: another client's text, or a group's approximate (blended)
KV, which never enters the tree where prefix matching reads; with ``--asks-blended-donors`` a
finished blended request's approximate tail is kept as a *private node*, visible to its own
group only (``radix_ext.asks.private``), ranked below an exact place on a tie.

``find_segments`` (read-only, at the forward): from the member's first uncached position to its
last ``fresh_tail`` tokens, each position's window is looked up in the group's index; every
occurrence is followed forward through nodes visible to ``g`` (the run's length) and backward
against the member's own preceding tokens (its context, up to ``CONTEXT_CAP`` tokens). The
occurrence whose preceding tokens match longest wins (the same neighbour document, the same
question: its KV stands nearest the member's), then the longest run; a run of at least
``WINDOW`` tokens is a *segment* ``(start, donor slots, delta)``, ``delta`` being the member's
position minus the donor's. So a run is found wherever it stands: mid-chunk, after a label the
member's own opening left cached, inside another request's prompt or its output (relay).

Bounds: ``MAX_WINDOWS_PER_GROUP`` per group and ``MAX_WINDOWS`` in all (the oldest windows of the
least recently indexed group go first), ``MAX_WALKS_PER_REQUEST`` occurrences followed per member.
Nodes keep their windows (``WINDOWS_ATTR``): an eviction drops them, a split moves the upper
part's to the new node. What is done with a segment's KV is ``radix_ext.asks.blend``'s.
"""

from __future__ import annotations

import collections
import dataclasses
import weakref
from typing import Any

import torch

from rksc_sgl.protocol import AsksOptions

GROUPS_ATTR = "rksc_blend_groups"  # on a TreeNode: the groups whose exact requests had it on their path
START_ATTR = "rksc_blend_start"  # on a TreeNode: the position of its first token on its path
WINDOWS_ATTR = "rksc_blend_windows"  # on a TreeNode: the indexed windows starting in it
MEMBER_ATTR = "rksc_blend_member"  # on a Req: its group (its exact KV becomes the group's)
OPTIONS_ATTR = "rksc_blend_options"  # on a Req that may blend: its AsksOptions
# On a private node (``radix_ext.asks.private``: a blended request's approximate tail, kept for its
# group): the extra_key of the request that computed it, which a member must carry to reuse it.
BASE_KEY_ATTR = "rksc_blend_base_key"

WINDOW = MIN_SEGMENT = 8  # a shorter run is a coincidence of common tokens, not a text
MAX_OCCURRENCES = 8  # places kept per window and group, the newest
CONTEXT_CAP = 64  # preceding tokens compared when ranking occurrences
MAX_WINDOWS_PER_GROUP = 1 << 16
MAX_WINDOWS = 1 << 18  # 76 MiB of Python objects at most (about 300 bytes a window, measured)
MAX_WALKS_PER_REQUEST = 4096  # occurrences followed for one member; past it, the rest is computed

# rid -> Req of every live request that may blend (registered at creation, read at its prefill).
members: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()


@dataclasses.dataclass(frozen=True)
class Segment:
    start: int  # request position of the segment's first token
    donor_slots: torch.Tensor  # [length] int64 KV-pool slots of the donor's tokens
    delta: int  # request position - donor position
    context: int = 0  # preceding tokens the donor shares with the request (up to CONTEXT_CAP)

    @property
    def length(self) -> int:
        return int(self.donor_slots.shape[0])


class Window:
    """One indexed window: ``WINDOW`` tokens of ``group``'s text starting at path position ``pos``,
    in ``node`` (None once dropped)."""

    __slots__ = ("group", "digest", "node", "pos")

    def __init__(self, group: str, digest: int, node, pos: int) -> None:
        self.group, self.digest, self.node, self.pos = group, digest, node, pos


@dataclasses.dataclass
class GroupIndex:
    places: dict[int, list[Window]] = dataclasses.field(default_factory=dict)  # digest -> oldest first
    order: collections.deque = dataclasses.field(default_factory=collections.deque)  # FIFO, dead ones skipped
    live: int = 0


class ContentIndex:
    """Each group's windows (on ``AsksState.index``): what ``find_segments`` looks up."""

    def __init__(self) -> None:
        self.groups: dict[str, GroupIndex] = {}  # least recently indexed first
        self.windows = 0

    def has(self, group: str) -> bool:
        return group in self.groups

    def clear(self) -> None:
        self.groups.clear()
        self.windows = 0

    def add(self, group: str, windows) -> None:
        """Index ``windows`` (``(node, position, digest)`` each) for ``group``; a place already
        indexed is kept once."""
        index = self.groups.pop(group, None) or GroupIndex()
        self.groups[group] = index  # now the most recently indexed
        for node, pos, digest in windows:
            places = index.places.setdefault(digest, [])
            if any(w.node is node and w.pos == pos for w in places):
                continue
            window = Window(group, digest, node, pos)
            places.append(window)
            index.order.append(window)
            _node_windows(node).add(window)
            index.live += 1
            self.windows += 1
            if len(places) > MAX_OCCURRENCES:  # the oldest private place goes first: exact text stays findable
                self.drop(next((w for w in places if hasattr(w.node, BASE_KEY_ATTR)), places[0]))
            while index.live > MAX_WINDOWS_PER_GROUP:
                self._drop_oldest(group)
            while self.windows > MAX_WINDOWS:
                self._drop_oldest(next(iter(self.groups)))

    def drop(self, window: Window) -> None:
        if window.node is None:
            return
        getattr(window.node, WINDOWS_ATTR).discard(window)
        window.node = None
        index = self.groups[window.group]
        places = index.places[window.digest]
        places.remove(window)
        if not places:
            del index.places[window.digest]
        index.live -= 1
        self.windows -= 1
        if index.live == 0:
            del self.groups[window.group]
        elif len(index.order) > 2 * index.live + 1024:  # dropped windows pile up: compact
            index.order = collections.deque(w for w in index.order if w.node is not None)

    def _drop_oldest(self, group: str) -> None:
        order = self.groups[group].order
        while order:
            window = order.popleft()
            if window.node is not None:
                self.drop(window)
                return


def _node_windows(node) -> set:
    windows = getattr(node, WINDOWS_ATTR, None)
    if windows is None:
        windows = set()
        setattr(node, WINDOWS_ATTR, windows)
    return windows


def digest_of(tokens) -> int:
    return hash(tuple(tokens))


def register_member(req, options: AsksOptions) -> None:
    """``req`` (a generating request of group ``options.group``) may blend at its prefill."""
    setattr(req, OPTIONS_ATTR, options)
    setattr(req, MEMBER_ATTR, options.group)
    members[req.rid] = req


def register_commit(req, group: str) -> None:
    """``req`` (a prefill-only commit of ``group``) computes exactly: its text becomes the group's."""
    setattr(req, MEMBER_ATTR, group)


def on_checkpoint(cache, req) -> None:
    """After ``req``'s tokens went into the tree (so they are exact): its path becomes visible to its
    group, and the windows starting in the newly visible part (and the ``WINDOW - 1`` tokens before
    it, whose windows reach into it) go into the group's index."""
    group = getattr(req, MEMBER_ATTR, None)
    index = cache.asks.index if cache.asks is not None else None
    if group is None or index is None:
        return
    path, node = [], req.last_node
    while node is not None and node is not cache.root_node:
        path.append(node)
        node = node.parent
    path.reverse()
    starts, end = [], 0
    for n in path:
        setattr(n, START_ATTR, end)
        starts.append(end)
        end += len(n.key)
    new = next((i for i, n in enumerate(path) if group not in (getattr(n, GROUPS_ATTR, None) or ())), None)
    if new is None:
        return
    for n in path[new:]:
        groups = getattr(n, GROUPS_ATTR, None)
        if groups is None:
            setattr(n, GROUPS_ATTR, {group})
        else:
            groups.add(group)
    first = max(0, starts[new] - (WINDOW - 1))
    i = new
    while starts[i] > first:  # the node holding ``first``
        i -= 1
    tokens = [t for n in path[i:] for t in n.key.token_ids]
    base = starts[i]

    def windows():
        nonlocal i
        for pos in range(first, end - WINDOW + 1):
            while i + 1 < len(path) and starts[i + 1] <= pos:
                i += 1
            yield path[i], pos, digest_of(tokens[pos - base: pos - base + WINDOW])

    index.add(group, windows())


def on_delete(cache, node) -> None:
    if cache.asks is not None:
        for window in list(getattr(node, WINDOWS_ATTR, None) or ()):
            cache.asks.index.drop(window)


def on_split(child, new_node) -> None:
    """``new_node`` is ``child``'s upper part: it is visible to the same groups, and the windows
    starting in it move to it."""
    groups = getattr(child, GROUPS_ATTR, None)
    if groups is None:
        return
    setattr(new_node, GROUPS_ATTR, set(groups))
    start = getattr(child, START_ATTR)
    setattr(new_node, START_ATTR, start)
    setattr(child, START_ATTR, start + len(new_node.key))
    windows = getattr(child, WINDOWS_ATTR, None)
    if windows:
        upper = {w for w in windows if w.pos < start + len(new_node.key)}
        windows -= upper
        for w in upper:
            w.node = new_node
        setattr(new_node, WINDOWS_ATTR, upper)


def _forward(node, offset: int, key, pos: int, limit: int, group: str) -> tuple[int, list[torch.Tensor]]:
    """How many of ``key[pos:limit]`` continue from ``node``'s token ``offset`` on, down through nodes
    visible to ``group``, and their KV slots."""
    ids, matched, parts = key.token_ids, 0, []
    while node is not None and pos < limit and group in (getattr(node, GROUPS_ATTR, None) or ()):
        own = node.key.token_ids
        m = _common(own, offset, ids, pos, min(len(own) - offset, limit - pos))
        if m <= 0:
            break
        parts.append(node.value[offset: offset + m])
        matched, pos = matched + m, pos + m
        if offset + m < len(own) or pos >= limit:
            break
        node, offset = node.children.get(key.child_key_at(pos)), 0
    return matched, parts


def _backward(node, offset: int, ids, pos: int) -> int:
    """How many tokens before ``node``'s token ``offset`` equal ``ids[:pos]``'s last ones (at most
    ``CONTEXT_CAP``)."""
    matched, want = 0, min(CONTEXT_CAP, pos)
    while node is not None and node.key is not None and matched < want:
        own = node.key.token_ids
        while offset > 0 and matched < want:
            if own[offset - 1] != ids[pos - matched - 1]:
                return matched
            offset, matched = offset - 1, matched + 1
        node = node.parent
        offset = len(node.key) if node is not None and node.key is not None else 0
    return matched


def _common(a, i: int, b, j: int, n: int) -> int:
    """The length of the common prefix of ``a[i:i+n]`` and ``b[j:j+n]``."""
    if a[i: i + n] == b[j: j + n]:
        return n
    lo, hi = 0, n  # a[i:i+lo] matches, a[i:i+hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[i: i + mid] == b[j: j + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _base_key(node):
    return getattr(node, BASE_KEY_ATTR, node.key.extra_key)


def find_segments(index: ContentIndex, key, start: int, limit: int, group: str) -> list[Segment]:
    """The reusable runs of ``key[start:limit]`` in ``group``'s text, greedy from the left: at each
    position the occurrence of its window with the longest shared preceding context, then the
    longest run, then an exact one over a private node's."""
    places_of = index.groups[group].places if index.has(group) else None
    ids, segments, walks, pos = key.token_ids, [], 0, start
    while places_of and pos + WINDOW <= limit and walks < MAX_WALKS_PER_REQUEST:
        best = None  # ((context, length, exact), parts, donor position)
        for window in reversed(places_of.get(digest_of(ids[pos: pos + WINDOW]), ())):
            walks += 1
            node = window.node
            if node is None or node.value is None or _base_key(node) != key.extra_key:
                continue
            offset = window.pos - getattr(node, START_ATTR)
            length, parts = _forward(node, offset, key, pos, limit, group)
            if length < WINDOW:
                continue  # a hash collision
            rank = (_backward(node, offset, ids, pos), length, not hasattr(node, BASE_KEY_ATTR))
            if best is None or rank > best[0]:
                best = (rank, parts, window.pos)
        if best is None:
            pos += 1
            continue
        (context, length, _), parts, donor_pos = best
        segments.append(Segment(pos, torch.cat(parts).to(torch.int64), pos - donor_pos, context))
        pos += length
    return segments
