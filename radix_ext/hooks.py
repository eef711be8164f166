"""One AROUND hook per SGLang target for the whole plugin.

Two of our mechanisms wrap the same SGLang functions (the model's forward: CGEE's early exit and
ASKS blend; ``PrefillAdder.add_one_req``: CGEE's batch classes and blend's whole-prefill hold).
Registered one by one, SGLang chains them and warns at every start-up that an AROUND hook which
skips the original bypasses the others. ``around`` registers a single dispatcher per target and
runs our hooks through it in registration order, the first registered innermost (as SGLang's own
chaining would): each hook gets the next inner one as its ``original``, so a hook that handles a
call itself skips only the hooks inside it, by design. Registering a hook twice is a no-op.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

# target -> our AROUND hooks on it, innermost first (read at every call)
_chains: dict[str, list[Callable[..., Any]]] = {}


def around(target: str, hook: Callable[..., Any]) -> None:
    """Wrap ``target`` with ``hook(original, *args, **kwargs)``, outside the hooks registered before."""
    chain = _chains.get(target)
    if chain is None:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        chain = _chains[target] = []
        HookRegistry.register(target, _dispatcher(chain), HookType.AROUND)
    if hook not in chain:
        chain.append(hook)


def _dispatcher(chain: list[Callable[..., Any]]) -> Callable[..., Any]:
    # SGLang passes the target's plain function as ``original`` (``self`` comes in ``args``), the
    # same object at every call: the chain is composed once, again only if a hook was added since.
    composed: list[Any] = [None, -1, None]  # original, len(chain), composed call

    def dispatch(original, *args, **kwargs):
        if composed[0] is not original or composed[1] != len(chain):
            call = original
            for hook in chain:
                call = functools.partial(hook, call)
            composed[:] = [original, len(chain), call]
        return composed[2](*args, **kwargs)

    return dispatch
