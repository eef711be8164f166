"""The scheduler's idle heap trim (``radix_ext.cpu.heap_trim``): when it trims, that the scheduler's
loop only hands the trim to its own thread and never waits for it, what it reports, and the glibc
behaviour it exists for. No wall-clock bound: what the loop is spared is shown by a trim that cannot
finish until the test lets it (the waits' timeouts only stop a broken test from hanging)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from radix_ext.cpu import heap_trim
from radix_ext.cpu.heap_trim import BUSY_FACTOR, TRIM_THREAD, HeapTrimmer

GUARD_S = 60  # only against a hang


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def trimmer(interval_s=30.0, resident=(100 << 20, 60 << 20)):
    clock, calls = FakeClock(), []
    readings = iter(resident * 100)
    t = HeapTrimmer(interval_s, lambda: calls.append(clock.now), clock=clock, resident=lambda: next(readings))
    return t, clock, calls


def test_idle_trims_once_per_interval():
    t, clock, calls = trimmer()
    clock.now = 29.0
    assert not t.maybe_trim(busy=False)
    clock.now = 30.0
    assert t.maybe_trim(busy=False) and t.wait(GUARD_S)
    assert not t.maybe_trim(busy=False)  # the interval counts from the last trim
    clock.now = 60.0
    assert t.maybe_trim(busy=False) and t.wait(GUARD_S)
    assert calls == [30.0, 60.0]
    assert t.state() == {"interval_s": 30.0, "enabled": True, "trims": 2, "released_mb": 80.0, "longest_ms": 0.0,
                         "running": False, "thread": TRIM_THREAD}


def test_unbroken_load_trims_every_busy_factor_intervals():
    t, clock, calls = trimmer()
    clock.now = 30.0 * BUSY_FACTOR - 1
    assert not t.maybe_trim(busy=True)
    clock.now = 30.0 * BUSY_FACTOR
    assert t.maybe_trim(busy=True) and t.wait(GUARD_S)
    assert len(calls) == 1


class IdleScheduler:
    def is_fully_idle(self) -> bool:
        return True


@pytest.mark.parametrize("hook", [heap_trim._after_idle, heap_trim._after_batch])
def test_the_loop_hands_the_trim_to_its_thread_and_never_waits_for_it(monkeypatch, hook):
    """The scheduler's hook returns while the trim it started is still held, the trim runs on the
    trim thread (not the caller's), and no second trim starts while it runs, however long."""
    entered, release, ran_on = threading.Event(), threading.Event(), []

    def held_trim():
        ran_on.append(threading.current_thread())
        entered.set()
        release.wait(GUARD_S)

    clock = FakeClock()
    t = HeapTrimmer(30.0, held_trim, clock=clock, resident=lambda: None)
    monkeypatch.setattr(heap_trim, "trimmer", t)
    clock.now = 1e6
    try:
        assert hook("result", IdleScheduler()) == "result"  # returned: the trim cannot have finished
        assert entered.wait(GUARD_S) and not release.is_set()
        assert len(ran_on) == 1 and ran_on[0] is not threading.current_thread()
        assert ran_on[0].name == TRIM_THREAD and ran_on[0].daemon
        clock.now = 2e6
        assert t.running and not t.maybe_trim(busy=False) and not t.maybe_trim(busy=True)  # one at a time
        assert t.state()["running"] and t.state()["trims"] == 0
    finally:
        release.set()
    assert t.wait(GUARD_S)
    assert len(ran_on) == 1 and t.state()["trims"] == 1 and t.state()["thread"] == TRIM_THREAD


def test_a_failed_trim_leaves_the_thread_serving():
    clock, outcomes = FakeClock(), [RuntimeError("no"), None]

    def trim():
        outcome = outcomes.pop(0)
        if outcome:
            raise outcome

    t = HeapTrimmer(30.0, trim, clock=clock, resident=lambda: None)
    clock.now = 30.0
    assert t.maybe_trim(busy=False) and t.wait(GUARD_S) and t.trims == 0
    clock.now = 60.0  # the failed trim left `last` at its start
    assert t.maybe_trim(busy=False) and t.wait(GUARD_S) and t.trims == 1 and not outcomes


def test_a_forked_child_starts_its_own_trim_thread():
    t, clock, calls = trimmer()
    clock.now = 30.0
    assert t.maybe_trim(busy=False) and t.wait(GUARD_S)
    t.forget_thread()  # what the child runs after fork: the parent's thread is not there
    clock.now = 60.0
    assert t.maybe_trim(busy=False) and t.wait(GUARD_S)
    assert calls == [30.0, 60.0]


@pytest.mark.parametrize("interval_s, trim", [(0.0, lambda: None), (30.0, None)])
def test_off_when_the_interval_is_zero_or_there_is_no_malloc_trim(interval_s, trim):
    clock = FakeClock()
    t = HeapTrimmer(interval_s, trim, clock=clock)
    clock.now = 1e6
    assert not t.enabled and not t.maybe_trim(busy=False) and t.trims == 0


def test_a_bad_interval_names_the_variable(monkeypatch):
    monkeypatch.setenv(heap_trim.INTERVAL_ENV, "soon")
    with pytest.raises(ValueError, match="RKSC_HEAP_TRIM_S must be a number of seconds >= 0"):
        heap_trim.interval_from_env()
    with pytest.raises(ValueError, match="RKSC_HEAP_TRIM_S"):
        HeapTrimmer(-1, None)


FRAGMENT = """
import json, random, torch
from radix_ext.cpu import heap_trim
trimmer = heap_trim.HeapTrimmer(1e-9, heap_trim.glibc_trim())
rng, keep = random.Random(0), []
base = heap_trim.resident_anonymous_bytes()
for _ in range(400):
    rows = rng.randint(1, 256)
    activations = torch.ones(rows, 3072), torch.ones(rows, 576)  # a step's, freed at its end
    keep.append(torch.ones(rows))  # something small that lives on, allocated between them
    del activations
grown = heap_trim.resident_anonymous_bytes() - base
assert trimmer.maybe_trim(busy=False) and trimmer.wait(60)  # on the trim thread, as in the scheduler
print(json.dumps([grown, heap_trim.resident_anonymous_bytes() - base, trimmer.state()["thread"]]))
"""


def test_glibc_keeps_freed_activations_resident_until_trimmed():
    """What the trim is for: steps of varying rows, with something small that lives on allocated
    between them, leave freed heap pages resident; ``malloc_trim(0)``, run on the trim thread as in
    the scheduler, gives the main thread's back. Fails if the C library stops behaving so (then the
    trim may be dropped) or has no ``malloc_trim``. In a fresh interpreter: the heap's state depends
    on what ran before. Up to three interpreters: the first of a series on this machine has been
    seen to leave only 4 MiB resident (its later ones about 23 MiB), so one such run is not the C
    library changing."""
    assert heap_trim.glibc_trim() is not None
    runs = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", FRAGMENT], capture_output=True, text=True, timeout=120, check=True)
        grown, left, thread = json.loads(out.stdout.strip().splitlines()[-1])
        assert thread == TRIM_THREAD
        runs.append(grown >> 20)
        if grown > 8 << 20:
            break
    assert grown > 8 << 20, f"freed activations left only {runs} MiB resident in three interpreters"
    assert left < grown / 2, f"malloc_trim released {(grown - left) >> 20} of {grown >> 20} MiB"
