"""Batch requests refused at the door with an HTTP 400 that names the field: a malformed batch
shape, and a fan-out (prompts x ``n``) beyond ``--max-fanout``.

A ``/generate`` body is one prompt or a batch: ``text`` (or ``input_ids``, ``input_embeds``) a
list of prompts. Per-request fields then take one value for all prompts or a list with one value
per prompt, and SGLang indexes those lists by prompt without checking their length
(``io_struct.GenerateReqInput.__getitem__``): a short ``sampling_params`` list raised IndexError
(HTTP 500), a long one was silently cut, and a list where one prompt takes a scalar
(``logprob_start_len: [0]`` beside ``text: "hi"``) reached the scheduler and killed it. An empty
batch was answered 200 ``[]``. And a batch list had no bound: SGLang queues every prompt (times
``n``) at once, so 5,000 one-token prompts held the server for 30 s.

The checks are pure functions of the request's fields (a mapping); they run where SGLang's own
ValueErrors become HTTP 400s, in the process that holds the tokenizer manager, before any prompt
is tokenized or queued: on the raw ``/generate`` body (so a streamed batch is a 400 too, not an
error event after a 200), on every ``GenerateReqInput`` SGLang normalizes (OpenAI routes, the
engine), and on OpenAI requests before they are converted (``prompt`` and ``n``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

from radix_ext.ops.request_guards import (
    COMPLETION_VALIDATE_TARGET,
    CONTRACT_TARGET,
    PARALLEL_SAMPLING_TARGET,
)

CHAT_VALIDATE_TARGET = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._validate_request"
PROMPT_FIELDS = ("text", "input_ids", "input_embeds")  # SGLang's order of precedence
# One value per request; in a batch, one value for all prompts or a list of one per prompt.
PER_PROMPT_FIELDS = (
    "sampling_params", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num",
    "return_sampling_mask", "sampling_logprobs_mode", "custom_logit_processor", "lora_path",
    "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "decode_tp_size",
)
# Lists even for one prompt (images, token ids); in a batch, a list of one entry per prompt.
BATCH_LIST_FIELDS = ("video_data", "audio_data")
SHAPE_FIELDS = (*PROMPT_FIELDS, *PER_PROMPT_FIELDS, *BATCH_LIST_FIELDS, "token_ids_logprob")


def prompts(fields: Mapping[str, Any]) -> tuple[str, int | None] | None:
    """(the prompt field, its batch size, or None for one prompt); None if the request has no
    prompt SGLang would read (SGLang refuses it with its own reason)."""
    for name in PROMPT_FIELDS:
        value = fields.get(name)
        if value is None:
            continue
        if isinstance(value, str):
            return name, None
        if not isinstance(value, list):
            return None
        if name == "text":
            return name, len(value)
        if name == "input_ids":  # [] is SGLang's to judge: a session may supply the prompt
            return None if not value else (name, None if not isinstance(value[0], list) else len(value))
        one_prompt = value and isinstance(value[0], list) and value[0] and not isinstance(value[0][0], list)
        return name, None if one_prompt else len(value)
    return None


def batch_shape_error(fields: Mapping[str, Any]) -> str | None:
    """The reason a request's batch is malformed, or None."""
    found = prompts(fields)
    if found is None:
        return None
    prompt_field, batch = found
    if batch is None:
        for name in PER_PROMPT_FIELDS:
            if isinstance(fields.get(name), list):
                return (f"{name} is a list, but {prompt_field} is a single prompt: send one value, "
                        f"or send {prompt_field} as a list of prompts (a batch)")
        ids = fields.get("token_ids_logprob")
        if isinstance(ids, list) and any(isinstance(i, list) for i in ids):
            return (f"token_ids_logprob is a list of lists, but {prompt_field} is a single prompt: "
                    "send one list of token ids")
        return None
    if batch == 0:
        return f"{prompt_field} is an empty list: a batch needs at least one prompt"
    for name in (*PER_PROMPT_FIELDS, *BATCH_LIST_FIELDS):
        value = fields.get(name)
        if isinstance(value, list) and len(value) != batch:
            return (f"{name} has {len(value)} entries for the {batch} prompts in {prompt_field}: "
                    "send one entry per prompt, or one value for all")
    ids = fields.get("token_ids_logprob")
    if isinstance(ids, list) and ids and isinstance(ids[0], list) and len(ids) != batch:
        return (f"token_ids_logprob has {len(ids)} lists for the {batch} prompts in {prompt_field}: "
                "send one list per prompt, or one list of token ids for all")
    return None


