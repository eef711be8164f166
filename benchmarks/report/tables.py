"""The README's one results table, and the tables of the tools other than ``benchmarks.bench``.

Every figure is read from a committed results file under ``benchmarks/results/`` (its latest run)
and printed beside the commit and machine that file records; ``benchmarks.report --all`` writes
them between their markers (README.md's ``summary``, docs/benchmarks.md's ``speed``, ``load``...).
"""

from __future__ import annotations

import json
import shlex
import statistics
from pathlib import Path

from benchmarks.bench.modes import MODES
from benchmarks.bench.records import latest_run
from benchmarks.perf.profile_scheduler import FORWARD_KINDS, PREFILL

RESULTS = Path(__file__).resolve().parents[1] / "results"


def latest_rows(path: Path) -> list[dict]:
    """The latest run of a file: by ``run_id`` where rows carry one, else the trailing rows of the
    last row's commit (``benchmarks.speed`` appends one row per kind and stream count)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{path} holds no results")
    if "run_id" in rows[-1]:
        return latest_run(path)
    last, out = rows[-1]["commit"], []
    for r in reversed(rows):
        if r["commit"] != last:
            break
        out.append(r)
    return out[::-1]


def _mode(rows: list[dict], mode: str) -> list[dict]:
    mine = [r for r in rows if r["mode"] == mode]
    if not mine:
        raise ValueError(f"no rows of mode {mode!r} in the latest run of {rows[0]['workload']}")
    return mine


def _mean(values) -> float:
    return statistics.mean(values)


def _delta_points(rows: list[dict], mine: list[dict], against: str) -> str:
    """Mean accuracy delta against the ``against`` mode over the datasets, in points."""
    base = {r["dataset"]: r["accuracy"] for r in _mode(rows, against)}
    return f"accuracy {_mean(100 * (r['accuracy'] - base[r['dataset']]) for r in mine):+.1f} pts"


def _run(*rows: dict) -> tuple[str, str]:
    """The commits (one per run the figure draws on) and the machine of the rows, with the CPU
    path's linears they ran (float32 for rows written before the runs recorded them)."""
    linears = "/".join(dict.fromkeys(r.get("linear_dtype", "float32") for r in rows))
    return (", ".join(dict.fromkeys(r["commit"] for r in rows)),
            ", ".join(dict.fromkeys(r["machine"] for r in rows)) + f", {linears} linears")


def _bench_row(label: str, mechanism: str, path: Path, mode: str, against: str = "exact") -> list[str]:
    """One row from a ``benchmarks.bench`` run: mean speed-up over the datasets, accuracy delta and
    answer agreement against ``exact``, and what the mechanism did."""
    rows = latest_rows(path)
    mine = _mode(rows, mode)
    key = "speedup_vs_exact" if against == "exact" else "speedup_vs_no_cache"
    speed = _mean(r[key] for r in mine)
    quality = _delta_points(rows, mine, against)
    if against == "exact":  # the share of problems whose majority answer is exact's
        quality += f", votes agree {_mean(r['answer_agreement_vs_exact'] for r in mine):.2f}"
    return [label, mechanism, f"`{mode}` vs `{against}`", f"{speed:.2f}x", quality,
            _did(rows, mine) if against == "exact" else f"prompt reuse {_mean(r['reuse_rate'] for r in mine):.2f}",
            *_run(*mine)]


