"""Requests that stock SGLang cannot survive or serve fairly, refused at the door with an HTTP 400
that names the field and its limit, so that no single request can kill, stall or silently
misconfigure the server.

The set comes from what the scheduler indexes or sizes with request values:

* the prompt: an empty one reaches the scheduler as a zero-token prefill, whose rotary embedding
  fails to reshape an empty tensor; a token id outside the vocabulary in ``input_ids`` fails the
  embedding lookup (SGLang range-checks ``token_ids_logprob``'s ids, not the prompt's);
* ``top_logprobs_num``: the logits processor calls ``topk(max(top_logprobs_nums))`` over the
  vocabulary (``layers/logprob_processor.py``), so k > vocabulary raises "selected index k out of
  range" in the scheduler and SGLang takes the whole server down; must be in [0, vocabulary];
* ``token_ids_logprob``: ids are SGLang's check, the length ours (at most the vocabulary: every
  prompt position gathers that many log-probabilities);
* ``logprob_start_len``: -1 (SGLang's "none") or a prompt position; SGLang refuses one past the
  prompt itself, values below -1 it treats as 0 without a word;
* ``sampling_params.stop_token_ids``: with ``min_new_tokens`` the penalizer scatters them into a
  vocabulary-wide tensor (``penaltylib/min_new_tokens.py``), so an id outside it kills the
  scheduler;
* ``sampling_params.n``: SGLang expands a request into ``n`` queued children before anything
  else runs, so ``n`` must be in [1, ``--max-n``], and a request's children (prompts x n) never
  more than ``--max-queued-requests`` (the scheduler would refuse the rest one by one);
* fields SGLang's ``/generate`` would silently drop: a top-level key that is not a
  ``GenerateReqInput`` field (``custom_params`` outside ``sampling_params``, a misspelt
  ``top_logprob_num``), and ``best_of`` on ``/v1/completions`` (SGLang never reads it). The one
  top-level key let through is ``model``: sglang-router adds it to every body it forwards, and a
  single-model server has nothing to choose with it.

Each check runs in the process that holds SGLang's tokenizer manager (the engine or HTTP server
process), where SGLang's own ValueErrors become HTTP 400s; the per-request checks are pure
functions of the request and the vocabulary size.
"""

from __future__ import annotations

import dataclasses
import functools

VALIDATE_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
PARALLEL_SAMPLING_TARGET = "sglang.srt.managers.io_struct.GenerateReqInput._handle_parallel_sampling"
SAMPLING_VERIFY_TARGET = "sglang.srt.sampling.sampling_params.SamplingParams.verify"
CONTRACT_TARGET = "sglang.srt.entrypoints.api_contract.generate_contract_error"
COMPLETION_VALIDATE_TARGET = (
    "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._validate_request"
)
MAX_QUEUED_SOURCE = "sglang.srt.runtime_context.get_schedule"
SAMPLING_FIELDS = "sglang.srt.sampling.sampling_params.SamplingParams.__struct_fields__"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_samples(sampling_params, num_prompts: int, max_n: int, max_queued: int | None) -> None:
    """``sampling_params.n`` in [1, max_n], and num_prompts x n within the queue (if bounded)."""
    for entry in sampling_params if isinstance(sampling_params, list) else [sampling_params]:
        n = entry.get("n") if isinstance(entry, dict) else None
        if n is None:
            continue
        if not _is_int(n) or n < 1:
            raise ValueError(f"sampling_params.n must be an integer >= 1 (samples to draw), got {n!r}")
        if n > max_n:
            raise ValueError(f"sampling_params.n must be <= {max_n} (the server's --max-n), got {n}")
        if max_queued is not None and num_prompts * n > max_queued:
            raise ValueError(f"sampling_params.n = {n} over {num_prompts} prompt(s) makes {num_prompts * n} "
                             f"requests, more than the server queues (--max-queued-requests {max_queued})")


