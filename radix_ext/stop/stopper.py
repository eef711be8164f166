"""Confident early stop in the scheduler: trace-confidence stops and group votes.

Options (``rksc_sgl.protocol``): ``rksc_conf_stop`` (``ConfStop``) stops one request once its
sliding-window token confidence falls below a threshold; ``rksc_group_policy`` (``GroupPolicy``),
on members of a ``rksc_group``, stops the group's remaining members once the vote over the
answers of the members that finished by themselves is decided (``rksc_sgl.stop_rules``).

Hooks (installed by ``radix_ext.plugin``):

* tokenizer process: ``SamplingParams.verify`` (AFTER) parses the options (HTTP 400 naming the
  field); ``TokenizerManager._validate_one_request`` (BEFORE) refuses a confidence stop without
  ``return_logprob`` and ``top_logprobs_num >= top_k`` (its per-step input).
* ``Scheduler._create_generation_req`` (AFTER): a request with options gets a ``StopState``;
  under ``--tp-size > 1`` it is refused (HTTP 400: each rank would decide on its own); a member
  of an already decided group is marked, and ``Scheduler._add_request_to_queue`` (AFTER) takes
  it out of the waiting queue again as SGLang's own abort does for queued requests.
* ``Scheduler.process_batch_result`` (AFTER, every prefill and decode step): each tracked
  request's new top-k log-probabilities (``req.logprob.output_top_logprobs_val``, appended by
  SGLang in this step) feed its window; below the threshold, ``req.to_finish`` gets a stop
  finish reason, which SGLang applies at the next step exactly as it applies a scheduler abort
  (``update_finish_state``), so the KV is released by its normal path (the request decodes one
  more token). A member that finished by itself (not aborted, not stopped) votes with what the
  policy's answer patterns read in its text (in order, the first that gives an answer, its last
  match, normalised: ``stop_rules.read_answer``); the group's vote is read once per step, after
  every member that finished in that step voted, and a decided vote stops the other members:
  running ones through ``to_finish``, queued ones popped and answered as SGLang answers an
  aborted queued request (empty text).

The finish reason's JSON is ``{"type": "abort", "status_code": None, "message": "rksc: ..."}``:
type ``abort`` is in OpenAI's set and, with no status code, SGLang returns the partial text
with HTTP 200. ``meta_info["rksc_stop"]`` (a request-level ``customized_info`` key, so it comes
once, with the finished non-streamed output) says why and at which token the stop was decided.
Confidences are those of SGLang's returned log-probabilities: temperature-scaled. The server's
internal-state readback (``/server_info``) gains ``rksc_early_stop``: tracked requests, live
groups, and the scheduler's running and waiting requests.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from typing import Any

from radix_ext.cgee import requests as exit_requests
from radix_ext.ops import introspection
from radix_ext.stop import groups
from rksc_sgl.stop_options import (CONF_STOP_KEY, EARLY_STOP_STATE_KEY, GROUP_POLICY_KEY, STOP_KEY, STOP_MESSAGE_PREFIX,
                                   ConfStop, GroupPolicy, GroupTag)
from rksc_sgl import stop_rules
from rksc_sgl.stop_rules import WindowConfidence, should_stop_trace, token_confidence

logger = logging.getLogger(__name__)

SAMPLING_VERIFY = exit_requests.SAMPLING_VERIFY
VALIDATE_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
CREATE_REQ = exit_requests.CREATE_REQ
ADD_TO_QUEUE = "sglang.srt.managers.scheduler.Scheduler._add_request_to_queue"
PROCESS_BATCH_RESULT = "sglang.srt.managers.scheduler.Scheduler.process_batch_result"
REQUEST_LEVEL_TARGET = ("sglang.srt.managers.scheduler_components.output_streamer."
                        "SchedulerOutputStreamer.is_request_level_customized_info_key")
MAKE_ABORT_REQ = "sglang.srt.managers.scheduler._make_abort_req"
SCHEDULER_METHODS = ("sglang.srt.managers.scheduler.Scheduler._release_aborted_request",
                     "sglang.srt.managers.scheduler.Scheduler.send_abort_output")

REQ_ATTR = "rksc_stop_state"
TP_REFUSAL = (f"custom_params.{CONF_STOP_KEY} / {GROUP_POLICY_KEY} (early stop) need --tp-size 1, this server "
              "runs {tp} ranks: each rank's scheduler would decide on its own")


@dataclasses.dataclass
class StopState:
    """What the scheduler keeps on a request with stop options (``Req.rksc_stop_state``)."""

    conf: ConfStop | None
    window: WindowConfidence | None
    tag: GroupTag | None
    seen: int = 0  # top-logprob steps already pushed into the window
    voted: bool = False
    refused: dict | None = None  # the stop report of a member whose group was decided before it came


_tracked: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()  # id(req) -> req
registry = groups.GroupRegistry()  # this scheduler process's groups


@functools.cache
def _finish_reason_class():
    from sglang.srt.managers.schedule_batch import BaseFinishReason

    class RkscStop(BaseFinishReason):
        """A request stopped by us: reported like a graceful abort (HTTP 200, partial text)."""

        def __init__(self, message: str) -> None:
            super().__init__()
            self.message = message

        def to_json(self):
            return {"type": "abort", "status_code": None, "message": self.message, "err_type": None}

    return RkscStop


def stop(req, report: dict[str, Any], message: str) -> None:
    """Finish ``req`` at its next step with our finish reason and report."""
    req.to_finish = _finish_reason_class()(STOP_MESSAGE_PREFIX + message)
    req.customized_info = {**(req.customized_info or {}), STOP_KEY: [report]}


# ---- tokenizer-side checks -------------------------------------------------------------------

def _check_options(result, sampling_params, *args, **kwargs):
    ConfStop.from_custom_params(sampling_params.custom_params)  # ValueError -> HTTP 400
    policy = GroupPolicy.from_custom_params(sampling_params.custom_params)
    if policy is not None and (sampling_params.n or 1) == 1 \
            and GroupTag.from_custom_params(sampling_params.custom_params) is None:
        raise ValueError(f"custom_params.{GROUP_POLICY_KEY} needs a group: send custom_params.rksc_group "
                         f"(a program's forks) or n > 1")
    return None


def _check_logprobs(manager, obj, *args, **kwargs):
    params = obj.sampling_params if isinstance(getattr(obj, "sampling_params", None), dict) else None
    conf = ConfStop.from_custom_params(params.get("custom_params")) if params else None
    if conf is not None and (not obj.return_logprob or (obj.top_logprobs_num or 0) < conf.top_k):
        raise ValueError(
            f"custom_params.{CONF_STOP_KEY}.top_k = {conf.top_k} needs return_logprob and top_logprobs_num >= "
            f"{conf.top_k} (OpenAI routes: logprobs={conf.top_k} on completions, logprobs=true and "
            f"top_logprobs={conf.top_k} on chat), got return_logprob={obj.return_logprob}, "
            f"top_logprobs_num={obj.top_logprobs_num}")
    return None


# ---- scheduler hooks -------------------------------------------------------------------------

def _on_create(req, scheduler, recv_req, *args, **kwargs):
    custom = getattr(req.sampling_params, "custom_params", None)
    try:
        conf = ConfStop.from_custom_params(custom)
        policy = GroupPolicy.from_custom_params(custom)
        tag = GroupTag.from_custom_params(custom) if policy is not None else None
    except ValueError as e:  # verify() refuses these first; never fail the scheduler on one
        logger.warning("ignoring the stop options of request %s: %s", req.rid, e)
        return None
    if conf is None and tag is None:
        return None
    if getattr(scheduler, "tp_size", 1) > 1:
        req.set_finish_with_abort(TP_REFUSAL.format(tp=scheduler.tp_size))
        return None
    state = StopState(conf, WindowConfidence(conf.window) if conf else None, tag)
    setattr(req, REQ_ATTR, state)
    _tracked[id(req)] = req
    if tag is not None:
        size = req.sampling_params.n if (req.sampling_params.n or 1) > 1 else None
        group = registry.join(tag, policy, req, size=size)
        if group.decided is not None:
            state.refused = _group_report(tag, group, at_token=0)
    return None


def _drop_refused(result, scheduler, req, *args, **kwargs):
    state: StopState | None = getattr(req, REQ_ATTR, None)
    if state is not None and state.refused is not None and req in scheduler.waiting_queue:
        _abort_queued(scheduler, req, state.refused)
        registry.release(state.tag.id)
    return result


def _abort_queued(scheduler, req, report: dict[str, Any]) -> None:
    """Take a queued request out, as SGLang's abort does for one ("method 1"): nothing allocated."""
    from sglang.srt.managers.scheduler import _make_abort_req

    scheduler.waiting_queue.remove(req)
    scheduler._release_aborted_request(req)
    reason = _finish_reason_class()(STOP_MESSAGE_PREFIX + _group_message(report))
    scheduler.send_abort_output(_make_abort_req(req, finished_reason=reason.to_json()), req)
    req.finished_reason = reason  # so the group sees it finished
    _tracked.pop(id(req), None)  # no batch will carry it any more