def _did(rows: list[dict], mine: list[dict]) -> str:
    """What the mechanism did in the run, in the run's own counters."""
    r = mine[0]
    if r.get("stop_rule"):  # adaptive sampling: what the rule sampled, against the replay of it
        sampled, full = sum(x["branches_sampled"] for x in mine), sum(x["branches_full"] for x in mine)
        verb = "let" if r.get("stop_applied_by") == "scheduler" else "sampled"
        ended = " finish (the scheduler stopped the rest)" if verb == "let" else ""
        rules = ", ".join(f"`{x}`" for x in dict.fromkeys(x["stop_rule"] for x in mine))
        return (f"{rules} {verb} {sampled:,} of {full:,} branches{ended}; completion tokens "
                f"{_mean(x['completion_tokens_vs_exact'] for x in mine):.2f}x (replay of the rule: "
                f"{1 - _mean(x['replay_token_saving'] for x in mine):.2f}x)")
    if r.get("asks_substituted_branches") is not None:
        exact = {x["dataset"]: x for x in rows if x["mode"] == "exact"}
        share = _mean(x["prefill_tokens"] / exact[x["dataset"]]["prefill_tokens"] for x in mine)
        did = f"{sum(x['asks_substituted_branches'] for x in mine)} branches adopted a sibling's span; prefill {share:.2f}x"
        probed = [x for x in mine if x.get("asks_same_topic_probed")]
        if probed:  # the gate's false accepts on held-out same-topic controls, in the same engine
            hits, n = sum(x["asks_same_topic_false_accepts"] for x in probed), sum(x["asks_same_topic_probed"] for x in probed)
            did += f"; same-topic controls accepted {hits}/{n}"
        return did
    if r.get("prefill_computed_vs_exact") is not None and r.get("asks_reused_tokens"):  # ASKS blend
        kl = [x["first_token_kl_median"] for x in mine if x.get("first_token_kl_median") is not None]
        return (f"prefill computed {_mean(x['prefill_computed_vs_exact'] for x in mine):.2f}x; "
                f"{sum(x['asks_reused_tokens'] for x in mine):,} tokens' KV reused, "
                f"{sum(x.get('asks_recomputed_tokens') or 0 for x in mine):,} recomputed"
                + (f"; first-token KL median {_mean(kl):.3f}" if kl else ""))
    errors = [x for x in mine if x.get("cgee_errors") is not None]
    if errors:
        e, n = sum(x["cgee_errors"] for x in errors), sum(x["n_problems"] for x in errors)
        skips = [x["cgee_skip_rate"] for x in errors]
        return (f"CGEE skipped {min(skips):.0%}-{max(skips):.0%} of verifications, "
                f"{e}/{n} decisions differ from full depth")
    exact = {x["dataset"]: x for x in rows if x["mode"] == "exact"}
    share = _mean(x["prefill_tokens"] / exact[x["dataset"]]["prefill_tokens"] for x in mine)
    evicted = sum(x["evictions"] / (x.get("repeats") or 1) for x in mine)
    return f"prefill {share:.2f}x, {evicted:,.0f} tokens evicted per repeat"


def _datasets(path: Path, mode: str = "exact") -> str:
    """The datasets of the latest run's rows of ``mode`` and problems per dataset, e.g. ``mmlu-stem x50``."""
    rows = _mode(latest_rows(path), mode)
    return ", ".join(sorted({r["dataset"] for r in rows})) + f" x{rows[0]['n_problems']}"


def _cgee_row(label: str, path: Path) -> list[str]:
    """Per-dataset CGEE thresholds: the verifier's time against full depth, and its errors."""
    mine = _mode(latest_rows(path), "cgee-only")
    e, n = sum(r["cgee_errors"] for r in mine), sum(r["n_problems"] for r in mine)
    ratio = _mean(r["cgee_verify_time_ratio"] for r in mine)
    skips = [r["cgee_skip_rate"] for r in mine]
    return [label, "CGEE", "verify vs full-depth verify", f"{1 / ratio:.2f}x",
            f"{e}/{n} decisions differ from full depth", f"skipped {min(skips):.0%}-{max(skips):.0%} of verifications",
            *_run(*mine)]


def _speed_row(label: str, mechanism: str, against: str, r: dict) -> list[str]:
    return [label, mechanism, against, f"{r['tok_s'] / r['baseline_tok_s']:.2f}x", "-",
            f"{r['tok_s']:.1f} vs {r['baseline_tok_s']:.1f} tok/s", *_run(r)]


DATASET_NAMES = {"coqa": "CoQA", "coqa-short": "CoQA", "gsm8k": "GSM8K", "arc-challenge": "ARC-Challenge", "mmlu-stem": "MMLU-STEM",
                 "gpqa": "GPQA"}


