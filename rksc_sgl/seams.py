"""Every SGLang name rksc-sgl relies on, resolved up front, so a renamed one fails loudly.

SGLang's ``HookRegistry.apply_hooks`` only logs a hook target that does not resolve, and the
plugin loader only logs an exception raised by a plugin: against another SGLang version, a
renamed target would silently switch a mechanism off. So each side lists what it touches (hook
targets, overridden private methods, module attributes it reads) and checks the list before
using it: ``radix_ext.plugin.load`` for the scheduler side (``radix_ext.seams``), the frontend
backends for the client side (``CLIENT``). A missing name raises ``SeamMissing``, a
``SystemExit`` that neither loader swallows, naming every missing name and the mechanism it
serves. ``tests/unit/test_seams.py`` resolves all of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import Any

# Client side, checked where each is first used: the frontend backends (rksc_sgl.program_state, before
# the fork fix is installed) and the engine wrapper (rksc_sgl.engine, when its class is built).
CLIENT: dict[str, tuple[str, ...]] = {
    "frontend backends": (
        "sglang.lang.backend.runtime_endpoint.RuntimeEndpoint._generate_http_request",
        "sglang.lang.backend.runtime_endpoint.RuntimeEndpoint._add_images",
        "sglang.lang.backend.runtime_endpoint.RuntimeEndpoint._handle_dtype_to_regex",
        "sglang.lang.backend.runtime_endpoint.RuntimeEndpoint._assert_success",
        "sglang.lang.interpreter.StreamExecutor.fork",
        "sglang.utils.http_request",
        "sglang.lang.interpreter.ProgramState.fork",  # paraphrase_fork
        "sglang.lang.interpreter.ProgramState.text",
    ),
    "in-process engine": (
        "sglang.srt.entrypoints.engine.Engine._ensure_event_loop",
        "sglang.srt.entrypoints.engine.Engine.async_generate",
        "sglang.srt.entrypoints.engine.kill_process_tree",
        # creates the tasks that shutdown cancels (tokenizer_manager.asyncio_tasks, event_loop)
        "sglang.srt.managers.tokenizer_manager.TokenizerManager.auto_create_handle_loop",
    ),
}


class SeamMissing(SystemExit):
    """SGLang lacks names rksc-sgl needs (a SystemExit: SGLang's loaders catch Exception only)."""


def resolve(path: str) -> Any:
    """The object at dotted ``path``: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)  # AttributeError: the name is gone
        return obj
    raise ImportError(f"no module in {path!r}")


def missing(seams: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """Per mechanism, the paths that do not resolve (empty when all do)."""
    out: dict[str, list[str]] = {}
    for mechanism, paths in seams.items():
        for path in paths:
            try:
                resolve(path)
            except (ImportError, AttributeError):
                out.setdefault(mechanism, []).append(path)
    return out


def check(seams: Mapping[str, Iterable[str]]) -> None:
    """Raise ``SeamMissing`` naming every path of ``seams`` that does not resolve."""
    gone = missing(seams)
    if gone:
        from importlib.metadata import version

        lines = [f"  {mechanism}: {', '.join(paths)}" for mechanism, paths in gone.items()]
        raise SeamMissing(
            f"rksc-sgl needs sglang==0.5.23; the installed sglang {version('sglang')} lacks:\n" + "\n".join(lines)
        )
