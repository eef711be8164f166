"""``python -m benchmarks.faults``: a worker behind sglang-router dies under load; what clients see.

    python -m benchmarks.faults --programs 16 --forks 4

Starts 2 ``rksc_sgl.launch_server`` workers behind sglang-router (``pinned`` routing) with the
router's own fail-over settings (``FAILOVER``: its retries, circuit breaker and health checks,
tightened from their defaults), and runs ``--programs`` self-consistency programs at once through
the router, ``--concurrency`` at a time. Each program retries itself: a program whose run fails is
run again from its start (a new routing key), up to ``--program-retries`` times. ``--kill-after``
seconds in, once at least ``--forks`` requests are in flight on worker 1 (running or queued;
polled, for at most a minute),
worker 1 and every process it started are SIGKILLed (a crash mid-request). The run then records
when the router first lists worker 1 unhealthy, restarts worker 1 on its old port without
touching the router, and records when the router lists it healthy again and routes a request to
it.

The report (programs completed on their first try and after a retry, failed, hung, the errors
clients saw, the requests in flight on the victim when it died and the KV they held, the seconds to
detection and to recovery) is printed as JSON and appended to
``benchmarks/results/faults.jsonl``. The exit status is 1 if a program was lost or hung, the
worker did not rejoin, or no request was in flight on it when it died (the run proved nothing).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

from benchmarks.serving.load import LoadSettings, prompts
from benchmarks.bench.records import MODEL_NAME, append_jsonl, git_commit, machine
from rksc_sgl import servers
from rksc_sgl.endpoint import RkscEndpoint

RESULTS = Path("benchmarks/results/faults.jsonl")
KILL_WAIT_S = 60.0  # how long after --kill-after the kill waits for the victim to hold work
# sglang-router 0.3.2's fail-over knobs. Its defaults check health every 60 s and mark a worker
# unhealthy after 3 failures (a dead worker keeps getting requests for minutes), and open a
# worker's circuit after 10 failures for 60 s; these detect a crash within seconds, and retry a
# failed request (on another worker where the policy picks one) before the client sees it. A health
# check may take 5 s: a busy CPU worker answers slowly, and with 2 s a run on a loaded machine had
# programs refused after the kill with "no_available_workers" (all circuits open or unhealthy).
FAILOVER = ["--health-check-interval-secs", "2", "--health-failure-threshold", "2",
            "--health-success-threshold", "1", "--health-check-timeout-secs", "5",
            "--cb-failure-threshold", "3", "--cb-timeout-duration-secs", "5",
            "--retry-max-retries", "3", "--retry-initial-backoff-ms", "100"]


@dataclasses.dataclass(frozen=True)
class FaultSettings:
    programs: int = 16
    forks: int = 4
    max_new_tokens: int = 32
    concurrency: int = 8
    kill_after_s: float = 20.0
    program_retries: int = 2
    shots: int = 2
    seed: int = 0
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("programs", "forks", "max_new_tokens", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name, flag in (("kill_after_s", "--kill-after"), ("program_retries", "--program-retries"),
                           ("shots", "--shots")):
            if getattr(self, name) < 0:
                raise ValueError(f"{flag} must be >= 0, got {getattr(self, name)}")
        if self.timeout_s <= 0:
            raise ValueError(f"--timeout-s must be > 0, got {self.timeout_s}")


def worker_health(router: str, worker_url: str) -> bool | None:
    """Whether the router lists ``worker_url`` healthy (None: not listed, or no answer)."""
    try:
        listed = requests.get(router + "/workers", timeout=5).json().get("workers", [])
    except (requests.RequestException, ValueError):
        return None
    return next((bool(w.get("is_healthy")) for w in listed if w.get("url") == worker_url), None)


def wait_for(condition, timeout_s: float, interval_s: float = 0.25) -> float | None:
    """Seconds until ``condition()`` holds, or None at the deadline."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if condition():
            return round(time.monotonic() - start, 2)
        time.sleep(interval_s)
    return None