def _scope(path: Path) -> str:
    """What a run covered, from its rows: "CoQA x10, one repeat" or "GSM8K x50, median of 3"."""
    r = latest_rows(path)[0]
    repeats = r.get("repeats") or 1
    return (f"{DATASET_NAMES.get(r['dataset'], r['dataset'])} x{r['n_problems']}, "
            + ("one repeat" if repeats == 1 else f"median of {repeats}"))


def _default_linears(rows: list[dict]) -> str:
    """The engine's default linears on the machine that measured ``rows``: int8 where it ran them
    (``rksc_sgl.config.default_cpu_linear_dtype``), else float32. Read from the rows, so that the
    report does not depend on the machine that writes it."""
    return "int8" if any(r.get("linear_dtype") == "int8" for r in rows) else "float32"


def _speed(rows: list[dict], kind: str, streams: int, baseline: str) -> dict:
    """The row of the engine's default linears (a run may hold a row per linear dtype)."""
    default = _default_linears(rows)
    row = next((r for r in rows if (r["kind"], r["streams"], r["baseline"]) == (kind, streams, baseline)
                and r.get("linear_dtype", "float32") == default), None)
    if row is None:
        raise ValueError(f"speed.jsonl's latest run has no {kind} row of {streams} streams against {baseline} with "
                         f"{default} linears: run python -m benchmarks.speed")
    return row


SUMMARY_HEADER = ["workload", "mechanism", "compared", "speed-up", "accuracy / agreement", "what it did",
                  "commit", "machine"]


def _blend(results: Path, workload: str) -> Path:
    """A blend workload's headline run: median of 3 (``blend-repeats/``), else the sweep's (``blend/``)."""
    repeats = results / "blend-repeats" / f"{workload}.jsonl"
    return repeats if repeats.exists() else results / "blend" / f"{workload}.jsonl"


def summary_rows(results: Path = RESULTS, blend_extra: list[list[str]] = ()) -> list[list[str]]:
    speed = latest_rows(results / "speed.jsonl")
    fidelity = results / "fidelity.jsonl"
    adaptive = results / "adaptive" / "sc.jsonl"
    adaptive_modes = {r["mode"] for r in latest_rows(adaptive)} if adaptive.exists() else set()
    in_scheduler = "group-stop" in adaptive_modes
    blend_workloads = {"role-sc": "role self-consistency over one passage, 8 roles",
                       "multi-doc": "multi-document questions, 4 passages per branch order",
                       "paraphrase-sc": "self-consistency, 8 paraphrased branches, 8 shots"}
    blend_rows = [_bench_row(f"{what}, {_scope(path)}", "ASKS blend", path, "asks-only")
                  for workload, what in blend_workloads.items() if (path := _blend(results, workload)).exists()
                  ] + list(blend_extra)
    return [
        *([_bench_row(f"self-consistency, 16 branches, {_datasets(adaptive, 'adaptive')}", "early stop (adaptive vote)",
                      adaptive, "adaptive")] if "adaptive" in adaptive_modes else []),
        *([_bench_row(f"self-consistency, 16 branches, {_datasets(adaptive, 'group-stop')}",
                      "early stop in the scheduler (group vote)", adaptive, "group-stop")] if in_scheduler else []),
        *blend_rows,
        _bench_row("self-consistency, 8 paraphrased branches, GSM8K x50 (before blend)", "ASKS adopt",
                   results / "paraphrase-sc.jsonl", "asks-only"),
        _bench_row("tree of thoughts, KV pool 1/4 of working set, GSM8K x20", "RSBCM", results / "tot.jsonl",
                   "rsbcm-only"),
        _bench_row("best-of-4 + verifier, 4 datasets x50", "all", results / "bon-verify.jsonl", "rksc"),
        _bench_row("best-of-4 + verifier, 4 datasets x50", "stock radix cache", results / "bon-verify.jsonl",
                   "exact", "no-cache"),
        _bench_row("best-of-4 + verifier, KV pool 1/4, 4 datasets x50", "RSBCM",
                   results / "capped" / "bon-verify.jsonl", "rsbcm-only"),
        _cgee_row("best-of-4 + verifier, 4 datasets x50, verification phase", results / "bon-verify.jsonl"),
        _speed_row("decode, 1 stream", "CPU path: backend, lean decode, linears", "stock `torch_native`", _speed(speed, "decode", 1, "stock")),
        _speed_row("decode, 32 streams", "CPU path: backend, lean decode, linears", "stock `torch_native`", _speed(speed, "decode", 32, "stock")),
        _speed_row("prefill, 2,000 tokens", "CPU attention backend", "stock `torch_native`",
                   _speed(speed, "prefill", 1, "stock")),
        *_llama_cpp_rows(speed, latest_rows(fidelity) if fidelity.exists() else []),
        _speed_row("sampled decode, 32 streams", "seeded sampling", "SGLang's sampler", _speed(speed, "sampled", 32, "unseeded")),
    ]


