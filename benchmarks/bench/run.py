"""``python -m benchmarks.bench``: the paper's table, every mode in one process run.

    python -m benchmarks.bench --workload sc --datasets gsm8k,arc-challenge,mmlu-stem,gpqa \\
        --limit 50 --modes no-cache,exact,rksc,rsbcm-only --repeats 1
    python -m benchmarks.bench --workload role-sc --limit 50 --modes exact,exact-reseed,asks-only \\
        --asks-recompute-sweep 0,0.15,1.0

Each repeat runs every mode, in an order that rotates between repeats (repeat r starts at mode
r mod M, recorded as ``mode_order``), so that drift over a long run falls on every mode alike;
each (repeat, mode) starts one engine, warms it up and runs the workload on every dataset (radix
cache flushed first). Wall time is the median over repeats. Every mode sees the same problems,
exemplars, seeds and model; CGEE modes' rows count their own tokens and time apart from the
untimed full-depth reference pass (``reference_*``). After all modes ran, speed-ups
against ``no-cache`` and ``exact`` and answer agreement against ``exact`` are computed, one JSON
line per (workload, dataset, mode) is appended to ``benchmarks/results/<workload>.jsonl`` and a
summary table is printed last. The ASKS workloads (``paraphrase-sc``, ``role-sc``, ``multi-doc``)
also compare every mode with ``exact`` branch by branch (``benchmarks.calibration.blend_quality``: first-token
KL, identical outputs, ROUGE-L; ``exact-reseed`` is the two-seed floor) and count the prefill
blend left uncomputed (``TokenCounters.blended_tokens``); ``--asks-recompute-sweep`` adds one blend
mode per recompute share. With ``exact`` in the run, every stop rule of
``benchmarks.bench.stop_replay.CURVE`` is replayed on exact's branches (the trade-off curve, written to
``<workload>_stop_curve.json``); ``adaptive`` rows compare the runtime's saving with the replay
of their own rule. Stop thresholds are chosen on other problems: ``--calibration-offset 20``
evaluates the 20 problems after a ``--limit 20`` run's. ``python -m benchmarks.plot`` draws the figures and
``python -m benchmarks.report`` writes the README's results section.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm

from benchmarks.bench import stats as st
from benchmarks.bench.modes import MODES, resolve_modes, sweep_modes
from programs.datasets import load
from benchmarks.bench.records import MODEL_NAME, append_jsonl, git_commit, machine
from benchmarks.bench.stop_replay import choose, curve, replay_group_stop, replay_rule, replay_trace_stop, trace_curve
from benchmarks.bench.workloads import WORKLOADS, BenchSettings, resolve_workload

RESULTS_DIR = Path("benchmarks/results")
ADAPTIVE_WORKLOADS = ("sc", "diverse-sc", "bon-verify")  # the workloads whose branches vote
GROUP_STOP_WORKLOADS = ("sc", "diverse-sc")  # ... and whose branches may finish out of index order


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = BenchSettings()
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="sc", help=f"{', '.join(WORKLOADS)} (default: %(default)s)")
    p.add_argument("--datasets", default=None,
                   help="comma-separated (default: the workload's: every voting dataset; role-sc coqa, multi-doc coqa-short)")
    p.add_argument("--modes", default="no-cache,exact,rksc",
                   help=f"comma-separated, from {', '.join(MODES)} (default: %(default)s)")
    p.add_argument("--asks-recompute-sweep", default=None,
                   help="ASKS workloads: also run blend once per comma-separated recompute share in [0, 1] (each "
                        "request asks for it), as modes asks-blend@<share>, e.g. 0,0.05,0.15,0.3,1.0")
    p.add_argument("--limit", type=int, default=20, help="problems per dataset (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per (dataset, mode); wall time is their median")
    p.add_argument("--seed", type=int, default=d.seed, help="sampling seed of the run (default: %(default)s)")
    p.add_argument("--num-branches", type=int, default=d.num_branches, help="forks per problem (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens,
                   help="per branch (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=d.temperature, help="(default: %(default)s)")
    p.add_argument("--shots", type=int, default=None,
                   help=f"held-out solved exemplars in front of every question (default: {d.shots}; "
                        "role-sc and multi-doc: 0, they use none)")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="problems (programs) in flight at once (default: all; bon-verify: 16)")
    p.add_argument("--cgee-thresholds", default=None,
                   help="CGEE modes: a calibrate_cgee JSON file, its per-dataset thresholds where it has them "
                        "(default: RkscConfig's pooled ones)")
    p.add_argument("--stop-rule", default=d.stop_rule,
                   help="adaptive mode: none, esc:W or beta:C[:W] (default: %(default)s)")
    p.add_argument("--trace-stop", type=float, default=None,
                   help="the *+trace modes: stop a branch once its window confidence falls below this threshold "
                        "(DeepConf online; choose it on held-apart problems from the curve's trace table)")
    p.add_argument("--calibration-offset", type=int, default=0,
                   help="skip this many problems after the exemplars, e.g. to choose stop thresholds on problems "
                        "held apart from a reported run (default: %(default)s)")
    p.add_argument("--model-path", default=None, help=f"local HF folder (default: {MODEL_NAME})")
    p.add_argument("--max-total-tokens", type=int, default=None, help="KV pool size (default: CPU default)")
    p.add_argument("--pool-fraction", type=float, default=None,
                   help="KV pool per dataset: this fraction of the dataset's working set (tree_tokens_after of "
                        "exact in --working-set-from); one engine per (mode, dataset)")
    p.add_argument("--working-set-from", type=Path, default=None,
                   help="results file of an uncapped run of the same workload, datasets and --limit")
    p.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    try:
        args.workload_obj = workload = resolve_workload(args.workload)
        args.mode_objs = resolve_modes(args.modes)
        if args.asks_recompute_sweep is not None:
            if not workload.branch_quality:
                raise ValueError(f"--asks-recompute-sweep: runs only with --workload "
                                 f"{', '.join(w.name for w in WORKLOADS.values() if w.branch_quality)}, "
                                 f"not {args.workload!r}")
            args.mode_objs += sweep_modes(args.asks_recompute_sweep)
        if len({m.name for m in args.mode_objs}) != len(args.mode_objs):
            raise ValueError(f"--modes: a mode is given twice in {args.modes!r}")
        if args.datasets is None:
            args.datasets = ",".join(workload.default_datasets or workload.datasets)
        if args.shots is None:
            args.shots = d.shots if workload.default_shots is None else workload.default_shots
        args.dataset_names = [x.strip() for x in args.datasets.split(",") if x.strip()]
        for name in args.dataset_names:
            if name not in workload.datasets:
                raise ValueError(f"--datasets: unknown dataset {name!r} for --workload {args.workload}; "
                                 f"valid: {', '.join(workload.datasets)}")
        for flag in ("limit", "repeats"):
            if getattr(args, flag) < 1:
                raise ValueError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
        if args.calibration_offset < 0:
            raise ValueError(f"--calibration-offset must be >= 0, got {args.calibration_offset}")
        if any(m.adaptive for m in args.mode_objs) and args.workload not in ADAPTIVE_WORKLOADS:
            raise ValueError(f"--modes: adaptive runs only with --workload {', '.join(ADAPTIVE_WORKLOADS)}, "
                             f"not {args.workload!r}")
        if any(m.trace_stop for m in args.mode_objs) and args.trace_stop is None:
            raise ValueError("--modes: the *+trace modes need --trace-stop T")
        if any(m.group_stop for m in args.mode_objs) and args.workload not in GROUP_STOP_WORKLOADS:
            raise ValueError(f"--modes: group-stop runs only with --workload {', '.join(GROUP_STOP_WORKLOADS)}, "
                             f"not {args.workload!r}")
        args.pool_tokens = pool_by_dataset(args) if args.pool_fraction is not None else None
        args.settings = BenchSettings(args.num_branches, args.max_new_tokens, args.temperature, args.seed, args.shots,
                                      args.max_concurrency, args.cgee_thresholds, args.stop_rule, args.trace_stop)
    except ValueError as e:
        p.error(str(e))
    return args


def pool_by_dataset(args) -> dict[str, int]:
    """KV pool per dataset: ``--pool-fraction`` of exact's ``tree_tokens_after`` in the latest run of
    ``--working-set-from`` (same workload and --limit); ValueError naming what is missing."""
    from benchmarks.bench.records import latest_run

    if not 0 < args.pool_fraction <= 1:
        raise ValueError(f"--pool-fraction must be in (0, 1], got {args.pool_fraction}")
    if args.working_set_from is None or args.max_total_tokens:
        raise ValueError("--pool-fraction needs --working-set-from and excludes --max-total-tokens")
    rows = {r["dataset"]: r for r in latest_run(args.working_set_from)
            if r["mode"] == "exact" and r["workload"] == args.workload}
    pools = {}
    for name in args.dataset_names:
        row = rows.get(name)
        if row is None or row["n_problems"] != args.limit or not row.get("tree_tokens_after"):
            raise ValueError(f"--working-set-from: no exact {args.workload} row for {name} with "
                             f"{args.limit} problems and tree_tokens_after in {args.working_set_from}")
        pools[name] = int(row["tree_tokens_after"] * args.pool_fraction)
    return pools


def split_problems(name: str, shots: int, limit: int, offset: int = 0):
    """The first ``shots`` problems are held out as exemplars; after ``offset`` more, the next
    ``limit`` are evaluated."""
    problems = load(name, limit=shots + offset + limit)
    return tuple(problems[:shots]), problems[shots + offset:]


def mode_order(modes: list, repeat: int) -> list:
    """The modes in the order repeat ``repeat`` runs them: starting at mode ``repeat mod M``, so
    that drift over a long run (a shared machine warming, other jobs) falls on every mode alike."""
    start = repeat % len(modes)
    return modes[start:] + modes[:start]


def run_mode(mode, args, data) -> dict[str, dict]:
    """One repeat of the workload on every dataset under ``mode``: one engine for all of them, or
    one per dataset when the pool is sized per dataset (``--pool-fraction``); raw results by dataset."""
    if args.pool_tokens is None:
        return run_engine(mode, args, data, args.max_total_tokens)
    raw = {}
    for name in data:
        raw.update(run_engine(mode, args, {name: data[name]}, args.pool_tokens[name]))
    return raw


def run_engine(mode, args, data, max_total_tokens: int | None) -> dict[str, dict]:
    """Start one engine for ``mode``, warm it up and run the workload once on every dataset of ``data``."""
    from rksc_sgl.engine import launch_engine
    from rksc_sgl.engine_endpoint import RkscEngineEndpoint

    workload, settings = args.workload_obj, args.settings
    if mode.seed_offset:  # exact-reseed: the same run under another seed base
        settings = dataclasses.replace(settings, seed=settings.seed + mode.seed_offset)
    overrides = mode.engine_overrides()
    if max_total_tokens:
        overrides["max_total_tokens"] = max_total_tokens
    backend = RkscEngineEndpoint(launch_engine(args.model_path, rksc=mode.rksc_config(), log_level="error",
                                               **overrides))
    raw = {}
    try:
        exemplars, problems = next(iter(data.values()))
        workload.run(problems[:2], backend, mode, settings, exemplars)  # warm-up
        for name, (exemplars, problems) in tqdm(data.items(), desc=f"{args.workload} / {mode.name}"):
            backend.flush_cache()
            evicted_before = backend.kv_pool()["evicted_tokens"]
            backend.reset_counters()
            t0 = time.perf_counter()
            run = workload.run(problems, backend, mode, settings, exemplars)
            wall = time.perf_counter() - t0 - run.reference_s
            counters = backend.reset_counters()
            if run.reference_tokens is not None:  # the mode's own work, apart from the reference pass
                counters = counters - run.reference_tokens
            pool = run.pool or backend.kv_pool()
            raw[name] = {"wall": wall, "run": run, "counters": counters, "reference": run.reference_tokens,
                         "evicted": pool["evicted_tokens"] - evicted_before, "pool": pool,
                         "max_total_tokens": max_total_tokens}
    finally:
        backend.shutdown()
    return raw


def run_all(args, data) -> tuple[dict[str, dict[str, dict]], list[list[str]]]:
    """Every repeat of every mode, the mode order rotating between repeats (``mode_order``); one
    engine per (repeat, mode). Raw results by mode and dataset (walls, counters, ... per repeat),
    and the order each repeat ran."""
    results = {m.name: {} for m in args.mode_objs}
    orders = []
    for repeat in range(args.repeats):
        order = mode_order(args.mode_objs, repeat)
        orders.append([m.name for m in order])
        for mode in order:
            for name, r in run_mode(mode, args, data).items():
                acc = results[mode.name].setdefault(name, {"walls": [], "counters": [], "references": [], "evicted": 0})
                acc["walls"].append(r["wall"])
                acc["counters"].append(r["counters"])
                acc["references"].append(r["reference"])
                acc["evicted"] += r["evicted"]
                acc.update(run=r["run"], pool=r["pool"], max_total_tokens=r["max_total_tokens"])
    return results, orders


def sum_counters(per_repeat: list):
    """The token counters of every repeat, added field by field (same type as each element)."""
    first = per_repeat[0]
    return type(first)(**{f.name: sum(getattr(c, f.name) for c in per_repeat) for f in dataclasses.fields(first)})


def build_rows(args, results, meta) -> list[dict]:
    from benchmarks.calibration.asks_quality import substitution_quality

    rows = []
    for name in args.dataset_names:
        by_mode = {m: results[m][name] for m in results}
        wall = {m: statistics.median(r["walls"]) for m, r in by_mode.items()}
        exact_run = by_mode["exact"]["run"] if "exact" in by_mode else None
        for mode in args.mode_objs:
            r = by_mode[mode.name]
            run, c = r["run"], sum_counters(r["counters"])
            n = len(run.correct)
            rows.append({
                "workload": args.workload, "dataset": name, "mode": mode.name,
                "mechanisms": sorted(mode.mechanisms), "n_problems": n, **meta,
                "wall_s": round(wall[mode.name], 3), "wall_s_samples": [round(w, 3) for w in r["walls"]],
                "speedup_vs_no_cache": st.ratio(wall.get("no-cache"), wall[mode.name]),
                "speedup_vs_exact": st.ratio(wall.get("exact"), wall[mode.name]),
                # Token counters are summed over the repeats; per repeat in *_per_repeat.
                "prefill_tokens": c.prefill_tokens, "cached_tokens": c.cached_tokens,
                "prefill_tokens_per_repeat": [x.prefill_tokens for x in r["counters"]],
                "prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                # CGEE modes: the untimed full-depth reference pass, counted apart (not in the above).
                "reference_prefill_tokens": (sum(x.prefill_tokens for x in r["references"])
                                             if r["references"][0] is not None else None),
                "reference_completion_tokens": (sum(x.completion_tokens for x in r["references"])
                                                if r["references"][0] is not None else None),
                "verify_prefill_tokens": run.stats.get("verify_prefill_tokens"),
                "reuse_rate": round(c.cached_tokens / c.prompt_tokens, 4) if c.prompt_tokens else None,
                "accuracy": round(sum(run.correct) / n, 4) if n else None,
                "accuracy_ci95": st.wilson_ci95(sum(run.correct), n),
                # Against exact, same seeds: the majority answers, then branch by branch (the branch's
                # extracted answer; its whole text identical). From the last repeat of each mode.
                "answer_agreement_vs_exact": st.agreement(run.answers, exact_run.answers) if exact_run else None,
                "branch_answer_agreement_vs_exact":
                    st.branch_agreement(run.branch_answers, exact_run.branch_answers, run.branch_indices)
                    if exact_run else None,
                "branch_text_agreement_vs_exact":
                    st.branch_agreement(run.branch_digests, exact_run.branch_digests, run.branch_indices)
                    if exact_run else None,
                "cgee_skip_rate": run.stats.get("cgee_skip_rate"),
                "cgee_mean_exit_layer": run.stats.get("cgee_mean_exit_layer"),
                "cgee_error": run.stats.get("cgee_error"), "cgee_errors": run.stats.get("cgee_errors"),
                "cgee_error_ub95": run.stats.get("cgee_error_ub95"),
                "cgee_verify_time_ratio": run.stats.get("cgee_verify_time_ratio"),
                "cgee_thresholds": run.stats.get("cgee_thresholds"),
                **{k: v for k, v in run.stats.items() if k.startswith("asks_")},
                # Adoption's own measures, over the branches that took a sibling's wording.
                **(substitution_quality(run.details, exact_run.details)
                   if mode.effective_asks_mode == "adopt" and run.details is not None and exact_run is not None
                   else {}),
                **blend_columns(args, mode, r, by_mode),
                "evictions": r["evicted"] if not mode.disable_radix_cache else None,
                "max_total_tokens": r["max_total_tokens"], "pool_tokens": r["pool"]["total"],
                # Tokens left in the radix tree after the last repeat: the run's KV working set when
                # nothing was evicted (what --max-total-tokens is set against to create pressure).
                "tree_tokens_after": r["pool"]["evictable"] if not mode.disable_radix_cache else None,
                "vote_skip_rate": run.stats.get("vote_skip_rate"),
                **adaptive_columns(mode, args, run, c, by_mode),
                "answers": run.answers, "branch_answers": run.branch_answers, "branch_tokens": run.branch_tokens,
                **({"branch_indices": run.branch_indices} if run.branch_indices else {}),
                **({"branch_conf_minima": run.branch_conf_minima}
                   if run.branch_conf_minima and mode.name == "exact" else {}),
                **({"branch_policy_answers": run.branch_policy_answers}
                   if run.branch_policy_answers and mode.name == "exact" else {}),
            })
    return rows


def blend_columns(args, mode, r, by_mode) -> dict:
    """The ASKS workloads' columns (``benchmarks.calibration.blend_quality``): the recompute share the mode's
    requests asked for, prefill really computed (``TokenCounters.prefill_tokens``: prompt - cached
    - blend's reused tokens; summed over repeats, and against exact's), and the mode's branches
    against exact's, same problems and seeds (from the last repeat)."""
    from benchmarks.calibration.blend_quality import branch_quality

    if not args.workload_obj.branch_quality:
        return {}
    computed = sum(c.prefill_tokens for c in r["counters"])
    exact = by_mode.get("exact")
    exact_computed = sum(c.prefill_tokens for c in exact["counters"]) if exact else None
    out = {"asks_mode": mode.effective_asks_mode, "asks_recompute_asked": mode.recompute,
           "seed_offset": mode.seed_offset or None,
           "prefill_tokens_computed": computed, "blended_tokens": sum(c.blended_tokens for c in r["counters"]),
           "prefill_computed_vs_exact": st.ratio(computed, exact_computed)}
    if exact is not None and mode.name != "exact" and r["run"].details is not None:
        out.update(branch_quality(r["run"].details, exact["run"].details))
    return out


