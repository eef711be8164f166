"""``python -m benchmarks.decode_profile``: where a decode step's time goes, by part of the model.

    python -m benchmarks.decode_profile --streams 1,8,32 --cpu-linear-dtype float32,bfloat16

For each linear dtype it starts the default CPU engine, warms it up, and for each stream count
decodes ``--new-tokens`` greedy tokens of that many streams under SGLang's own profiler
(``Engine.start_profile``: torch's profiler in the scheduler, Python frames recorded). In the
trace every event's self time (its duration less its children's) goes to the innermost frame of a
known part (``PARTS``, matched on the Python frames around it) and to "ops" (a torch operator:
kernel time) or "python" (interpreter time in that part's own code). Only time inside SGLang's
decode-step annotations counts. The profiler slows Python more than kernels, so the shares are of
a profiled step (``step_ms``); the unprofiled rate of the same engine is measured next to it
(``tok_s``). One JSON line per (linear dtype, streams) is appended to ``--output``, a table
printed.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench.records import MODEL_NAME, append_jsonl, git_commit, machine
from benchmarks.perf.speed import measure_decode
from rksc_sgl.config import CPU_LINEAR_DTYPES, RkscConfig

RESULTS = Path("benchmarks/results/decode_profile.jsonl")
STEP_PREFIX = "step[DECODE"  # SGLang's annotation of one decode step
# (part, substrings of a Python frame's name): an event belongs to the innermost frame matching one.
PARTS = (
    ("LM head", ("logits_processor.py",)),  # checked on every enclosing frame first: its linear is ours
    ("linears", ("radix_ext/cpu/speed.py", "layers/linear.py")),
    ("KV writes", ("mem_cache/memory_pool.py",)),
    ("layer boundaries", ("layers/layer_boundary/",)),  # SGLang's per-layer stage machinery
    ("attention", ("radix_ext/cpu/attention.py", "radix_attention.py", "torch_native_backend.py")),
    ("norms", ("layernorm.py", "): add_rms_norm", "): fused_rms_norm")),  # the fused norm (int8 path)
    ("rotary", ("rotary_embedding", "): _rotate", "): rope_neox")),  # the lean loop's own rotations
    ("activation", ("activation.py",)),
    ("sampling", ("sampler.py", "radix_ext/sampling/")),
    # decode_stack.py: every decoder layer in one C++ call (int8): its norms, linears, attention and
    # activation are one op there; RKSC_CPU_DECODE_LAYERS=0 splits them into the parts above
    ("decoder layers, one call", ("radix_ext/cpu/decode_stack.py",)),
    ("model (other)", ("sglang/srt/models/", "radix_ext/cpu/decode.py")),  # decode.py: the lean loop
    ("scheduler", ("sglang/srt/",)),
)
OTHER = "other"


def self_times(events: list[dict]) -> list[tuple[dict, float, list[dict]]]:
    """(event, self time in us, its enclosing events innermost first) for one thread's events."""
    events = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
    out, stack = [], []
    for e in events:
        while stack and stack[-1][0]["ts"] + stack[-1][0]["dur"] <= e["ts"]:
            stack.pop()
        entry = [e, float(e["dur"]), [s[0] for s in reversed(stack)]]
        if stack:
            stack[-1][1] -= e["dur"]
        stack.append(entry)
        out.append(entry)
    return [tuple(entry) for entry in out]


def part_of(event: dict, parents: list[dict]) -> str:
    frames = [f for f in (event, *parents) if f.get("cat") == "python_function"]
    if any(p in f["name"] for f in frames for p in PARTS[0][1]):
        return PARTS[0][0]
    for frame in frames:
        if frame.get("cat") != "python_function":
            continue
        for part, patterns in PARTS:
            if any(p in frame["name"] for p in patterns):
                return part
    return OTHER


