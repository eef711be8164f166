"""The scheduler's idle heap trim (``radix_ext.cpu.heap_trim``): when it trims, what it reports, and
the glibc behaviour it exists for."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from radix_ext.cpu import heap_trim
from radix_ext.cpu.heap_trim import BUSY_FACTOR, HeapTrimmer


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
    assert t.maybe_trim(busy=False)
    assert not t.maybe_trim(busy=False)  # the interval counts from the last trim
    clock.now = 60.0
    assert t.maybe_trim(busy=False)
    assert calls == [30.0, 60.0]
    assert t.state() == {"interval_s": 30.0, "enabled": True, "trims": 2, "released_mb": 80.0, "longest_ms": 0.0}


def test_unbroken_load_trims_every_busy_factor_intervals():
    t, clock, calls = trimmer()
    clock.now = 30.0 * BUSY_FACTOR - 1
    assert not t.maybe_trim(busy=True)
    clock.now = 30.0 * BUSY_FACTOR
    assert t.maybe_trim(busy=True)
    assert len(calls) == 1


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
rng, keep = random.Random(0), []
base = heap_trim.resident_anonymous_bytes()
for _ in range(400):
    rows = rng.randint(1, 256)
    activations = torch.ones(rows, 3072), torch.ones(rows, 576)  # a step's, freed at its end
    keep.append(torch.ones(rows))  # something small that lives on, allocated between them
    del activations
grown = heap_trim.resident_anonymous_bytes() - base
heap_trim.glibc_trim()()
print(json.dumps([grown, heap_trim.resident_anonymous_bytes() - base]))
"""


def test_glibc_keeps_freed_activations_resident_until_trimmed():
    """What the trim is for: steps of varying rows, with something small that lives on allocated
    between them, leave freed heap pages resident; ``malloc_trim(0)`` gives them back. Fails if
    the C library stops behaving so (then the trim may be dropped) or has no ``malloc_trim``. In
    a fresh interpreter: the heap's state depends on what ran before. Up to three interpreters: the
    first of a series on this machine has been seen to leave only 4 MiB resident (its later ones
    about 23 MiB), so one such run is not the C library changing."""
    assert heap_trim.glibc_trim() is not None
    runs = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", FRAGMENT], capture_output=True, text=True, timeout=120, check=True)
        grown, left = json.loads(out.stdout.strip().splitlines()[-1])
        runs.append(grown >> 20)
        if grown > 8 << 20:
            break
    assert grown > 8 << 20, f"freed activations left only {runs} MiB resident in three interpreters"
    assert left < grown / 2, f"malloc_trim released {(grown - left) >> 20} of {grown >> 20} MiB"