def _llama_cpp_rows(speed: list[dict], fidelity: list[dict] = ()) -> list[list[str]]:
    """1-stream decode against llama.cpp: the default linears first, then each other dtype of the
    run (a flag away), each with its greedy agreement with float32 linears where the run has it,
    and its teacher-forced reading against them (``benchmarks.fidelity``) where there is one."""
    default = _default_linears(speed)
    rows = []
    for r in sorted((r for r in speed if (r["kind"], r["streams"], r["baseline"]) == ("decode", 1, "llama.cpp")),
                    key=lambda r: r.get("linear_dtype", "float32") != default):
        dtype = r.get("linear_dtype", "float32")
        what = f"CPU path, {dtype} linears" if dtype == default else f"CPU path, `--cpu-linear-dtype {dtype}`"
        row = _speed_row("decode, 1 stream", what, "llama.cpp, Q4_1, same machine", r)
        agree = next((a for a in speed if a["kind"] == "agreement" and a["linear_dtype"] == dtype
                      and a["baseline"].startswith("float32")), None)
        if agree:
            row[4] = (f"greedy text equal to float32's for {agree['identical']} of {agree['prompts']} prompts "
                      f"({agree['new_tokens']} tokens)")
        read = next((f for f in fidelity if f["engine"] == dtype), None)
        if read:
            row[4] = (f"{'' if row[4] == '-' else row[4] + '; '}teacher-forced, top token float32's at "
                      f"{read['top_token_agreement']:.1%} of positions, perplexity {read['perplexity']:.3f} vs "
                      f"{read['reference_perplexity']:.3f}")
        rows.append(row)
    return rows


def fidelity_section(path: Path) -> str:
    """``benchmarks.fidelity``'s latest run: each engine's teacher-forced reading against float32 linears."""
    rows = latest_rows(path)
    first = rows[0]
    body = [[f"`{r['engine']}`", r["linear_dtype"], f"{r['perplexity']:.3f}", f"{r['reference_perplexity']:.3f}",
             f"{r['top_token_agreement']:.1%}", f"{r['mean_abs_logprob_difference']:.4f}",
             f"{r['nll_delta_per_token']:+.4f} [{r['nll_delta_ci95'][0]:+.4f}, {r['nll_delta_ci95'][1]:+.4f}]"]
            for r in rows]
    return (f"Commit {first['commit']}, {first['date']}, {first['machine']}: {first['texts']} {first['dataset']}, "
            f"{first['tokens']:,} positions, read teacher-forced. Produced by:\n\n```bash\n{first['command']}\n```\n\n"
            + markdown(["engine", "linears", "perplexity", "float32 linears' perplexity", "top token = float32's",
                        "mean abs log-prob difference", "NLL change per token [95% CI]"], body))


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def summary(results: Path = RESULTS, blend_extra: list[list[str]] = ()) -> str:
    return markdown(SUMMARY_HEADER, summary_rows(results, blend_extra))


