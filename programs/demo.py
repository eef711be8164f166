"""``make demo``: self-consistency on a few GSM8K problems, in-process, on the CPU.

Starts the SGLang engine with the default model, runs N-branch self-consistency through the
frontend language (``programs.sc``), and prints each problem's branch answers, the vote, the gold
answer, then accuracy, token counts and timings.
"""

from __future__ import annotations

import argparse
import time

from programs.datasets import DATASETS, load
from programs.sc import SamplingConfig, solve_batch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m programs.demo", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="gsm8k", choices=DATASETS)
    p.add_argument("--limit", type=int, default=4, help="number of problems")
    p.add_argument("--num-branches", type=int, default=SamplingConfig.num_branches)
    p.add_argument("--max-new-tokens", type=int, default=SamplingConfig.max_new_tokens)
    p.add_argument("--temperature", type=float, default=SamplingConfig.temperature)
    p.add_argument("--model-path", default=None, help="local HF folder (default: SmolLM2-135M-Instruct)")
    args = p.parse_args(argv)
    if args.limit < 1:
        p.error(f"--limit must be >= 1, got {args.limit}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        config = SamplingConfig(args.num_branches, args.max_new_tokens, args.temperature)
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    problems = load(args.dataset, limit=args.limit)

    from rksc_sgl.engine import launch_engine
    from rksc_sgl.frontend import EngineBackend

    t0 = time.perf_counter()
    backend = EngineBackend(launch_engine(args.model_path, log_level="error"))
    startup_s = time.perf_counter() - t0
    print(f"engine ready in {startup_s:.1f} s ({backend.model_info['model_path']})")
    try:
        t1 = time.perf_counter()
        results = solve_batch(problems, config, backend)
        run_s = time.perf_counter() - t1
        counters = backend.reset_counters()
    finally:
        backend.shutdown()

    for r in results:
        mark = "ok " if r.correct else "   "
        branch_answers = ", ".join(str(b.answer) for b in r.branches)
        print(f"{mark} {r.problem.id}: branches [{branch_answers}] -> vote {r.answer!r}, gold {r.problem.answer!r}")
    n_correct = sum(r.correct for r in results)
    print(f"\naccuracy {n_correct}/{len(results)} = {n_correct / len(results):.0%} "
          f"({config.num_branches} branches, {config.max_new_tokens} max new tokens, T={config.temperature})")
    print(f"tokens: {counters.prompt_tokens} prompt ({counters.cached_tokens} from the radix cache, "
          f"{counters.prefill_tokens} prefilled), {counters.completion_tokens} generated")
    print(f"time: start-up {startup_s:.1f} s, self-consistency {run_s:.1f} s "
          f"({counters.completion_tokens / run_s:.1f} generated tok/s)")


if __name__ == "__main__":
    main()
