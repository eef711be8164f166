"""Which requests take the early-exit forward, and the guarantees they get around it.

Three SGLang seams, one small hook each (installed by ``radix_ext.cgee.forward.install``):

* ``SamplingParams.verify`` (AFTER, tokenizer process): a malformed ``rksc_early_exit`` entry, or
  one on a request that may generate more than one token, is rejected before it reaches the
  scheduler (HTTP 400 naming the field; ValueError in-process).
* ``Scheduler._create_generation_req`` (AFTER; SGLang's "extension point for request-local
  state"): a flagged request gets ``skip_radix_cache_insert = True``, so its KV, which is
  truncated after the exit layer, is freed when it finishes and never enters the radix tree; it
  is also registered by rid, because the ForwardBatch the model sees is a ``dataclasses.replace``
  copy (``EagerRunner.load_batch``) that keeps only dataclass fields such as ``rids``.
* ``PrefillAdder.add_one_req`` (AROUND): a prefill batch holds flagged requests only or unflagged
  requests only (the request that does not fit waits for the next batch, as with
  ``--prefill-max-requests``). The layer loop is shared by a batch's rows, so this is what lets a
  verification batch really stop early, and it keeps ordinary requests on SGLang's own forward.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from rksc_sgl.protocol import EXIT_KEY as PARAMS_KEY
from rksc_sgl.protocol import EarlyExitParams

logger = logging.getLogger(__name__)

REQ_ATTR = "rksc_early_exit"  # EarlyExitParams on a flagged Req
SAMPLING_VERIFY = "sglang.srt.sampling.sampling_params.SamplingParams.verify"
CREATE_REQ = "sglang.srt.managers.scheduler.Scheduler._create_generation_req"
ADD_ONE_REQ = "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req"

TP_REFUSAL = (f"custom_params.{PARAMS_KEY} (CGEE early exit) needs --tp-size 1, this server runs {{tp}} ranks: "
              "each rank would read the logit lens on its own vocabulary shard and could stop at another layer")

# rid -> Req of every live flagged request in this scheduler process (entries die with the Req).
_flagged: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()


def params_of(req) -> EarlyExitParams | None:
    return getattr(req, REQ_ATTR, None)


def any_flagged() -> bool:
    return len(_flagged) > 0


def rows_of(rids: list[str]) -> list[EarlyExitParams | None]:
    """Per batch row: the request's options if it is flagged and this is its last prefill chunk.

    Earlier chunks run every layer: the next chunk attends to their KV at every layer.
    """
    rows: list[EarlyExitParams | None] = []
    for rid in rids:
        req = _flagged.get(rid)
        params = params_of(req) if req is not None else None
        if params is not None and req.extend_end != len(req.full_untruncated_fill_ids):
            params = None
        rows.append(params)
    return rows


def _check_request(result, sampling_params, *args, **kwargs):
    params = EarlyExitParams.from_custom_params(sampling_params.custom_params)  # ValueError -> 400
    if params is not None and sampling_params.max_new_tokens != 1:
        raise ValueError(
            f"custom_params.{PARAMS_KEY} needs max_new_tokens == 1 (the verdict token), got "
            f"{sampling_params.max_new_tokens}: the layers after an exit write no KV to decode from"
        )
    return None


def _flag_request(req, scheduler, recv_req, *args, **kwargs):
    try:
        params = EarlyExitParams.from_custom_params(req.sampling_params.custom_params)
    except ValueError as e:  # verify() rejects these first; never fail the scheduler on one
        logger.warning("ignoring %s of request %s: %s", PARAMS_KEY, req.rid, e)
        return None
    if params is not None and getattr(scheduler, "tp_size", 1) > 1:
        req.set_finish_with_abort(TP_REFUSAL.format(tp=scheduler.tp_size))
        return None
    if params is not None:
        req.skip_radix_cache_insert = True
        setattr(req, REQ_ATTR, params)
        _flagged[req.rid] = req
    return None


def _same_batch_class(original, adder, req, *args, **kwargs):
    from sglang.srt.managers.schedule_policy import AddReqResult

    if adder.can_run_list and (params_of(req) is None) != (params_of(adder.can_run_list[0]) is None):
        return AddReqResult.OTHER
    return original(adder, req, *args, **kwargs)


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from radix_ext import hooks

    HookRegistry.register(SAMPLING_VERIFY, _check_request, HookType.AFTER)
    HookRegistry.register(CREATE_REQ, _flag_request, HookType.AFTER)
    hooks.around(ADD_ONE_REQ, _same_batch_class)
