"""The scheduler gives its freed heap back to the OS (glibc's ``malloc_trim``) when it is idle, on a
thread of its own.

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

**What.** An AFTER hook on ``Scheduler.on_idle`` starts a trim once the scheduler is fully idle
and ``interval_s`` passed since the last trim ended; an AFTER hook on
``Scheduler.process_batch_result`` does the same under unbroken load every ``busy_factor *
interval_s``. The hook only hands the trim to the ``rksc-heap-trim`` daemon thread (which the
first trim starts, waiting only for it to start) and returns: the scheduler's loop never calls
``malloc_trim``, never waits for one to return, and starts none while one runs. The allocation
policy itself (glibc's dynamic threshold, which keeps a decode step's allocations off ``mmap``) is
untouched, so a step costs what it did. Off with
``RKSC_HEAP_TRIM_S=0``; on other C libraries than glibc it does nothing. The internal-state
readback (``/server_info``) gains ``rksc_heap_trim``: trims, resident memory they released (read
around the call, so the loop's own allocations meanwhile blur it), the longest one (its time on
the trim thread), whether one is running and the thread the last one ran on.

**What still holds the loop.** ctypes releases the GIL for the call, so the loop's Python runs on,
but glibc's ``malloc_trim`` takes each arena's mutex in turn and, under it, consolidates the
arena, walks its free chunks and ``madvise(MADV_DONTNEED)``s their whole pages. ``malloc_trim(pad)``
bounds none of that (``pad`` is only what stays at the top of the main heap), and glibc has no
partial trim. A ``malloc`` of the loop's thread (glibc's main arena, where its forwards' freed
activations lie) waits while that arena is trimmed, not while the others are; so a request that
arrives during a trim can still wait for the main arena's part of it, where it waited for the
whole trim before. Seen on a 2-core machine shared with other work (load average 3-7), heaps
fragmented by 1,200-1,500 steps of 1..256 rows, the trim on a daemon thread and the main thread
allocating a step's activation in a loop (``malloc_trim(0)`` on the main thread itself took
7.5-49.7 ms and released 93-153 MiB): with the fragments in the main arena, the loop's longest gap
was 6.8-42.9 ms within trims of 12.0-42.8 ms (67-158 MiB), half the trim to all of it (in 3 of 9
it made no allocation until the trim ended); with them in another thread's arena, 4.1-11.5 ms
within trims of 15.8-33.9 ms (521-806 allocations inside them), and once a 459 ms gap around a
449 ms trim; alone, the loop's longest gaps were 12-132 ms. A fixed mmap threshold
(``mallopt(M_MMAP_THRESHOLD, 128 KiB)``), which keeps activations off the heap and leaves little
to trim, made a pass of float32 linears of SmolLM2-135M's shapes slower there (8 layers, runs
interleaved: 8.6 and 12.6 s against 6.8 and 6.9 s), so glibc's dynamic threshold stays.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import queue
import threading
import time
from typing import Any, Callable

logger = logging.getLogger(__name__)

ON_IDLE = "sglang.srt.managers.scheduler.Scheduler.on_idle"
PROCESS_BATCH_RESULT = "sglang.srt.managers.scheduler.Scheduler.process_batch_result"
INTERVAL_ENV = "RKSC_HEAP_TRIM_S"
DEFAULT_INTERVAL_S = 30.0
BUSY_FACTOR = 10  # under unbroken load, trim every BUSY_FACTOR * interval_s
STATE_KEY = "rksc_heap_trim"
TRIM_THREAD = "rksc-heap-trim"  # the daemon thread every trim runs on


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
    """When to trim (decided on the scheduler's loop), the trim itself (on its own thread), and
    what trimming released."""

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
        self.thread_name: str | None = None  # the thread the last trim ran on
        self._inbox: queue.SimpleQueue | None = None  # the trim thread's, made at the first trim
        self._idle = threading.Event()  # set while no trim is running
        self._idle.set()

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0 and self.trim is not None

    @property
    def running(self) -> bool:
        return not self._idle.is_set()

    def maybe_trim(self, busy: bool) -> bool:
        """Start a trim on the trim thread if the interval for this state (idle, or ``busy``) has
        passed since the last one ended and none is running; True if it started one. Returns
        without waiting for it."""
        if not self.enabled or self.running:
            return False
        now = self.clock()
        if now - self.last < self.interval_s * (BUSY_FACTOR if busy else 1):
            return False
        self.last = now
        self._idle.clear()
        if self._inbox is None:
            self._inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(self._inbox,), name=TRIM_THREAD, daemon=True).start()
        self._inbox.put(now)
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no trim is running; False if ``timeout`` passed first (for tests and tools)."""
        return self._idle.wait(timeout)

    def forget_thread(self) -> None:
        """In a forked child, which has no trim thread: the next trim starts a new one."""
        self._inbox = None
        self._idle.set()

    def _serve(self, inbox: queue.SimpleQueue) -> None:
        while True:
            inbox.get()
            try:
                self._trim_once()
            except Exception:  # a failed trim must not end the thread, nor leave `running` set
                logger.exception("heap trim failed")
            finally:
                self._idle.set()

    def _trim_once(self) -> None:
        start, before = self.clock(), self.resident()
        self.trim()
        after, end = self.resident(), self.clock()
        self.last = end  # the interval counts from the end of the trim
        self.trims += 1
        self.longest_s = max(self.longest_s, end - start)
        self.thread_name = threading.current_thread().name
        if before is not None and after is not None:
            self.released_bytes += max(0, before - after)

    def state(self) -> dict[str, Any]:
        return {"interval_s": self.interval_s, "enabled": self.enabled, "trims": self.trims,
                "released_mb": round(self.released_bytes / 2**20, 1), "longest_ms": round(self.longest_s * 1e3, 1),
                "running": self.running, "thread": self.thread_name}


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
    os.register_at_fork(after_in_child=trimmer.forget_thread)
    HookRegistry.register(ON_IDLE, _after_idle, HookType.AFTER)
    HookRegistry.register(PROCESS_BATCH_RESULT, _after_batch, HookType.AFTER)
    HookRegistry.register(introspection.TARGET, _add_state, HookType.AFTER)
