"""``RkscEngineEndpoint.run`` gives up after its timeout instead of hanging a program for ever."""

from __future__ import annotations

import asyncio
import types

import pytest

from rksc_sgl.engine_endpoint import RkscEngineEndpoint


def fake_engine(tmp_path):
    """Just what ``RkscEngineEndpoint`` reads of an engine: its loop and its model's path and kind."""
    loop = asyncio.new_event_loop()
    model_config = types.SimpleNamespace(is_image_understandable_model=False)
    return types.SimpleNamespace(loop=loop, server_args=types.SimpleNamespace(model_path=str(tmp_path)),
                                 tokenizer_manager=types.SimpleNamespace(model_config=model_config),
                                 shutdown=lambda: None)


def test_a_coroutine_that_never_finishes_raises_timeout_error(tmp_path):
    backend = RkscEngineEndpoint(fake_engine(tmp_path), chat_template_name="chatml", timeout_s=0.2)
    try:
        with pytest.raises(TimeoutError, match="timeout_s"):
            backend.run(asyncio.sleep(60))
        assert backend.run(asyncio.sleep(0, result="done")) == "done"  # the loop still serves
    finally:
        backend.shutdown()


def test_a_nonpositive_timeout_is_refused(tmp_path):
    with pytest.raises(ValueError, match="timeout_s"):
        RkscEngineEndpoint(fake_engine(tmp_path), chat_template_name="chatml", timeout_s=0)