def speed_section(path: Path) -> str:
    """``benchmarks.speed``'s latest run: ours against its baseline per kind and stream count."""
    rows = latest_rows(path)
    first = rows[0]
    speeds = [r for r in rows if r["kind"] != "agreement"]
    body = [[r["kind"], str(r["streams"]), r.get("linear_dtype", "float32"), f"{r['tok_s']:.1f}", r["baseline"],
             f"{r['baseline_tok_s']:.1f}", f"{r['tok_s'] / r['baseline_tok_s']:.2f}"] for r in speeds]
    agreement = "".join(
        f"\nGreedy agreement of ours with {r['linear_dtype']} linears against {r['baseline']}: {r['identical']} of "
        f"{r['prompts']} GSM8K prompts give the same {r['new_tokens']} tokens; the median first difference is "
        f"at token {r['median_first_difference']}.\n" for r in rows if r["kind"] == "agreement")
    loads = ", ".join(str(x) for x in dict.fromkeys(r["load_avg_1min"] for r in rows))
    return (f"Commit {first['commit']}, {first['date']}, {first['machine']}, model in {first['dtype']}, median of "
            f"{first['repeats']}, 1-minute load average {loads} at the start of each run.\n\n"
            + markdown(["kind", "streams", "ours' linears", "ours tok/s", "baseline", "baseline tok/s", "ratio"], body)
            + agreement)


def scaleout_section(path: Path) -> str:
    """``benchmarks.scaleout``'s latest run: one row per routing policy."""
    rows = latest_rows(path)
    first = rows[0]
    body = [[f"`{r['policy']}`", f"{r['wall_s']:.1f}", f"{r['prefill_tokens']:,}", f"{r['reuse_rate']:.2f}",
             f"{r['branch_text_agreement_vs_first']:.2f}"] for r in rows]
    return (f"Commit {first['commit']}, {first['date']}, {first['machine']}. Produced by:\n\n```bash\n"
            f"{first['command']}\n```\n\n"
            + markdown(["policy", "wall s", "prefill tokens", "prompt reuse", f"branch texts as under `{rows[0]['policy']}`"],
                       body))


def load_section(path: Path) -> str:
    """``benchmarks.load``'s latest run, as one row."""
    r = latest_rows(path)[-1]
    p, q = r["program_latency_s"], r["request_latency_s"]
    body = [[f"{r['programs_completed']}/{r['settings']['programs']}", str(r["requests"]),
             f"{r['pool_tokens']:,} of {r['working_set_tokens']:,}", f"{r['wall_s']:.0f}",
             f"{p['p50']:.0f} / {p['p95']:.0f} / {p['p99']:.0f}", f"{q['p50']:.0f} / {q['p95']:.0f} / {q['p99']:.0f}",
             f"{r['completion_tok_s']:.0f}", f"{r['reuse_rate']:.2f}", f"{r['kv_pool']['evicted_tokens']:,}",
             "yes" if r["kv_balanced"] and r["server_serving"] else "no"]]
    return (f"Commit {r['commit']}, {r['date']}, {r['machine']}. Produced by:\n\n```bash\n{r['command']}\n```\n\n"
            + markdown(["programs completed", "requests", "KV pool tokens (of working set)", "wall s",
                        "program latency p50/p95/p99 s", "request latency p50/p95/p99 s", "completion tok/s",
                        "prompt reuse", "evicted tokens", "pool balanced, still serving"], body))


PROFILE_COLUMNS = ("model forward", "sampling", "radix cache", "rksc hooks", "scheduler loop (other)")


def scheduler_profile_section(path: Path) -> str:
    """``benchmarks.profile_scheduler``'s latest run per (workload, dataset, bench flags): the
    scheduler's seconds by category, per mode."""
    latest = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            latest[(r["workload"], r["dataset"], profile_bench_args(r))] = r
    out = []
    for (workload, dataset, flags), r in latest.items():
        body = [[f"{m['mode']} ({MODES[m['mode']].cache_class})" if m["mode"] in MODES else m["mode"],
                 f"{m['bench_wall_s']:.1f}"] + [f"{m['seconds_by_category'].get(c, 0.0):.2f}" for c in PROFILE_COLUMNS]
                + [_forward_kinds(m)] for m in r["modes"]]
        flags = f", bench flags `{flags}`" if flags else ""
        out.append(f"{workload}, {dataset}, {r['limit']} problems{flags}: commit {r['commit']}, {r['date']}, "
                   f"{r['machine']}, one run per mode. Produced by:\n\n```bash\n{r['command']}\n```\n\n"
                   + markdown(["mode", "bench wall s", "model forward s", "sampling s", "radix cache s",
                               "our other hooks s", "rest of the loop s",
                               f"model forward: {' / '.join(KINDS[:-1])} / other {PREFILL} s"], body))
    return "\n".join(out)


