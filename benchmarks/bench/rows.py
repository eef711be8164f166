"""The bench's rows: one per (workload, dataset, mode), from every repeat's runs (speed-ups against
``no-cache`` and ``exact``, answer agreement, ASKS's quality columns, an ``adaptive`` row's savings
against the replay of its own rule), the stop-rule curve replayed on exact's branches, and the
summary tables printed last."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

from benchmarks.bench import stats as st
from benchmarks.bench.stop_replay import choose, curve, replay_group_stop, replay_rule, replay_trace_stop, trace_curve


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
                **({"linear_dtype": mode.linear_dtype} if mode.linear_dtype else {}),  # else the run's (meta)
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
                **workload_columns(args, mode, r, by_mode),
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
    """The ASKS workloads' columns (``benchmarks.blend_quality``): the recompute share the mode's
    requests asked for, prefill really computed (``TokenCounters.prefill_tokens``: prompt - cached
    - blend's reused tokens; summed over repeats, and against exact's), and the mode's branches
    against exact's, same problems and seeds (from the last repeat)."""
    from benchmarks.calibration.blend_quality import branch_quality

    if not args.workload_obj.branch_quality:
        return {}
    computed = sum(c.prefill_tokens for c in r["counters"])
    exact = by_mode.get("exact")
    exact_computed = sum(c.prefill_tokens for c in exact["counters"]) if exact else None
    gate = None
    if mode.effective_asks_mode == "blend":  # the requests' own gate where the mode leaves the server's default
        gate = mode.gate_asked(args.workload_obj.request_gate)
        gate = mode.rksc_config().asks_max_deviation if gate is None else gate
    out = {"asks_mode": mode.effective_asks_mode, "asks_recompute_asked": mode.recompute,
           "asks_max_deviation": gate if gate is not None and math.isfinite(gate) else None,
           "seed_offset": mode.seed_offset or None,
           "prefill_tokens_computed": computed, "blended_tokens": sum(c.blended_tokens for c in r["counters"]),
           "prefill_computed_vs_exact": st.ratio(computed, exact_computed)}
    if exact is not None and mode.name != "exact" and r["run"].details is not None:
        out.update(branch_quality(r["run"].details, exact["run"].details))
    return out


def workload_columns(args, mode, r, by_mode) -> dict:
    """The workload's own columns (``Workload.columns``: the agent workloads' TTFT, per-agent
    quality, the grader's picks), from every repeat's run of the mode and of exact."""
    columns = args.workload_obj.columns
    if columns is None:
        return {}
    exact = by_mode.get("exact") if mode.name != "exact" else None
    return columns(r["runs"], exact["runs"] if exact else None)


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
    thresholds that reach 95% vote agreement on these problems; None without an exact run or where
    the workload's branches are not votes (``agents``). A
    dataset of an earlier run in the same file stays, with its own commit and command (so the
    datasets can be run one command at a time)."""
    exact = [r for r in rows if r["mode"] == "exact"]
    if not exact or not args.workload_obj.branches_vote:
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
    """The ASKS workloads' quality against exact (``benchmarks.blend_quality``)."""
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
