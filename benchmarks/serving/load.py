"""``python -m benchmarks.load``: many forking programs at once against one server, pool under pressure.

    python -m benchmarks.load --programs 32 --forks 8 --pool-fraction 0.25

Starts ``python -m rksc_sgl.launch_server`` (``--server-args``, default ``--rsbcm``) with the KV pool
at ``--pool-fraction`` of the programs' working set (each program's prompt under the model's chat
template, plus ``forks x max_new_tokens`` generated tokens: what the radix tree would hold if
nothing were evicted), or uses the server at ``--url``. Then runs ``--programs`` self-consistency
programs at once (``programs.sc.sc_program``, GSM8K questions, ``--forks`` seeded branches each),
while ``--disconnects`` clients walk away mid-request (a stream closed after its first chunk, a
request whose client times out). Afterwards it checks that every program completed (none lost,
none past ``--timeout-s``), that the server still serves, and that the KV pool balances with
nothing held. The report (latency percentiles of programs and of single requests, throughput,
evictions, checks) is printed as JSON and appended to ``benchmarks/results/load.jsonl``; the exit
status is 1 if a check failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import shlex
import sys
import tempfile
import time
from pathlib import Path

import requests
from tqdm import tqdm

from benchmarks.bench.records import MODEL_NAME, append_jsonl, git_commit, machine
from rksc_sgl import servers
from rksc_sgl.endpoint import RkscEndpoint

RESULTS = Path("benchmarks/results/load.jsonl")


@dataclasses.dataclass(frozen=True)
class LoadSettings:
    programs: int = 32
    forks: int = 8
    max_new_tokens: int = 32
    temperature: float = 0.7
    seed: int = 0
    shots: int = 3
    disconnects: int = 2
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        for name in ("programs", "forks", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.shots < 0:
            raise ValueError(f"--shots must be >= 0, got {self.shots}")
        if self.disconnects < 0:
            raise ValueError(f"--disconnects must be >= 0, got {self.disconnects}")
        if self.timeout_s <= 0:
            raise ValueError(f"--timeout-s must be > 0, got {self.timeout_s}")


def percentiles(samples: list[float]) -> dict[str, float | None]:
    """p50 / p95 / p99 (nearest rank) in seconds, rounded to ms; None without samples."""
    ordered = sorted(samples)
    pick = lambda q: round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 3) if ordered else None
    return {"p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99)}


def prompts(settings: LoadSettings) -> list[str]:
    """GSM8K questions after ``shots`` solved exemplars (the first problems, held out)."""
    from programs.datasets import load
    from programs.sc import user_prompt

    problems = load("gsm8k", limit=settings.shots + settings.programs)
    exemplars = tuple(problems[:settings.shots])
    return [user_prompt(p, exemplars) for p in problems[settings.shots:]]


def working_set(texts: list[str], settings: LoadSettings, model_path: str) -> tuple[int, int]:
    """(KV tokens the programs would leave in the tree with nothing evicted, see the module doc;
    tokens of the longest single request: its prompt plus ``max_new_tokens``)."""
    from transformers import AutoTokenizer

    from programs.sc import SYSTEM_PROMPT

    tok = AutoTokenizer.from_pretrained(model_path)
    chats = [tok.apply_chat_template([{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": t}],
                                     tokenize=False, add_generation_prompt=True) for t in texts]
    lengths = [len(tok(chat, add_special_tokens=False)["input_ids"]) for chat in chats]
    return sum(lengths) + len(texts) * settings.forks * settings.max_new_tokens, max(lengths) + settings.max_new_tokens


class TimedEndpoint(RkscEndpoint):
    """``RkscEndpoint`` that also records every request's latency."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url)
        self.latencies: list[float] = []

    def _send(self, data, routing_key=None):
        t0 = time.perf_counter()
        out = super()._send(data, routing_key)
        self.latencies.append(time.perf_counter() - t0)  # list.append is atomic
        return out


def walk_away(url: str, index: int) -> str:
    """One client that leaves mid-request: a stream closed after its first chunk (even index) or a
    request abandoned after 1 s (odd). Returns what happened."""
    body = {"text": f"Tell a very long story number {index}.",
            "sampling_params": {"max_new_tokens": 256, "temperature": 0.7, "ignore_eos": True}}
    if index % 2 == 0:
        with requests.post(url + "/generate", json={**body, "stream": True}, stream=True, timeout=60) as res:
            next(res.iter_lines(), None)
        return "stream closed after its first chunk"
    try:
        requests.post(url + "/generate", json=body, timeout=1.0)
        return "completed within 1 s"
    except requests.Timeout:
        return "client timed out after 1 s"