KINDS = (*(kind for kind, _ in FORWARD_KINDS), PREFILL)  # the profiler's split of the model forward


def _forward_kinds(mode: dict) -> str:
    kinds = mode.get("forward_seconds_by_kind")  # runs before 2026-12-05 did not split the forward
    if kinds is None:
        return "-"
    return " / ".join(f"{kinds.get(k, 0.0):.2f}" for k in KINDS)


def decode_profile_section(path: Path) -> str:
    """``benchmarks.decode_profile``'s latest run: a column per (linear dtype, streams), a row per
    part of the model with its ms per profiled step as kernels + Python."""
    rows = latest_rows(path)
    first = rows[0]
    parts = sorted({p for r in rows for p in r["parts"]},
                   key=lambda p: -sum(sum(r["parts"].get(p, {}).values()) for r in rows))
    body = [["tok/s, unprofiled", *(f"{r['tok_s']:.1f}" for r in rows)],
            ["profiled step, ms", *(f"{r['step_ms']:.1f}" for r in rows)]]
    body += [[part, *(f"{r['parts'][part]['ops']:.1f} + {r['parts'][part]['python']:.1f}" if part in r["parts"]
                      else "-" for r in rows)] for part in parts]
    return (f"Commit {first['commit']}, {first['date']}, {first['machine']}, {first['new_tokens']} tokens per "
            f"stream. Produced by:\n\n```bash\n{first['command']}\n```\n\n"
            + markdown(["ms per step: kernels + Python", *(f"{r['linear_dtype']}, {r['streams']} stream{'s' * (r['streams'] > 1)}" for r in rows)],
                       body)
            + _profile_history(path, [(r["linear_dtype"], r["streams"]) for r in rows]))


def _profile_history(path: Path, columns: list[tuple[str, int]]) -> str:
    """Every run of the file, oldest first, as its profiled step, its Python ms (the parts'
    Python time summed) and its unprofiled rate, in the latest run's columns: a change's before and after."""
    runs: dict[str, dict[tuple[str, int], dict]] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            runs.setdefault(r["commit"], {})[(r["linear_dtype"], r["streams"])] = r
    if len(runs) < 2:
        return ""

    def cell(r: dict | None) -> str:
        return "-" if r is None else f"{r['step_ms']:.1f} / {sum(p['python'] for p in r['parts'].values()):.1f} / {r['tok_s']:.1f}"

    body = [[f"{commit} ({next(iter(by.values()))['date']})", *(cell(by.get(c)) for c in columns)]
            for commit, by in runs.items()]
    return ("\n\nEvery run in the file, oldest first: profiled step ms / of it Python ms / unprofiled tok/s.\n\n"
            + markdown(["commit", *(f"{d}, {n} stream{'s' * (n > 1)}" for d, n in columns)], body))


def profile_bench_args(record: dict) -> str:
    """The ``--bench-args`` a profile ran the bench with, read from its recorded command, or ""."""
    words = shlex.split(record["command"])
    return words[words.index("--bench-args") + 1] if "--bench-args" in words[:-1] else ""


