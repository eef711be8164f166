"""``python -m benchmarks.fidelity``: how far the CPU path's linears move the model's numbers, read teacher-forced.

    python -m benchmarks.fidelity --texts 200

Each engine reads the same GSM8K reference solutions (``Question: ...`` then ``Answer:`` and the
solution, the first ``--texts`` of the test split) in prefills only, and returns per position the
log-probability of the text's next token and its own top token (SGLang's input logprobs). Against
the engine with float32 linears, each of ``--cpu-linear-dtypes`` and stock SGLang (``torch_native``
attention and MKL's linears, both float32: another summation order alone, the floor) get: their
perplexity on the texts; the share of positions whose top token is float32's; the mean absolute
difference of the text's log-probabilities; and the change in negative log-likelihood per token,
the mean over texts with a 95% interval.

Teacher forcing compares every position on the same context, so one early difference does not
move the rest of a text the way it moves greedy or sampled output (``benchmarks.speed``'s greedy
agreement), and it needs no answer to be right: it measures the numbers where task accuracy, for a
model at its floor, cannot. One JSON line per engine is appended to
``benchmarks/results/fidelity.jsonl``; a table is printed last.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm

from benchmarks.bench.records import MODEL_NAME, append_jsonl, git_commit, machine
from benchmarks.perf.speed import engine_overrides
from rksc_sgl.config import CPU_LINEAR_DTYPES, int8_linears_unsupported

RESULTS = Path("benchmarks/results/fidelity.jsonl")
# A text's reading: per position after the first, the text's token's log-probability and the top token id.
Reading = tuple[list[float], list[int]]


def reference_texts(n: int) -> list[str]:
    from programs.datasets.gsm8k import read_raw

    return [f"Question: {r['question'].strip()}\nAnswer: {r['answer'].strip()}" for r in read_raw()[:n]]


def engines(dtypes: list[str]) -> dict[str, dict]:
    """Engine name -> ``launch_engine`` keyword arguments (``benchmarks.speed``'s "ours" in each
    dtype, and its "stock"); ``float32`` is the reference."""
    named = {dtype: engine_overrides(dtype)["ours"] for dtype in ("float32", *dtypes)}
    return {**named, "stock": engine_overrides()["stock"]}


def read(engine, texts: list[str]) -> list[Reading]:
    """Every text in one prefill, no token cached (``logprob_start_len=0``), one token generated."""
    outs = engine.generate(prompt=texts, sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                           return_logprob=True, logprob_start_len=0, top_logprobs_num=1)
    readings = []
    for out in outs:
        info = out["meta_info"]
        logprobs = [lp for lp, _, _ in info["input_token_logprobs"][1:]]
        tops = [top[0] for top in info["input_top_logprobs"][1:]]
        if len(logprobs) != info["prompt_tokens"] - 1 or any(lp > top_lp + 1e-4 for lp, (top_lp, _, _) in
                                                              zip(logprobs, tops)):
            raise RuntimeError("input logprobs do not line up with the prompt's positions")
        readings.append((logprobs, [token for _, token, _ in tops]))
    return readings


def compare(ours: list[Reading], reference: list[Reading]) -> dict:
    """What ``ours`` reads against ``reference`` on the same texts (pure: see the module's docstring)."""
    if [len(lp) for lp, _ in ours] != [len(lp) for lp, _ in reference]:
        raise ValueError("the readings are of different texts")
    pairs = list(zip(ours, reference))
    tokens = sum(len(lp) for lp, _ in reference)
    same_top = sum(a == b for (_, x), (_, y) in pairs for a, b in zip(x, y))
    abs_diff = sum(abs(a - b) for (x, _), (y, _) in pairs for a, b in zip(x, y))
    deltas = [statistics.fmean(y) - statistics.fmean(x) for (x, _), (y, _) in pairs if x]  # NLL: ours - reference
    delta = statistics.fmean(deltas)
    half = 1.96 * statistics.stdev(deltas) / math.sqrt(len(deltas)) if len(deltas) > 1 else math.inf
    nll = -sum(sum(x) for x, _ in ours) / tokens
    reference_nll = -sum(sum(y) for y, _ in reference) / tokens
    return {"texts": len(pairs), "tokens": tokens,
            "perplexity": round(math.exp(nll), 4), "reference_perplexity": round(math.exp(reference_nll), 4),
            "top_token_agreement": round(same_top / tokens, 4),
            "mean_abs_logprob_difference": round(abs_diff / tokens, 5),
            "nll_delta_per_token": round(delta, 5), "nll_delta_ci95": [round(delta - half, 5), round(delta + half, 5)]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fidelity", description=__doc__.splitlines()[0])
    default_dtypes = ",".join(d for d in ("int8", "bfloat16") if d != "int8" or int8_linears_unsupported() is None)
    p.add_argument("--cpu-linear-dtypes", default=default_dtypes,
                   help="comma-separated linears compared with float32 (default: %(default)s)")
    p.add_argument("--texts", type=int, default=200, help="GSM8K reference solutions read (default: %(default)s)")
    p.add_argument("--model-path", default=None, help=f"local HF folder (default: {MODEL_NAME})")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    dtypes = [d.strip() for d in args.cpu_linear_dtypes.split(",") if d.strip()]
    for dtype in dtypes:
        if dtype not in CPU_LINEAR_DTYPES or dtype == "float32":
            p.error(f"--cpu-linear-dtypes: {dtype!r} is not one of {', '.join(CPU_LINEAR_DTYPES[1:])}")
        if dtype == "int8" and (why := int8_linears_unsupported()):
            p.error(f"--cpu-linear-dtypes int8: {why}")
    if args.texts < 2:
        p.error(f"--texts must be >= 2 (the interval is over texts), got {args.texts}")

    from rksc_sgl.engine import launch_engine

    texts = reference_texts(args.texts)
    meta = {"commit": git_commit(), "date": time.strftime("%Y-%m-%d"), "machine": machine(),
            "model": args.model_path or MODEL_NAME, "dataset": "gsm8k reference solutions",
            "command": " ".join(["python -m benchmarks.fidelity", *(sys.argv[1:] if argv is None else argv)])}
    readings = {}
    for name, kwargs in tqdm(engines(dtypes).items(), desc="engines"):
        engine = launch_engine(args.model_path, log_level="error", **kwargs)
        try:
            t0 = time.perf_counter()
            readings[name] = read(engine, texts)
            seconds = time.perf_counter() - t0
        finally:
            engine.shutdown()
        tqdm.write(f"{name}: {len(texts)} texts read in {seconds:.1f} s")
    rows = [{"engine": name, "linear_dtype": "float32" if name == "stock" else name, "reference": "float32",
             **compare(readings[name], readings["float32"]), **meta} for name in readings if name != "float32"]
    append_jsonl(args.output, rows)
    print(f"\n{'engine':9} {'perplexity':>10} {'float32':>8} {'top = f32':>9} {'|dlogp|':>8}  dNLL/token [95% CI]")
    for r in rows:
        lo, hi = r["nll_delta_ci95"]
        print(f"{r['engine']:9} {r['perplexity']:>10.3f} {r['reference_perplexity']:>8.3f} "
              f"{r['top_token_agreement']:>9.3f} {r['mean_abs_logprob_difference']:>8.4f}  "
              f"{r['nll_delta_per_token']:+.4f} [{lo:+.4f}, {hi:+.4f}]")
    print(f"appended {len(rows)} lines to {args.output}")


if __name__ == "__main__":
    main()
