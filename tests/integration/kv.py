"""KV pool checks shared by the integration tests, synchronised on the scheduler's state.

A response can reach the client a moment before the scheduler has retired its request (released
its lock on the tree), so a leak check polls the pool until it settles, within a deadline
(``rksc_sgl.servers.settled_pool``), instead of reading it once or sleeping a guessed time.
"""

from __future__ import annotations

from rksc_sgl import servers


def wait_until_idle(backend, timeout_s: float = 30.0) -> dict:
    """The KV pool once no request holds KV and every slot is free or evictable (or at the deadline)."""
    return servers.settled_pool(backend.kv_pool, timeout_s)


def assert_no_kv_leak(backend) -> None:
    """free + evictable + protected == total, and nothing protected once idle."""
    pool = wait_until_idle(backend)
    assert pool["available"] + pool["evictable"] + pool["protected"] == pool["total"], pool
    assert pool["protected"] == 0, pool  # nothing runs, so nothing may stay locked