def cgee_calibration_section(path: Path) -> str:
    """``benchmarks.calibrate_cgee``'s output: the thresholds it chose, pooled and per dataset, with
    the skip rate and the CGEE error (and its 95% upper bound) they had on the calibration split."""
    data = json.loads(Path(path).read_text())
    cand = data.get("candidates") or {}
    entries = [("pooled (`RkscConfig` defaults)", data)] + [(f"`{k}`", v) for k, v in data.get("per_dataset", {}).items()]
    body = []
    for name, entry in entries:
        t, c = entry["thresholds"], entry["calibration"]
        body.append([name, str(c["n_problems"]), f"{t['tau_conf']:g}", f"{t['margin']:g}", str(t["min_layer"]),
                     f"{c['skip_rate']:.1%}", f"{c['errors']}/{c['n_problems']}", f"{c['error_ub95']:.1%}"])
    sampled = (f"{cand['num_candidates']} candidates per problem, {cand['shots']} shots, {cand['max_new_tokens']} new "
               f"tokens, temperature {cand['temperature']:g}" if cand else "candidates as the program samples them")
    lens = {int(k): v for k, v in data["calibration"].get("decision_agreement_if_all_exit_at_layer", {}).items()}
    depth = max(lens, default=None)
    best = max((k for k in lens if k != depth), key=lens.get, default=None)
    why = (f" Why no layer exit: had every candidate exited at one layer before the last, the verifier would have "
           f"decided as at full depth on at most {lens[best]:.0%} of problems (layer {best}); only layer {depth} "
           f"reaches 100%." if best is not None else "")
    return (f"Chosen on the {data['calibration_split']} ({sampled}): among the settings whose 95% upper bound "
            f"on CGEE error is <= {data['target_error']:.0%}, the cheapest.{why} Produced by:\n\n```bash\n"
            f"{data['command']}\n```\n\n"
            + markdown(["thresholds", "problems", "tau_conf", "margin", "min_layer (30: no layer exit)", "skipped",
                        "decisions differ from full depth", "95% upper bound"], body))



def blend_table(rows: list[dict]) -> list[str]:
    """The ASKS workloads' quality against ``exact``, same problems and seeds
    (``benchmarks.calibration.blend_quality``), for every mode that has it; ``exact-reseed``'s row is the
    two-seed floor and every row's vote agreement is shown beside it."""
    mine = [r for r in rows if "prefill_tokens_computed" in r and r["mode"] != "exact"]
    if not mine:
        return []
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    floor = {r["dataset"]: r.get("answer_agreement_vs_exact") for r in rows if r["mode"] == "exact-reseed"}
    exact = {r["dataset"]: r for r in rows if r["mode"] == "exact"}
    out = ["", "Against `exact`, branch by branch on the same problems and seeds (`exact-reseed`: exact under "
           "another seed base, the two-seed floor; `asks-blend@R`: every request asks blend to recompute share R, "
           "the gate off; gate: `--asks-max-deviation`, and the covered tokens past it, recomputed whatever the share; "
           "prefill computed = prompt - cached - blend's reused tokens (served from a donor, not recomputed), summed over the repeats; quality from the last repeat; the accuracy interval is "
           "exact's 95% Wilson interval):", "",
           "| dataset | mode | ASKS mode | recompute asked | gate (tokens past it) | wall x exact | prefill computed x exact "
           "| reused / recomputed tokens (last repeat) | first-token KL median (p90) | identical outputs | ROUGE-L vs exact "
           "| vote agrees (two-seed floor) | accuracy (exact's 95% CI) | outcomes |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in mine:
        ci = (exact.get(r["dataset"]) or {}).get("accuracy_ci95")
        acc = f"{fmt(r['accuracy'], '.2f')} ({'-' if not ci else f'{ci[0]:.2f}-{ci[1]:.2f}'})"
        reused = (f"{r['asks_reused_tokens']} / {fmt(r.get('asks_recomputed_tokens'), 'd')}"
                  if r.get("asks_reused_tokens") is not None else "-")
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted((r.get("asks_outcomes") or {}).items())) or "-"
        gate = (f"{r['asks_max_deviation']:g} ({fmt(r.get('asks_deviating_tokens'), 'd')})"
                if r.get("asks_max_deviation") is not None else "-")
        out.append(
            f"| {r['dataset']} | {r['mode']} | {r.get('asks_mode') or '-'} | {fmt(r.get('asks_recompute_asked'), 'g')} "
            f"| {gate} "
            f"| {fmt(r.get('speedup_vs_exact'), '.2f')} | {fmt(r.get('prefill_computed_vs_exact'), '.2f')} | {reused} "
            f"| {fmt(r.get('first_token_kl_median'), '.4f')} ({fmt(r.get('first_token_kl_p90'), '.4f')}) "
            f"| {fmt(r.get('output_identical_vs_exact'), '.2f')} | {fmt(r.get('rouge_l_vs_exact'), '.3f')} "
            f"| {fmt(r.get('answer_agreement_vs_exact'), '.2f')} ({fmt(floor.get(r['dataset']), '.2f')}) "
            f"| {acc} | {outcomes} |")
    return out
