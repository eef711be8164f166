"""Several engines in one process: own event loops (``_own_event_loop``), own shutdown (``_engine_class``).

Pinned against SGLang: ``Engine._ensure_event_loop`` is what ``Engine.__init__`` keeps as
``engine.loop``. If SGLang stops taking the thread's current loop there, these tests fail and the
override in ``launch_engine`` must be revisited.
"""

from __future__ import annotations

import asyncio

from sglang.srt.entrypoints.engine import Engine

from rksc_sgl.engine import _own_event_loop


def test_engine_loop_is_new_and_the_threads_loop_is_restored():
    before = asyncio.new_event_loop()
    asyncio.set_event_loop(before)
    with _own_event_loop():
        first = Engine._ensure_event_loop()
    with _own_event_loop():
        second = Engine._ensure_event_loop()
    assert first is not before and second is not before and first is not second
    assert asyncio.get_event_loop_policy().get_event_loop() is before


def test_without_the_override_sglang_shares_the_threads_loop():
    # The failure the override exists for: two engines of one thread, one loop.
    assert Engine._ensure_event_loop() is Engine._ensure_event_loop()


def test_inside_a_running_loop_sglang_keeps_that_loop():
    async def bind():
        with _own_event_loop():
            return Engine._ensure_event_loop() is asyncio.get_running_loop()

    assert asyncio.run(bind())


def test_sglang_shutdown_kills_every_child_of_the_process():
    # What rksc_sgl.engine._engine_class narrows: if SGLang stops calling this, revisit it.
    import inspect

    assert "kill_process_tree(os.getpid(), include_parent=False" in inspect.getsource(Engine.shutdown)