def _after_batch(result, scheduler, *args, **kwargs):
    if not _tracked:
        return result
    voted: dict[str, tuple[GroupTag, groups.Group]] = {}  # groups with a new vote in this step
    finished: set[str] = set()  # groups a member of which finished in this step
    for req in list(_tracked.values()):
        state: StopState = getattr(req, REQ_ATTR)
        if req.finished():
            _tracked.pop(id(req), None)
            if state.tag is not None:
                finished.add(state.tag.id)
                _record_member(req, state, voted)
        elif state.window is not None and req.to_finish is None:
            _push_confidences(req, state)
    # Each group's vote is read once, over every member that finished up to this step.
    for tag, group in voted.values():
        if group.decide():
            _stop_group(scheduler, tag, group)
    for group_id in finished:
        registry.release(group_id)
    return result


def _push_confidences(req, state: StopState) -> None:
    steps = req.logprob.output_top_logprobs_val if getattr(req, "logprob", None) is not None else None
    if not steps:
        return
    state.seen = min(state.seen, len(steps))  # a retracted request starts its logprobs again
    for top in steps[state.seen:]:
        state.seen += 1
        mean = state.window.push(token_confidence(top, state.conf.top_k))
        if should_stop_trace(mean, state.conf.threshold):
            at = len(req.output_ids)
            report = {"reason": "confidence", "at_token": at, "window_confidence": mean,
                      "threshold": state.conf.threshold, "window": state.conf.window, "top_k": state.conf.top_k}
            stop(req, report, f"trace confidence {mean:.4f} < {state.conf.threshold} over the last "
                              f"{state.conf.window} tokens, at token {at}")
            return


