"""``python -m benchmarks.scaleout``: the same forking programs through sglang-router, policy by policy.

    python -m benchmarks.scaleout --workers 2 --programs 16 --forks 8 --policies pinned,cache_aware,round_robin

Starts ``--workers`` rksc-sgl workers once (``rksc_sgl.launch_router.Cluster``), then for each
routing policy: empties every worker's radix cache, starts sglang-router with that policy, and runs
``--programs`` self-consistency programs at once (GSM8K, ``--shots`` exemplars, ``--forks`` seeded
branches each) through it with ``RkscEndpoint``, which sends each program's routing key. Per policy:
wall time, prompt tokens served from a cache (reuse), and how many branch texts equal those of the
first policy (routing must not change what a seeded branch samples). One JSON line per policy is
appended to ``benchmarks/results/scaleout.jsonl``; a table is printed last.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench.records import MODEL_NAME, append_jsonl, git_commit, machine
from rksc_sgl.launch_router import POLICIES, Cluster

RESULTS = Path("benchmarks/results/scaleout.jsonl")


def run_policy(cluster: Cluster, policy: str, problems, exemplars, args) -> dict:
    from programs.sampling import SamplingConfig
    from programs.sc import run_branches
    from rksc_sgl.endpoint import RkscEndpoint

    cluster.flush()
    url = cluster.start_router(policy)
    try:
        endpoint = RkscEndpoint(url)
        config = SamplingConfig(num_branches=args.forks, max_new_tokens=args.max_new_tokens,
                                temperature=args.temperature, seed=args.seed)
        endpoint.reset_counters()
        t0 = time.perf_counter()
        out = run_branches(problems, config, endpoint, exemplars=exemplars, progress_bar=True)
        wall = time.perf_counter() - t0
        c = endpoint.reset_counters()
    finally:
        cluster.stop_router()
    return {"policy": policy, "wall_s": round(wall, 2), "prompt_tokens": c.prompt_tokens,
            "cached_tokens": c.cached_tokens, "prefill_tokens": c.prefill_tokens,
            "reuse_rate": round(c.cached_tokens / c.prompt_tokens, 4) if c.prompt_tokens else None,
            "branch_texts": [text for branches in out for _, text, _ in branches]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaleout", description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--policies", default="pinned,cache_aware,round_robin", help=f"from {', '.join(POLICIES)}")
    p.add_argument("--programs", type=int, default=16, help="programs in flight at once (default: %(default)s)")
    p.add_argument("--forks", type=int, default=8)
    p.add_argument("--shots", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker-args", default="", help="flags for every rksc_sgl.launch_server worker")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    bad = [x for x in policies if x not in POLICIES]
    if bad or not policies:
        p.error(f"--policies: unknown {bad}; valid: {', '.join(POLICIES)}")
    for flag in ("workers", "programs", "forks"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")

    from programs.datasets import load

    data = load("gsm8k", limit=args.shots + args.programs)
    exemplars, problems = tuple(data[:args.shots]), data[args.shots:]
    meta = {"run_id": time.strftime("%Y%m%dT%H%M%S"), "commit": git_commit(), "date": time.strftime("%Y-%m-%d"),
            "machine": machine(), "model": MODEL_NAME, "workers": args.workers, "programs": args.programs,
            "forks": args.forks, "shots": args.shots, "max_new_tokens": args.max_new_tokens,
            "worker_args": args.worker_args,
            "command": "python -m benchmarks.scaleout " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))}
    rows = []
    with tempfile.TemporaryDirectory() as log_dir:
        cluster = Cluster(args.workers, shlex.split(args.worker_args), Path(log_dir))
        try:
            for policy in policies:
                rows.append(run_policy(cluster, policy, problems, exemplars, args))
        finally:
            cluster.stop()
    first = rows[0]["branch_texts"]
    for row in rows:
        texts = row.pop("branch_texts")
        row["branch_text_agreement_vs_first"] = round(sum(a == b for a, b in zip(texts, first)) / len(first), 4)
        row["speedup_vs_first"] = round(rows[0]["wall_s"] / row["wall_s"], 3)
    rows = [{**meta, **row} for row in rows]
    append_jsonl(args.output, rows)
    print(f"\n{'policy':12} {'wall s':>7} {'x first':>8} {'prefill':>8} {'reuse':>6} {'same texts':>10}")
    for r in rows:
        print(f"{r['policy']:12} {r['wall_s']:>7.1f} {r['speedup_vs_first']:>8.2f} {r['prefill_tokens']:>8} "
              f"{r['reuse_rate']:>6.2f} {r['branch_text_agreement_vs_first']:>10.2f}")
    print(f"{len(rows)} rows appended to {args.output}")


if __name__ == "__main__":
    main()
