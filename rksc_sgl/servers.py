"""HTTP servers as child processes: a free port, a wait for readiness, a stop that always happens.

Used by ``rksc_sgl.launch_router`` (its workers), ``benchmarks.load`` and the integration tests.
Readiness is ``/health_generate`` answering 200: SGLang's ``/health`` answers before the scheduler
can serve, ``/health_generate`` runs one generation through it.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import requests

from rksc_sgl.protocol import KV_POOL_KEY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# uvicorn's bind error (SGLang's server then keeps running without HTTP), a line of its own; the
# words alone could be in a logged prompt or error.
PORT_TAKEN = re.compile(r"^.*ERROR:\s+\[Errno \d+\] error while attempting to bind on address .*: "
                        r"address already in use$", re.MULTILINE)
START_ATTEMPTS = 3  # settle: fresh ports tried when another process took the chosen one first


class PortTaken(RuntimeError):
    """The server could not bind its port: another process took it between ``free_port`` and the bind."""


def port_taken(log: Path | None) -> bool:
    try:
        return log is not None and PORT_TAKEN.search(Path(log).read_text(errors="replace")) is not None
    except FileNotFoundError:
        return False


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout_s: float = 240,
                 route: str = "/health_generate", log: Path | None = None) -> None:
    """Until ``url + route`` answers 200; RuntimeError if ``proc`` exits first, PortTaken as soon
    as ``log`` shows the server could not bind its port, TimeoutError at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode} before becoming healthy")
        if port_taken(log):
            raise PortTaken(f"server at {url} could not bind its port")
        try:
            if requests.get(url + route, timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise TimeoutError(f"server at {url} not healthy after {timeout_s} s")


def stop(proc: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM, then SIGKILL if it has not exited after ``timeout_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def spawn(module: str, args: list[str], log: Path, env: dict[str, str] | None = None,
          python: str = sys.executable, port: int | None = None,
          host: str = "127.0.0.1") -> tuple[subprocess.Popen, str]:
    """``python -m module args --host HOST --port PORT`` with output to ``log``; (process, base URL)."""
    port = port or free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as log_file:
        proc = subprocess.Popen(
            [python, "-m", module, *args, "--host", host, "--port", str(port)],
            stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )
    local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return proc, f"http://{local}:{port}"


def settle(spawned: tuple[subprocess.Popen, str], module: str, args: list[str], log: Path,
           env: dict[str, str] | None = None, timeout_s: float = 240,
           python: str = sys.executable) -> tuple[subprocess.Popen, str]:
    """A ``spawn``ed server once it serves a generation: started again on a fresh port when its log
    shows another process took its port first (``START_ATTEMPTS`` in all); stopped, and
    RuntimeError with the log's tail, if it cannot start."""
    proc, url = spawned
    for attempt in range(1, START_ATTEMPTS + 1):
        if attempt > 1:
            proc, url = spawn(module, args, log, env, python=python)
        try:
            wait_healthy(url, proc, timeout_s, log=log)
            return proc, url
        except PortTaken:
            stop(proc, timeout_s=5)
        except Exception as e:
            stop(proc, timeout_s=5)
            raise RuntimeError(f"python -m {module} failed to start ({e}); log:\n{log.read_text()[-4000:]}") from None
    raise RuntimeError(f"python -m {module}: {START_ATTEMPTS} ports taken before it could bind; "
                       f"log:\n{log.read_text()[-4000:]}")


@contextlib.contextmanager
def http_server(module: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None,
                timeout_s: float = 240) -> Iterator[str]:
    """``python -m module args`` on a free loopback port: its base URL once it serves a
    generation; stopped on exit. ``log_dir/server.log`` keeps its output (shown if start-up fails)."""
    log = Path(log_dir) / "server.log"
    proc, url = settle(spawn(module, args, log, env), module, args, log, env, timeout_s)
    try:
        yield url
    finally:
        stop(proc)


def settled_pool(read_pool, timeout_s: float = 60.0) -> dict[str, int]:
    """``read_pool()`` (a KV pool readback, ``radix_ext.ops.introspection``) once every slot is free or
    evictable, i.e. no request holds KV and none leaked; or as it reads at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        pool = read_pool()
        if is_settled(pool) or time.monotonic() > deadline:
            return pool
        time.sleep(0.05)


def is_settled(pool: dict[str, int]) -> bool:
    return pool["protected"] == 0 and pool["available"] + pool["evictable"] == pool["total"]


def kv_pool(url: str, timeout_s: float = 30) -> dict[str, int]:
    """The first scheduler's KV pool readback (``radix_ext.ops.introspection``) over HTTP."""
    return requests.get(f"{url}/server_info", timeout=timeout_s).json()["internal_states"][0][KV_POOL_KEY]
