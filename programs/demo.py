"""``make demo``: stock SGLang and rksc side by side, on workloads where a mechanism acts.

Two in-process engines with the same model and KV pool, run one after the other on the same
problems and seeds: ``exact`` (stock SGLang's radix cache, LRU) and ``rksc`` (ASKS and RSBCM on).
Each runs

* paraphrase self-consistency (``programs.paraphrase_sc``): every branch opens with its own
  wording of the system message, so exact caching recomputes each branch's prompt; ASKS blend lets
  a branch keep its wording and reuse the KV of the shared tail computed after branch 0's, K
  re-rotated and a selected share recomputed, and reports what it reused;
* self-consistency as one ``n = 16`` request per MMLU-STEM problem (``programs.sc.
  solve_as_one_request``), all problems at once: ``exact`` samples every child; ``rksc`` carries a
  group policy (Adaptive-Consistency, ``beta:0.9``), so the scheduler stops a problem's remaining
  children once the vote over its finished ones is decided. The children sample with the same
  seeds in both engines, so the vote is compared with the full-16 vote;
* tree of thoughts (``programs.tot``, only with ``--tot-problems N``, best with ``--max-total-tokens
  1100``: at the demo's size RSBCM and LRU evict the same and the workload adds half a minute) with
  the pool smaller than the tree, branch scores reported: RSBCM evicts deep, low-scoring thoughts
  first, LRU whatever is oldest;

then, on the ``rksc`` engine, best-of-N with the verifier (``benchmarks.bon_verify``): the same
candidates verified at full depth and with CGEE (skip when confidently ahead, early exit), and
CGEE's decisions compared with full depth's. Every speed-up is printed beside its agreement or
accuracy delta.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import time
import warnings

from programs.sampling import SamplingConfig

SC_SHOTS = 3  # solved exemplars after each paraphrase: the prompt tail ASKS lets branches share
VOTE = "self-consistency, n-sample requests"
VOTE_TOKENS = 48  # per child: MMLU-STEM's short "The answer is X." answers (docs/benchmarks-adaptive.md)
NEXT_STEPS = """\
next:
  python -m rksc_sgl.launch_server --port 30000 --rsbcm --asks   # the same runtime as an HTTP server
  python -m benchmarks.bench --workload paraphrase-sc --limit 5 --modes exact,asks-only   # a small benchmark
  docs/benchmarks.md (every measurement and its command); docs/mechanisms.md (what each mechanism asks of a program)"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m programs.demo", description=__doc__.splitlines()[0])
    p.add_argument("--sc-problems", type=int, default=1, help="paraphrase self-consistency problems (default: %(default)s)")
    p.add_argument("--branches", type=int, default=4, help="branches per paraphrase problem (default: %(default)s)")
    p.add_argument("--vote-problems", type=int, default=3,
                   help="self-consistency problems sent as one n-sample request each, MMLU-STEM (default: %(default)s)")
    p.add_argument("--vote-branches", type=int, default=16, help="n of each of those requests (default: %(default)s)")
    p.add_argument("--stop-rule", default="beta:0.9",
                   help="rksc's group policy on them: esc:W or beta:C[:W] (default: %(default)s, chosen on held-apart "
                        "MMLU-STEM problems: docs/benchmarks-adaptive.md)")
    p.add_argument("--tot-problems", type=int, default=0,
                   help="tree-of-thoughts problems, RSBCM against LRU (default: %(default)s, not run)")
    p.add_argument("--bon-problems", type=int, default=6, help="best-of-N problems, MMLU-STEM (default: %(default)s)")
    p.add_argument("--max-total-tokens", type=int, default=8192,
                   help="KV pool of both engines, in tokens (default: %(default)s; 1100 puts tree of thoughts under "
                        "pressure)")
    from rksc_sgl.config import CPU_LINEAR_DTYPES, RkscConfig

    p.add_argument("--cpu-linear-dtype", default=RkscConfig().cpu_linear_dtype, choices=CPU_LINEAR_DTYPES,
                   help="both engines' linears on the CPU (default: %(default)s; int8 needs AVX-512 VNNI)")
    p.add_argument("--seed", type=int, default=0, help="run seed of every branch's sampling seed")
    p.add_argument("--model-path", default=None, help="local HF folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--verbose", action="store_true", help="keep SGLang's and third-party warnings")
    args = p.parse_args(argv)
    if args.tot_problems < 0:
        p.error(f"--tot-problems must be >= 0 (0: not run), got {args.tot_problems}")
    for flag in ("sc_problems", "branches", "bon_problems", "vote_problems", "vote_branches"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.branches < 2:
        p.error(f"--branches must be >= 2 (branch 0 is the others' donor), got {args.branches}")
    from rksc_sgl.adaptive import StopRule

    try:
        args.rule = StopRule.parse(args.stop_rule)
    except ValueError as e:
        p.error(f"--stop-rule: {e}")
    if args.rule.name == "none":
        p.error("--stop-rule: give esc:W or beta:C[:W]; none stops nothing")
    if args.max_total_tokens < 1024:
        p.error(f"--max-total-tokens must be >= 1024 (a branch's prompt, the tree's shared part and the "
                f"warm-up), got {args.max_total_tokens}")
    return args


def quiet_third_parties() -> None:
    """Hide warnings that say nothing to a demo's reader (CUDA-only quantisation notes, Triton on
    CPU, asyncio's "Task was destroyed" at exit), here and in the engine's spawned processes
    (which inherit ``PYTHONWARNINGS``). SGLang's one-line weight-loading bar still prints."""
    warnings.filterwarnings("ignore")
    os.environ["PYTHONWARNINGS"] = "ignore"
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)


