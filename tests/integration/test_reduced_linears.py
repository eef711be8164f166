"""``--cpu-linear-dtype bfloat16`` and ``int8`` on the real model: the engine runs its linears in
that dtype, which moves log-probabilities by its rounding (measurably, not by much), and a
request's tokens do not depend on the cache having served its prompt.

The agreement of greedy text with float32 over 128 tokens is a benchmark figure
(``python -m benchmarks.speed --cpu-linear-dtype bfloat16``, or ``int8``), not a test bound.
"""

from __future__ import annotations

import pytest

from radix_ext.cpu import kernels
from rksc_sgl.config import RkscConfig

pytestmark = pytest.mark.integration

POOL_TOKENS = 4096
PROMPTS = [
    "The capital of France is",
    "List the first five prime numbers and explain why 1 is not prime.",
    "Q: What is 17 + 25? A:",
    "Write a haiku about the sea.",
]
MOVED_AT_LEAST = 1e-4  # nats: float32 linears move a log-probability by ~1e-6, bf16 and int8 ones by far more
# nats, the top token's log-probability at the first position: int8 weights (a scale per 32) round
# coarser than bf16's 8-bit mantissa; int8 moved these four by at most 0.14. oneDNN's bf16 linears
# round differently at different row counts, so bf16's figure depended on how the scheduler
# batched the four prompts: 0.09 to 0.135 on "Q: What is 17 + 25? A:" in four runs (a fresh-clone
# CI run failed on the old bound, 0.1). Each prompt now runs alone on an empty cache (first_top),
# one batching; the bound keeps room for another CPU's kernel choice.
MOVED_AT_MOST = {"bfloat16": 0.2, "int8": 0.25}


def launch(dtype: str):
    from rksc_sgl.engine import launch_engine

    return launch_engine(rksc=RkscConfig(cpu_linear_dtype=dtype), max_total_tokens=POOL_TOKENS, log_level="error")


@pytest.fixture(scope="module")
def engines():
    started = {}
    try:
        for dtype in ("float32", "bfloat16") + (("int8",) if kernels.unsupported() is None else ()):
            started[dtype] = launch(dtype)
        yield started
    finally:
        for engine in started.values():
            engine.shutdown()


def first_top(engine, prompts: list[str]) -> list[tuple[int, float]]:
    """(token, log-probability) of each prompt's first greedy token, each prompt alone on an empty
    cache: one batching whatever the scheduler's timing."""
    tops = []
    for prompt in prompts:
        engine.flush_cache()
        out = engine.generate(prompt=prompt, sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                              return_logprob=True, top_logprobs_num=1)
        logprob, token = out["meta_info"]["output_top_logprobs"][0][0][:2]
        tops.append((token, logprob))
    return tops


def reduced(engines, dtype: str):
    if dtype not in engines:
        pytest.skip(f"int8 linears: {kernels.unsupported()}")
    return engines[dtype]


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_it_moves_the_first_log_probabilities_by_rounding_only(engines, dtype):
    fp32, ours = first_top(engines["float32"], PROMPTS), first_top(reduced(engines, dtype), PROMPTS)
    moved = [abs(a[1] - b[1]) for a, b in zip(fp32, ours)]
    assert max(moved) >= MOVED_AT_LEAST, moved  # the reduced path really ran
    assert max(moved) <= MOVED_AT_MOST[dtype], (moved, fp32, ours)
    assert sum(a[0] == b[0] for a, b in zip(fp32, ours)) >= len(PROMPTS) - 1, (fp32, ours)


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_its_tokens_are_the_same_with_and_without_the_cached_prompt(engines, dtype):
    engine = reduced(engines, dtype)
    params = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
    engine.flush_cache()
    cold = engine.generate(prompt=PROMPTS[1], sampling_params=params)
    warm = engine.generate(prompt=PROMPTS[1], sampling_params=params)
    assert warm["meta_info"]["cached_tokens"] > 0
    assert warm["output_ids"] == cold["output_ids"]


def test_int8_tokens_do_not_depend_on_the_batch(engines):
    engine = reduced(engines, "int8")
    params = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
    alone = [engine.generate(prompt=p, sampling_params=params)["output_ids"] for p in PROMPTS]
    together = [o["output_ids"] for o in engine.generate(prompt=PROMPTS, sampling_params=params)]
    assert together == alone
