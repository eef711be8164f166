"""The ``rksc_cpu`` attention backend decodes what stock ``torch_native`` decodes, on the real model.

Two engines (stock ``torch_native`` and ``rksc_cpu``) run the same greedy requests. Tokens must be
the same. Batched attention and oneDNN linears sum in another order than stock's per-request loop
and MKL, so a sequence may
legitimately part ways where two candidates are tied to within float rounding: at the first step
where the tokens differ, both engines' top log-probabilities must agree within
``LOGPROB_TOLERANCE`` and the two chosen tokens must be within ``TIE_TOLERANCE`` of each other in
stock's distribution; the sequence is not compared further (its contexts now differ).

The stock reference runs on one OpenMP thread (``OMP_NUM_THREADS=1``): torch's CPU matmuls and
SDPA split rows, not sums, across threads, so its numbers are the same as with two, and on a
shared 2-core machine it is ~10x faster (see ``radix_ext.cpu.speed``).
"""

from __future__ import annotations

import dataclasses

import pytest

from radix_ext.cpu.attention import BACKEND_NAME

pytestmark = pytest.mark.integration

POOL_TOKENS = 4096  # small pool: fast start-up, little RAM
TOP_LOGPROBS = 5
LOGPROB_TOLERANCE = 1e-3  # nats; observed at most 6.7e-5 (batched attention + oneDNN linears)
TIE_TOLERANCE = 1e-3  # nats between stock's top-1 and our token, where the tokens differ
PROMPTS = [  # different lengths, so the batch is ragged and the padding mask is used
    "The capital of France is",
    "List the first five prime numbers and explain why 1 is not prime.",
    "def fibonacci(n):",
    "Once upon a time, in a village at the edge of a great forest, there lived",
    "Q: What is 17 + 25? A:",
    "Translate to French: The weather is nice today.",
    "Write a haiku about the sea.",
    "Explain, step by step, how a refrigerator keeps food cold, as if to a ten-year-old child.",
]


@dataclasses.dataclass(frozen=True)
class Decoded:
    token_ids: list[int]
    top_logprobs: list[dict[int, float]]  # per step: token id -> log-probability
    cached_tokens: int  # prompt tokens served from the radix cache


def launch(attention_backend: str, env: dict[str, str] | None = None):
    """The default engine with another attention backend and float32 linears (stock's numbers, which
    this file compares with; test_reduced_linears covers the others); ``env`` reaches its spawned
    scheduler."""
    from rksc_sgl.config import RkscConfig
    from rksc_sgl.engine import launch_engine

    with pytest.MonkeyPatch.context() as mp:
        for name, value in (env or {}).items():
            mp.setenv(name, value)
        return launch_engine(attention_backend=attention_backend, rksc=RkscConfig(cpu_linear_dtype="float32"),
                             max_total_tokens=POOL_TOKENS, log_level="error")


@pytest.fixture(scope="module")
def stock_engine():
    engine = launch("torch_native", env={"OMP_NUM_THREADS": "1"})
    try:
        yield engine
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def fast_engine():
    engine = launch(BACKEND_NAME)
    try:
        yield engine
    finally:
        engine.shutdown()


def greedy(engine, prompts: list[str], new_tokens: list[int]) -> list[Decoded]:
    params = [{"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True} for n in new_tokens]
    outs = engine.generate(prompt=prompts, sampling_params=params, return_logprob=True, top_logprobs_num=TOP_LOGPROBS)
    return [
        Decoded(
            token_ids=[tid for _, tid, _ in o["meta_info"]["output_token_logprobs"]],
            top_logprobs=[{tid: lp for lp, tid, _ in step} for step in o["meta_info"]["output_top_logprobs"]],
            cached_tokens=o["meta_info"]["cached_tokens"],
        )
        for o in outs
    ]


def assert_top_logprobs_agree(stock: dict[int, float], fast: dict[int, float], where: str) -> None:
    stock_top1 = max(stock, key=stock.get)
    assert stock_top1 in fast, (where, stock, fast)  # both engines rank stock's best token in their top
    for token_id in stock.keys() & fast.keys():
        assert abs(stock[token_id] - fast[token_id]) <= LOGPROB_TOLERANCE, (where, token_id, stock, fast)


def assert_same_decoding(stock: list[Decoded], fast: list[Decoded]) -> int:
    """Returns how many sequences parted ways at a near-tie (each such step checked as described)."""
    parted = 0
    assert len(stock) == len(fast) > 0
    for i, (s, f) in enumerate(zip(stock, fast)):
        assert len(s.token_ids) == len(f.token_ids), i
        for step, (s_id, f_id) in enumerate(zip(s.token_ids, f.token_ids)):
            where = f"sequence {i}, step {step}"
            assert_top_logprobs_agree(s.top_logprobs[step], f.top_logprobs[step], where)
            if s_id != f_id:
                stock_top = s.top_logprobs[step]
                assert f_id in stock_top, (where, s_id, f_id, stock_top)
                assert stock_top[s_id] - stock_top[f_id] <= TIE_TOLERANCE, (where, stock_top)
                parted += 1
                break
    return parted


class TestGreedyDecodingMatchesStock:
    def test_ragged_batch_with_requests_finishing_at_different_steps(self, stock_engine, fast_engine):
        new_tokens = [24, 8, 24, 16, 24, 12, 20, 24]
        stock = greedy(stock_engine, PROMPTS, new_tokens)
        fast = greedy(fast_engine, PROMPTS, new_tokens)
        assert assert_same_decoding(stock, fast) <= 1  # a near-tie may split one sequence, not many

    def test_forked_branches_of_one_prompt(self, stock_engine, fast_engine):
        prompts = [PROMPTS[3]] * 6  # equal lengths: the unmasked path
        stock = greedy(stock_engine, prompts, [32] * 6)
        fast = greedy(fast_engine, prompts, [32] * 6)
        assert assert_same_decoding(stock, fast) == 0
        assert all(f.token_ids == fast[0].token_ids for f in fast)

    def test_branches_extending_a_cached_prompt(self, stock_engine, fast_engine):
        prompt = PROMPTS[7]
        branches = [prompt + suffix for suffix in (" First,", " Step 1: the fridge", " Imagine a box that", " Okay")]
        for engine in (stock_engine, fast_engine):
            greedy(engine, [prompt], [1])  # the prompt is now cached: branches extend from it
        stock = greedy(stock_engine, branches, [16] * 4)
        fast = greedy(fast_engine, branches, [16] * 4)
        assert all(f.cached_tokens > 0 for f in fast)  # the extend attended over a cached prefix
        assert assert_same_decoding(stock, fast) <= 1

    def test_single_stream(self, stock_engine, fast_engine):
        stock = greedy(stock_engine, PROMPTS[1:2], [32])
        fast = greedy(fast_engine, PROMPTS[1:2], [32])
        assert assert_same_decoding(stock, fast) == 0
        assert stock[0].token_ids == fast[0].token_ids