def adaptive_columns(mode, args, run, counters, by_mode) -> dict:
    """Branches sampled against full N (for ``group-stop``: those that finished, the others were
    stopped); for the adaptive modes, completion tokens against ``exact`` and the runtime's savings
    beside the replay of the same rule, as the mode applies it, on exact's branches."""
    from rksc_sgl.adaptive import StopRule

    full = len(run.branch_answers) * args.num_branches
    sampled = sum(len(b) for b in run.branch_answers)
    out = {"stop_rule": args.stop_rule if mode.adaptive else None, "branches_sampled": sampled, "branches_full": full,
           **({"stop_applied_by": "scheduler" if mode.group_stop else "program rounds"} if mode.adaptive else {}),
           **({"trace_stop": args.trace_stop} if mode.trace_stop else {})}
    exact = by_mode.get("exact")
    if not mode.adaptive or exact is None:
        return out
    exact_tokens = sum_counters(exact["counters"]).completion_tokens
    rule, e = StopRule.parse(args.stop_rule), exact["run"]
    if mode.trace_stop:
        replayed = replay_trace_stop(rule, e.branch_answers, e.branch_tokens, e.branch_conf_minima, args.trace_stop,
                                     concurrent=mode.group_stop, branch_read=e.branch_policy_answers or None)
        replayed["branches_sampled"] = replayed["branches_voting"]
        replayed["sample_saving"] = round(1 - replayed["branches_voting"] / replayed["branches_full"], 4)
    else:
        replayed = (replay_group_stop(rule, e.branch_answers, e.branch_tokens, e.branch_policy_answers or None)
                    if mode.group_stop else replay_rule(rule, e.branch_answers, e.branch_tokens))
    return {**out,
            "completion_tokens_vs_exact": st.ratio(counters.completion_tokens, exact_tokens),
            "sample_saving": round(1 - sampled / full, 4) if full else None,
            "token_saving": round(1 - counters.completion_tokens / exact_tokens, 4) if exact_tokens else None,
            "replay_sample_saving": replayed["sample_saving"], "replay_token_saving": replayed["token_saving"],
            "replay_vote_agreement": replayed["vote_agreement"]}