def run_load(url: str, settings: LoadSettings, progress: bool = True) -> dict:
    from programs.sc import branch_seed, sc_program

    texts = prompts(settings)
    endpoint = TimedEndpoint(url)
    program_latency: list[float] = []
    deadline = time.monotonic() + settings.timeout_s

    def one(i: int):
        t0 = time.perf_counter()
        # Positional: run() takes max_new_tokens and temperature as keywords of its own.
        state = sc_program.run(texts[i], settings.forks, settings.max_new_tokens, settings.temperature,
                               [branch_seed(settings.seed, i, b) for b in range(settings.forks)], backend=endpoint)
        if state.error() is not None:
            raise RuntimeError(state.error())
        program_latency.append(time.perf_counter() - t0)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=settings.programs + settings.disconnects)
    started = time.perf_counter()
    futures = [pool.submit(one, i) for i in range(settings.programs)]
    leavers = [pool.submit(walk_away, url, i) for i in range(settings.disconnects)]
    failed = []
    bar = tqdm(total=len(futures), desc=f"{settings.programs} programs x {settings.forks} forks", disable=not progress)
    try:
        for fut in concurrent.futures.as_completed(futures, timeout=max(1.0, deadline - time.monotonic())):
            try:
                fut.result()
            except Exception as e:  # a program that failed is reported, not raised: the report is the point
                failed.append(f"{type(e).__name__}: {e}"[:300])
            bar.update()
    except concurrent.futures.TimeoutError:
        pass
    finally:
        bar.close()
    wall = time.perf_counter() - started
    hung = sum(not f.done() for f in futures)
    concurrent.futures.wait(leavers, timeout=120)  # each leaves within ~1 s of its first chunk
    pool.shutdown(wait=False, cancel_futures=True)
    leaver_outcomes = [f.result() if f.done() and f.exception() is None else repr(f.exception()) if f.done() else "hung"
                       for f in leavers]
    counters = endpoint.reset_counters()
    completed = settings.programs - len(failed) - hung
    return {
        "programs_completed": completed, "programs_failed": len(failed), "programs_hung": hung,
        "failures": failed[:5], "disconnects": leaver_outcomes,
        "wall_s": round(wall, 2),
        "program_latency_s": percentiles(program_latency), "request_latency_s": percentiles(endpoint.latencies),
        "requests": len(endpoint.latencies),
        "programs_per_s": round(completed / wall, 3),
        "completion_tok_s": round(counters.completion_tokens / wall, 1),
        "prompt_tokens": counters.prompt_tokens, "cached_tokens": counters.cached_tokens,
        "reuse_rate": round(counters.cached_tokens / counters.prompt_tokens, 4) if counters.prompt_tokens else None,
    }


def settle(url: str, timeout_s: float = 60.0) -> dict:
    """The KV pool once settled (``servers.settled_pool``, or at the deadline), and whether the
    server still serves a generation."""
    pool = servers.settled_pool(lambda: servers.kv_pool(url), timeout_s)
    serving = requests.get(url + "/health_generate", timeout=60).status_code == 200
    return {"kv_pool": pool, "kv_balanced": servers.is_settled(pool), "server_serving": serving}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = LoadSettings()
    p = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__.splitlines()[0])
    p.add_argument("--programs", type=int, default=d.programs, help="programs in flight at once (default: %(default)s)")
    p.add_argument("--forks", type=int, default=d.forks, help="branches per program (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="per branch (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--shots", type=int, default=d.shots, help="solved exemplars before each question (default: %(default)s)")
    p.add_argument("--disconnects", type=int, default=d.disconnects,
                   help="clients that leave mid-request during the load (default: %(default)s)")
    p.add_argument("--timeout-s", type=float, default=d.timeout_s,
                   help="a program not done by then counts as hung (default: %(default)s)")
    p.add_argument("--pool-fraction", type=float, default=0.25,
                   help="KV pool as a fraction of the working set (default: %(default)s; ignored with --url)")
    p.add_argument("--server-args", default="--rsbcm", help="flags for rksc_sgl.launch_server (default: %(default)s)")
    p.add_argument("--url", default=None, help="use this running server instead of starting one")
    p.add_argument("--model-path", default=None, help=f"local HF folder (default: {MODEL_NAME})")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    try:
        args.settings = LoadSettings(args.programs, args.forks, args.max_new_tokens, args.temperature, args.seed,
                                     args.shots, args.disconnects, args.timeout_s)
        if not 0 < args.pool_fraction <= 1:
            raise ValueError(f"--pool-fraction must be in (0, 1], got {args.pool_fraction}")
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    from rksc_sgl.engine import resolve_model_path

    args = parse_args(argv)
    settings = args.settings
    report: dict = {"settings": dataclasses.asdict(settings), "commit": git_commit(), "date": time.strftime("%Y-%m-%d"),
                    "machine": machine(), "model": args.model_path or MODEL_NAME,
                    "command": "python -m benchmarks.load " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))}
    if args.url:
        report.update(url=args.url, pool_tokens=servers.kv_pool(args.url)["total"])
        report.update(run_load(args.url, settings))
        report.update(settle(args.url))
    else:
        model_path = resolve_model_path(args.model_path)
        tokens, longest = working_set(prompts(settings), settings, model_path)
        # Never below two of the longest request: SGLang refuses a request larger than the pool.
        pool_tokens = max(2 * longest, int(tokens * args.pool_fraction))
        server_args = [*shlex.split(args.server_args), "--model-path", model_path, "--max-total-tokens", str(pool_tokens),
                       "--log-level", "warning"]
        report.update(server_args=server_args, working_set_tokens=tokens, pool_tokens=pool_tokens,
                      pool_fraction=round(pool_tokens / tokens, 3))
        with tempfile.TemporaryDirectory() as log_dir, servers.http_server("rksc_sgl.launch_server", server_args, Path(log_dir)) as url:
            report.update(run_load(url, settings))
            report.update(settle(url))
    report["ok"] = (report["programs_completed"] == settings.programs and report["kv_balanced"] and report["server_serving"])
    print(json.dumps(report, indent=1))
    append_jsonl(args.output, [report])
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
