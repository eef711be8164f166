"""ASKS blend, the prefill order: a member that will reuse most of its prompt prefills first, in a
batch of its own kind.

On a CPU a prefill forward costs about its computed tokens, and every request of the batch gets
its first token when the whole forward ends. A member that blends computes a small share of its
prompt (an agent reading a passage and the earlier agents' outputs: tens of tokens of hundreds),
so batched with a request that computes 400 tokens in full it waits for those 400, and its time
to first token is the other request's. Here (``--asks-blend-first``, on by default):

* ``is_light``: a member is *light* when its group's content index (``radix_ext.asks.segments``)
  covers at least ``LIGHT_SHARE`` of its prompt. Predicted once per request, the first time the
  scheduler orders the waiting queue with the member in it (``LIGHT_ATTR``); the plan at its
  forward searches again, since the tree can change in between.
* AROUND ``SchedulePolicy.calc_priority``: after SGLang's own order, light members first (a
  stable partition: SGLang's order holds within each part).
* AROUND ``PrefillAdder.add_one_req``: once the batch being built holds a light member, a request
  that is not light waits for the next prefill batch (``CONTINUE``: later light members may still
  join), at most ``MAX_HOLDS`` batches, then joins as SGLang would. The next batch runs right after
  (the scheduler prefills before it decodes while requests wait), so a held request waits for the
  light batch, a fraction of its own prefill.

Only members of a group are ever light, and only by their own group's text; a request outside any
group is never moved ahead of, only held behind light batches, at most ``MAX_HOLDS`` of them. With
no member waiting both hooks return SGLang's behaviour untouched.
"""

from __future__ import annotations

from radix_ext.asks import segments as tree

CALC_PRIORITY = "sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority"
LIGHT_ATTR = "rksc_blend_light"  # on a member Req: predicted to reuse at least LIGHT_SHARE of its prompt
HOLDS_ATTR = "rksc_blend_order_holds"  # on a Req: light batches it waited out
LIGHT_SHARE = 0.5
MAX_HOLDS = 4



def _state():
    """The scheduler's AsksState when blend orders prefills (``--asks-blend-first``), else None."""
    from radix_ext.asks.blend import _live

    state = _live[0] if _live and tree.members else None
    return state if state is not None and state.blend is not None and state.blend.blend_first else None


def is_light(req, state) -> bool:
    """Whether ``req`` (a waiting member) is predicted to reuse at least ``LIGHT_SHARE`` of its prompt."""
    light = getattr(req, LIGHT_ATTR, None)
    if light is None:
        light = _predict(req, state)
        setattr(req, LIGHT_ATTR, light)
    return light


def _predict(req, state) -> bool:
    from radix_ext.asks.blend import _recompute
    from sglang.srt.mem_cache.radix_cache import RadixKey

    options = getattr(req, tree.OPTIONS_ATTR, None)
    if (options is None or req.rid not in tree.members or req.output_ids or not state.index.has(options.group)
            or _recompute(options, state) >= 1):
        return False
    ids = req.origin_input_ids
    key = RadixKey(token_ids=ids, extra_key=req.extra_key, cache_salt=req.cache_salt)
    found = tree.find_segments(state.index, key, 0, len(ids) - state.blend.fresh_tail, options.group)
    return sum(segment.length for segment in found) >= LIGHT_SHARE * len(ids)


def light_first(original, policy, waiting_queue, *args, **kwargs):
    """AROUND ``SchedulePolicy.calc_priority``: SGLang's order, then light members first."""
    result = original(policy, waiting_queue, *args, **kwargs)
    state = _state() if len(waiting_queue) > 1 else None
    if state is not None:
        light = [is_light(req, state) for req in waiting_queue]
        if any(light) and not all(light):
            waiting_queue[:] = ([req for req, first in zip(waiting_queue, light) if first]
                                + [req for req, first in zip(waiting_queue, light) if not first])
    return result


def hold_behind_light(original, adder, req, *args, **kwargs):
    """AROUND ``PrefillAdder.add_one_req``: a request that is not light waits out a batch that
    holds a light member, at most ``MAX_HOLDS`` times."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    if adder.can_run_list and not getattr(req, LIGHT_ATTR, False) and _state() is not None:
        if any(getattr(other, LIGHT_ATTR, False) for other in adder.can_run_list):
            holds = getattr(req, HOLDS_ATTR, 0)
            if holds < MAX_HOLDS:
                setattr(req, HOLDS_ATTR, holds + 1)
                return AddReqResult.CONTINUE
    return original(adder, req, *args, **kwargs)