def _record_member(req, state: StopState, voted: dict) -> None:
    """Record a finished member's answer in its group, if it finished by itself (``voted``: the
    groups whose vote is to be read again)."""
    group = registry.get(state.tag.id)
    if group is None or state.voted or not _votes(req):
        return
    state.voted = True
    group.record(state.tag.index, _answer(req, group))
    voted[state.tag.id] = (state.tag, group)


def _votes(req) -> bool:
    """Whether a finished request's answer counts: it finished by itself (not aborted or stopped)."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    return not isinstance(req.finished_reason, (FINISH_ABORT, _finish_reason_class()))


def _answer(req, group: groups.Group) -> str | None:
    tokenizer = getattr(req, "tokenizer", None)
    if tokenizer is None or group.patterns is None:  # --skip-tokenizer-init: no text to vote on
        return None
    ids = req.output_ids[: req.finished_len] if req.finished_len is not None else req.output_ids
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    return stop_rules.read_answer(group.patterns, text, group.policy.answer_normalize)


def _group_report(tag: GroupTag, group: groups.Group, at_token: int) -> dict[str, Any]:
    return {"reason": "group", "at_token": at_token, "group": tag.id, "rule": group.policy.rule,
            "answer": group.decided, "votes": len(group.answers)}


def _group_message(report: dict[str, Any]) -> str:
    return (f"group {report['group']} decided {report['answer']!r} by {report['rule']} after {report['votes']} "
            f"votes, at token {report['at_token']}")


def _stop_group(scheduler, tag: GroupTag, group: groups.Group) -> None:
    for req in group.running():
        if req.to_finish is not None:
            continue
        report = _group_report(tag, group, at_token=len(req.output_ids))
        if req in scheduler.waiting_queue:
            _abort_queued(scheduler, req, report)
        else:
            stop(req, report, _group_message(report))


def _request_level(result, streamer, key, *args, **kwargs):
    return True if key == STOP_KEY else result


def _add_state(result, controller, *args, **kwargs):
    """``rksc_early_stop`` in the internal-state readback: what this scheduler tracks and runs."""
    scheduler = controller.scheduler
    result.internal_state[EARLY_STOP_STATE_KEY] = {
        "tracked_requests": len(_tracked), "groups": len(registry),
        "running_requests": len(scheduler.running_batch.reqs), "waiting_requests": len(scheduler.waiting_queue)}
    return result


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(SAMPLING_VERIFY, _check_options, HookType.AFTER)
    HookRegistry.register(VALIDATE_TARGET, _check_logprobs, HookType.BEFORE)
    HookRegistry.register(CREATE_REQ, _on_create, HookType.AFTER)
    HookRegistry.register(ADD_TO_QUEUE, _drop_refused, HookType.AFTER)
    HookRegistry.register(PROCESS_BATCH_RESULT, _after_batch, HookType.AFTER)
    HookRegistry.register(REQUEST_LEVEL_TARGET, _request_level, HookType.AFTER)
    HookRegistry.register(introspection.TARGET, _add_state, HookType.AFTER)