def write_curve(args, rows, meta) -> Path | None:
    """The trade-off curve of every rule replayed on exact's branches, per dataset, with the
    thresholds that reach 95% vote agreement on these problems; None without an exact run. A
    dataset of an earlier run in the same file stays, with its own commit and command (so the
    datasets can be run one command at a time)."""
    exact = [r for r in rows if r["mode"] == "exact"]
    if not exact:
        return None
    suffix = f"_offset{args.calibration_offset}" if args.calibration_offset else ""
    out = args.output_dir / f"{args.workload}_stop_curve{suffix}.json"
    per_dataset = earlier_curves(out)
    for r in exact:
        points = curve(r["branch_answers"], r["branch_tokens"], branch_read=r.get("branch_policy_answers"))
        per_dataset[r["dataset"]] = {"points": points, "chosen_at_0.95": choose(points, 0.95),
                                     "commit": meta["commit"], "command": meta["command"], "n_problems": args.limit}
        if r.get("branch_conf_minima"):
            per_dataset[r["dataset"]]["trace_points"] = trace_curve(
                r["branch_answers"], r["branch_tokens"], r["branch_conf_minima"], args.stop_rule,
                branch_read=r.get("branch_policy_answers"))
    out.parent.mkdir(parents=True, exist_ok=True)
    keep = ("run_id", "model", "commit", "date", "machine", "seed", "settings", "command")
    out.write_text(json.dumps({**{k: meta[k] for k in keep}, "workload": args.workload,
                               "calibration_offset": args.calibration_offset, "n_problems": args.limit,
                               "num_branches": args.num_branches, "datasets": per_dataset}, indent=1) + "\n")
    return out


