"""``python -m benchmarks.profile_scheduler``: where the scheduler's time goes, per mode, on one workload.

    python -m benchmarks.profile_scheduler --workload bon-verify --dataset mmlu-stem --limit 20 \\
        --modes exact,rksc-lru,rsbcm-only

Each mode runs as its own ``benchmarks.bench`` process (results to a scratch folder, not to
``benchmarks/results``); once its scheduler process (title ``sglang::scheduler``) appears,
``py-spy record`` samples it (``--rate`` per second, idle samples left out) until the run ends.
Every sample's stack is put in one category, the first of ``CATEGORIES`` that any of its frames
matches: sampling, the model forward (with its KV pool writes), the radix cache (SGLang's
``mem_cache`` and our ``backend.py`` / ``eviction.py``, called from the loop), our other scheduler
hooks (``radix_ext``), and the rest of the scheduler loop; start-up (loading the model, warming up before the event loop) is left out. Per mode: seconds per category, and the functions that spent most of the cache's
samples themselves, and the model forward's seconds by batch kind (decode, ASKS blend's reduced prefill, other
prefill). This is what tells the cache class's cost (``rksc-lru`` against ``exact``) from
the policy's and from the model's. Sampling slows the scheduler a little, alike in every mode: read
the shares and the differences, not the wall time. One JSON record per run is appended to
``--output`` and a table is printed.
"""

from __future__ import annotations

import argparse
import collections
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench.records import append_jsonl, git_commit, machine

RESULTS = Path("benchmarks/results/scheduler_profile.jsonl")
SCHEDULER_TITLE = "sglang::scheduler"
# (category, substrings of a frame's file path): a sample goes to the first category any frame of
# its stack matches. Sampling runs inside the forward, and the forward writes the KV pool (in
# ``mem_cache/memory_pool.py``): those count as the forward's, so "radix cache" is the tree's own
# work (match, insert, evict, lock), SGLang's or ours, called from the scheduler loop.
CATEGORIES = (
    ("sampling", ("/sglang/srt/layers/sampler.py", "/radix_ext/sampling/sampler.py", "/radix_ext/sampling/seeded.py")),
    ("model forward", ("/sglang/srt/model_executor/", "/sglang/srt/models/", "/radix_ext/cpu/attention.py",
                       "/radix_ext/cgee/forward.py")),
    ("radix cache", ("/sglang/srt/mem_cache/", "/radix_ext/eviction/backend.py", "/radix_ext/eviction/policy.py")),
    ("rksc hooks", ("/radix_ext/",)),
)
OTHER = "scheduler loop (other)"
EVENT_LOOP = "event_loop_"  # Scheduler.event_loop_normal / event_loop_overlap: serving, not start-up


# The model forward's samples by the kind of batch (``forward_kind``): a decode step (the lean
# loop's ``_decode``, or the attention backend's ``forward_decode`` under SGLang's own layers), ASKS
# blend's reduced prefill (``blend_forward``), else a prefill (extend) as SGLang computes it.
FORWARD_KINDS = (("decode", ("_decode", "forward_decode")), ("ASKS blend", ("blend_forward",)))
PREFILL = "prefill"


def function_name(frame: str) -> str:
    """``Class.method`` of a py-spy frame ``"Class.method (file)"``."""
    return frame.split(" (", 1)[0]


def forward_kind(stack: list[str]) -> str:
    """What kind of forward a "model forward" sample was in (``FORWARD_KINDS``, else prefill)."""
    names = {function_name(f).rsplit(".", 1)[-1] for f in stack}
    for kind, functions in FORWARD_KINDS:
        if names.intersection(functions):
            return kind
    return PREFILL


def categorize(stack: list[str]) -> str:
    """The category of one sampled stack (frames outermost first, as py-spy writes them)."""
    for name, paths in CATEGORIES:
        if any(p in frame for frame in stack for p in paths):
            return name
    return OTHER


def parse_collapsed(text: str) -> list[tuple[list[str], int]]:
    """py-spy's ``--format raw`` output: ``frame;frame;... count`` per line."""
    stacks = []
    for line in text.splitlines():
        head, _, count = line.rpartition(" ")
        if head and count.isdigit():
            stacks.append((head.split(";"), int(count)))
    return stacks


def in_event_loop(stack: list[str]) -> bool:
    """Whether a sample is the scheduler serving (``Scheduler.event_loop_*``), not loading the model."""
    return any(function_name(frame).rsplit(".", 1)[-1].startswith(EVENT_LOOP) for frame in stack)


def summarize(stacks: list[tuple[list[str], int]], rate: int, top: int = 8) -> dict:
    """Over the samples of the scheduler's event loop: seconds per category, and the innermost
    cache frames with the most samples."""
    by_category: collections.Counter = collections.Counter()
    by_forward: collections.Counter = collections.Counter()
    cache_frames: collections.Counter = collections.Counter()
    for stack, count in stacks:
        if not in_event_loop(stack):
            continue
        category = categorize(stack)
        by_category[category] += count
        if category == "model forward":
            by_forward[forward_kind(stack)] += count
        if category == "radix cache":
            frame = next(f for f in reversed(stack) if any(p in f for p in dict(CATEGORIES)["radix cache"]))
            cache_frames[frame] += count
    total = sum(by_category.values())
    return {"samples": total, "seconds": round(total / rate, 2),
            "seconds_by_category": {k: round(v / rate, 2) for k, v in by_category.most_common()},
            "share_by_category": {k: round(v / total, 4) for k, v in by_category.most_common()} if total else {},
            "forward_seconds_by_kind": {k: round(v / rate, 2) for k, v in by_forward.most_common()},
            "top_cache_frames": [{"frame": f, "seconds": round(c / rate, 2)} for f, c in cache_frames.most_common(top)]}


