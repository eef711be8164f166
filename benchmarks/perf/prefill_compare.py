"""``python -m benchmarks.prefill_compare``: prefill tok/s of engine variants side by side, one process.

    python -m benchmarks.prefill_compare --variants ours,mkl,stock --tokens 2000 --repeats 4

``ours`` is the CPU default engine (its default linears), ``mkl`` the same with float32 linears and
``RKSC_CPU_ONEDNN_LINEARS=0`` (every linear through MKL's ``F.linear``), ``stock`` SGLang's ``torch_native`` backend with its own sampler.
All engines stay up; each repeat prefills one new prompt per variant in turn (the same measure
as ``benchmarks.speed``'s prefill); medians and samples are printed. A narrower tool than
``benchmarks.speed``, for finding where a prefill gap comes from.
"""

from __future__ import annotations

import argparse
import os
import statistics

from benchmarks.perf.speed import measure_prefill

VARIANTS = ("ours", "mkl", "stock")


def launch(variant: str):
    from rksc_sgl.config import ONEDNN_LINEARS_ENV, RkscConfig
    from rksc_sgl.engine import launch_engine

    if variant == "stock":
        return launch_engine(attention_backend="torch_native", rksc=RkscConfig(seeded_sampling=False), log_level="error")
    if variant == "mkl":  # the spawned scheduler reads it at start-up; the default linears follow it
        os.environ[ONEDNN_LINEARS_ENV] = "0"
        try:
            return launch_engine(log_level="error")
        finally:
            os.environ.pop(ONEDNN_LINEARS_ENV)
    return launch_engine(log_level="error")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.prefill_compare", description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {', '.join(VARIANTS)}")
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=4)
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in VARIANTS for v in variants) or args.tokens < 1 or args.repeats < 1:
        p.error(f"--variants from {', '.join(VARIANTS)}; --tokens and --repeats >= 1")
    from transformers import AutoTokenizer

    engines = {v: launch(v) for v in variants}
    try:
        tok = AutoTokenizer.from_pretrained(engines[variants[0]].server_args.model_path)
        for engine in engines.values():
            measure_prefill(engine, tok, 64, salt=-1)  # warm-up
        samples = {v: [] for v in variants}
        for r in range(args.repeats):
            for v, engine in engines.items():
                samples[v].append(round(measure_prefill(engine, tok, args.tokens, salt=r), 1))
        for v in variants:
            print(f"{v:6} {statistics.median(samples[v]):8.1f} tok/s  {samples[v]}")
    finally:
        for engine in engines.values():
            engine.shutdown()


if __name__ == "__main__":
    main()
