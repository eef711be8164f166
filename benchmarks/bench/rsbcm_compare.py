"""RSBCM against LRU on tree of thoughts with a KV pool too small for the tree.

``compare()`` runs ``programs.tot`` on the same GSM8K problems once per mode, each mode in a fresh
in-process engine (started in turn, in this process), all problems submitted at once:

* ``exact``: stock SGLang radix cache (its default ``UnifiedRadixCache``), LRU;
* ``rksc-lru``: our backend with every rksc option off (LRU): isolates the policy from the class;
* ``rsbcm-only``: our backend, eviction by ``branch_score / (depth + 1)``, aged (the default
  ``horizon_s``: importance buys at most that many seconds of residency);
* ``rsbcm-unbounded``: the same without ageing (``horizon_s: null``, the paper's order).

The KV pool is capped at ``pool_fraction`` of the workload's working set: the KV tokens one run
leaves in the tree when nothing is evicted, measured first with an uncapped ``exact`` run (mode
``uncapped``, reported too: the floor any policy could reach) unless ``working_set_tokens`` is
given. Per mode: prefill tokens computed (sum of ``prompt_tokens - cached_tokens`` over every
request, zero-token ones included), cache hit rate, wall time, accuracy, evicted tokens, and
whether the KV pool balanced when idle (SGLang's leak invariant).

    python -m benchmarks.rsbcm_compare --limit 20
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

from programs.datasets import load
from benchmarks.bench.records import append_jsonl
from programs.tot import TotConfig, solve_batch
from rksc_sgl.config import RkscConfig


@dataclasses.dataclass(frozen=True)
class Mode:
    rksc: RkscConfig
    server: dict[str, Any]  # SGLang ServerArgs overrides


MODES: dict[str, Mode] = {
    "exact": Mode(RkscConfig(), {}),
    "rksc-lru": Mode(RkscConfig(), {"radix_cache_backend": "rksc"}),
    "rsbcm-only": Mode(RkscConfig(rsbcm=True), {}),
    "rsbcm-unbounded": Mode(RkscConfig(rsbcm=True), {"radix_eviction_policy_config": {"horizon_s": None}}),
}
UNCAPPED_POOL_TOKENS = 32768


def internal_state(backend) -> dict[str, Any]:
    return backend.get_server_info()["internal_states"][0]


def run_mode(name: str, problems, cfg: TotConfig, pool_tokens: int, log_level: str = "error",
             rsbcm_config: dict[str, Any] | None = None, **server: Any) -> dict[str, Any]:
    """One engine, one tree-of-thoughts run over ``problems``; a plain dict of what it measured."""
    from rksc_sgl.engine import launch_engine
    from rksc_sgl.engine_endpoint import RkscEngineEndpoint

    mode = MODES["exact"] if name == "uncapped" else MODES[name]
    if mode.rksc.rsbcm and rsbcm_config:
        base = mode.server.get("radix_eviction_policy_config") or {}
        server = {**server, "radix_eviction_policy_config": {**base, **rsbcm_config}}
    engine = launch_engine(rksc=mode.rksc, max_total_tokens=pool_tokens, log_level=log_level,
                           **{**mode.server, **server})
    backend = RkscEngineEndpoint(engine)
    try:
        backend.run(engine.async_generate(prompt="Warm up.", sampling_params={"max_new_tokens": 2}))
        backend.flush_cache()
        backend.reset_counters()
        evicted_before = internal_state(backend)["rksc_kv_pool"]["evicted_tokens"]
        start = time.perf_counter()
        results = solve_batch(problems, cfg, backend)
        wall_s = time.perf_counter() - start
        counters = backend.reset_counters()
        state = internal_state(backend)
    finally:
        backend.shutdown()
    pool, cache = state["rksc_kv_pool"], state["rksc_cache"]
    n_correct = sum(r.correct for r in results)
    return {
        "mode": name,
        "problems": len(problems),
        "accuracy": n_correct / len(problems),
        "correct": n_correct,
        "prefill_tokens": counters.prefill_tokens,
        "prompt_tokens": counters.prompt_tokens,
        "cached_tokens": counters.cached_tokens,
        "completion_tokens": counters.completion_tokens,
        "requests": counters.requests,
        "cache_hit_rate": counters.cached_tokens / max(counters.prompt_tokens, 1),
        "wall_s": wall_s,
        "evicted_tokens": pool["evicted_tokens"] - evicted_before,
        "pool_tokens": pool["total"],
        "tree_tokens_after": pool["evictable"],
        "kv_pool_balanced": pool["available"] + pool["evictable"] + pool["protected"] == pool["total"]
        and pool["protected"] == 0,
        "cache_class": cache["cache_class"],
        "eviction_policy": cache["eviction_policy"],
        "answers": [r.answer for r in results],
    }


def compare(limit: int = 20, modes: tuple[str, ...] = ("exact", "rsbcm-only"), *, pool_fraction: float = 0.25,
            working_set_tokens: int | None = None, cfg: TotConfig = TotConfig(), dataset: str = "gsm8k",
            offset: int = 0, log_level: str = "error", rsbcm_config: dict[str, Any] | None = None,
            verbose: bool = False, **server: Any) -> dict[str, dict[str, Any]]:
    """Run ToT under each mode with the pool at ``pool_fraction`` of the working set; {mode: metrics}.

    Problems ``offset .. offset + limit`` of ``dataset``. Must run under ``if __name__ ==
    "__main__":`` (SGLang spawns its scheduler). ``rsbcm_config``: RSBCM's policy config
    (``{"unscored_importance": ...}``); ``verbose``: print each mode's line as it ends; ``server``:
    extra SGLang ServerArgs for every engine.
    """
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"--modes: unknown mode(s) {unknown}; known: {sorted(MODES)}")
    if not 0 < pool_fraction <= 1:
        raise ValueError(f"--pool-fraction must be in (0, 1], got {pool_fraction}")
    problems = load(dataset, limit=offset + limit)[offset:]
    report: dict[str, dict[str, Any]] = {}

    def run(name: str, pool_tokens: int) -> None:
        report[name] = run_mode(name, problems, cfg, pool_tokens, log_level, rsbcm_config, **server)
        if verbose:
            print(json.dumps({k: v for k, v in report[name].items() if k != "answers"}), flush=True)

    if working_set_tokens is None:
        run("uncapped", UNCAPPED_POOL_TOKENS)
        working_set_tokens = report["uncapped"]["tree_tokens_after"]
    for name in modes:
        run(name, int(working_set_tokens * pool_fraction))
    for metrics in report.values():
        metrics["working_set_tokens"] = working_set_tokens
    return report


COLUMNS = ("mode", "pool_tokens", "prefill_tokens", "cache_hit_rate", "evicted_tokens", "wall_s", "accuracy",
           "kv_pool_balanced")


def summary_table(report: dict[str, dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    rows = [COLUMNS] + [tuple(cell(m[c]) for c in COLUMNS) for m in report.values()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rsbcm_compare", description=__doc__.splitlines()[0])
    p.add_argument("--limit", type=int, default=20, help="number of GSM8K problems")
    p.add_argument("--offset", type=int, default=0, help="index of the first problem")
    p.add_argument("--modes", default="exact,rsbcm-only", help=f"comma-separated, from {sorted(MODES)}")
    p.add_argument("--pool-fraction", type=float, default=0.25)
    p.add_argument("--working-set-tokens", type=int, default=None, help="skip the uncapped calibration run")
    p.add_argument("--rsbcm-config", default=None, help='JSON policy config for rsbcm, e.g. {"unscored_importance": 0.2}')
    p.add_argument("--output", default=None, help="append one JSON line per mode to this file")
    args = p.parse_args(argv)
    rsbcm_config = json.loads(args.rsbcm_config) if args.rsbcm_config else None
    report = compare(args.limit, tuple(args.modes.split(",")), pool_fraction=args.pool_fraction,
                     working_set_tokens=args.working_set_tokens, offset=args.offset, rsbcm_config=rsbcm_config,
                     verbose=True)
    if args.output:
        append_jsonl(args.output, ({"offset": args.offset, "limit": args.limit, **m} for m in report.values()))
    print(summary_table(report))
    base = report.get("exact")
    if base:
        for name, metrics in report.items():
            if name not in ("exact", "uncapped"):
                saved = 1 - metrics["prefill_tokens"] / max(base["prefill_tokens"], 1)
                print(f"{name}: {saved:+.1%} fewer prefill tokens than exact, "
                      f"wall time x{metrics['wall_s'] / base['wall_s']:.2f}")


if __name__ == "__main__":
    main()
