"""Adds the KV pool's accounting to SGLang's internal-state readback (``/get_server_info``).

SGLang checks ``available + evictable + protected == total`` only inside the scheduler, when it is
idle, and raises there. Tests and the benchmark want the same numbers from outside, so an AFTER
hook on ``SchedulerInternalStateController.get_internal_state`` adds ``rksc_kv_pool``:
``{"total", "available", "evictable", "protected", "cache_class"}`` in tokens. Reading it is
only meaningful while no request runs.
"""

from __future__ import annotations

from typing import Any

TARGET = (
    "sglang.srt.managers.scheduler_components.internal_state."
    "SchedulerInternalStateController.get_internal_state"
)
KEY = "rksc_kv_pool"


def kv_pool_stats(scheduler) -> dict[str, Any]:
    cache = scheduler.tree_cache
    return {
        "total": int(scheduler.max_total_num_tokens),
        "available": int(scheduler.token_to_kv_pool_allocator.available_size()),
        "evictable": int(cache.evictable_size()),
        "protected": int(cache.protected_size()),
        "cache_class": f"{type(cache).__module__}.{type(cache).__qualname__}",
    }


def _add_kv_pool_stats(result, controller, *args, **kwargs):
    result.internal_state[KEY] = kv_pool_stats(controller.scheduler)
    return result


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, _add_kv_pool_stats, HookType.AFTER)
