"""Adds the KV pool's accounting to SGLang's internal-state readback (``/get_server_info``).

SGLang checks ``available + evictable + protected == total`` only inside the scheduler, when it is
idle, and raises there. Tests and the benchmark want the same numbers from outside, so an AFTER
hook on ``SchedulerInternalStateController.get_internal_state`` adds ``rksc_kv_pool``:
``{"total", "available", "evictable", "protected", "evicted_tokens", "cache_class"}`` in
tokens, the scheduler's ``queued_requests`` and ``running_requests``, and whether it runs
SGLang's overlap schedule (``overlap_schedule``). ``evicted_tokens`` totals ``EvictResult.num_tokens_evicted`` since start-up, counted by
AFTER hooks on the two eviction entry points that free KV: ``RadixCache.evict`` (Python tree, our
backend's parent) and ``UnifiedRadixCache._evict`` (SGLang's default, Rust tree core). Reading it
is only meaningful while no request runs. It also adds ``rksc_decode``: how many decode steps
took the one-call layers of ``radix_ext.cpu.decode_stack``, the lean loop of ``radix_ext.cpu.decode``
and SGLang's forward (``radix_ext.cpu.decode.stats``).
"""

from __future__ import annotations

from typing import Any

from rksc_sgl.protocol import DECODE_KEY, KV_POOL_KEY as KEY

TARGET = (
    "sglang.srt.managers.scheduler_components.internal_state."
    "SchedulerInternalStateController.get_internal_state"
)
EVICTION_TARGETS = (
    "sglang.srt.mem_cache.radix_cache.RadixCache.evict",
    "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache._evict",
)
_EVICTED_ATTR = "_rksc_evicted_tokens"


def kv_pool_stats(scheduler) -> dict[str, Any]:
    cache = scheduler.tree_cache
    return {
        "total": int(scheduler.max_total_num_tokens),
        "available": int(scheduler.token_to_kv_pool_allocator.available_size()),
        "evictable": int(cache.evictable_size()),
        "protected": int(cache.protected_size()),
        "evicted_tokens": int(getattr(cache, _EVICTED_ATTR, 0)),
        "cache_class": f"{type(cache).__module__}.{type(cache).__qualname__}",
        "queued_requests": len(scheduler.waiting_queue),
        "running_requests": len(scheduler.running_batch.reqs),
        "overlap_schedule": bool(scheduler.enable_overlap),  # the CPU default turns it off (rksc_sgl.engine)
    }


def _add_kv_pool_stats(result, controller, *args, **kwargs):
    from radix_ext.cpu import decode

    result.internal_state[KEY] = kv_pool_stats(controller.scheduler)
    result.internal_state[DECODE_KEY] = decode.stats()
    return result


def _count_evicted(result, cache, *args, **kwargs):
    setattr(cache, _EVICTED_ATTR, getattr(cache, _EVICTED_ATTR, 0) + result.num_tokens_evicted)
    return result


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, _add_kv_pool_stats, HookType.AFTER)
    for target in EVICTION_TARGETS:
        HookRegistry.register(target, _count_evicted, HookType.AFTER)
