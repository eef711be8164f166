"""Requests that stock SGLang's CPU path cannot survive, refused where SGLang validates requests.

An empty prompt (``text: ""``, ``input_ids: []``) reaches the scheduler as a zero-token prefill,
whose rotary embedding fails to reshape an empty tensor and takes the scheduler (and every
in-flight request) down. A BEFORE hook on ``TokenizerManager._validate_one_request`` (the
engine or HTTP server process, where SGLang's own length checks raise ValueError, an HTTP 400)
refuses it with the reason instead.
"""

from __future__ import annotations

VALIDATE_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"


def _refuse_empty_prompt(manager, obj, input_ids, *args, **kwargs):
    if not input_ids and getattr(obj, "input_embeds", None) is None:
        raise ValueError("the prompt is empty (0 tokens after tokenization): send non-empty text or input_ids")
    return None


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(VALIDATE_TARGET, _refuse_empty_prompt, HookType.BEFORE)
