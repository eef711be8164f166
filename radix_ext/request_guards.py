"""Requests that stock SGLang's CPU path cannot survive, refused where SGLang validates requests.

An empty prompt (``text: ""``, ``input_ids: []``) reaches the scheduler as a zero-token prefill,
whose rotary embedding fails to reshape an empty tensor and takes the scheduler (and every
in-flight request) down. So does a token id outside the vocabulary in ``input_ids`` (SGLang
range-checks ``token_ids_logprob`` but not the prompt; the embedding lookup fails in the
scheduler). A BEFORE hook on ``TokenizerManager._validate_one_request`` (the engine or HTTP
server process, where SGLang's own length checks raise ValueError, an HTTP 400) refuses both with
the reason instead. The same hook checks ``sampling_params`` field by field against SGLang's
``SamplingParams`` (an unknown name, or a value of the wrong type such as ``"max_new_tokens":
"ten"``): SGLang builds the struct from the dict and its TypeError becomes an HTTP 500 without the
field's name. A BEFORE hook on ``GenerateReqInput._handle_parallel_sampling`` refuses ``n`` < 1:
SGLang expands a request into ``n`` samples, and with none the OpenAI chat route never answers.
"""

from __future__ import annotations

VALIDATE_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
PARALLEL_SAMPLING_TARGET = "sglang.srt.managers.io_struct.GenerateReqInput._handle_parallel_sampling"


# Fields whose values are objects with entries of their own: SGLang declares custom_params'
# values as JSON scalars or flat lists/objects, narrower than what it passes through in practice
# (CGEE's early-exit options hold a list of lens token ids).
OBJECT_FIELDS = ("custom_params", "logit_bias", "watermark")


def check_sampling_params(params, struct) -> None:
    """ValueError naming the first field of ``params`` that ``struct`` (a msgspec Struct) lacks or
    whose value does not convert to the field's type."""
    import msgspec

    if params is None:
        return
    if not isinstance(params, dict):
        raise ValueError(f"sampling_params must be a JSON object, got {type(params).__name__}")
    fields = {f.name: f.type for f in msgspec.structs.fields(struct)}
    for name, value in params.items():
        if name not in fields:
            raise ValueError(f"sampling_params.{name} is not a sampling parameter")
        if value is None:  # SGLang reads null as "the default" (SamplingParams.__post_init__)
            continue
        if name in OBJECT_FIELDS:  # their entries are checked by their owners (ours: rksc_sgl.protocol)
            if not isinstance(value, dict):
                raise ValueError(f"sampling_params.{name} must be a JSON object, got {type(value).__name__}")
            continue
        try:
            msgspec.convert(value, fields[name])
        except msgspec.ValidationError as e:
            raise ValueError(f"sampling_params.{name}: {e}") from None


def _refuse_no_samples(obj, *args, **kwargs):
    params = obj.sampling_params
    for entry in params if isinstance(params, list) else [params]:
        n = entry.get("n") if isinstance(entry, dict) else None
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"sampling_params.n must be an integer >= 1 (samples to draw), got {n!r}")
    return None


def _refuse_unservable_prompt(manager, obj, input_ids, *args, **kwargs):
    check_sampling_params(getattr(obj, "sampling_params", None), manager.sampling_params_class)
    top = getattr(obj, "top_logprobs_num", None)
    if isinstance(top, int) and top < 0:
        raise ValueError(f"top_logprobs_num must be >= 0, got {top}")
    if not input_ids and getattr(obj, "input_embeds", None) is None:
        raise ValueError("the prompt is empty (0 tokens after tokenization): send non-empty text or input_ids")
    vocab_size = manager.model_config.vocab_size
    if input_ids and not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in input_ids):
        bad = next(t for t in input_ids if not (isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size))
        raise ValueError(f"input_ids contains {bad!r}, not a token id of this model's vocabulary [0, {vocab_size})")
    return None


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(VALIDATE_TARGET, _refuse_unservable_prompt, HookType.BEFORE)
    HookRegistry.register(PARALLEL_SAMPLING_TARGET, _refuse_no_samples, HookType.BEFORE)
