"""``python -m benchmarks.report``: the results sections of the docs, generated from results files.

    python -m benchmarks.report benchmarks/results/bon-verify.jsonl [--readme FILE --section NAME]
    python -m benchmarks.report benchmarks/results/adaptive/sc_stop_curve.json [--readme docs/benchmarks-adaptive.md]
    python -m benchmarks.report --all     # README.md's summary table and every table of docs/benchmarks.md

Takes the latest run (``run_id``) of the file and prints a Markdown section: the command that
produced it, commit, date and machine, one table row per (dataset, mode) with every speed-up next
to its accuracy delta against ``exact``, and a headline per mode (mean speed-ups over the datasets,
mean accuracy delta, CGEE error pooled over the datasets with its 95% upper bound) when the run
covers several datasets. A stop-rule curve file (``.json``) gives its table instead. With
``--readme`` the section replaces the text between
``<!-- results:<workload>:start -->`` and ``<!-- results:<workload>:end -->`` in that file.
``--all`` rewrites every generated block (``generated_blocks``) from the committed results files.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.report import tables
from benchmarks.report import latency
from benchmarks.report.step_tables import decode_parts_section
from benchmarks.report.latency import latency_table
from benchmarks.bench.stats import clopper_pearson_upper95
from benchmarks.bench.records import latest_run, runs_of

def _fmt(value, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def command_of(rows: list[dict]) -> str:
    """The command of the run: recorded by ``benchmarks.bench``, else rebuilt from the rows' fields."""
    if rows[0].get("command"):
        return rows[0]["command"]
    first, settings = rows[0], rows[0].get("settings", {})
    datasets = ",".join(dict.fromkeys(r["dataset"] for r in rows))
    modes = ",".join(dict.fromkeys(r["mode"] for r in rows))
    parts = [f"python -m benchmarks.bench --workload {first['workload']} --datasets {datasets}",
             f"--limit {first['n_problems']} --modes {modes}"]
    if first.get("repeats", 1) != 1:
        parts.append(f"--repeats {first['repeats']}")
    return " ".join(parts) + ("" if not settings else "  # settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))


def pooled_cgee_error(rows: list[dict]) -> tuple[int, int, float | None] | None:
    """(decisions that differ from full depth, decisions, 95% upper bound) over the rows."""
    scored = [r for r in rows if r.get("cgee_error") is not None]
    if not scored:
        return None
    # Exact counts; rows written before bench recorded ``cgee_errors`` give a rate only.
    errors = sum(r.get("cgee_errors", round(r["cgee_error"] * r["n_problems"])) for r in scored)
    n = sum(r["n_problems"] for r in scored)
    return errors, n, clopper_pearson_upper95(errors, n)


def headline(rows: list[dict]) -> list[str]:
    exact = {r["dataset"]: r["accuracy"] for r in rows if r["mode"] == "exact"}
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        parts = []
        for key, label in (("speedup_vs_no_cache", "over no-cache"), ("speedup_vs_exact", "over exact")):
            values = [r[key] for r in mine if r.get(key) is not None]
            if values and mode not in ("no-cache",) and not (key == "speedup_vs_exact" and mode == "exact"):
                parts.append(f"{statistics.mean(values):.2f}x {label} (range {min(values):.2f}-{max(values):.2f})")
        deltas = [r["accuracy"] - exact[r["dataset"]] for r in mine if r["dataset"] in exact and r["accuracy"] is not None]
        if deltas and mode != "exact":
            parts.append(f"accuracy {statistics.mean(deltas) * 100:+.1f} points vs exact")
        pooled = pooled_cgee_error(mine)
        if pooled:
            errors, n, ub = pooled
            parts.append(f"CGEE error {errors}/{n} = {errors / n:.1%} (95% upper bound {ub:.1%})")
        if parts:
            lines.append(f"- `{mode}`: " + "; ".join(parts))
    return lines


def section(rows: list[dict]) -> str:
    first = rows[0]
    exact = {r["dataset"]: r["accuracy"] for r in rows if r["mode"] == "exact"}
    out = run_headers(rows) + [
        "| dataset | mode | wall s | x no-cache | x exact | x exact, per repeat | accuracy [95% CI] | acc. vs exact "
        "| vote agrees | branch agrees | prefill tokens (per repeat) | prompt reuse | CGEE skip | CGEE exit layer "
        "| CGEE verify time x full | CGEE error [UB95] | evicted tokens (per repeat) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    paired = {id(r): paired_vs_exact(r, run) for run in runs_of(rows) for r in run}
    for r in rows:
        ci = r.get("accuracy_ci95")
        acc = f"{r['accuracy']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else _fmt(r["accuracy"], ".2f")
        delta = None if r["dataset"] not in exact or r["mode"] == "exact" else r["accuracy"] - exact[r["dataset"]]
        err = "-" if r.get("cgee_error") is None else f"{r['cgee_error']:.2f} [{r['cgee_error_ub95']:.2f}]"
        out.append(
            f"| {r['dataset']} | {r['mode']} | {r['wall_s']:.1f} | {_fmt(r['speedup_vs_no_cache'], '.2f')} "
            f"| {_fmt(r['speedup_vs_exact'], '.2f')} | {paired[id(r)]} | {acc} | {_fmt(delta, '+.2f')} "
            f"| {_fmt(r['answer_agreement_vs_exact'], '.2f')} | {_fmt(r.get('branch_text_agreement_vs_exact'), '.2f')} "
            f"| {prefill_cell(r)} | {_fmt(r['reuse_rate'], '.2f')} "
            f"| {_fmt(r['cgee_skip_rate'], '.2f')} | {_fmt(r['cgee_mean_exit_layer'], '.1f')} "
            f"| {_fmt(r.get('cgee_verify_time_ratio'), '.2f')} | {err} "
            f"| {_fmt(per_repeat(r, 'evictions'), 'd')} |"
        )
    if len({r["dataset"] for r in rows}) > 1:  # with one dataset the rows say it all
        out += ["", "Per mode, over the datasets:", "", *headline(rows)]
    out += asks_table(rows)
    out += tables.blend_table(rows)
    out += latency_table(rows)
    out += adaptive_table(rows)
    return "\n".join(out) + "\n"


def paired_vs_exact(row: dict, run: list[dict]) -> str:
    """``exact``'s wall over the row's, repeat by repeat, within the row's run (``records.runs_of``:
    each repeat runs every mode once, so a pair shares the machine's state), or "-" where there is
    no pairing (one repeat, or no ``exact`` of the row's dataset in its run)."""
    mine = row.get("wall_s_samples") or []
    exact = next((r.get("wall_s_samples") or [] for r in run if r["mode"] == "exact" and r["dataset"] == row["dataset"]), [])
    if row["mode"] == "exact" or len(mine) < 2 or len(exact) != len(mine):
        return "-"
    return " / ".join(f"{e / m:.2f}" for e, m in zip(exact, mine))


def prefill_cell(row: dict) -> str:
    """Prefill tokens of one repeat, or of each repeat where they differ (eviction and scheduling
    order can move them between repeats)."""
    each = row.get("prefill_tokens_per_repeat") or []
    if len(set(each)) > 1:
        return " / ".join(str(x) for x in each)
    return _fmt(per_repeat(row, "prefill_tokens"), "d")


def per_repeat(row: dict, key: str) -> int | None:
    """A token counter of one repeat (rows sum them over their repeats; the repeats compute the same)."""
    value = row.get(key)
    return None if value is None else round(value / (row.get("repeats") or 1))


def run_headers(rows: list[dict]) -> list[str]:
    """Where the rows come from: per run (one, or one per dataset when a table is run a dataset
    at a time), its workload, size, commit, date, machine, repeats and the command that produced it."""
    runs = runs_of(rows)
    out = []
    for run in runs:
        first = run[0]
        total = f", whole run {first['run_total_s'] / 60:.0f} min" if first.get("run_total_s") else ""
        repeats = f", median of {first['repeats']} repeats" if (first.get("repeats") or 1) > 1 else ", one repeat"
        # Rows written before bench recorded the linears ran float32, the only dtype it had then.
        linears = f", {first.get('linear_dtype', 'float32')} linears"
        which = "" if len(runs) == 1 else ", ".join(dict.fromkeys(r["dataset"] for r in run)) + ": "
        out += [f"{which}Workload `{first['workload']}`, {first['n_problems']} problems per dataset, model "
                f"{first['model']}, commit {first['commit']}, {first['date']}, {first['machine']}{linears}{total}{repeats}. "
                "Produced by:", "", "```bash", command_of(run), "```", ""]
    return out


def adaptive_table(rows: list[dict]) -> list[str]:
    """The ``adaptive`` mode's columns: what its stop rule sampled and saved, at runtime and in
    the replay of the same rule on ``exact``'s branches, and its vote against the full-N vote."""
    mine = [r for r in rows if r.get("stop_rule")]
    if not mine:
        return []
    out = ["", "Adaptive sampling, against `exact` on the same problems and seeds (its full-N vote; "
           "replay = the rule replayed offline on exact's branches):", "",
           "| dataset | mode | stop rule | branches finished / full | completion tokens x exact | tokens saved "
           "| tokens saved, replay | samples saved (replay) | wall x exact (speed-up) | vote agrees with full N "
           "| vote agrees, replay | accuracy [95% CI] | verification skipped (vote) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in mine:
        ci = r.get("accuracy_ci95")
        acc = f"{r['accuracy']:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else _fmt(r["accuracy"], ".2f")
        samples = f"{_fmt(r.get('sample_saving'), '.1%')} ({_fmt(r.get('replay_sample_saving'), '.1%')})"
        out.append(
            f"| {r['dataset']} | {r['mode']} | `{r['stop_rule']}` | {r['branches_sampled']} / {r['branches_full']} "
            f"| {_fmt(r.get('completion_tokens_vs_exact'), '.3f')} | {_fmt(r.get('token_saving'), '.1%')} "
            f"| {_fmt(r.get('replay_token_saving'), '.1%')} | {samples} | {_fmt(r.get('speedup_vs_exact'), '.2f')} "
            f"| {_fmt(r.get('answer_agreement_vs_exact'), '.2f')} | {_fmt(r.get('replay_vote_agreement'), '.2f')} "
            f"| {acc} | {_fmt(r.get('vote_skip_rate'), '.2f')} |")
    return out


def curve_table(curve: dict) -> str:
    """A stop-rule curve file (``benchmarks.bench``'s ``*_stop_curve*.json``) as a Markdown table."""
    offset = curve.get("calibration_offset") or 0
    runs: dict[tuple, list[str]] = {}  # (commit, command, problems) -> its datasets, in file order
    for dataset, entry in curve["datasets"].items():
        key = (entry.get("commit", curve["commit"]), entry.get("command", curve["command"]),
               entry.get("n_problems", curve["n_problems"]))
        runs.setdefault(key, []).append(dataset)
    out = []
    for (commit, command, problems), datasets in runs.items():
        which = f"{', '.join(datasets)}: " if len(runs) > 1 else ""
        out += [f"{which}Replayed on `exact`'s branches: workload `{curve['workload']}`, {problems} problems per "
                f"dataset from offset {offset}, N = {curve['num_branches']}, commit {commit}. Produced by:", "",
                "```bash", command, "```", ""]
    out += ["Rounds: the program launches the branches a round at a time (`adaptive_fork`); scheduler: every "
            "branch at once, the scheduler's group stop reading each finished branch's answer with the "
            "dataset's answer pattern (absent from older files: rounds only).", "",
            "| dataset | rule | applied by | branches sampled / full | samples saved | tokens saved "
            "| vote agrees with full N |", "|---|---|---|---|---|---|---|"]
    for dataset, entry in curve["datasets"].items():
        for p in entry["points"]:
            out.append(f"| {dataset} | `{p['rule']}` | {p.get('applied_by', 'rounds')} "
                       f"| {p['branches_sampled']} / {p['branches_full']} "
                       f"| {_fmt(p['sample_saving'], '.1%')} | {_fmt(p['token_saving'], '.1%')} "
                       f"| {_fmt(p['vote_agreement'], '.2f')} |")
        chosen = ", ".join(f"{k}: `{v}`" if v else f"{k}: none" for k, v in entry["chosen_at_0.95"].items())
        out.append(f"\n{dataset}: the most tokens saved at >= 95% vote agreement: {chosen}.\n")
    out += trace_table(curve)
    return "\n".join(out).rstrip("\n") + "\n"


def trace_table(curve: dict) -> list[str]:
    """The trace-stop points of a curve file (``benchmarks.bench.stop_replay.trace_curve``), if any."""
    mine = {d: e["trace_points"] for d, e in curve["datasets"].items() if e.get("trace_points")}
    if not mine:
        return []
    from programs.sc import CONF_TOP_K, CONF_WINDOW

    out = ["", f"Trace stops (DeepConf online: window {CONF_WINDOW}, top-{CONF_TOP_K}) replayed on the same branches, "
           "alone and on top of the stop rule; the threshold T is a percentile of these traces' lowest window "
           "confidence (in-sample, as DeepConf's warm-up traces set it). A stopped trace casts no vote:", "",
           "| dataset | T (percentile) | stop rule | applied by | traces stopped | branches voting / full "
           "| tokens saved | vote agrees with full N |", "|---|---|---|---|---|---|---|---|"]
    for dataset, points in mine.items():
        for p in points:
            out.append(f"| {dataset} | {p['threshold']:.3f} (p{p['percentile']:g}) | `{p['rule']}` | {p['applied_by']} "
                       f"| {p['traces_stopped']} | {p['branches_voting']} / {p['branches_full']} "
                       f"| {_fmt(p['token_saving'], '.1%')} | {_fmt(p['vote_agreement'], '.2f')} |")
    return out


def asks_table(rows: list[dict]) -> list[str]:
    """ASKS's own columns (``benchmarks.calibration.asks_quality``), for the modes that ran it."""
    mine = [r for r in rows if r.get("asks_substituted_branches") is not None or r.get("asks_false_accept_rate") is not None]
    if not mine:
        return []
    exact = {r["dataset"]: r for r in rows if r["mode"] == "exact"}
    out = ["", "ASKS, against `exact` on the same problems and seeds (substituted branches only for the "
           "output columns):", "",
           "| dataset | mode | substituted branches | prefill tokens x exact | reused tokens | wall x exact "
           "| branch answer agrees | ROUGE-L vs own wording | ROUGE-L two seeds, one prompt | first-token KL "
           "| mean abs dlogprob (16) | topic-control false accepts (probed pairs) "
           "| same-topic control false accepts (probed pairs) | ASKS scheduler time, % of wall |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in mine:
        ref = exact.get(r["dataset"])
        prefill = r["prefill_tokens"] / ref["prefill_tokens"] if ref and ref.get("prefill_tokens") else None
        far = r.get("asks_false_accept_rate")
        probed = f"{far:.3f} ({r.get('asks_control_probed')} of {r.get('asks_control_pairs')})" if far is not None else "-"
        same = r.get("asks_same_topic_false_accept_rate")  # runs before the same-topic probe have none
        same = (f"{same:.3f} ({r.get('asks_same_topic_probed')} of {r.get('asks_same_topic_pairs')})"
                if same is not None else "-")
        overhead = r.get("asks_overhead_s")
        overhead = None if overhead is None or not r.get("wall_s") else 100 * overhead / r["wall_s"]
        out.append(
            f"| {r['dataset']} | {r['mode']} | {_fmt(r.get('asks_substituted_branches'), 'd')} | {_fmt(prefill, '.2f')} "
            f"| {_fmt(r.get('asks_reused_tokens'), 'd')} | {_fmt(r.get('speedup_vs_exact'), '.2f')} "
            f"| {_fmt(r.get('branch_answer_agreement_vs_exact'), '.2f')} "
            f"| {_fmt(r.get('asks_rouge_l_vs_own_wording'), '.3f')} | {_fmt(r.get('asks_rouge_l_two_seeds_one_prompt'), '.3f')} "
            f"| {_fmt(r.get('asks_first_token_kl'), '.3f')} | {_fmt(r.get('asks_mean_abs_dlogprob_16'), '.3f')} | {probed} "
            f"| {same} "
            f"| {_fmt(overhead, '.2f')} |")
    return out


def replace_between_markers(text: str, workload: str, body: str) -> str:
    start, end = f"<!-- results:{workload}:start -->", f"<!-- results:{workload}:end -->"
    if start not in text or end not in text:
        raise ValueError(f"markers {start} ... {end} not found")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}{end}{tail}"


ROOT = tables.RESULTS.parent.parent
# docs/benchmarks.md's marker name -> the results file of its table, and how it is drawn.
DOC_SECTIONS = {
    "speed": ("speed.jsonl", tables.speed_section),
    "decode-profile": ("decode_profile.jsonl", tables.decode_profile_section),
    "decode-parts": ("decode_parts.jsonl", decode_parts_section),
    "fidelity": ("fidelity.jsonl", tables.fidelity_section),
    "bon-verify": ("bon-verify.jsonl", None),
    "bon-verify-capped": ("capped/bon-verify.jsonl", None),
    "bon-verify-aa": ("aa/bon-verify.jsonl", None),
    "cgee-calibration": ("cgee_thresholds.json", tables.cgee_calibration_section),
    "blend-role-sc": ("blend/role-sc.jsonl", None),
    "blend-multi-doc": ("blend/multi-doc.jsonl", None),
    "blend-paraphrase-sc": ("blend/paraphrase-sc.jsonl", None),
    "blend-repeats-role-sc": ("blend-repeats/role-sc.jsonl", None),
    "blend-repeats-multi-doc": ("blend-repeats/multi-doc.jsonl", None),
    "blend-repeats-paraphrase-sc": ("blend-repeats/paraphrase-sc.jsonl", None),
    "blend-check-role-sc": ("blend-check/role-sc.jsonl", None),
    "agents-steady": ("agents/agents-steady.jsonl", None),
    "agents-steady-reading": ("agents-reading/agents-steady.jsonl", None),
    "agents-steady-reading-floor": ("agents-reading-floor/agents-steady.jsonl", None),
    "bon-grader-steady": ("agents/bon-grader-steady.jsonl", None),
    "bon-grader-gate": ("bon-grader-gate/bon-grader-steady.jsonl", None),
    "paraphrase-sc": ("paraphrase-sc.jsonl", None),
    "paraphrase-sc-3shot": ("paraphrase-sc-3shot/paraphrase-sc.jsonl", None),
    "tot": ("tot.jsonl", None),
    "load": ("load.jsonl", tables.load_section),
    "scaleout": ("scaleout.jsonl", tables.scaleout_section),
    "scheduler-profile": ("scheduler_profile.jsonl", tables.scheduler_profile_section),
}


def generated_blocks(root: Path = ROOT) -> dict[Path, dict[str, str]]:
    """Every generated block: file -> marker name -> its text, from the results under ``root``."""
    results = root / "benchmarks" / "results"
    docs = {name: (draw or (lambda path: section(latest_run(path))))(results / file)
            for name, (file, draw) in DOC_SECTIONS.items()}
    summary = tables.summary(results, latency.summary_rows(results))
    return {root / "README.md": {"summary": summary}, root / "docs" / "benchmarks.md": docs}


def block(text: str, name: str) -> str:
    """The text between a marker pair (what ``replace_between_markers`` writes there)."""
    start, end = f"<!-- results:{name}:start -->", f"<!-- results:{name}:end -->"
    if start not in text or end not in text:
        raise ValueError(f"markers {start} ... {end} not found")
    return text.split(start, 1)[1].split(end, 1)[0].removeprefix("\n")


def write_all(root: Path = ROOT) -> None:
    for path, blocks in generated_blocks(root).items():
        text = path.read_text()
        for name, body in blocks.items():
            text = replace_between_markers(text, name, body)
        path.write_text(text)
        print(f"wrote {', '.join(blocks)} in {path.relative_to(root)}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, nargs="?", help="a results file of benchmarks.bench (JSON lines)")
    p.add_argument("--readme", type=Path, default=None, help="write the section into this file between its markers")
    p.add_argument("--section", default=None,
                   help="marker name: <!-- results:SECTION:start --> (default: the run's workload)")
    p.add_argument("--all", action="store_true",
                   help="rewrite README.md's summary and every table of docs/benchmarks.md from benchmarks/results/")
    args = p.parse_args(argv)
    if args.all:
        if args.results or args.readme:
            p.error("--all takes no results file and no --readme")
        try:
            write_all()
        except ValueError as e:
            p.error(f"--all: {e}")
        return
    if args.results is None:
        p.error("give a results file, or --all")
    if not args.results.is_file():
        p.error(f"results file not found: {args.results}")
    if args.results.suffix == ".json":
        curve = json.loads(args.results.read_text())
        body, default_name = curve_table(curve), args.results.stem
    else:
        rows = latest_run(args.results)
        body, default_name = section(rows), rows[0]["workload"]
    if args.readme is None:
        print(body, end="")
        return
    try:
        name = args.section or default_name
        args.readme.write_text(replace_between_markers(args.readme.read_text(), name, body))
    except ValueError as e:
        p.error(f"--readme {args.readme}: {e}")
    print(f"wrote the {name} section of {args.readme}")