@dataclasses.dataclass
class Timed:
    results: list
    wall_s: float
    prefill_tokens: int


def timed(backend, run) -> Timed:
    """``run()`` from an empty cache, with its wall time and the prompt tokens it computed."""
    backend.flush_cache()
    backend.reset_counters()
    start = time.perf_counter()
    results = run()
    wall_s = time.perf_counter() - start
    return Timed(results, wall_s, backend.reset_counters().prefill_tokens)


def run_engine(name: str, rksc, workloads: dict, args) -> dict[str, object]:
    """Start one engine, run every workload on it in turn, shut it down."""
    from rksc_sgl.engine import launch_engine
    from rksc_sgl.engine_endpoint import RkscEngineEndpoint

    start = time.perf_counter()
    engine = launch_engine(args.model_path, rksc=rksc, log_level="error", max_total_tokens=args.max_total_tokens)
    backend = RkscEngineEndpoint(engine)
    try:
        backend.run(engine.async_generate(prompt="Warm up.", sampling_params={"max_new_tokens": 2}))
        print(f"engine {name}: ready in {time.perf_counter() - start:.1f} s", flush=True)
        out = {}
        for label, run in workloads.items():
            out[label] = run(backend)
            print(f"  {label}: {out[label].wall_s:.1f} s", flush=True)
        return out
    finally:
        backend.shutdown()


