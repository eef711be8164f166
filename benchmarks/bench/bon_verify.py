"""Best-of-N measured: every verification mode on the same candidates (the program: ``programs.bon``).

Per round of problems (``chunk`` at a time, so the candidates' KV is still cached when they are
verified): the candidates are generated once, concurrently, then verified in every requested
mode on those same candidates: ``"full"`` (every candidate scored at full depth, SGLang's own
forward: the reference decision and the cost baseline) and ``"cgee"`` (skip + early exit). A
mode's verification time is the wall time of its phase (the round's problems verified eight at
a time, each as one batched request of its N candidates), summed over rounds. Neither mode inserts
its verification prompts into the radix cache, so the phases cannot serve one another.

``measure(backend, dataset, limit)`` returns one plain dict per (dataset, mode), with the CGEE
error of each mode against the full-depth decision and its one-sided 95% Clopper-Pearson bound.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from benchmarks.bench.stats import clopper_pearson_upper95, wilson_ci95
from programs.bon import candidate_tokens, sample_candidates, verify_all
from programs.datasets import Problem, load
from programs.sampling import SamplingConfig
from rksc_sgl.adaptive import StopRule
from rksc_sgl.cgee import Candidate, CgeeThresholds, VerifyResult
from rksc_sgl.counters import TokenCounters


@dataclasses.dataclass(frozen=True)
class BonResult:
    problem: Problem
    candidates: tuple[Candidate, ...]
    verdicts: dict[str, VerifyResult]  # by mode

    def correct(self, mode: str) -> bool:
        return self.verdicts[mode].answer == self.problem.answer

    def cgee_error(self, mode: str) -> bool:
        """The mode's decision differs from the full-depth verifier's."""
        return self.verdicts[mode].decision != self.verdicts["full"].decision


def solve_batch(problems: list[Problem], config: SamplingConfig, backend, *,
                modes: dict[str, CgeeThresholds | None] | None = None, chunk: int = 16,
                exemplars: tuple[Problem, ...] = (), lens: bool = False,
                repeats: int = 1, rule: StopRule | None = None
                ) -> tuple[list[BonResult], dict[str, float], dict[str, TokenCounters]]:
    """Best-of-N on every problem in every mode; also the verification wall time per mode and the
    tokens its verification phases sent (every run of them), apart from candidate generation.

    ``modes`` maps a name to CGEE thresholds, or to None for full depth; ``"full"`` is required
    (default: ``{"full": None, "cgee": the server's thresholds}``).

    Each round's verification phases run ``repeats`` times in alternating mode order (the
    machine is shared: its timings are noisy); a round counts its median per mode. ``lens`` asks
    the full-depth pass for every layer's lens diagnostics (calibration reads them). ``rule``: a
    stop rule for the sampling; a vote it decided skips verification in every mode.
    """
    modes = dict(modes) if modes is not None else {"full": None, "cgee": CgeeThresholds.of_server(backend)}
    if modes.get("full", 0) is not None:
        raise ValueError("modes must map 'full' to None: CGEE error is measured against it")
    names = list(modes)
    results: list[BonResult] = []
    verify_s = {m: 0.0 for m in modes}
    verify_tokens = {m: TokenCounters() for m in modes}
    for first in range(0, len(problems), chunk):
        part = problems[first:first + chunk]
        candidate_sets = sample_candidates(part, config, backend, first_index=first, exemplars=exemplars, rule=rule)
        by_mode, seconds = {}, {m: [] for m in modes}
        for r in range(repeats):
            for i in range(len(names)):
                mode = names[(i + r + first // chunk) % len(names)]  # rotate who goes first
                before = backend.counters_snapshot()
                verdicts, s = verify_all(backend, candidate_sets, modes[mode], lens=lens and mode == "full",
                                         rule=rule)
                verify_tokens[mode] = verify_tokens[mode] + (backend.counters_snapshot() - before)
                by_mode.setdefault(mode, verdicts)
                seconds[mode].append(s)
        for mode in modes:
            verify_s[mode] += statistics.median(seconds[mode])
        for j, problem in enumerate(part):
            results.append(BonResult(problem, candidate_sets[j], {m: by_mode[m][j] for m in modes}))
    return results, verify_s, verify_tokens


def summarize(results: list[BonResult], verify_s: dict[str, float], dataset: str) -> list[dict[str, Any]]:
    """One plain dict per mode (keys as ``benchmarks.bench`` reads them: ``cgee_*``)."""
    n = len(results)
    depth = max((e for r in results for e in (r.verdicts["full"].exit_layers or ()) if e), default=None)
    rows = []
    for mode, seconds in verify_s.items():
        verdicts = [r.verdicts[mode] for r in results]
        verified = [v for v in verdicts if not v.skipped]
        exits = [e for v in verified for e in (v.exit_layers or ()) if e is not None]
        runs = [e for v in verified for e in (v.layers_run or ()) if e is not None]
        # Decoder-layer work per problem relative to full depth (0 when skipped): the wall-time
        # ratio's noise-free counterpart, ignoring what does not scale with layers.
        work = [0.0 if v.skipped else statistics.mean(v.layers_run) / depth for v in verdicts
                if v.skipped or (depth and v.layers_run and None not in v.layers_run)]
        errors = sum(r.cgee_error(mode) for r in results)
        correct = sum(r.correct(mode) for r in results)
        rows.append({
            "workload": "bon-verify", "dataset": dataset, "mode": mode, "n_problems": n,
            "n_candidates": len(results[0].candidates) if results else 0,
            "accuracy": round(correct / n, 4) if n else None, "accuracy_ci95": wilson_ci95(correct, n),
            "cgee_skip_rate": round(sum(v.skip_reason == "cgee" for v in verdicts) / n, 4) if n else None,
            "vote_skip_rate": round(sum(v.skip_reason == "vote" for v in verdicts) / n, 4) if n else None,
            "cgee_mean_exit_layer": round(statistics.mean(exits), 2) if exits else None,
            "cgee_mean_layers_run": round(statistics.mean(runs), 2) if runs else None,
            "layer_work_vs_full": round(statistics.mean(work), 4) if work and len(work) == n else None,
            "cgee_error": round(errors / n, 4) if n else None,
            "cgee_errors": errors,
            "cgee_error_ub95": clopper_pearson_upper95(errors, n),
            "cgee_errors_when_skipped": sum(r.cgee_error(mode) for r in results if r.verdicts[mode].skipped),
            "verify_wall_s": round(seconds, 3),
            "verify_time_ratio_vs_full": round(seconds / verify_s["full"], 3) if verify_s.get("full") else None,
            "verify_requests": len(verified),
        })
    return rows


def measure(backend, dataset: str, limit: int, *, num_candidates: int = 4, max_new_tokens: int | None = None,
            temperature: float = 0.7, seed: int = 0, thresholds: CgeeThresholds | None = None,
            variants: dict[str, CgeeThresholds] | None = None, chunk: int = 16,
            repeats: int = 2) -> list[dict[str, Any]]:
    """Best-of-N with verification on the first ``limit`` problems of ``dataset``: modes "full",
    "cgee" (``thresholds``, default the server's) and one CGEE mode per entry of ``variants``."""
    problems = load(dataset, limit)
    tokens = max_new_tokens or candidate_tokens(dataset)
    config = SamplingConfig(num_candidates, tokens, temperature, seed)
    modes = {"full": None, "cgee": thresholds or CgeeThresholds.of_server(backend), **(variants or {})}
    results, verify_s, _ = solve_batch(problems, config, backend, modes=modes, chunk=chunk, repeats=repeats)
    return [{**row, "thresholds": dataclasses.asdict(modes[row["mode"]]) if modes[row["mode"]] else None}
            for row in summarize(results, verify_s, dataset)]


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json
    import os
    import sys

    p = argparse.ArgumentParser(prog="python -m benchmarks.bon_verify", description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default="gsm8k,arc-challenge,mmlu-stem,gpqa")
    p.add_argument("--limit", type=int, default=50, help="first problems of each dataset (the evaluation split)")
    p.add_argument("--num-candidates", type=int, default=4)
    p.add_argument("--thresholds", default=None,
                   help="a calibrate_cgee JSON file, its per-dataset entries where it has them (default: RkscConfig's)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=TAU,MARGIN,THETA,EPS,MIN_LAYER",
                   help="an extra CGEE mode with these thresholds (repeatable)")
    p.add_argument("--chunk", type=int, default=16, help="problems generated and verified per round")
    p.add_argument("--repeats", type=int, default=2, help="verification phases per round and mode (median)")
    p.add_argument("--out", default="benchmarks/results/bon_verify.jsonl")
    args = p.parse_args(argv)
    names = [x for x in args.datasets.split(",") if x]
    thresholds = {name: CgeeThresholds.load(args.thresholds, name) if args.thresholds else None
                  for name in names}
    variants = {}
    for spec in args.variant:
        name, _, values = spec.partition("=")
        tau, margin, theta, eps, min_layer = values.split(",")
        variants[name] = CgeeThresholds(float(tau), float(margin), float(theta), float(eps), int(min_layer))

    from rksc_sgl.engine import launch_engine
    from rksc_sgl.engine_endpoint import RkscEngineEndpoint

    command = "python -m benchmarks.bon_verify " + " ".join(sys.argv[1:] if argv is None else argv)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    backend = RkscEngineEndpoint(launch_engine(log_level="error"))
    rows = []
    try:
        for name in names:
            new_rows = measure(backend, name, args.limit, num_candidates=args.num_candidates,
                               thresholds=thresholds[name], variants=variants, chunk=args.chunk, repeats=args.repeats)
            with open(args.out, "a") as f:  # per dataset: a long run keeps what it finished
                for row in new_rows:
                    f.write(json.dumps({**row, "command": command}) + "\n")
            rows += new_rows
            print(f"{name}: done", file=sys.stderr)
    finally:
        backend.shutdown()
    head = f"{'dataset':14} {'mode':8} {'n':>4} {'skip':>6} {'exit l':>6} {'run l':>6} {'verify s':>9} {'x full':>7} {'work':>5} {'err':>4} {'err ub95':>8} {'acc':>5}"
    print("\n" + head + "\n" + "-" * len(head))
    fmt = lambda v, f: "-" if v is None else format(v, f)
    for r in rows:
        print(f"{r['dataset']:14} {r['mode']:8} {r['n_problems']:>4} {fmt(r['cgee_skip_rate'], '>6.2f')} "
              f"{fmt(r['cgee_mean_exit_layer'], '>6.1f')} {fmt(r['cgee_mean_layers_run'], '>6.1f')} "
              f"{r['verify_wall_s']:>9.2f} {fmt(r['verify_time_ratio_vs_full'], '>7.2f')} "
              f"{fmt(r['layer_work_vs_full'], '>5.2f')} {r['cgee_errors']:>4} "
              f"{fmt(r['cgee_error_ub95'], '>8.3f')} {fmt(r['accuracy'], '>5.2f')}")


if __name__ == "__main__":
    main()
