"""A parent's abort reaches its children: an ``n > 1`` request stops and frees all of its samples.

SGLang's tokenizer manager runs an ``n > 1`` request as children with fresh uuid rids
(``TokenizerManager._handle_batch_request``, ``regenerate_rid``), so ``/abort_request`` with the
rid the client sent finds no request of that name, and the children run to their end. Two hooks
in the tokenizer manager's process close that gap:

* an AROUND hook on ``_handle_batch_request`` records, for the request's rids (the client's rid
  ``r`` becomes ``r_0 .. r_{n-1}``), the live dict of its children's states that SGLang fills as
  it sends them; when the request ends early (a streaming client disconnects, the handler is
  cancelled, an error) it aborts every child still running;
* an AROUND hook on ``TokenizerManager.abort_request`` aborts the children of every recorded
  request whose rid starts with the aborted one, the scheduler's own prefix rule for rids.
"""

from __future__ import annotations

BATCH_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._handle_batch_request"
ABORT_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.abort_request"


class Families:
    """Running ``n > 1`` requests: parent rid -> the children's states (rid -> state), live."""

    def __init__(self) -> None:
        self._children: dict[str, dict] = {}

    def add(self, parent_rids: list[str], children: dict) -> None:
        for rid in parent_rids:
            self._children[rid] = children

    def remove(self, parent_rids: list[str]) -> None:
        for rid in parent_rids:
            self._children.pop(rid, None)

    def children_of(self, rid: str) -> list[str]:
        """The child rids of every request whose rid starts with ``rid`` (none for "")."""
        if not rid:
            return []
        found: dict[str, None] = {}  # ordered, without duplicates
        for parent, children in list(self._children.items()):
            if parent.startswith(rid):
                found.update(dict.fromkeys(c for c in list(children) if c != parent))
        return list(found)


FAMILIES = Families()


def _abort_running(manager, rids) -> None:
    for rid in rids:
        if rid in manager.rid_to_state:
            manager.abort_request(rid)


async def _track_children(original, manager, obj, request, request_states, *args, **kwargs):
    parents = obj.rid if isinstance(obj.rid, list) else [obj.rid]
    if getattr(obj, "parallel_sample_num", 1) == 1:  # no children: every rid is the client's
        async for out in original(manager, obj, request, request_states, *args, **kwargs):
            yield out
        return
    FAMILIES.add(parents, request_states)
    finished = False
    try:
        async for out in original(manager, obj, request, request_states, *args, **kwargs):
            yield out
        finished = True
    finally:
        FAMILIES.remove(parents)
        if not finished:  # closed or failed before every child answered
            _abort_running(manager, list(request_states))


def _abort_with_children(original, manager, rid: str = "", abort_all: bool = False, *args, **kwargs):
    if not abort_all:
        for child in FAMILIES.children_of(rid):
            if child in manager.rid_to_state:
                original(manager, child)
    return original(manager, rid, abort_all, *args, **kwargs)


def install() -> None:
    from radix_ext import hooks

    hooks.around(BATCH_TARGET, _track_children)
    hooks.around(ABORT_TARGET, _abort_with_children)
