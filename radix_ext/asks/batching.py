"""How prefill batches are built around ASKS blend members (AROUND hooks on SGLang's schedule policy).

A member *may blend* when its group has exact text indexed (so a donor can exist) and its share
recomputed is below 1. It computes only its kept rows (its opening, the question, what the check
sends back: about an eighth of its prompt on the agents workload), but every row of a forward
finishes together, so a member batched beside a request that computes its whole prompt waits for
all of that prompt. SGLang's own longest-prefix-match puts first the requests whose prompt is most
cached; these rules do the same for what blend covers, in three bounded steps:

* ``members_first`` (AROUND ``SchedulePolicy.calc_priority``): after SGLang's order, the waiting
  queue puts first the requests that already waited out their hold (below), then the members that
  may blend, then the rest, each in SGLang's order. Nothing moves while no member may blend, or
  when the server schedules by priority (``--enable-priority-scheduling``).
* ``hold_out_of_blend_batch`` (AROUND ``PrefillAdder.add_one_req``): a grouped request that may not
  blend and would compute more than ``SIDE_ROWS`` tokens stays queued while the batch holds a member
  that may, once (``SIDE_HOLDS``): the next batch takes it first. Its time to first token grows by
  one blended forward at most; no prompt, cache decision or eviction order changes. A request of no
  group (a client the operator did not group) is never held.
* ``hold_for_whole_prefill`` (AROUND the same): a member that may blend and that the batch would
  chunk (its extend is longer than what is left of the chunk budget) stays queued, unless the
  batch is empty or it already waited ``MAX_HOLDS`` batches: a chunked prefill computes every
  token; in a later batch it comes earlier and prefills whole.
"""

from __future__ import annotations

from typing import Any

from radix_ext.asks import blend, segments as tree
from radix_ext.asks.segments import OPTIONS_ATTR

CALC_PRIORITY = "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority"
ADD_ONE_REQ = "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req"
HOLDS_ATTR = "rksc_blend_holds"  # on a Req: prefill batches it waited out (either hold)
MAX_HOLDS = 4  # a member that would be chunked: then it is chunked as SGLang would (and computes every token)
SIDE_ROWS = 64  # a request computing more than this waits out a batch of members (about one member's kept rows)
SIDE_HOLDS = 1


def _state() -> Any:
    return blend._live[0] if blend._live else None


def may_blend(req, state) -> bool:
    """Whether ``req`` is a member whose group has exact text indexed and that reuses some of it."""
    options = getattr(req, OPTIONS_ATTR, None)
    if (options is None or state.blend is None or req.rid not in tree.members
            or not state.index.has(options.group)):
        return False
    recompute = state.blend.recompute if options.recompute is None else float(options.recompute)
    return recompute < 1


def _extend(req) -> int:
    return len(req.full_untruncated_fill_ids) - req.prefix_len


def members_first(original, policy, waiting_queue, *args, **kwargs):
    """AROUND ``SchedulePolicy.calc_priority``: SGLang's order, then (stable) the requests whose
    hold is spent, the members that may blend, the rest."""
    result = original(policy, waiting_queue, *args, **kwargs)
    state = _state()
    if (state is None or not tree.members or len(waiting_queue) < 2
            or getattr(policy, "enable_priority_scheduling", False)):
        return result
    blending = [may_blend(req, state) for req in waiting_queue]
    if not any(blending):
        return result
    spent = [not b and getattr(req, HOLDS_ATTR, 0) >= SIDE_HOLDS for req, b in zip(waiting_queue, blending)]
    rank = [0 if s else 1 if b else 2 for s, b in zip(spent, blending)]
    order = sorted(range(len(waiting_queue)), key=rank.__getitem__)
    waiting_queue[:] = [waiting_queue[i] for i in order]
    return result


def hold_out_of_blend_batch(original, adder, req, *args, **kwargs):
    """AROUND ``PrefillAdder.add_one_req``: a long grouped request that may not blend waits out a
    batch that holds a member that may, once."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    state = _state()
    if (state is not None and tree.members and adder.can_run_list
            and getattr(req, OPTIONS_ATTR, None) is not None
            and getattr(req, HOLDS_ATTR, 0) < SIDE_HOLDS and _extend(req) > SIDE_ROWS
            and not may_blend(req, state) and any(may_blend(r, state) for r in adder.can_run_list)):
        setattr(req, HOLDS_ATTR, getattr(req, HOLDS_ATTR, 0) + 1)
        return AddReqResult.CONTINUE
    return original(adder, req, *args, **kwargs)


def hold_for_whole_prefill(original, adder, req, *args, **kwargs):
    """AROUND ``PrefillAdder.add_one_req``: a member that may blend and that the batch would chunk
    waits for a later batch, at most ``MAX_HOLDS`` times, unless the batch is empty."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    state = _state()
    budget = adder.rem_chunk_tokens
    if (state is not None and budget is not None and adder.can_run_list and may_blend(req, state)
            and _extend(req) > budget):
        holds = getattr(req, HOLDS_ATTR, 0)
        if holds < MAX_HOLDS:
            setattr(req, HOLDS_ATTR, holds + 1)
            return AddReqResult.CONTINUE
    return original(adder, req, *args, **kwargs)


def install() -> None:
    from radix_ext import hooks

    hooks.around(CALC_PRIORITY, members_first)
    hooks.around(ADD_ONE_REQ, hold_out_of_blend_batch)
    hooks.around(ADD_ONE_REQ, hold_for_whole_prefill)