def fraction(hits: int, n: int) -> str:
    return f"{hits}/{n}"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.verbose:
        quiet_third_parties()
    from benchmarks.bench.bon_verify import solve_batch as bon_batch, summarize
    from benchmarks.bench.workloads import EXEMPLAR_POOL
    from programs import paraphrase_sc, sc, tot
    from programs.bon import candidate_tokens
    from programs.datasets import load
    from rksc_sgl.config import RkscConfig
    from rksc_sgl.cgee import CgeeThresholds

    gsm8k = load("gsm8k")
    sc_problems, exemplar_pool = gsm8k[:args.sc_problems], tuple(gsm8k[-EXEMPLAR_POOL:])
    tot_problems = gsm8k[args.sc_problems:args.sc_problems + args.tot_problems]
    bon_problems = load("mmlu-stem", limit=args.bon_problems)
    mmlu = load("mmlu-stem", limit=SC_SHOTS + args.vote_problems)
    vote_exemplars, vote_problems = tuple(mmlu[:SC_SHOTS]), mmlu[SC_SHOTS:]
    vote_config = SamplingConfig(args.vote_branches, VOTE_TOKENS, 0.7, args.seed)
    # Short answers after 3 shared exemplars: the prompt, which ASKS shares, is most of the work.
    sc_config = SamplingConfig(args.branches, 16, 0.7, args.seed)
    tot_config = tot.TotConfig(seed=args.seed)
    bon_config = SamplingConfig(4, candidate_tokens("mmlu-stem"), 0.7, args.seed)

    workloads = {
        "paraphrase self-consistency": lambda b: timed(b, lambda: paraphrase_sc.solve_batch(
            sc_problems, exemplar_pool, SC_SHOTS, sc_config, b, max_concurrency=1)),
    }

    def vote(rule):
        return {VOTE: lambda b: timed(b, lambda: sc.solve_as_one_request(vote_problems, vote_config, b,
                                                                           exemplars=vote_exemplars, rule=rule))}
    if tot_problems:
        workloads["tree of thoughts"] = lambda b: timed(b, lambda: tot.solve_batch(tot_problems, tot_config, b))
    print(f"stock SGLang (exact) and rksc side by side, in-process on the CPU, KV pool {args.max_total_tokens} "
          f"tokens in both engines:\n  paraphrase self-consistency: {len(sc_problems)} GSM8K problems x {args.branches} branches, each "
          f"branch its own wording of the system message\n"
          + (f"  tree of thoughts: {len(tot_problems)} GSM8K problems at once, thoughts scored by the model\n"
             if tot_problems else "")
          + f"  self-consistency: {len(vote_problems)} MMLU-STEM problems, one n={args.vote_branches} request each, "
            f"all at once; rksc's carry the group policy {args.stop_rule}\n"
          + f"  best-of-4 with the verifier: {len(bon_problems)} MMLU-STEM problems\n",
          flush=True)
    linears = args.cpu_linear_dtype
    exact = run_engine("exact (stock radix cache, LRU)", RkscConfig(cpu_linear_dtype=linears),
                       {**workloads, **vote(None)}, args)
    # Every candidate verified at full depth and with CGEE, twice, in both orders (under the small pool
    # the phases may not find the same candidates cached): the median of two counts.
    bon = {"best-of-4 with the verifier": lambda b: timed(b, lambda: bon_batch(
        bon_problems, bon_config, b, modes={"full": None, "cgee": CgeeThresholds.from_config()}, repeats=2))}
    ours = run_engine("rksc (ASKS, RSBCM, CGEE, early stop)", RkscConfig(asks=True, rsbcm=True, cpu_linear_dtype=linears),
                      {**workloads, **vote(args.rule), **bon}, args)
    print()
    bon_results, verify_s, verify_tokens = ours["best-of-4 with the verifier"].results
    report(exact, ours, summarize(bon_results, verify_s, "mmlu-stem"),
           {mode: counters.prefill_tokens for mode, counters in verify_tokens.items()})
    print()
    print(NEXT_STEPS)


