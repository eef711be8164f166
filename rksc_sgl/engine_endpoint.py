"""``RkscEngineEndpoint``: the frontend backend of an in-process engine.

It is ``RkscEndpoint`` (``rksc_sgl.endpoint``) with the HTTP transport replaced by
``Engine.async_generate(**body)`` on the engine's own event loop, run in one background thread so
the fork threads can share it; a stream (``stream=True``) is pulled from the engine's async
generator one output at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

from sglang.lang.chat_template import get_chat_template

from rksc_sgl.endpoint import FLUSH_TIMEOUT_S, RkscEndpoint, chat_template_for
from rksc_sgl.program_state import install_fork_prefix_fix


class RkscEngineEndpoint(RkscEndpoint):
    """``sgl.set_default_backend(RkscEngineEndpoint(engine))`` runs frontend programs in-process."""

    def __init__(self, engine, chat_template_name: str | None = None, timeout_s: float | None = 1800.0):
        # RuntimeEndpoint.__init__ would query a server over HTTP; set its fields directly.
        install_fork_prefix_fix()
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self.support_concate_and_append = False
        self.engine = engine
        self.model_info = {  # the fields of the server's /model_info that we read
            "model_path": engine.server_args.model_path,
            "has_image_understanding": engine.tokenizer_manager.model_config.is_image_understandable_model,
        }
        self.chat_template = (
            get_chat_template(chat_template_name) if chat_template_name
            else chat_template_for(self.model_info["model_path"])
        )
        self._init_counters()
        self._loop: asyncio.AbstractEventLoop = engine.loop
        self._thread = threading.Thread(target=self._loop.run_forever, name="rksc-engine-loop", daemon=True)
        self._thread.start()

    def run(self, coro, timeout_s: float | None = None):
        """Run a coroutine on the engine's event loop from any thread and return its result.

        Waits at most ``timeout_s`` (default: the backend's ``timeout_s``; None waits forever),
        then cancels the coroutine and raises ``TimeoutError``, so a stuck request cannot hang a
        program (or a test) for ever.
        """
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"RkscEngineEndpoint: no result after {timeout_s} s (timeout_s)") \
                from None

    def _send(self, data: dict[str, Any], routing_key: str | None = None):  # one engine: no routing
        return self.run(self.engine.async_generate(**_engine_body(data)))

    def _send_stream(self, data: dict[str, Any], routing_key: str | None = None):
        """The engine's streamed outputs, each pulled from its async generator on the loop."""
        events = self.run(self.engine.async_generate(**_engine_body(data)))  # stream=True: a generator
        try:
            while (event := self.run(_next_or_none(events))) is not None:
                yield event
        finally:  # also when the consumer stops early
            self.run(events.aclose())

    def token_ids(self, text: str) -> list[int]:
        return list(self.engine.tokenizer_manager.tokenizer.encode(text, add_special_tokens=False))

    def flush_cache(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        result = self.run(self.engine.tokenizer_manager.flush_cache(timeout_s=timeout_s), timeout_s + 30)
        if not result.success:
            raise RuntimeError(f"flush_cache failed: {result.message or 'the scheduler was not idle'}")

    def get_server_info(self):
        states = self.run(self.engine.tokenizer_manager.get_internal_state())
        return {**self.model_info, "internal_states": states}

    def shutdown(self):
        """Stop the loop thread, then the engine (which cancels its tasks on the stopped loop)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self.engine.shutdown()


def _engine_body(data: dict[str, Any]) -> dict[str, Any]:
    """A ``/generate`` body as ``Engine.async_generate`` keywords (it calls the text ``prompt``)."""
    body = dict(data)
    body["prompt"] = body.pop("text", None)
    return body


async def _next_or_none(events):
    try:
        return await events.__anext__()
    except StopAsyncIteration:
        return None
