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
mode per recompute share. The agent workloads (``agents``, ``bon-grader`` and their
``-steady`` variants, ``benchmarks.bench.agent_workloads``) also time every request to its first
token (TTFT beside wall time). With ``exact`` in the run, every stop rule of
``benchmarks.bench.stop_replay.CURVE`` is replayed on exact's branches (the trade-off curve, written to
``<workload>_stop_curve.json``); ``adaptive`` rows compare the runtime's saving with the replay
of their own rule. Stop thresholds are chosen on other problems: ``--calibration-offset 20``
evaluates the 20 problems after a ``--limit 20`` run's. ``python -m benchmarks.plot`` draws the figures and
``python -m benchmarks.report`` writes the README's results section.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path

from tqdm import tqdm

from benchmarks.bench.agent_workloads import print_latency
from benchmarks.bench.modes import MODES, check_sweep_modes, resolve_modes, sweep_modes
from benchmarks.bench.records import MODEL_NAME, append_jsonl, git_commit, machine
from benchmarks.bench.rows import build_rows, print_adaptive, print_blend, print_table, write_curve
from benchmarks.bench.workloads import WORKLOADS, BenchSettings, resolve_workload
from programs.datasets import load
from rksc_sgl.config import CPU_LINEAR_DTYPES, RkscConfig

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
    p.add_argument("--asks-check-sweep", default=None,
                   help="ASKS workloads: also run blend once per comma-separated LAYERS:GATE (--asks-check-layers, "
                        "--asks-max-deviation), as modes asks-check@<layers>:<gate>, e.g. 2:0.025,3:0.04,4:0.07")
    p.add_argument("--limit", type=int, default=20, help="problems per dataset (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per (dataset, mode); wall time is their median")
    p.add_argument("--seed", type=int, default=d.seed, help="sampling seed of the run (default: %(default)s)")
    p.add_argument("--num-branches", type=int, default=d.num_branches, help="forks per problem (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"per branch (default: {d.max_new_tokens}; agents and bon-grader: "
                        f"{WORKLOADS['agents'].default_max_new_tokens})")
    p.add_argument("--temperature", type=float, default=d.temperature, help="(default: %(default)s)")
    p.add_argument("--shots", type=int, default=None,
                   help=f"held-out solved exemplars in front of every question (default: {d.shots}; "
                        "role-sc and multi-doc: 0, they use none)")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="problems (programs) in flight at once (default: all; bon-verify and bon-grader: rounds "
                        "of 16)")
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
    p.add_argument("--cpu-linear-dtype", default=RkscConfig().cpu_linear_dtype, choices=CPU_LINEAR_DTYPES,
                   help="the CPU path's linears in every mode of the run, so modes compare on the same numerics "
                        "(default: the engine's, %(default)s)")
    p.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    try:
        args.workload_obj = workload = resolve_workload(args.workload)
        args.mode_objs = resolve_modes(args.modes)
        for flag, spec, make in (("--asks-recompute-sweep", args.asks_recompute_sweep, sweep_modes),
                                 ("--asks-check-sweep", args.asks_check_sweep, check_sweep_modes)):
            if spec is None:
                continue
            if not workload.branch_quality:
                raise ValueError(f"{flag}: runs only with --workload "
                                 f"{', '.join(w.name for w in WORKLOADS.values() if w.branch_quality)}, "
                                 f"not {args.workload!r}")
            args.mode_objs += make(spec)
        if len({m.name for m in args.mode_objs}) != len(args.mode_objs):
            raise ValueError(f"--modes: a mode is given twice in {args.modes!r}")
        if args.datasets is None:
            args.datasets = ",".join(workload.default_datasets or workload.datasets)
        if args.shots is None:
            args.shots = d.shots if workload.default_shots is None else workload.default_shots
        if args.max_new_tokens is None:
            args.max_new_tokens = workload.default_max_new_tokens or d.max_new_tokens
        args.dataset_names = [x.strip() for x in args.datasets.split(",") if x.strip()]
        for name in args.dataset_names:
            if name not in workload.datasets:
                raise ValueError(f"--datasets: unknown dataset {name!r} for --workload {args.workload}; "
                                 f"valid: {', '.join(workload.datasets)}")
        for flag in ("limit", "repeats"):
            if getattr(args, flag) < 1:
                raise ValueError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
        if args.limit < workload.min_problems:
            raise ValueError(f"--limit must be >= {workload.min_problems} for --workload {args.workload} (its "
                             f"first half warms the cache, the second is measured), got {args.limit}")
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
    backend = RkscEngineEndpoint(launch_engine(args.model_path, rksc=mode.engine_config(args.cpu_linear_dtype),
                                               log_level="error", **overrides))
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
                acc = results[mode.name].setdefault(name, {"walls": [], "counters": [], "references": [], "runs": [],
                                                           "evicted": 0})
                acc["walls"].append(r["wall"])
                acc["runs"].append(r["run"])
                acc["counters"].append(r["counters"])
                acc["references"].append(r["reference"])
                acc["evicted"] += r["evicted"]
                acc.update(run=r["run"], pool=r["pool"], max_total_tokens=r["max_total_tokens"])
    return results, orders


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data = {name: split_problems(name, args.shots, args.limit, args.calibration_offset) for name in args.dataset_names}
    meta = {"run_id": time.strftime("%Y%m%dT%H%M%S"), "model": args.model_path or MODEL_NAME, "commit": git_commit(), "date": time.strftime("%Y-%m-%d"),
            "machine": machine(),
            "linear_dtype": args.cpu_linear_dtype, "repeats": args.repeats, "seed": args.seed, "settings": dataclasses.asdict(args.settings),
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
    print_latency(rows)
    print_adaptive(rows)
    print(f"\n{len(rows)} rows appended to {out}; total {time.perf_counter() - started:.0f} s")
    if curve_file:
        print(f"stop-rule curve (replayed on exact's branches): {curve_file}")