def earlier_curves(path: Path) -> dict:
    """The per-dataset entries of an existing curve file, each stamped with its run's commit,
    command and problem count where the file kept them only once."""
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    return {name: {"commit": old.get("commit"), "command": old.get("command"), "n_problems": old.get("n_problems"),
                   **entry} for name, entry in old.get("datasets", {}).items()}


def print_table(rows: list[dict]) -> None:
    head = (f"{'dataset':14} {'mode':15} {'wall s':>7} {'x no-cache':>10} {'x exact':>8} {'prefill':>8} {'reuse':>6} "
            f"{'acc':>6} {'acc 95% CI':>14} {'agree':>6} {'br.agree':>8} {'evicted':>8}")
    print("\n" + head + "\n" + "-" * len(head))
    fmt = lambda v, f: "-" if v is None else format(v, f)
    for r in rows:
        ci = "-" if r["accuracy_ci95"] is None else f"[{r['accuracy_ci95'][0]:.2f}, {r['accuracy_ci95'][1]:.2f}]"
        print(f"{r['dataset']:14} {r['mode']:15} {r['wall_s']:>7.1f} {fmt(r['speedup_vs_no_cache'], '>10.2f')} "
              f"{fmt(r['speedup_vs_exact'], '>8.2f')} {r['prefill_tokens']:>8} {fmt(r['reuse_rate'], '>6.2f')} "
              f"{fmt(r['accuracy'], '>6.2f')} {ci:>14} {fmt(r['answer_agreement_vs_exact'], '>6.2f')} "
              f"{fmt(r['branch_text_agreement_vs_exact'], '>8.2f')} {fmt(r['evictions'], '>8')}")


