"""Requests that stock SGLang's CPU path cannot survive, refused where SGLang validates requests.

An empty prompt (``text: ""``, ``input_ids: []``) reaches the scheduler as a zero-token prefill,
whose rotary embedding fails to reshape an empty tensor and takes the scheduler (and every
in-flight request) down. So does a token id outside the vocabulary in ``input_ids`` (SGLang
range-checks ``token_ids_logprob`` but not the prompt; the embedding lookup fails in the
scheduler). A BEFORE hook on ``TokenizerManager._validate_one_request`` (the engine or HTTP
server process, where SGLang's own length checks raise ValueError, an HTTP 400) refuses both with
the reason instead, and a negative ``top_logprobs_num`` (SGLang served it). Unknown or mistyped
sampling fields need nothing here: SGLang's ``/generate`` contract check and the OpenAI routes'
pydantic models refuse them first. A BEFORE hook on ``GenerateReqInput._handle_parallel_sampling`` refuses ``n`` < 1:
SGLang expands a request into ``n`` samples, and with none the OpenAI chat route never answers.
"""

from __future__ import annotations

VALIDATE_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
PARALLEL_SAMPLING_TARGET = "sglang.srt.managers.io_struct.GenerateReqInput._handle_parallel_sampling"


def _refuse_no_samples(obj, *args, **kwargs):
    params = obj.sampling_params
    for entry in params if isinstance(params, list) else [params]:
        n = entry.get("n") if isinstance(entry, dict) else None
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"sampling_params.n must be an integer >= 1 (samples to draw), got {n!r}")
    return None


def _refuse_unservable_prompt(manager, obj, input_ids, *args, **kwargs):
    top = getattr(obj, "top_logprobs_num", None)
    if isinstance(top, int) and top < 0:
        raise ValueError(f"top_logprobs_num must be >= 0, got {top}")
    if not input_ids and getattr(obj, "input_embeds", None) is None:
        raise ValueError("the prompt is empty (0 tokens after tokenization): send non-empty text or input_ids")
    if getattr(obj, "input_ids", None) is not None:  # ids the client sent (the tokenizer's are valid)
        vocab_size = manager.model_config.vocab_size
        bad = next((t for t in input_ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size),
                   None)
        if bad is not None:
            raise ValueError(f"input_ids contains {bad!r}, not a token id of this model's vocabulary [0, {vocab_size})")
    return None


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(VALIDATE_TARGET, _refuse_unservable_prompt, HookType.BEFORE)
    HookRegistry.register(PARALLEL_SAMPLING_TARGET, _refuse_no_samples, HookType.BEFORE)
