"""``--cpu-linear-dtype bfloat16`` on the real model: the engine runs its linears in bf16, which
moves log-probabilities by bf16 rounding (measurably, not by much), and a request's tokens do not
depend on the cache having served its prompt.

The agreement of greedy text with float32 over 128 tokens is a benchmark figure
(``python -m benchmarks.speed --cpu-linear-dtype bfloat16``), not a test bound.
"""

from __future__ import annotations

import pytest

from rksc_sgl.config import RkscConfig

pytestmark = pytest.mark.integration

POOL_TOKENS = 4096
PROMPTS = [
    "The capital of France is",
    "List the first five prime numbers and explain why 1 is not prime.",
    "Q: What is 17 + 25? A:",
    "Write a haiku about the sea.",
]
MOVED_AT_LEAST = 1e-4  # nats: float32 linears move a log-probability by ~1e-6, bf16 ones by far more
MOVED_AT_MOST = 0.1  # nats, the top token's log-probability at the first position


def launch(dtype: str):
    from rksc_sgl.engine import launch_engine

    return launch_engine(rksc=RkscConfig(cpu_linear_dtype=dtype), max_total_tokens=POOL_TOKENS, log_level="error")


@pytest.fixture(scope="module")
def engines():
    started = {}
    try:
        for dtype in ("float32", "bfloat16"):
            started[dtype] = launch(dtype)
        yield started
    finally:
        for engine in started.values():
            engine.shutdown()


def first_top(engine, prompts: list[str]) -> list[tuple[int, float]]:
    outs = engine.generate(prompt=prompts, sampling_params={"max_new_tokens": 1, "temperature": 0.0},
                           return_logprob=True, top_logprobs_num=1)
    return [(o["meta_info"]["output_top_logprobs"][0][0][1], o["meta_info"]["output_top_logprobs"][0][0][0])
            for o in outs]


def test_bf16_moves_the_first_log_probabilities_by_rounding_only(engines):
    fp32, bf16 = first_top(engines["float32"], PROMPTS), first_top(engines["bfloat16"], PROMPTS)
    moved = [abs(a[1] - b[1]) for a, b in zip(fp32, bf16)]
    assert max(moved) >= MOVED_AT_LEAST, moved  # the bf16 path really ran
    assert max(moved) <= MOVED_AT_MOST, (moved, fp32, bf16)
    assert sum(a[0] == b[0] for a, b in zip(fp32, bf16)) >= len(PROMPTS) - 1, (fp32, bf16)


def test_bf16_tokens_are_the_same_with_and_without_the_cached_prompt(engines):
    engine = engines["bfloat16"]
    params = {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}
    engine.flush_cache()
    cold = engine.generate(prompt=PROMPTS[1], sampling_params=params)
    warm = engine.generate(prompt=PROMPTS[1], sampling_params=params)
    assert warm["meta_info"]["cached_tokens"] > 0
    assert warm["output_ids"] == cold["output_ids"]