def print_blend(rows: list[dict]) -> None:
    """The ASKS workloads' quality against exact (``benchmarks.calibration.blend_quality``)."""
    mine = [r for r in rows if "prefill_tokens_computed" in r]
    if not mine:
        return
    head = (f"{'dataset':11} {'mode':15} {'x exact':>7} {'computed':>9} {'x exact':>7} {'reused':>7} {'recomp':>7} "
            f"{'KL med':>7} {'KL p90':>7} {'ident':>6} {'ROUGE-L':>7} {'vote':>5} {'acc':>5}")
    print("\n" + head + "\n" + "-" * len(head))
    fmt = lambda v, f: "-" if v is None else format(v, f)
    for r in mine:
        print(f"{r['dataset']:11} {r['mode']:15} {fmt(r['speedup_vs_exact'], '>7.2f')} "
              f"{r['prefill_tokens_computed']:>9} {fmt(r['prefill_computed_vs_exact'], '>7.2f')} "
              f"{fmt(r.get('asks_reused_tokens'), '>7')} {fmt(r.get('asks_recomputed_tokens'), '>7')} "
              f"{fmt(r.get('first_token_kl_median'), '>7.4f')} {fmt(r.get('first_token_kl_p90'), '>7.4f')} "
              f"{fmt(r.get('output_identical_vs_exact'), '>6.2f')} {fmt(r.get('rouge_l_vs_exact'), '>7.3f')} "
              f"{fmt(r['answer_agreement_vs_exact'], '>5.2f')} {fmt(r['accuracy'], '>5.2f')}")


