"""ASKS blend, the prefill order: a member that will reuse most of its prompt gets its first token
without waiting for another member's prefill computed in full.

On a CPU a prefill forward costs about its computed tokens, and every request of the batch gets
its first token when the whole forward ends. A member that blends computes a small share of its
prompt (an agent reading a passage and the earlier agents' outputs: tens of tokens of hundreds),
so batched with a request that computes 400 tokens, or arriving while one runs, it waits for
those 400: its time to first token is the other request's. Here (``--asks-blend-first``, on by
default):

* ``is_light``: a member is *light* when its group's content index (``radix_ext.asks.segments``)
  covers at least ``LIGHT_SHARE`` of its prompt. Predicted once per request, the first time the
  scheduler orders the waiting queue with it (``LIGHT_ATTR``); the plan at its forward searches
  again, since the tree can change in between.
* AROUND ``SchedulePolicy.calc_priority``: after SGLang's own order, light members first (a
  stable partition: SGLang's order holds within each part).
* AROUND ``PrefillAdder.add_one_req``: once the batch being built holds a light member, a request
  that is not light waits for the next prefill batch (``CONTINUE``: later light members may still
  join), at most ``MAX_HOLDS`` batches, then joins as SGLang would. The next batch runs right after
  (the scheduler prefills before it decodes while requests wait).
* **Heavy members in chunks.** While light members come (one was seen in the last
  ``LIGHT_WINDOW_S``), a *heavy* member (its group's text covers none of it, so a chunked prefill,
  which computes every token, costs it no reuse) prefills in chunks of ``HEAVY_CHUNK`` tokens,
  one such member at a time, and its next chunk waits out a round in which a light member waits
  (AROUND ``PrefillAdder.add_chunked_req``: the chunk is *parked*, at most ``MAX_HOLDS`` rounds in
  a row). So a light member waits at most for the chunk that is running. SGLang counts a middle
  chunk for its chunked request in every batch it builds (``inflight_middle_chunks``); a parked
  chunk is not in the batch, so AROUND ``ScheduleBatch.init_new`` takes that count back. Chunked
  or whole, a request's rows are the same bits (``tests/integration/test_asks_order.py``).

Only members of a group are ever light, chunked or parked, and only by their own group's text; a
request outside any group is never moved ahead or chunked, only held behind light batches, at most
``MAX_HOLDS`` of them. With no member waiting every hook returns SGLang's behaviour untouched.
"""

from __future__ import annotations

import time

from radix_ext.asks import segments as tree

CALC_PRIORITY = "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority"
ADD_CHUNKED_REQ = "sglang.srt.managers.schedule_policy.PrefillAdder.add_chunked_req"
INIT_BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch.init_new"
LIGHT_ATTR = "rksc_blend_light"  # on a member Req: predicted to reuse at least LIGHT_SHARE of its prompt
COVERED_ATTR = "rksc_blend_covered"  # on a member Req: its tokens its group's text covers, predicted
HOLDS_ATTR = "rksc_blend_order_holds"  # on a Req: light batches it waited out
CHUNKED_ATTR = "rksc_blend_heavy_chunks"  # on a member Req with nothing to reuse: it prefills in chunks
PARKS_ATTR = "rksc_blend_parks"  # on a heavy member Req being chunked: rounds in a row its chunk waited
PARKED_ATTR = "rksc_blend_parked"  # ... True in the round whose batch it sits out
LIGHT_SHARE = 0.5
MAX_HOLDS = 4
HEAVY_CHUNK = 128  # tokens: about a tenth of a second of prefill on two cores
LIGHT_WINDOW_S = 10.0

_round = {"light_waiting": False, "last_light": -float("inf")}  # this scheduling round's waiting queue


def _state(members_waiting: bool = True):
    """The scheduler's AsksState when blend orders prefills (``--asks-blend-first``), else None;
    with ``members_waiting`` also None while no member is live (``segments.members``; a member
    leaves it at its first forward, so a chunk in progress is not one)."""
    from radix_ext.asks.blend import _live

    state = _live[0] if _live and (tree.members or not members_waiting) else None
    return state if state is not None and state.blend is not None and state.blend.blend_first else None


def is_light(req, state) -> bool:
    """Whether ``req`` (a waiting member) is predicted to reuse at least ``LIGHT_SHARE`` of its prompt."""
    light = getattr(req, LIGHT_ATTR, None)
    if light is None:
        covered = _covered(req, state)
        light = covered is not None and covered >= LIGHT_SHARE * len(req.origin_input_ids)
        setattr(req, COVERED_ATTR, covered)
        setattr(req, LIGHT_ATTR, light)
        state.blend_counters.light_requests += light
    return light


def _covered(req, state) -> int | None:
    """How many of a member's tokens its group's text covers (None: not a member that may blend)."""
    from radix_ext.asks.blend import _recompute
    from sglang.srt.mem_cache.radix_cache import RadixKey

    options = getattr(req, tree.OPTIONS_ATTR, None)
    if options is None or req.rid not in tree.members or req.output_ids or _recompute(options, state) >= 1:
        return None
    if not state.index.has(options.group):
        return 0
    ids = req.origin_input_ids
    key = RadixKey(token_ids=ids, extra_key=req.extra_key, cache_salt=req.cache_salt)
    found = tree.find_segments(state.index, key, 0, len(ids) - state.blend.fresh_tail, options.group)
    return sum(segment.length for segment in found)


