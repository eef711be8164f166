"""``make demo``: self-consistency on a few GSM8K problems, in-process on the CPU, with SGLang's
radix cache off and then on: the same seeded branches, so the same answers, and how much faster.

Starts the SGLang engine with the default model twice (cache off, cache on), runs N-branch
self-consistency through the frontend language (``programs.sc``) with the same per-branch seeds,
and prints each problem's branch answers and vote in both runs, whether every branch drew the
same text, the speed-up and the tokens the cache served, then where to go next.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import warnings

from programs.datasets import DATASETS, load
from programs.sampling import SamplingConfig

NEXT_STEPS = """\
next:
  python -m rksc_sgl.launch_server --port 30000 --rsbcm    # the same runtime as an HTTP server (OpenAI API too)
  python -m benchmarks.bench --workload bon-verify --limit 5 --modes no-cache,exact,rksc   # a small paper table
  README.md "Using it" (write @sgl.function programs); docs/architecture.md (where each mechanism lives)"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = SamplingConfig()
    p = argparse.ArgumentParser(prog="python -m programs.demo", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="gsm8k", choices=DATASETS)
    p.add_argument("--limit", type=int, default=4, help="number of problems (default: %(default)s)")
    p.add_argument("--num-branches", type=int, default=d.num_branches, help="(default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="(default: %(default)s)")
    p.add_argument("--temperature", type=float, default=d.temperature, help="(default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="run seed of every branch's sampling seed")
    p.add_argument("--model-path", default=None, help="local HF folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--verbose", action="store_true", help="keep SGLang's and third-party warnings")
    args = p.parse_args(argv)
    if args.limit < 1:
        p.error(f"--limit must be >= 1, got {args.limit}")
    try:
        args.config = SamplingConfig(args.num_branches, args.max_new_tokens, args.temperature, args.seed)
    except ValueError as e:
        p.error(str(e))
    return args


def quiet_third_parties() -> None:
    """Hide warnings that say nothing to a demo's reader (CUDA-only quantisation notes, Triton on
    CPU, asyncio's "Task was destroyed" at exit), here and in the engine's spawned processes
    (which inherit ``PYTHONWARNINGS``). Our own code is not touched. SGLang's one-line
    weight-loading bar still prints: its scheduler writes it to the terminal itself."""
    warnings.filterwarnings("ignore")
    os.environ["PYTHONWARNINGS"] = "ignore"
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)


def run_once(problems, args, *, cache: bool):
    """Start an engine (radix cache on or off), run self-consistency, shut it down."""
    from programs.sc import solve_batch
    from rksc_sgl.engine import launch_engine
    from rksc_sgl.frontend import EngineBackend

    t0 = time.perf_counter()
    backend = EngineBackend(launch_engine(args.model_path, log_level="error", disable_radix_cache=not cache))
    startup_s = time.perf_counter() - t0
    print(f"radix cache {'on ' if cache else 'off'} (engine ready in {startup_s:.1f} s):", flush=True)
    try:
        t1 = time.perf_counter()
        results = solve_batch(problems, args.config, backend, progress_bar=True)
        run_s = time.perf_counter() - t1
        counters = backend.reset_counters()
    finally:
        backend.shutdown()
    return results, run_s, counters


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.verbose:
        quiet_third_parties()
    problems = load(args.dataset, limit=args.limit)
    c = args.config
    print(f"self-consistency: {len(problems)} {args.dataset} problems x {c.num_branches} seeded branches "
          f"({c.max_new_tokens} new tokens, T={c.temperature}), in-process on the CPU")
    off, off_s, _ = run_once(problems, args, cache=False)
    on, on_s, counters = run_once(problems, args, cache=True)

    print(f"\n{'problem':10} {'gold':>6}  branch answers -> vote (cache off | cache on)")
    for a, b in zip(off, on):
        show = lambda r: f"[{', '.join(str(x.answer) for x in r.branches)}] -> {r.answer}"  # noqa: E731
        print(f"{a.problem.id:10} {a.problem.answer:>6}  {show(a)} | {show(b)}")
    pairs = [(x, y) for a, b in zip(off, on) for x, y in zip(a.branches, b.branches)]
    same_text = sum(x.text == y.text for x, y in pairs)
    same_votes = sum(a.answer == b.answer for a, b in zip(off, on))
    correct = sum(r.correct for r in on)
    print(f"\nsame branch text with the cache off and on: {same_text}/{len(pairs)}; same votes: "
          f"{same_votes}/{len(on)} (each branch has its own seed; see radix_ext/sampler.py)")
    print(f"radix cache on: {off_s / on_s:.1f}x faster ({on_s:.1f} s vs {off_s:.1f} s), {counters.cached_tokens} of "
          f"{counters.prompt_tokens} prompt tokens served from the cache")
    print(f"accuracy {correct}/{len(on)} (a 135M model: the demo shows the mechanics, not the model's skill)\n")
    print(NEXT_STEPS)


if __name__ == "__main__":
    main()
