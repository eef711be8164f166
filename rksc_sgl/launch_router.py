"""``python -m rksc_sgl.launch_router``: N rksc-sgl workers behind sglang-router, in one command.

    python -m rksc_sgl.launch_router --workers 2 --port 30000 --rsbcm

Starts ``--workers`` ``python -m rksc_sgl.launch_server`` processes on free loopback ports (every
flag this command does not know goes to each worker: ours such as ``--rsbcm``, and SGLang's), waits
until each serves a generation, then starts sglang-router in front of them on ``--host:--port`` and
waits until it lists every worker healthy and routes one. It runs until interrupted, then stops
the router and the workers.

Routing (``--policy``):

* ``pinned`` (default): the router's ``manual`` policy with ``--assignment-mode min_group``. Every
  request of a program carries the program's key in ``X-SMG-Routing-Key`` (``RkscEndpoint`` sends
  it), the router pins each new key to the worker with the fewest keys in flight (ties at random)
  and keeps it there, so a program's forks meet their shared prefix in that worker's radix tree.
  Agents of an ASKS group on the OpenAI routes send the key ``rksc-asks:<group>``
  (``protocol.asks_routing_key``), which keeps the group on one worker and names the group there.
  Requests without a key are spread at random.
* ``cache_aware``: the router's prefix-match approximation (``--cache-threshold``, load balance):
  forks usually, not always, land with their prefix.
* any other sglang-router policy (``round_robin``, ``random``, ``power_of_two``).

sglang-router is a separate program with its own dependencies: it runs from ``--router-python``
(default ``$RKSC_ROUTER_PYTHON``, else ``.venv-front/bin/python`` of this checkout, made by ``make
front``, else this interpreter if it can import ``sglang_router``). On the CPU each worker gets
``RKSC_CPU_THREADS`` = cores / workers unless that is set. On GPUs: one worker per GPU (or per
tensor-parallel group, ``--tp-size``), each its own ``launch_server``; see ``docs/router.md``.

Keys (``ClusterKeys``): SGLang's ``--api-key`` and ``--admin-api-key`` go to every worker; the router
gets the user key as its ``--api-key`` (it then asks clients for it and uses it with the workers)
and the admin key as its control-plane admin key (``/workers``, ``/flush_cache``); the launcher's
own calls carry the key each needs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import requests

from rksc_sgl import servers
from rksc_sgl.endpoint import flush_server

ROUTER_ENV = "RKSC_ROUTER_PYTHON"
FRONT_VENV_PYTHON = Path(__file__).resolve().parents[1] / ".venv-front" / "bin" / "python"
WORKER = "rksc_sgl.launch_server"  # each worker: python -m WORKER worker_args
# Our policy name -> sglang-router's flags.
POLICIES = {
    "pinned": ["--policy", "manual", "--assignment-mode", "min_group"],
    "cache_aware": ["--policy", "cache_aware"],
    "round_robin": ["--policy", "round_robin"],
    "random": ["--policy", "random"],
    "power_of_two": ["--policy", "power_of_two"],
}


@dataclasses.dataclass(frozen=True)
class ClusterKeys:
    """The workers' SGLang keys: ``api_key`` for generation, ``admin_api_key`` for admin routes."""

    api_key: str | None = None
    admin_api_key: str | None = None

    @classmethod
    def of(cls, worker_args: list[str]) -> "ClusterKeys":
        from rksc_sgl.launch_server import flag_value

        return cls(flag_value(worker_args, "api_key") or None, flag_value(worker_args, "admin_api_key") or None)

    def router_args(self) -> list[str]:
        """sglang-router's flags: the user key for clients and workers, the admin key for its control plane."""
        args = ["--api-key", self.api_key] if self.api_key else []
        if self.admin_api_key:
            args += ["--control-plane-api-keys", f"rksc-admin:rksc-sgl admin:admin:{self.admin_api_key}"]
        return args

    def headers(self, admin: bool = False) -> dict[str, str]:
        """What a request needs: the user key, or (``admin``) the admin key, else the user key
        (SGLang's admin routes take it when no admin key is set)."""
        key = (self.admin_api_key or self.api_key) if admin else self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}


