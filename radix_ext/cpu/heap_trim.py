"""The scheduler gives its freed heap back to the OS (glibc's ``malloc_trim``) when it is idle.

**Why.** A CPU forward allocates its activations on the host heap, with sizes that change every
step (the batch's rows). glibc serves allocations above its mmap threshold with ``mmap`` and
returns them at ``free``, but it raises that threshold (up to 32 MiB) each time such a chunk is
freed, so soon every activation comes from the heap; the heap fragments, and freed chunks in its
middle keep their pages resident. The process's resident memory then climbs along a decelerating
curve, with no object leaking: in a loop of oneDNN linears of SmolLM2-135M's shapes, rows 1..256
in random order, resident memory after five passes grew 638, 777, 855, 890 and 902 MB; with
``malloc_trim(0)`` after each pass it stayed at 458-468 MB, each call taking 16-100 ms. In the
server (``benchmarks.soak`` at b41f8e0, 30 minutes of unbroken load) each of its 6 trims released
23-31 MB; the scheduler's steady growth beside them was oneDNN's primitive caches, now capped
(``radix_ext/cpu/speed.py``).

**What.** An AFTER hook on ``Scheduler.on_idle`` calls ``malloc_trim(0)`` once the scheduler is
fully idle and ``interval_s`` passed since the last trim; an AFTER hook on
``Scheduler.process_batch_result`` does the same under unbroken load every ``busy_factor *
interval_s``. The allocation policy itself (glibc's dynamic threshold, which keeps a decode
step's allocations off ``mmap``) is untouched, so a step costs what it did. Off with
``RKSC_HEAP_TRIM_S=0``; on other C libraries than glibc it does nothing. The internal-state
readback (``/server_info``) gains ``rksc_heap_trim``: trims, resident memory they released, and
the longest one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from typing import Any, Callable

logger = logging.getLogger(__name__)

ON_IDLE = "sglang.srt.managers.scheduler.Scheduler.on_idle"
PROCESS_BATCH_RESULT = "sglang.srt.managers.scheduler.Scheduler.process_batch_result"
INTERVAL_ENV = "RKSC_HEAP_TRIM_S"
DEFAULT_INTERVAL_S = 30.0
BUSY_FACTOR = 10  # under unbroken load, trim every BUSY_FACTOR * interval_s
STATE_KEY = "rksc_heap_trim"


def resident_anonymous_bytes() -> int | None:
    """This process's ``RssAnon`` (bytes), or None where ``/proc`` has none."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def glibc_trim() -> Callable[[], Any] | None:
    """``malloc_trim(0)`` of the C library, or None when it has none (not glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class HeapTrimmer:
    """When to trim, and what trimming released."""

    def __init__(self, interval_s: float, trim: Callable[[], Any] | None,
                 clock: Callable[[], float] = time.monotonic,
                 resident: Callable[[], int | None] = resident_anonymous_bytes) -> None:
        if interval_s < 0:
            raise ValueError(f"{INTERVAL_ENV} must be a number of seconds >= 0 (0: off), got {interval_s!r}")
        self.interval_s, self.trim, self.clock, self.resident = interval_s, trim, clock, resident
        self.last = clock()
        self.trims = 0
        self.released_bytes = 0
        self.longest_s = 0.0

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0 and self.trim is not None

    def maybe_trim(self, busy: bool) -> bool:
        """Trim if the interval for this state (idle, or ``busy``) has passed; True if it did."""
        if not self.enabled:
            return False
        now = self.clock()
        if now - self.last < self.interval_s * (BUSY_FACTOR if busy else 1):
            return False
        before = self.resident()
        self.trim()
        after = self.resident()
        self.last = end = self.clock()
        self.trims += 1
        self.longest_s = max(self.longest_s, end - now)
        if before is not None and after is not None:
            self.released_bytes += max(0, before - after)
        return True

    def state(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "enabled": self.enabled, "trims": self.trims,
                "released_mb": round(self.released_bytes / 2**20, 1), "longest_ms": round(self.longest_s * 1e3, 1)}


def interval_from_env() -> float:
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    try:
        return float(raw) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV} must be a number of seconds >= 0 (0: off), got {raw!r}") from None


trimmer: HeapTrimmer | None = None  # this scheduler's, built at install


def _after_idle(result, scheduler, *args, **kwargs):
    if trimmer is not None and scheduler.is_fully_idle():
        trimmer.maybe_trim(busy=False)
    return result


def _after_batch(result, scheduler, *args, **kwargs):
    if trimmer is not None:
        trimmer.maybe_trim(busy=True)
    return result


def _add_state(result, controller, *args, **kwargs):
    if trimmer is not None:
        result.internal_state[STATE_KEY] = trimmer.state()
    return result


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from radix_ext.ops import introspection

    global trimmer
    try:
        trimmer = HeapTrimmer(interval_from_env(), glibc_trim())
    except ValueError as e:  # SGLang only logs a plugin's exceptions: stop start-up instead
        raise SystemExit(f"rksc-sgl: {e}") from None
    if not trimmer.enabled:
        logger.info("heap trim off (%s=%s, malloc_trim %s)", INTERVAL_ENV, trimmer.interval_s,
                    "found" if trimmer.trim else "not found: not glibc")
        return
    HookRegistry.register(ON_IDLE, _after_idle, HookType.AFTER)
    HookRegistry.register(PROCESS_BATCH_RESULT, _after_batch, HookType.AFTER)
    HookRegistry.register(introspection.TARGET, _add_state, HookType.AFTER)
