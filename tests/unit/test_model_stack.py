"""``radix_ext.model_stack``: the one check CGEE's lens loop, ASKS blend and the lean CPU decode
share before running a model's layers themselves, on stand-in models whose stack forward is
SGLang's (the real engines are in the integration tests)."""

from __future__ import annotations

import types

import pytest

from radix_ext.model_stack import TARGETS, norm_kwargs, plain_call, plain_stack, stack_forwards


def model_with(stack_class, *, first=True, last=True, capture=None, aux=False):
    stack = stack_class()
    stack.pp_group = types.SimpleNamespace(is_first_rank=first, is_last_rank=last)
    stack.layers_to_capture = capture or []
    return types.SimpleNamespace(model=stack, capture_aux_hidden_states=aux)


def stack_class(path: str):
    from rksc_sgl.seams import resolve

    return type("Stack", (), {"forward": resolve(path)})


@pytest.mark.parametrize("hooked", sorted(TARGETS))
def test_sglangs_llama_and_qwen2_stacks_are_plain(hooked):
    stack_path, final_norm_kwargs = TARGETS[hooked]
    model = model_with(stack_class(stack_path))
    assert plain_stack(model) is None
    assert norm_kwargs(model.model) == final_norm_kwargs
    assert len(stack_forwards()) == len(TARGETS)


def test_each_reason_is_named():
    llama = stack_class("sglang.srt.models.llama.LlamaModel.forward")
    other = type("Stack", (), {"forward": lambda self: None})
    assert plain_stack(model_with(other)) == "model"
    assert plain_stack(model_with(llama, last=False)) == "pipeline-parallel"
    assert plain_stack(model_with(llama, first=False)) == "pipeline-parallel"
    assert plain_stack(model_with(llama, capture=[3])) == "captured-hidden-states"
    assert plain_stack(model_with(llama, aux=True)) == "captured-hidden-states"


def test_a_call_with_extra_inputs_is_not_plain():
    assert plain_call((), {})
    assert plain_call((), {"input_embeds": None, "get_embedding": False, "pp_proxy_tensors": None})
    assert not plain_call((object(),), {})
    assert not plain_call((), {"get_embedding": True})
    assert not plain_call((), {"input_embeds": object()})