def check_logprob_fields(obj, vocab_size: int) -> None:
    """``top_logprobs_num``, ``token_ids_logprob`` and ``logprob_start_len`` of one request."""
    top = getattr(obj, "top_logprobs_num", None)
    if _is_int(top) and not 0 <= top <= vocab_size:
        raise ValueError(f"top_logprobs_num must be in [0, {vocab_size}] (the vocabulary), got {top}")
    ids = getattr(obj, "token_ids_logprob", None)
    if isinstance(ids, list) and len(ids) > vocab_size:
        raise ValueError(f"token_ids_logprob has {len(ids)} ids, more than the vocabulary ({vocab_size})")
    start = getattr(obj, "logprob_start_len", None)
    if _is_int(start) and start < -1:
        raise ValueError(f"logprob_start_len must be -1 (none) or a prompt position >= 0, got {start}")


def check_prompt(obj, input_ids, vocab_size: int) -> None:
    if not input_ids and getattr(obj, "input_embeds", None) is None:
        raise ValueError("the prompt is empty (0 tokens after tokenization): send non-empty text or input_ids")
    if getattr(obj, "input_ids", None) is not None:  # ids the client sent (the tokenizer's are valid)
        bad = next((t for t in input_ids if not _is_int(t) or not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ValueError(f"input_ids contains {bad!r}, not a token id of this model's vocabulary [0, {vocab_size})")


def check_stop_token_ids(stop_token_ids, vocab_size: int) -> None:
    bad = next((t for t in stop_token_ids or () if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"sampling_params.stop_token_ids contains {bad}, not a token id of this model's "
                         f"vocabulary [0, {vocab_size})")


# Top-level keys that /generate may carry and SGLang ignores by design: sglang-router forwards every
# body with the served model's name in ``model`` (tests/integration/test_router.py fails without it).
IGNORED_BY_DESIGN = frozenset({"model"})


def unknown_field_error(body, known: frozenset[str], sampling_fields: frozenset[str]) -> str | None:
    """The reason a ``/generate`` body has a top-level key SGLang would drop, or None."""
    if not isinstance(body, dict):
        return None
    for key in body:
        if key in known or key in IGNORED_BY_DESIGN:
            continue
        if key in sampling_fields:
            return (f"{key} is not a top-level field of /generate: put it inside sampling_params "
                    f"(SGLang would ignore it here)")
        return f"unknown field {key!r} in the /generate body (SGLang would ignore it)"
    return None


def _refuse_too_many_samples(obj, *args, max_n: int, **kwargs):
    from sglang.srt.runtime_context import get_schedule

    check_samples(obj.sampling_params, obj.batch_size, max_n, get_schedule().max_queued_requests)
    return None


def _refuse_unservable_request(manager, obj, input_ids, *args, **kwargs):
    vocab_size = manager.model_config.vocab_size
    check_logprob_fields(obj, vocab_size)
    check_prompt(obj, input_ids, vocab_size)
    return None


def _refuse_stop_ids_outside_vocab(result, sampling_params, vocab_size, *args, **kwargs):
    check_stop_token_ids(sampling_params.stop_token_ids, vocab_size)
    return None


@functools.cache
def _generate_fields() -> tuple[frozenset[str], frozenset[str]]:
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams  # a msgspec.Struct

    return frozenset(f.name for f in dataclasses.fields(GenerateReqInput)), frozenset(SamplingParams.__struct_fields__)


def _refuse_unknown_fields(result, body, *args, **kwargs):
    return result if result is not None else unknown_field_error(body, *_generate_fields())


def _refuse_best_of(result, serving, request, *args, **kwargs):
    best_of = getattr(request, "best_of", None)
    if result is None and best_of is not None and best_of != request.n:
        return (f"best_of is not supported (SGLang ignores it), got best_of={best_of} with n={request.n}: "
                "send n and pick the best yourself")
    return result


def install(max_n: int) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(VALIDATE_TARGET, _refuse_unservable_request, HookType.BEFORE)
    HookRegistry.register(PARALLEL_SAMPLING_TARGET, functools.partial(_refuse_too_many_samples, max_n=max_n),
                          HookType.BEFORE)
    HookRegistry.register(SAMPLING_VERIFY_TARGET, _refuse_stop_ids_outside_vocab, HookType.AFTER)
    HookRegistry.register(CONTRACT_TARGET, _refuse_unknown_fields, HookType.AFTER)
    HookRegistry.register(COMPLETION_VALIDATE_TARGET, _refuse_best_of, HookType.AFTER)
