"""Speed of SGLang's CPU path on this machine: decode tok/s at 1/8/32 streams and prefill tok/s.

    python -m benchmarks.speed --dtypes float32,float16,bfloat16 --repeats 3

For each dtype it starts three in-process engines: ours (the CPU defaults), stock (SGLang's
``torch_native`` attention) and ours with SGLang's own sampler (``seeded_sampling`` off), warms
them up, and measures (median of ``--repeats``, engines alternating): greedy decode throughput of
N streams from one short prompt (``--new-tokens`` each, EOS ignored) and prefill throughput of one
``--prefill-tokens``-token prompt that shares only its first token with the cache (the rate
counts the tokens computed), ours against stock; and
sampled decode (temperature ``--temperature``, every stream seeded) at ``--sampled-streams``,
ours against ours with SGLang's sampler: the cost of seeded sampling. One JSON line per
measurement (``tok_s`` ours, ``baseline`` and ``baseline_tok_s``; ``stock_tok_s`` where the
baseline is stock) is appended to ``benchmarks/results/speed.jsonl``; a table is printed last.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from tqdm import tqdm

from benchmarks.bench.records import MODEL_NAME, append_jsonl, git_commit, machine

RESULTS = Path("benchmarks/results/speed.jsonl")
DECODE_PROMPT = "Write a long story about a lighthouse keeper who finds a map."


def prefill_prompt(tokenizer, n_tokens: int, salt: int) -> list[int]:
    """A prompt of exactly ``n_tokens`` token ids, different for every ``salt`` from its second token
    on (all begin with ``item``, so a prefill extends a 1-token cached prefix)."""
    words = " ".join(f"item{salt}-{i} is number {i * 7 + salt}." for i in range(n_tokens))
    return tokenizer.encode(words)[:n_tokens]


def measure_decode(engine, streams: int, new_tokens: int, temperature: float = 0.0) -> float:
    params = [{"max_new_tokens": new_tokens, "temperature": temperature, "ignore_eos": True, "sampling_seed": i}
              for i in range(streams)]
    t0 = time.perf_counter()
    outs = engine.generate(prompt=[DECODE_PROMPT] * streams, sampling_params=params)
    elapsed = time.perf_counter() - t0
    return sum(o["meta_info"]["completion_tokens"] for o in outs) / elapsed


def measure_prefill(engine, tokenizer, n_tokens: int, salt: int) -> float:
    ids = prefill_prompt(tokenizer, n_tokens, salt)
    t0 = time.perf_counter()
    out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0.0})
    elapsed = time.perf_counter() - t0
    computed = out["meta_info"]["prompt_tokens"] - out["meta_info"]["cached_tokens"]
    return computed / elapsed


# "ours" is the default CPU engine (attention backend rksc_cpu, see radix_ext.cpu.attention); "stock"
# is the same engine on SGLang's own torch_native backend, which also leaves threads and linears
# as stock (radix_ext.cpu.speed is applied by rksc_cpu only) and samples with SGLang's sampler;
# "unseeded" is ours with SGLang's sampler (radix_ext.sampling.sampler off).
def engine_overrides() -> dict[str, dict]:
    from rksc_sgl.config import RkscConfig

    return {"ours": {}, "stock": {"attention_backend": "torch_native", "rksc": RkscConfig(seeded_sampling=False)},
            "unseeded": {"rksc": RkscConfig(seeded_sampling=False)}}


def run_dtype(dtype: str, args: argparse.Namespace) -> list[dict]:
    """Both engines stay up; every repeat measures ours then stock, so both see the same load."""
    from transformers import AutoTokenizer

    from rksc_sgl.engine import launch_engine

    engines, rows = {}, []
    try:
        for name, overrides in engine_overrides().items():
            engines[name] = launch_engine(args.model_path, dtype=dtype, log_level="error", **overrides)
        tokenizer = AutoTokenizer.from_pretrained(engines["ours"].server_args.model_path)
        for engine in engines.values():  # warm-up
            measure_decode(engine, 2, 8)
            measure_decode(engine, 2, 8, temperature=args.temperature)
            measure_prefill(engine, tokenizer, 64, salt=-1)
        jobs = ([("decode", s, "stock") for s in args.streams] + [("prefill", 1, "stock")]
                + [("sampled", s, "unseeded") for s in args.sampled_streams])
        for kind, streams, baseline in tqdm(jobs, desc=f"speed {dtype}"):
            samples: dict[str, list[float]] = {"ours": [], baseline: []}
            for r in range(args.repeats):
                for name in samples:
                    engine = engines[name]
                    samples[name].append(
                        measure_decode(engine, streams, args.new_tokens) if kind == "decode"
                        else measure_decode(engine, streams, args.new_tokens, args.temperature) if kind == "sampled"
                        else measure_prefill(engine, tokenizer, args.prefill_tokens, salt=r)
                    )
            base = round(statistics.median(samples[baseline]), 2)
            rows.append({
                "kind": kind, "streams": streams, "dtype": dtype,
                "tok_s": round(statistics.median(samples["ours"]), 2),
                "baseline": baseline, "baseline_tok_s": base,
                **({"stock_tok_s": base} if baseline == "stock" else {}),
                "samples": [round(x, 2) for x in samples["ours"]],
                "baseline_samples": [round(x, 2) for x in samples[baseline]],
                "new_tokens": args.new_tokens if kind != "prefill" else 1,
                "temperature": args.temperature if kind == "sampled" else 0.0,
                "prefill_tokens": args.prefill_tokens if kind == "prefill" else None,
            })
    finally:
        for engine in engines.values():
            engine.shutdown()
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.speed", description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="float32", help="comma-separated, e.g. float32,float16,bfloat16")
    p.add_argument("--streams", default="1,8,32", help="comma-separated decode stream counts")
    p.add_argument("--sampled-streams", default="8,32",
                   help="comma-separated stream counts of sampled decode, seeded vs SGLang's sampler ('' for none)")
    p.add_argument("--temperature", type=float, default=0.7, help="of sampled decode (default: %(default)s)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prefill-tokens", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model-path", default=None)
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    try:
        args.streams = [int(s) for s in args.streams.split(",")]
        args.sampled_streams = [int(s) for s in args.sampled_streams.split(",") if s.strip()]
    except ValueError as e:
        p.error(f"--streams / --sampled-streams take comma-separated integers: {e}")
    if args.repeats < 1 or min(args.streams + args.sampled_streams) < 1:
        p.error("--repeats and every --streams / --sampled-streams value must be >= 1")
    if args.temperature <= 0:
        p.error(f"--temperature must be > 0 (sampled decode), got {args.temperature}")

    meta = {"commit": git_commit(), "date": time.strftime("%Y-%m-%d"), "machine": machine(),
            "model": args.model_path or MODEL_NAME, "repeats": args.repeats,
            "load_avg_1min": round(os.getloadavg()[0], 2)}  # other engines share these cores
    rows = []
    for dtype in args.dtypes.split(","):
        rows += [{**row, **meta} for row in run_dtype(dtype, args)]
    append_jsonl(args.output, rows)
    print(f"\n{'kind':8} {'streams':>7} {'dtype':9} {'tok/s':>8} {'baseline':>9} {'tok/s':>8} {'x':>6}   "
          "samples (ours | baseline)")
    for r in rows:
        print(f"{r['kind']:8} {r['streams']:>7} {r['dtype']:9} {r['tok_s']:>8.1f} {r['baseline']:>9} "
              f"{r['baseline_tok_s']:>8.1f} {r['tok_s'] / r['baseline_tok_s']:>6.2f}   "
              f"{r['samples']} | {r['baseline_samples']}")
    print(f"appended {len(rows)} lines to {args.output}")


if __name__ == "__main__":
    main()
