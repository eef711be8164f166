"""``python -m benchmarks.fairness``: a light client's latency while a heavy client fills the queue.

    python -m benchmarks.fairness
    python -m benchmarks.fairness --url http://127.0.0.1:30000 --label mine --max-n 64

For each server configuration (``--configs``, each a set of ``rksc_sgl.launch_server`` flags, one
server started after the other) it measures a light client's request (``--light-tokens`` new
tokens, greedy) on the idle server, then starts a heavy client that asks for
``--heavy-samples`` samples of ``--heavy-tokens`` tokens each, as one request if the server's
``--max-n`` allows it, else (what its 400 tells the client) as many requests of ``n = --max-n`` as
it takes, all at once. Once the server queues the heavy work, the light client
sends ``--light-requests`` requests one after the other and records each latency (a request not
answered within ``--light-timeout-s`` counts as that many seconds, flagged). Then the heavy
requests are aborted by rid (their children too, ``radix_ext/stop/abort_children.py``) and the pool
must settle. One JSON line per configuration is appended to ``benchmarks/results/fairness.jsonl``
with the commit (``benchmarks.bench.records``), and a summary table is printed last.

With ``--url`` it measures that running server instead (``--max-n``: the one it was started with).
The configurations: ``uncapped`` (``--max-n`` lifted past the heavy request: stock SGLang's
behaviour), ``max-n`` (our default cap alone: the heavy client splits its samples, the queue holds
as many), ``max-n+queue`` (with SGLang's own ``--max-queued-requests``, which answers a
request beyond the queue with a 503 at once) and ``priority`` (SGLang's
``--enable-priority-scheduling``: the heavy client marks its requests ``priority = -100``, bulk,
which only that configuration honours; the light client's requests get the default 0 and go first;
being more than SGLang's preemption threshold above, they may preempt running bulk work, which
the results do not record); ``priority+retraction`` adds ``--retraction-policy priority``, so
that a full KV pool retracts bulk work first rather than the request with the fewest output tokens;
by default ``uncapped`` and ``max-n+queue``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import requests

from benchmarks.bench.records import MODEL_NAME, append_jsonl, git_commit, machine
from rksc_sgl import servers

RESULTS = Path("benchmarks/results/fairness.jsonl")
CONFIGS = {
    "uncapped": "--max-n 100000",
    "max-n": "--max-n 64",
    "max-n+queue": "--max-n 64 --max-queued-requests 64",
    "priority": "--max-n 64 --enable-priority-scheduling --default-priority-value 0",
    # SGLang's default --retraction-policy (length) retracts, when decoding runs out of KV, the
    # requests with the fewest output tokens first: a light request that just started. This one
    # retracts the lowest priority first.
    "priority+retraction": "--max-n 64 --enable-priority-scheduling --default-priority-value 0 "
                           "--retraction-policy priority",
}
# The heavy client marks its work as bulk; honoured only under --enable-priority-scheduling, where a
# request more than --priority-scheduling-preemption-threshold (10) above a running one may preempt it.
BULK_PRIORITY = -100
DEFAULT_CONFIGS = ["uncapped", "max-n+queue"]
READBACK_TIMEOUT_S = 300  # a server busy with the heavy client answers its readback slowly
HEAVY_PROMPT = "Write a long essay about rivers:"
LIGHT_PROMPT = "The capital of France is"


def light_request(url: str, tokens: int, timeout_s: float) -> dict:
    body = {"text": LIGHT_PROMPT, "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}
    start = time.monotonic()
    try:
        status = requests.post(url + "/generate", json=body, timeout=timeout_s).status_code
    except requests.Timeout:
        status = None
    return {"latency_s": round(time.monotonic() - start, 3), "status": status}


def heavy_request(url: str, rid: str, n: int, tokens: int) -> int:
    body = {"text": HEAVY_PROMPT, "rid": rid, "priority": BULK_PRIORITY,
            "sampling_params": {"n": n, "max_new_tokens": tokens, "ignore_eos": True, "temperature": 1.0}}
    try:
        return requests.post(url + "/generate", json=body, timeout=300).status_code  # then the client gives up
    except requests.RequestException:
        return -1


def held(url: str) -> bool:
    """Requests queued or KV held (a server without the request counts shows only the latter)."""
    pool = servers.kv_pool(url, timeout_s=READBACK_TIMEOUT_S)
    return pool.get("queued_requests", 0) > 0 or pool["total"] - pool["available"] - pool["evictable"] > 0


def run_config(url: str, args: argparse.Namespace, max_n: int) -> dict:
    light_request(url, args.light_tokens, args.light_timeout_s)  # warm-up
    idle = [light_request(url, args.light_tokens, args.light_timeout_s)["latency_s"] for _ in range(2)]
    run = uuid.uuid4().hex[:8]
    heavy: list[concurrent.futures.Future] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=64) as pool:
        # What the heavy client learns from the server's 400 beyond --max-n: split into n = max-n.
        sizes = [args.heavy_samples] if args.heavy_samples <= max_n else [max_n] * math.ceil(args.heavy_samples / max_n)
        for i, n in enumerate(sizes):
            heavy.append(pool.submit(heavy_request, url, f"heavy-{run}-{i}", n, args.heavy_tokens))
        try:
            deadline = time.monotonic() + 120
            while not held(url) and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(args.settle_s)  # let the heavy work reach the scheduler's queue
            queued_at_start = servers.kv_pool(url, timeout_s=READBACK_TIMEOUT_S).get("queued_requests")
            loaded = []
            for _ in range(args.light_requests):
                loaded.append(light_request(url, args.light_tokens, args.light_timeout_s))
                print(f"light request under load: {loaded[-1]}", file=sys.stderr, flush=True)
        finally:  # the heavy children must not outlive the measurement
            requests.post(url + "/abort_request", json={"rid": f"heavy-{run}"}, timeout=READBACK_TIMEOUT_S)
        heavy_status = [f.result() for f in heavy]
    pool_after = servers.settled_pool(lambda: servers.kv_pool(url, timeout_s=READBACK_TIMEOUT_S), 120)
    latencies = [r["latency_s"] for r in loaded]
    return {
        "heavy_requests": len(sizes), "heavy_n": sizes[0],
        "heavy_status": {str(s): heavy_status.count(s) for s in sorted(set(heavy_status))},
        "queued_when_light_started": queued_at_start,
        "light_idle_s": statistics.median(idle), "light_latencies_s": latencies,
        "light_median_s": statistics.median(latencies), "light_max_s": max(latencies),
        "light_timed_out": sum(r["status"] is None for r in loaded),
        "light_status": [r["status"] for r in loaded],
        "pool_settled": servers.is_settled(pool_after),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fairness", description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, choices=list(CONFIGS))
    p.add_argument("--heavy-samples", type=int, default=256, help="samples the heavy client wants (default: %(default)s)")
    p.add_argument("--heavy-tokens", type=int, default=16, help="new tokens per heavy sample (default: %(default)s)")
    p.add_argument("--light-requests", type=int, default=2)
    p.add_argument("--light-tokens", type=int, default=8)
    p.add_argument("--light-timeout-s", type=float, default=60.0)
    p.add_argument("--settle-s", type=float, default=2.0, help="wait after the heavy work is queued (default: %(default)s)")
    p.add_argument("--pool-tokens", type=int, default=4096,
                   help="--max-total-tokens of each server: small, so the heavy work queues (default: %(default)s)")
    p.add_argument("--url", default=None, help="measure this running server instead of starting --configs")
    p.add_argument("--label", default="running", help="the configuration's name in the results (with --url)")
    p.add_argument("--max-n", type=int, default=64, help="the running server's --max-n (with --url)")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    for name in ("heavy_samples", "heavy_tokens", "light_requests", "light_tokens", "pool_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m benchmarks.fairness " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    run_id = time.strftime("%Y%m%dT%H%M%S")
    rows = []
    runs = [(args.label, None)] if args.url else [(name, shlex.split(CONFIGS[name])) for name in args.configs]
    for name, flags in runs:
        start = time.monotonic()
        if flags is None:  # a server already running: its --max-n is the caller's word
            server_args, result = None, run_config(args.url, args, args.max_n)
        else:
            server_args = [*flags, "--max-total-tokens", str(args.pool_tokens), "--log-level", "warning"]
            with tempfile.TemporaryDirectory() as log_dir, servers.http_server("rksc_sgl.launch_server", server_args,
                                                                                Path(log_dir)) as url:
                result = run_config(url, args, int(flags[flags.index("--max-n") + 1]))
        rows.append({"run_id": run_id, "config": name, "server_args": server_args, "url": args.url,
                     "pool_tokens": servers.kv_pool(args.url, READBACK_TIMEOUT_S)["total"] if args.url else args.pool_tokens,
                     "commit": git_commit(),
                     "date": time.strftime("%Y-%m-%d"), "machine": machine(), "model": MODEL_NAME, "command": command,
                     "heavy_samples": args.heavy_samples, "heavy_tokens": args.heavy_tokens, "heavy_priority": BULK_PRIORITY,
                     "light_tokens": args.light_tokens, "wall_s": round(time.monotonic() - start, 1), **result})
        print(json.dumps(rows[-1]), flush=True)
    append_jsonl(args.output, rows)
    print(f"\n{'config':<14} {'heavy reqs x n':>15} {'queued':>7} {'idle s':>7} {'light median s':>15} {'light max s':>12}")
    for r in rows:
        print(f"{r['config']:<14} {str(r['heavy_requests']) + ' x ' + str(r['heavy_n']):>15} "
              f"{str(r['queued_when_light_started']):>7} {r['light_idle_s']:>7.2f} {r['light_median_s']:>15.2f} "
              f"{r['light_max_s']:>12.2f}")
    return 0 if all(r["pool_settled"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