def _heavy_member(req) -> bool:
    """A member with nothing to reuse: chunking its prefill costs it no reuse (a chunked prefill
    computes every token), so it is the one to chunk."""
    return req.rid in tree.members and getattr(req, COVERED_ATTR, None) == 0


def light_first(original, policy, waiting_queue, *args, **kwargs):
    """AROUND ``SchedulePolicy.calc_priority``: SGLang's order, then light members first."""
    result = original(policy, waiting_queue, *args, **kwargs)
    _round["light_waiting"] = False
    state = _state() if waiting_queue else None
    if state is not None:
        light = [is_light(req, state) for req in waiting_queue]
        if any(light):
            _round["light_waiting"], _round["last_light"] = True, time.monotonic()
            if not all(light):
                waiting_queue[:] = ([req for req, first in zip(waiting_queue, light) if first]
                                    + [req for req, first in zip(waiting_queue, light) if not first])
    return result


def hold_behind_light(original, adder, req, *args, **kwargs):
    """AROUND ``PrefillAdder.add_one_req``: a request that is not light waits out a batch that
    holds a light member (at most ``MAX_HOLDS`` times); a heavy member is admitted in chunks."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    if _state(members_waiting=False) is None:
        return original(adder, req, *args, **kwargs)
    budget = adder.rem_chunk_tokens
    extend = len(req.full_untruncated_fill_ids) - req.prefix_len
    if kwargs.get("has_chunked_req") and budget is not None and extend > budget:
        return AddReqResult.CONTINUE  # a chunk runs (or is parked) with budget left: SGLang tracks one
    light = getattr(req, LIGHT_ATTR, False)
    if not light and _state() is not None and adder.can_run_list and any(
            getattr(other, LIGHT_ATTR, False) for other in adder.can_run_list):
        holds = getattr(req, HOLDS_ATTR, 0)
        if holds < MAX_HOLDS:
            setattr(req, HOLDS_ATTR, holds + 1)
            return AddReqResult.CONTINUE
    if light or _state() is None:
        return original(adder, req, *args, **kwargs)
    if budget is None:  # SGLang's chunked prefill is off: so is ours
        return original(adder, req, *args, **kwargs)
    if kwargs.get("has_chunked_req"):  # one heavy member in chunks at a time
        if _heavy_member(req) and extend > HEAVY_CHUNK:
            return AddReqResult.CONTINUE
        return original(adder, req, *args, **kwargs)
    if not _heavy_member(req) or time.monotonic() - _round["last_light"] > LIGHT_WINDOW_S:
        return original(adder, req, *args, **kwargs)
    cap = min(budget, HEAVY_CHUNK)
    adder.rem_chunk_tokens = cap
    try:
        result = original(adder, req, *args, **kwargs)
    finally:
        adder.rem_chunk_tokens = budget - (cap - adder.rem_chunk_tokens)
    if adder.new_chunked_req is req:  # a chunk ends its batch, as SGLang's own chunks do
        setattr(req, CHUNKED_ATTR, True)
        _state(members_waiting=False).blend_counters.chunked_requests += 1
        adder.rem_chunk_tokens = 0
    return result


def park_for_light(original, adder, req, *args, **kwargs):
    """AROUND ``PrefillAdder.add_chunked_req``: a heavy member's next chunk (``HEAVY_CHUNK`` tokens)
    sits out a round in which a light member waits, at most ``MAX_HOLDS`` rounds in a row."""
    setattr(req, PARKED_ATTR, False)
    state = _state(members_waiting=False)
    if not getattr(req, CHUNKED_ATTR, False) or state is None:
        return original(adder, req, *args, **kwargs)
    parks = getattr(req, PARKS_ATTR, 0)
    if _round["light_waiting"] and parks < MAX_HOLDS:
        state.blend_counters.parked_chunks += 1
        setattr(req, PARKS_ATTR, parks + 1)
        setattr(req, PARKED_ATTR, True)
        return req  # still the chunked request; nothing added (SGLang's own parked chunk does the same)
    setattr(req, PARKS_ATTR, 0)
    limit = adder.chunked_req_limit
    adder.chunked_req_limit = HEAVY_CHUNK if limit is None else min(limit, HEAVY_CHUNK)
    return original(adder, req, *args, **kwargs)


def uncount_parked_chunk(original, cls, reqs, *args, **kwargs):
    """AROUND ``ScheduleBatch.init_new``: the scheduler has just counted a middle chunk for its
    chunked request; a parked one is not in this batch, so no result will count it back."""
    chunked = kwargs.get("chunked_req")
    if chunked is not None and getattr(chunked, PARKED_ATTR, False) and not any(r is chunked for r in reqs):
        chunked.inflight_middle_chunks -= 1
        setattr(chunked, PARKED_ATTR, False)
    return original(cls, reqs, *args, **kwargs)


def install() -> None:
    from radix_ext import hooks
    from radix_ext.asks.blend import ADD_ONE_REQ

    hooks.around(ADD_ONE_REQ, hold_behind_light)
    hooks.around(CALC_PRIORITY, light_first)
    hooks.around(ADD_CHUNKED_REQ, park_for_light)
    hooks.around(INIT_BATCH, uncount_parked_chunk)