def valid_n(n: Any, max_n: int) -> int | None:
    """``n`` if it is an int in [1, max_n], else None: ``request_guards.check_samples`` refuses
    it naming ``--max-n``, the more precise reason."""
    return n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= max_n else None


def samples_per_prompt(sampling_params: Any, max_n: int) -> int | None:
    """``n`` as SGLang reads it (the first entry of a list), if valid (``valid_n``)."""
    first = sampling_params[0] if isinstance(sampling_params, list) and sampling_params else sampling_params
    return valid_n(first.get("n", 1) if isinstance(first, dict) else 1, max_n)


def fanout_error(prompt_field: str, num_prompts: int, n_field: str, n: int | None, max_fanout: int) -> str | None:
    """The reason ``num_prompts`` x ``n`` generations are more than one request may ask for, or None."""
    if n is None or num_prompts * n <= max_fanout:
        return None
    return (f"this request fans out to {num_prompts * n} generations ({num_prompts} prompt(s) in {prompt_field} "
            f"x {n_field} = {n}), more than the server's limit of {max_fanout} per request (--max-fanout): "
            "split it into smaller requests")


def request_error(fields: Mapping[str, Any], max_fanout: int, max_n: int) -> str | None:
    """Batch shape, then fan-out, of a ``/generate``-shaped request."""
    error = batch_shape_error(fields)
    found = prompts(fields)
    if error is not None or found is None:
        return error
    prompt_field, batch = found
    n = samples_per_prompt(fields.get("sampling_params"), max_n)
    return fanout_error(prompt_field, batch or 1, "sampling_params.n", n, max_fanout)


def openai_error(request: Any, max_fanout: int, max_n: int) -> str | None:
    """Fan-out of an OpenAI completion (``prompt`` x ``n``) or chat completion (``messages`` x ``n``)."""
    prompt = getattr(request, "prompt", None)
    batch = len(prompt) if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)) else 1
    n = valid_n(getattr(request, "n", None) or 1, max_n)
    return fanout_error("prompt" if hasattr(request, "prompt") else "messages", batch, "n", n, max_fanout)


def _refuse_bad_body(result, body, *args, max_fanout: int, max_n: int, **kwargs):
    if result is not None or not isinstance(body, dict):
        return result
    return request_error(body, max_fanout, max_n)


def _refuse_bad_request(obj, *args, max_fanout: int, max_n: int, **kwargs):
    error = request_error({name: getattr(obj, name, None) for name in SHAPE_FIELDS}, max_fanout, max_n)
    if error is not None:
        raise ValueError(error)
    return None


def _refuse_openai_fanout(result, serving, request, *args, max_fanout: int, max_n: int, **kwargs):
    return result if result is not None else openai_error(request, max_fanout, max_n)


def install(max_fanout: int, max_n: int) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    def bound(hook: Callable) -> Callable:
        return functools.partial(hook, max_fanout=max_fanout, max_n=max_n)

    HookRegistry.register(CONTRACT_TARGET, bound(_refuse_bad_body), HookType.AFTER)
    HookRegistry.register(PARALLEL_SAMPLING_TARGET, bound(_refuse_bad_request), HookType.BEFORE)
    for target in (COMPLETION_VALIDATE_TARGET, CHAT_VALIDATE_TARGET):
        HookRegistry.register(target, bound(_refuse_openai_fanout), HookType.AFTER)