def summarize_trace(path: str) -> dict:
    """Per part, ms of ops and of Python per decode step, over the trace's decode steps."""
    with gzip.open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    by_thread = collections.defaultdict(list)
    for e in events:
        by_thread[(e["pid"], e["tid"])].append(e)
    totals: collections.Counter = collections.Counter()
    steps, step_us = 0, 0.0
    for thread_events in by_thread.values():
        for event, own, parents in self_times(thread_events):
            if event["name"].startswith(STEP_PREFIX):
                steps += 1
                step_us += event["dur"]
            if not any(p["name"].startswith(STEP_PREFIX) for p in parents):
                continue
            kind = "python" if event.get("cat") == "python_function" else "ops"
            totals[(part_of(event, parents), kind)] += own
    if not steps:
        raise RuntimeError(f"{path}: no {STEP_PREFIX} annotations; did SGLang's profiler record the decode?")
    parts = {}
    for (part, kind), us in totals.items():
        parts.setdefault(part, {"ops": 0.0, "python": 0.0})[kind] = round(us / steps / 1e3, 3)
    return {"steps": steps, "step_ms": round(step_us / steps / 1e3, 2), "parts": parts}


def profile(engine, streams: int, new_tokens: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="rksc-profile-") as out:
        engine.start_profile(output_dir=out, activities=["CPU"], with_stack=True, record_shapes=False)
        measure_decode(engine, streams, new_tokens)
        engine.stop_profile()
        for _ in range(100):  # the scheduler writes the trace after it answers
            traces = glob.glob(os.path.join(out, "*.trace.json.gz"))
            if traces:
                break
            time.sleep(0.2)
        time.sleep(1.0)
        if not traces:
            raise RuntimeError("SGLang's profiler wrote no trace")
        return summarize_trace(traces[0])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.decode_profile", description=__doc__.splitlines()[0])
    p.add_argument("--streams", default="1,8,32", help="comma-separated decode stream counts")
    p.add_argument("--cpu-linear-dtype", default=RkscConfig().cpu_linear_dtype,
                   help=f"comma-separated, of {', '.join(CPU_LINEAR_DTYPES)} (default: %(default)s)")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--model-path", default=None)
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    try:
        streams = [int(s) for s in args.streams.split(",")]
    except ValueError:
        p.error(f"--streams takes comma-separated integers, got {args.streams!r}")
    dtypes = args.cpu_linear_dtype.split(",")
    bad = [d for d in dtypes if d not in CPU_LINEAR_DTYPES]
    if bad or min(streams) < 1 or args.new_tokens < 2:
        p.error(f"--cpu-linear-dtype takes {', '.join(CPU_LINEAR_DTYPES)} (got {bad}); --streams and "
                "--new-tokens must be >= 1 and >= 2")

    from rksc_sgl.engine import launch_engine

    meta = {"commit": git_commit(), "date": time.strftime("%Y-%m-%d"), "machine": machine(),
            "model": args.model_path or MODEL_NAME, "new_tokens": args.new_tokens,
            "command": "python -m benchmarks.decode_profile " + " ".join(argv if argv is not None else sys.argv[1:])}
    rows = []
    for dtype in dtypes:
        engine = launch_engine(args.model_path, rksc=RkscConfig(cpu_linear_dtype=dtype), log_level="error")
        try:
            measure_decode(engine, 2, 8)
            for n in streams:
                tok_s = sorted(measure_decode(engine, n, args.new_tokens) for _ in range(3))[1]
                rows.append({"linear_dtype": dtype, "streams": n, "tok_s": round(tok_s, 2),
                             **profile(engine, n, args.new_tokens), **meta})
                print(f"{dtype} x{n}: {tok_s:.1f} tok/s unprofiled, {rows[-1]['step_ms']} ms per profiled step",
                      flush=True)
        finally:
            engine.shutdown()
    append_jsonl(args.output, rows)
    for r in rows:
        shares = sorted(r["parts"].items(), key=lambda kv: -sum(kv[1].values()))
        print(f"\n{r['linear_dtype']}, {r['streams']} streams: {r['tok_s']} tok/s, profiled step {r['step_ms']} ms")
        for part, t in shares:
            print(f"  {part:14} ops {t['ops']:7.2f} ms   python {t['python']:7.2f} ms")
    print(f"appended {len(rows)} lines to {args.output}")


if __name__ == "__main__":
    main()