def router_python(explicit: str | None = None) -> str:
    """The interpreter that runs sglang-router; ValueError naming how to get one."""
    for candidate in (explicit, os.environ.get(ROUTER_ENV)):
        if candidate:
            if not Path(candidate).is_file():
                raise ValueError(f"--router-python: {candidate} does not exist")
            return candidate
    if FRONT_VENV_PYTHON.is_file():
        return str(FRONT_VENV_PYTHON)
    if importlib.util.find_spec("sglang_router") is not None:
        return sys.executable
    raise ValueError("sglang-router is not installed: run `make front` (its own venv, .venv-front), "
                     f"or pass --router-python / set {ROUTER_ENV} to an interpreter that has it")


def worker_env(workers: int, device_cpu: bool) -> dict[str, str]:
    if not device_cpu or os.environ.get("RKSC_CPU_THREADS"):
        return {}
    return {"RKSC_CPU_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}


def all_registered(workers_payload: dict, worker_urls: list[str]) -> bool:
    """Whether the router's ``GET /workers`` answer lists every one of ``worker_urls`` as healthy."""
    healthy = {w.get("url") for w in workers_payload.get("workers", []) if w.get("is_healthy")}
    return set(worker_urls) <= healthy


def wait_routing(url: str, worker_urls: list[str], timeout_s: float = 120, keys: ClusterKeys = ClusterKeys()) -> None:
    """Until the router lists every worker as healthy and forwards a generation. Workers register
    in the background after the router starts; routing keys seen before the last one registers
    would all be pinned to the first (``min_group`` chooses among registered workers only)."""
    deadline = time.monotonic() + timeout_s
    body = {"text": "ping", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    while time.monotonic() < deadline:
        try:
            listed = requests.get(url + "/workers", headers=keys.headers(admin=True), timeout=30)
            if (listed.status_code == 200 and all_registered(listed.json(), worker_urls) and requests.post(
                    url + "/generate", json=body, headers=keys.headers(), timeout=30).status_code == 200):
                return
        except (requests.RequestException, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(
        f"router at {url} did not list {len(worker_urls)} healthy workers and route within {timeout_s} s")


class Cluster:
    """Workers that stay up while routers in front of them come and go (one at a time)."""

    def __init__(self, workers: int, worker_args: list[str], log_dir: Path, python: str | None = None,
                 timeout_s: float = 300) -> None:
        if workers < 1:
            raise ValueError(f"--workers must be >= 1, got {workers}")
        self.log_dir = Path(log_dir)
        self.python = router_python(python)
        from rksc_sgl.launch_server import flag_value

        self.worker_args = list(worker_args)
        self.keys = ClusterKeys.of(self.worker_args)
        self.env = worker_env(workers, flag_value(worker_args, "device") in (None, "cpu"))
        logs = [self.log_dir / f"worker{i}.log" for i in range(workers)]
        self.workers = [servers.spawn(WORKER, self.worker_args, log, self.env) for log in logs]
        self.router = None
        try:
            for i, log in enumerate(logs):  # all start at once; one whose port was taken starts again
                try:
                    self.workers[i] = servers.settle(self.workers[i], WORKER, self.worker_args, log, self.env,
                                                     timeout_s)
                except RuntimeError as e:
                    raise RuntimeError(f"worker {i}: {e}") from None
        except BaseException:
            self.stop()
            raise

    @property
    def worker_urls(self) -> list[str]:
        return [url for _, url in self.workers]

    def start_router(self, policy: str = "pinned", host: str = "127.0.0.1", port: int | None = None,
                     router_args: list[str] = ()) -> str:
        """Start sglang-router with ``policy`` (and sglang-router flags ``router_args``) in front of
        the workers; its URL once it routes."""
        if policy not in POLICIES:
            raise ValueError(f"--policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.stop_router()
        port = port or servers.free_port()
        args = ["--worker-urls", *self.worker_urls, *POLICIES[policy], *self.keys.router_args(), *router_args,
                "--log-level", "warn"]
        log = self.log_dir / f"router-{policy}.log"
        self.router, url = servers.spawn("sglang_router.launch_router", args, log, python=self.python, port=port,
                                         host=host)
        try:
            wait_routing(url, self.worker_urls, keys=self.keys)
        except Exception:
            self.stop_router()
            raise RuntimeError(f"sglang-router failed to route; log:\n{log.read_text()[-3000:]}") from None
        return url

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` and every process it started (its scheduler, detokenizer): a crash."""
        import psutil

        proc = self.workers[i][0]
        try:
            tree = psutil.Process(proc.pid)
            for p in [*tree.children(recursive=True), tree]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
        except psutil.NoSuchProcess:
            pass
        proc.wait()

    def restart_worker(self, i: int, timeout_s: float = 300) -> None:
        """Start worker ``i`` again, on its old port (the router knows it by URL), until it serves."""
        url = self.workers[i][1]
        log = self.log_dir / f"worker{i}-restart.log"
        proc, _ = servers.spawn(WORKER, self.worker_args, log, self.env,
                                port=int(url.rsplit(":", 1)[1]))
        self.workers[i] = (proc, url)
        servers.wait_healthy(url, proc, timeout_s)

    def flush(self) -> None:
        """Empty every worker's radix cache (between measured runs), each once it is idle;
        raises ``RuntimeError`` with the worker's reason if one was not flushed. Directly, with the
        admin key: sglang-router's own ``/flush_cache`` reaches the workers with its user key."""
        post = functools.partial(requests.post, headers=self.keys.headers(admin=True))
        for url in self.worker_urls:
            flush_server(url, post=post)

    def stop_router(self) -> None:
        if self.router is not None:
            servers.stop(self.router)
            self.router = None

    def stop(self) -> None:
        self.stop_router()
        for proc, _ in self.workers:
            servers.stop(proc)


@contextlib.contextmanager
def cluster(workers: int, worker_args: list[str], policy: str = "pinned", log_dir: Path | None = None,
            python: str | None = None) -> Iterator[tuple[str, Cluster]]:
    """(router URL, cluster) for the ``with`` block: workers and router started, then stopped."""
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        c = Cluster(workers, worker_args, log_dir, python)
        stack.callback(c.stop)
        yield c.start_router(policy), c


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m rksc_sgl.launch_router", description=__doc__.splitlines()[0],
                                epilog="Every other flag goes to each worker (python -m rksc_sgl.launch_server).")
    p.add_argument("--workers", type=int, default=2, help="rksc-sgl workers to start (default: %(default)s)")
    p.add_argument("--policy", default="pinned", help=f"{', '.join(POLICIES)} (default: %(default)s)")
    p.add_argument("--host", default="127.0.0.1", help="the router's address (default: %(default)s)")
    p.add_argument("--port", type=int, default=30000, help="the router's port (default: %(default)s)")
    p.add_argument("--router-python", default=None, help="interpreter with sglang-router installed")
    p.add_argument("--log-dir", type=Path, default=None, help="worker and router logs (default: a temporary folder)")
    args, worker_args = p.parse_known_args(argv)
    if args.workers < 1:
        p.error(f"--workers must be >= 1, got {args.workers}")
    if args.policy not in POLICIES:
        p.error(f"--policy must be one of {', '.join(POLICIES)}, got {args.policy!r}")
    try:
        args.router_python = router_python(args.router_python)
    except ValueError as e:
        p.error(str(e))
    return args, worker_args


def router_exposure_warning(host: str, keys: ClusterKeys) -> str | None:
    """The start-up warning for a router others can reach whose control plane no admin key locks."""
    from rksc_sgl.launch_server import is_loopback

    if keys.admin_api_key or is_loopback(host):
        return None
    who = "any client that holds --api-key" if keys.api_key else "any client"
    return (f"--host {host} is reachable from other machines and --admin-api-key is not set: the router's "
            f"control plane (/workers adds and removes workers, /flush_cache) answers {who}")


def main(argv: list[str] | None = None) -> None:
    args, worker_args = parse_args(argv)
    if worker_args:  # our flags and flag conflicts fail here, before any worker loads a model
        from rksc_sgl.launch_server import split_args

        split_args(worker_args)
    warning = router_exposure_warning(args.host, ClusterKeys.of(worker_args))
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="rksc-router-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"starting {args.workers} workers (logs in {log_dir})", flush=True)
    c = Cluster(args.workers, worker_args, log_dir, args.router_python)
    try:
        url = c.start_router(args.policy, args.host, args.port)
        print(f"router ({args.policy}) on {url} -> {' '.join(c.worker_urls)}", flush=True)
        c.router.wait()
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()


if __name__ == "__main__":
    main()