def scheduler_pid(root_pid: int) -> int | None:
    import psutil

    try:
        for child in psutil.Process(root_pid).children(recursive=True):
            try:
                if child.name().startswith(SCHEDULER_TITLE) or SCHEDULER_TITLE in " ".join(child.cmdline()):
                    return child.pid
            except psutil.NoSuchProcess:
                continue
    except psutil.NoSuchProcess:
        return None
    return None


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("py-spy not found: it is installed with the project (make install)")
    return found


def profile_mode(mode: str, args, scratch: Path) -> dict:
    """One bench run of ``mode`` with py-spy on its scheduler; its summary."""
    bench = [sys.executable, "-m", "benchmarks.bench", "--workload", args.workload, "--datasets", args.dataset,
             "--limit", str(args.limit), "--modes", mode, "--output-dir", str(scratch / mode), *args.bench_args]
    out = scratch / f"{mode}.txt"
    start = time.monotonic()
    log = open(scratch / f"{mode}.log", "w")
    run = subprocess.Popen(bench, stdout=subprocess.DEVNULL, stderr=log)
    spy = None
    try:
        while spy is None and run.poll() is None:
            pid = scheduler_pid(run.pid)
            if pid is None:
                time.sleep(0.2)
                continue
            spy = subprocess.Popen([py_spy(), "record", "--pid", str(pid), "--rate", str(args.rate), "--format", "raw",
                                    "--output", str(out), "--nonblocking", "--full-filenames", "--nolineno"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        code = run.wait()
    finally:
        if run.poll() is None:
            run.kill()
        log.close()
    if spy is not None:
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()
    if code != 0:
        raise SystemExit(f"mode {mode}: the bench failed (exit {code}); see {scratch / (mode + '.log')}:\n"
                         + (scratch / f"{mode}.log").read_text()[-2000:])
    if not out.exists():
        raise SystemExit(f"mode {mode}: py-spy wrote no profile (no scheduler process found, or ptrace refused)")
    wall = [json.loads(line)["wall_s"] for line in (scratch / mode / f"{args.workload}.jsonl").read_text().splitlines()]
    return {"mode": mode, "bench_wall_s": wall[0], "run_s": round(time.monotonic() - start, 1),
            **summarize(parse_collapsed(out.read_text()), args.rate)}


def table(record: dict) -> str:
    categories = [name for name, _ in CATEGORIES] + [OTHER]
    lines = ["| mode | bench wall s | " + " | ".join(f"{c} s" for c in categories) + " |",
             "|---|---|" + "---|" * len(categories)]
    for m in record["modes"]:
        lines.append(f"| {m['mode']} | {m['bench_wall_s']:.1f} | "
                     + " | ".join(f"{m['seconds_by_category'].get(c, 0):.2f}" for c in categories) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_scheduler", description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="bon-verify", help="a benchmarks.bench workload (default: %(default)s)")
    p.add_argument("--dataset", default="mmlu-stem", help="one dataset (default: %(default)s)")
    p.add_argument("--limit", type=int, default=20, help="problems (default: %(default)s)")
    p.add_argument("--modes", default="exact,rksc-lru,rsbcm-only", help="comma-separated bench modes (default: %(default)s)")
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second (default: %(default)s)")
    p.add_argument("--bench-args", default="", help="more flags for benchmarks.bench, quoted")
    p.add_argument("--output", type=Path, default=RESULTS, help="results file, JSON lines (default: %(default)s)")
    args = p.parse_args(argv)
    if args.limit < 1:
        p.error(f"--limit must be >= 1, got {args.limit}")
    if not 1 <= args.rate <= 1000:
        p.error(f"--rate must be in [1, 1000], got {args.rate}")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    from benchmarks.bench.modes import MODES

    unknown = [m for m in args.modes if m not in MODES]
    if not args.modes or unknown:
        p.error(f"--modes: unknown {unknown}; valid: {', '.join(MODES)}")
    args.bench_args = shlex.split(args.bench_args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tqdm import tqdm

    with tempfile.TemporaryDirectory(prefix="rksc-profile-") as scratch:
        modes = [profile_mode(mode, args, Path(scratch)) for mode in tqdm(args.modes, desc="profile", unit="mode")]
    record = {"benchmark": "scheduler_profile", "commit": git_commit(), "machine": machine(),
              "date": time.strftime("%Y-%m-%d"), "rate": args.rate,
              "command": "python -m benchmarks.profile_scheduler " + shlex.join(argv if argv is not None else sys.argv[1:]),
              "workload": args.workload, "dataset": args.dataset, "limit": args.limit, "modes": modes}
    append_jsonl(args.output, [record])
    print(table(record))
    for m in modes:
        kinds = ", ".join(f"{kind} {seconds:.2f} s" for kind, seconds in m["forward_seconds_by_kind"].items())
        print(f"\n{m['mode']}: the model forward by batch kind: {kinds or '-'}")
        print(f"{m['mode']}: the radix cache's busiest frames:")
        for f in m["top_cache_frames"]:
            print(f"  {f['seconds']:7.2f} s  {f['frame']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