def victim_load(url: str) -> tuple[int, int]:
    """(requests in flight on ``url``: running or queued, KV tokens they hold); (0, 0) if it does not answer."""
    try:
        pool = servers.kv_pool(url, timeout_s=30)
    except (requests.RequestException, KeyError, ValueError):
        return 0, 0
    in_flight = pool.get("running_requests", 0) + pool.get("queued_requests", 0)
    return in_flight, pool["total"] - pool["available"] - pool["evictable"]


def wait_for_work(url: str, timeout_s: float, min_in_flight: int) -> tuple[int, int]:
    """Poll ``url`` until at least ``min_in_flight`` requests are in flight on it; its load then
    (or at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while (load := victim_load(url))[0] < min_in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    return load


def run_programs(router: str, settings: FaultSettings, on_progress=None) -> dict:
    """Every program through the router, each retried from its start on failure; the tally."""
    from programs.sc import branch_seed, sc_program

    texts = prompts(LoadSettings(programs=settings.programs, shots=settings.shots))
    outcomes: list[dict] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        errors = []
        for attempt in range(settings.program_retries + 1):
            try:
                endpoint = RkscEndpoint(router)  # a fresh routing key per attempt; it asks the router too
                state = sc_program.run(texts[i], settings.forks, settings.max_new_tokens, 0.7,
                                       [branch_seed(settings.seed, i, b) for b in range(settings.forks)],
                                       backend=endpoint)
                error = state.error()
            except Exception as e:  # the program's own retry handles it, as a client's would
                error = e
            if error is None:
                break
            errors.append(f"{type(error).__name__}: {error}"[:200])
        with lock:
            outcomes.append({"program": i, "attempts": len(errors) + (error is None),
                             "completed": error is None, "errors": errors})
        if on_progress:
            on_progress()

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=settings.concurrency)
    futures = [pool.submit(one, i) for i in range(settings.programs)]
    done, pending = concurrent.futures.wait(futures, timeout=settings.timeout_s)
    pool.shutdown(wait=False, cancel_futures=True)
    lost = [f.exception() for f in done if f.exception() is not None]  # a bug of this harness, counted
    errors = [e for o in outcomes for e in o["errors"]] + [f"{type(e).__name__}: {e}"[:200] for e in lost]
    return {
        "programs_completed": sum(o["completed"] for o in outcomes),
        "programs_completed_first_try": sum(o["completed"] and o["attempts"] == 1 for o in outcomes),
        "programs_completed_after_retry": sum(o["completed"] and o["attempts"] > 1 for o in outcomes),
        "programs_failed": sum(not o["completed"] for o in outcomes) + len(lost),
        "programs_hung": len(pending),
        "client_errors": len(errors),
        "client_error_kinds": sorted({e.split(":")[0] for e in errors}),
        "client_error_examples": errors[:3],
    }


def run(settings: FaultSettings, log_dir: Path, worker_args: list[str], progress: bool = True) -> dict:
    from tqdm import tqdm

    from rksc_sgl.launch_router import Cluster

    cluster = Cluster(2, worker_args, log_dir)
    try:
        router = cluster.start_router("pinned", router_args=FAILOVER)
        victim = cluster.worker_urls[1]
        bar = tqdm(total=settings.programs, desc="programs", disable=not progress)
        events: dict = {}

        def crash_and_recover() -> None:
            time.sleep(settings.kill_after_s)
            # Kill while at least one program's forks run on the victim (a crash between two requests
            # would make "no client error" vacuous): poll it, for at most KILL_WAIT_S.
            waited = time.monotonic()
            in_flight, in_use = wait_for_work(victim, KILL_WAIT_S, settings.forks)
            t0 = time.monotonic()
            cluster.kill_worker(1)
            events["victim_requests_in_flight_at_kill"] = in_flight
            events["victim_kv_tokens_in_use_at_kill"] = in_use
            events["waited_for_victim_work_s"] = round(t0 - waited, 2)
            events["killed_at_s"] = round(time.monotonic() - started, 2)
            events["detected_unhealthy_s"] = wait_for(lambda: worker_health(router, victim) is False, 120)
            restart = time.monotonic()
            cluster.restart_worker(1)
            events["worker_restart_s"] = round(time.monotonic() - restart, 2)
            events["rejoined_healthy_s"] = wait_for(lambda: worker_health(router, victim) is True, 120)
            events["crash_to_rejoin_s"] = round(time.monotonic() - t0, 2)

        started = time.monotonic()
        chaos = threading.Thread(target=crash_and_recover, daemon=True)
        chaos.start()
        tally = run_programs(router, settings, on_progress=bar.update)
        bar.close()
        chaos.join(timeout=600)
        wall = round(time.monotonic() - started, 2)
        # After the run: the rejoined worker serves through the router again (a request pinned to it).
        routed = rejoined_serves(router, victim)
        return {**tally, **events, "wall_s": wall, "rejoined_worker_serves": routed,
                "router_flags": FAILOVER, "worker_args": worker_args}
    finally:
        cluster.stop()


def rejoined_serves(router: str, worker_url: str, tries: int = 16) -> bool:
    """Whether the router forwards generations to ``worker_url`` again: requests with fresh routing
    keys (each pinned to a worker, ties at random) until one's prompt is in that worker's radix
    cache, asked of the worker directly; at most ``tries``."""
    for i in range(tries):
        text = f"Rejoin check {i} of {time.time_ns()}: say hi. " * 4
        res = requests.post(router + "/generate", headers={"X-SMG-Routing-Key": f"rejoin-{time.time_ns()}"},
                            json={"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
                            timeout=120)
        if res.status_code != 200:
            continue
        meta = requests.post(worker_url + "/generate", json={"text": text, "sampling_params": {"max_new_tokens": 0}},
                             timeout=120).json()["meta_info"]
        if meta["cached_tokens"] >= meta["prompt_tokens"] - 1:
            return True
    return False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.faults", description=__doc__.splitlines()[0])
    defaults = FaultSettings()
    p.add_argument("--programs", type=int, default=defaults.programs, help="programs to run (default: %(default)s)")
    p.add_argument("--forks", type=int, default=defaults.forks, help="branches per program (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    p.add_argument("--concurrency", type=int, default=defaults.concurrency, help="programs in flight at once")
    p.add_argument("--kill-after", dest="kill_after_s", type=float, default=defaults.kill_after_s,
                   help="seconds after the programs start that worker 1 is killed (default: %(default)s)")
    p.add_argument("--program-retries", type=int, default=defaults.program_retries,
                   help="times a failed program runs again from its start (default: %(default)s)")
    p.add_argument("--timeout-s", type=float, default=defaults.timeout_s, help="a program not done by then hangs")
    p.add_argument("--worker-args", default="--max-total-tokens 8000 --log-level warning",
                   help="flags of each rksc_sgl.launch_server worker (default: %(default)s)")
    p.add_argument("--output", type=Path, default=RESULTS, help="results file, JSON lines (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        args.settings = FaultSettings(args.programs, args.forks, args.max_new_tokens, args.concurrency,
                                      args.kill_after_s, args.program_retries, timeout_s=args.timeout_s)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rksc-faults-") as logs:
        report = run(args.settings, Path(logs), shlex.split(args.worker_args))
    ok = (report["programs_failed"] == 0 and report["programs_hung"] == 0
          and report.get("rejoined_healthy_s") is not None and report["rejoined_worker_serves"]
          and report.get("victim_requests_in_flight_at_kill", 0) > 0)  # else the crash hit no request
    record = {"benchmark": "faults", "model": MODEL_NAME, "commit": git_commit(), "machine": machine(),
              "command": "python -m benchmarks.faults " + shlex.join(argv if argv is not None else sys.argv[1:]),
              "settings": dataclasses.asdict(args.settings), **report, "ok": ok}
    print(json.dumps(record, indent=1))
    append_jsonl(args.output, [record])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
