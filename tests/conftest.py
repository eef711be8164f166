"""Shared fixtures: one real SGLang engine (and one real HTTP server) per test session.

Both run the real default model (SmolLM2-135M-Instruct, float32, CPU). They are started lazily, on
first use, so ``pytest -m "not integration"`` starts nothing.
"""

from __future__ import annotations

import pytest

from rksc_sgl.servers import http_server

# Small pool: the integration tests need little KV, and a small pool keeps start-up and RAM low.
TEST_POOL_TOKENS = 16384
HEAP_TRIM_ENV, TEST_HEAP_TRIM_S = "RKSC_HEAP_TRIM_S", 2  # radix_ext.cpu.heap_trim


@pytest.fixture(scope="session")
def engine_backend():
    """An ``RkscEngineEndpoint`` over a stock-configured in-process engine (radix cache on, LRU)."""
    from rksc_sgl.engine import launch_engine
    from rksc_sgl.engine_endpoint import RkscEngineEndpoint

    backend = RkscEngineEndpoint(launch_engine(max_total_tokens=TEST_POOL_TOKENS, log_level="error"))
    yield backend
    backend.shutdown()


@pytest.fixture(scope="session")
def server_url(tmp_path_factory):
    """Base URL of ``python -m rksc_sgl.launch_server`` running on a free loopback port."""
    args = ["--max-total-tokens", str(TEST_POOL_TOKENS), "--log-level", "warning"]
    env = {HEAP_TRIM_ENV: str(TEST_HEAP_TRIM_S)}  # short, so tests see the idle trim happen
    with http_server("rksc_sgl.launch_server", args, tmp_path_factory.mktemp("server"), env=env) as url:
        yield url
