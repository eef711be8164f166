"""Shared fixtures: one real SGLang engine (and one real HTTP server) per test session.

Both run the real default model (SmolLM2-135M-Instruct, float32, CPU). They are started lazily, on
first use, so ``pytest -m "not integration"`` starts nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time

import pytest
import requests

# Small pool: the integration tests need little KV, and a small pool keeps start-up and RAM low.
TEST_POOL_TOKENS = 16384


@pytest.fixture(scope="session")
def engine_backend():
    """An ``EngineBackend`` over a stock-configured in-process engine (radix cache on, LRU)."""
    from rksc_sgl.engine import launch_engine
    from rksc_sgl.frontend import EngineBackend

    backend = EngineBackend(launch_engine(max_total_tokens=TEST_POOL_TOKENS, log_level="error"))
    yield backend
    backend.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode} before becoming healthy")
        try:
            if requests.get(f"{url}/health_generate", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise TimeoutError(f"server at {url} not healthy after {timeout_s} s")


@contextlib.contextmanager
def http_server(module: str, args: list[str], log_dir, env: dict[str, str] | None = None, timeout_s: float = 240):
    """``python -m module args`` on a free loopback port: its base URL once it serves a
    generation; stopped on exit. ``log_dir`` keeps its output (shown if start-up fails)."""
    port = free_port()
    log = log_dir / "server.log"
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args, "--host", "127.0.0.1", "--port", str(port)],
            stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout_s)
    except Exception:
        proc.kill()
        raise RuntimeError(f"python -m {module} failed to start; log:\n{log.read_text()[-4000:]}")
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def server_url(tmp_path_factory):
    """Base URL of ``python -m rksc_sgl.launch_server`` running on a free loopback port."""
    args = ["--max-total-tokens", str(TEST_POOL_TOKENS), "--log-level", "warning"]
    with http_server("rksc_sgl.launch_server", args, tmp_path_factory.mktemp("server")) as url:
        yield url