def report(exact: dict, ours: dict, bon_rows: list[dict], verify_prefill: dict[str, int] | None = None) -> None:
    """The side-by-side table, then what each mechanism did (``verify_prefill``: the prompt tokens
    each verification mode computed, over its phases)."""
    sc_e, sc_o = exact["paraphrase self-consistency"], ours["paraphrase self-consistency"]
    tot_e, tot_o = exact.get("tree of thoughts"), ours.get("tree of thoughts")  # only with --tot-problems
    full, cgee = (next(r for r in bon_rows if r["mode"] == m) for m in ("full", "cgee"))

    def branches(timed_run):
        return [b for r in timed_run.results for b in r.branches]

    sc_votes = sum(a.answer == b.answer for a, b in zip(sc_e.results, sc_o.results))
    sc_agree = sum(a.answer == b.answer for a, b in zip(branches(sc_e), branches(sc_o)))
    n_sc, n_bon = len(sc_e.results), full["n_problems"]
    rows = [
        ("paraphrase self-consistency", "ASKS", "exact", sc_e.wall_s, sc_o.wall_s,
         f"votes agree {fraction(sc_votes, n_sc)}, branch answers {fraction(sc_agree, len(branches(sc_e)))}; "
         f"correct {sum(r.correct for r in sc_o.results)} vs {sum(r.correct for r in sc_e.results)}"),
        ("best-of-4, verification", "CGEE", "full depth", full["verify_wall_s"], cgee["verify_wall_s"],
         f"decisions differ from full depth {fraction(cgee['cgee_errors'], n_bon)}; correct "
         f"{round(cgee['accuracy'] * n_bon)} vs {round(full['accuracy'] * n_bon)}"),
    ]
    vote_e, vote_o = exact[VOTE].results, ours[VOTE].results
    n_vote, n_children = len(vote_e), sum(len(r.answers) for r in vote_e)
    tokens_e, tokens_o = (sum(r.completion_tokens for r in rs) for rs in (vote_e, vote_o))
    rows.insert(1, (VOTE, "early stop", "exact", exact[VOTE].wall_s, ours[VOTE].wall_s,
                    f"votes agree with the full vote {fraction(sum(a.answer == b.answer for a, b in zip(vote_e, vote_o)), n_vote)}; "
                    f"correct {sum(r.correct for r in vote_o)} vs {sum(r.correct for r in vote_e)}"))
    if tot_e is not None:
        tot_agree = sum(a.answer == b.answer for a, b in zip(tot_e.results, tot_o.results))
        rows.insert(1, ("tree of thoughts, pool < tree", "RSBCM", "exact", tot_e.wall_s, tot_o.wall_s,
                        f"answers agree {fraction(tot_agree, len(tot_e.results))}; correct "
                        f"{sum(r.correct for r in tot_o.results)} vs {sum(r.correct for r in tot_e.results)}"))
    print(f"{'workload':36} {'mechanism':10} {'baseline':10} {'base s':>7} {'rksc s':>7} {'speed-up':>8}  "
          "agreement / accuracy (rksc vs baseline)")
    for label, mechanism, baseline, base_s, our_s, quality in rows:
        print(f"{label:36} {mechanism:10} {baseline:10} {base_s:7.1f} {our_s:7.1f} {base_s / our_s:7.2f}x  {quality}")

    reports = [b.asks for b in branches(sc_o) if b.asks and b.asks.get("outcome") == "blended"]
    same = sum(a.text == b.text for a, b in zip(branches(sc_e), branches(sc_o)))
    print(f"\nASKS (blend): {len(reports)} of {len(branches(sc_o))} branches kept their own wording and reused the KV "
          f"of the shared tail computed after branch 0's"
          + (f" ({sum(x['reused_tokens'] for x in reports):,} tokens' KV re-rotated and reused, "
             f"{sum(x['recomputed_tokens'] for x in reports):,} recomputed, share {reports[0]['recompute']})"
             if reports else "")
          + f"; prefill {sc_o.prefill_tokens:,} vs {sc_e.prefill_tokens:,} tokens; "
            f"branch texts identical to exact {fraction(same, len(branches(sc_e)))}")
    print(f"early stop: the scheduler stopped {sum(r.stopped for r in vote_o)} of {n_children} children once their "
          f"problem's vote was decided; completion tokens {tokens_o:,} vs {tokens_e:,}")
    if tot_e is not None:
        print(f"RSBCM: prefill {tot_o.prefill_tokens:,} vs {tot_e.prefill_tokens:,} tokens under the same pool")
    exit_layer = cgee["cgee_mean_exit_layer"]
    print(f"CGEE: skipped {round(cgee['cgee_skip_rate'] * n_bon)} of {n_bon} verifications"
          + (f"; the others exited at layer {exit_layer:.0f} on average (SmolLM2-135M's logit lens settles only "
             "at its last layer, 30)" if exit_layer is not None else "")
          + (f"; verification prefill {verify_prefill['cgee']:,} vs {verify_prefill['full']:,} tokens at full depth"
             if verify_prefill else ""))
    print("(a 135M model: the demo shows the mechanics, not the model's skill)")


if __name__ == "__main__":
    main()
