"""The decoder stacks our own forward loops replicate: SGLang's Llama and Qwen2.

CGEE's lens loop (``radix_ext.cgee.forward``), ASKS blend's reduced loop (``radix_ext.asks.blend``)
and the lean CPU decode (``radix_ext.cpu.decode``) each hook the model's forward (``TARGETS``:
Llama-3, Mistral, Falcon3 and SmolLM2 run on SGLang's Llama classes, Qwen2 and Qwen2.5 on its
Qwen2 ones) and run the layers themselves. They share what makes that safe: the stack's forward is
the one replicated, the model runs whole on one pipeline rank, nothing asks for intermediate hidden
states, and the call carries no extra inputs (``plain_stack``, ``plain_call``). Each adds its own
conditions on top.
"""

from __future__ import annotations

import functools
from typing import Any

# Hooked forward -> the decoder stack's forward the loops replicate, and the extra keyword
# arguments that stack passes to its final norm.
TARGETS = {
    "sglang.srt.models.llama.LlamaForCausalLM.forward": ("sglang.srt.models.llama.LlamaModel.forward", {}),
    "sglang.srt.models.qwen2.Qwen2ForCausalLM.forward": ("sglang.srt.models.qwen2.Qwen2Model.forward",
                                                         {"skip_empty": True}),
}


@functools.cache
def stack_forwards() -> dict[Any, dict[str, Any]]:
    """The replicated stack forwards (the functions) -> their final norm's extra kwargs, resolved
    once per process."""
    from rksc_sgl.seams import resolve

    return {resolve(stack): norm_kwargs for stack, norm_kwargs in TARGETS.values()}


def norm_kwargs(stack) -> dict[str, Any]:
    """The extra kwargs ``stack``'s forward passes to its final norm (``stack`` must be plain)."""
    return stack_forwards()[type(stack).forward]


def plain_call(args: tuple, kwargs: dict[str, Any]) -> bool:
    """A model forward called with ``(input_ids, positions, forward_batch)`` only: no extra
    positional argument, every keyword (``input_embeds``, ``get_embedding``, ...) unset."""
    return not args and all(value in (None, False) for value in kwargs.values())


def plain_stack(model) -> str | None:
    """Why ``model``'s decoder stack is not one the loops replicate (None: it is): ``model`` (its
    stack forward is not Llama's or Qwen2's), ``pipeline-parallel`` or ``captured-hidden-states``."""
    stack = model.model
    if type(stack).forward not in stack_forwards():
        return "model"
    if not (stack.pp_group.is_first_rank and stack.pp_group.is_last_rank):
        return "pipeline-parallel"
    if stack.layers_to_capture or getattr(model, "capture_aux_hidden_states", False):
        return "captured-hidden-states"
    return None