def print_adaptive(rows: list[dict]) -> None:
    mine = [r for r in rows if r.get("stop_rule")]
    if not mine:
        return
    head = (f"{'dataset':14} {'rule':9} {'branches':>11} {'tokens x exact':>14} {'saved':>6} {'replay':>6} "
            f"{'x exact':>12} {'vote agree':>10}")
    print("\n" + head + "\n" + "-" * len(head))
    fmt = lambda v, f: "-" if v is None else format(v, f)
    for r in mine:
        print(f"{r['dataset']:14} {r['stop_rule']:9} {r['branches_sampled']:>5}/{r['branches_full']:<5} "
              f"{fmt(r.get('completion_tokens_vs_exact'), '>14.3f')} {fmt(r.get('token_saving'), '>6.3f')} "
              f"{fmt(r.get('replay_token_saving'), '>6.3f')} {fmt(r['speedup_vs_exact'], '>12.2f')} "
              f"{fmt(r['answer_agreement_vs_exact'], '>10.2f')}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data = {name: split_problems(name, args.shots, args.limit, args.calibration_offset) for name in args.dataset_names}
    meta = {"run_id": time.strftime("%Y%m%dT%H%M%S"), "model": args.model_path or MODEL_NAME, "commit": git_commit(), "date": time.strftime("%Y-%m-%d"),
            "machine": machine(),
            "repeats": args.repeats, "seed": args.seed, "settings": dataclasses.asdict(args.settings),
            "pool_fraction": args.pool_fraction,  # each row records its own max_total_tokens
            "calibration_offset": args.calibration_offset,
            "command": "python -m benchmarks.bench " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))}
    started = time.perf_counter()
    results, meta["mode_order"] = run_all(args, data)
    meta["run_total_s"] = round(time.perf_counter() - started, 1)
    rows = build_rows(args, results, meta)
    out = args.output_dir / f"{args.workload}.jsonl"
    append_jsonl(out, rows)
    curve_file = write_curve(args, rows, meta)
    print_table(rows)
    print_blend(rows)
    print_adaptive(rows)
    print(f"\n{len(rows)} rows appended to {out}; total {time.perf_counter() - started:.0f} s")
    if curve_file:
        print(f"stop-rule curve (replayed on exact's branches): {curve_file}")
