"""The lean decode loop (``radix_ext.cpu.decode``) computes SGLang's decode step bit for bit.

Two ``rksc_cpu`` engines, one with the lean loop (the default) and one with
``RKSC_CPU_LEAN_DECODE=0`` (SGLang's forward through the same backend and linears), run the same
requests. One stream's tokens and every reported log-probability must be equal, not close: the
loop calls the callables SGLang's dispatch resolves to, in the same order. In a batch, which
requests share a step depends on when each reached the scheduler, and the batched attention sums
in an order that depends on the batch's longest request, so a ragged greedy batch and a seeded
sampled one are compared as ``test_fast_decode`` compares engines (log-probabilities within
float rounding; a sequence may part ways only at a near-tie). If SGLang's decoder layer changes
underneath (another norm placement, a fused op resolved differently), these are the tests that
fail. The readback proves the loop ran, and that the other engine never took it. The same holds
with ``--cpu-linear-dtype int8`` (its fused norm serves both engines), where the loop's layers run
in one C++ call (``radix_ext.cpu.decode_stack``; ``test_decode_layers`` compares it with the Python
loop).
"""

from __future__ import annotations

import pytest

from radix_ext.cpu import kernels
from rksc_sgl.protocol import DECODE_KEY
from tests.integration.test_fast_decode import Decoded, assert_same_decoding

pytestmark = pytest.mark.integration

POOL_TOKENS = 4096
PROMPTS = [
    "The capital of France is",
    "List the first five prime numbers and explain why 1 is not prime.",
    "def fibonacci(n):",
    "Once upon a time, in a village at the edge of a great forest, there lived",
    "Q: What is 17 + 25? A:",
    "Explain, step by step, how a refrigerator keeps food cold, as if to a ten-year-old child.",
]


def launch(env: dict[str, str], linear_dtype: str = "float32", **rksc):
    from rksc_sgl.config import RkscConfig
    from rksc_sgl.engine import launch_engine

    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        return launch_engine(rksc=RkscConfig(cpu_linear_dtype=linear_dtype, **rksc), max_total_tokens=POOL_TOKENS,
                             log_level="error")


@pytest.fixture(scope="module")
def engines():
    lean = launch({})
    try:
        plain = launch({"RKSC_CPU_LEAN_DECODE": "0"})
        try:
            yield lean, plain
        finally:
            plain.shutdown()
    finally:
        lean.shutdown()


def decode_stats(engine) -> dict:
    return engine.get_server_info()["internal_states"][0][DECODE_KEY]


def run(engine, prompts: list[str], params: list[dict]) -> list[tuple[list, list]]:
    outs = engine.generate(prompt=prompts, sampling_params=params, return_logprob=True, top_logprobs_num=5)
    return [(o["meta_info"]["output_token_logprobs"], o["meta_info"]["output_top_logprobs"]) for o in outs]


def decoded(runs: list[tuple[list, list]]) -> list[Decoded]:
    return [Decoded([tid for _, tid, _ in tokens], [{tid: lp for lp, tid, _ in step} for step in top], 0)
            for tokens, top in runs]


def test_one_stream_is_bitwise_sglangs(engines):
    lean, plain = engines
    before = decode_stats(lean)["lean_steps"]
    params = [{"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}]
    ours = run(lean, PROMPTS[1:2], params)
    assert ours == run(plain, PROMPTS[1:2], params)
    after = decode_stats(lean)
    assert after["lean_steps"] - before == 31, after  # every step after the prefill's token
    assert after["unsupported"] is None and after["stock_steps"] == after["layers_steps"] == 0, after
    assert after["layers_unsupported"] == "int8-kernels-off", after  # float32 linears: the Python loop
    assert decode_stats(plain) == {"layers_steps": 0, "lean_steps": 0, "stock_steps": 0, "unsupported": None,
                                   "layers_unsupported": None, "kept_rows_calls": 0, "donor_kv_calls": 0}


def test_greedy_ragged_batch(engines):
    lean, plain = engines
    params = [{"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True} for n in (24, 6, 24, 12, 18, 24)]
    assert assert_same_decoding(decoded(run(plain, PROMPTS, params)), decoded(run(lean, PROMPTS, params))) <= 1


def test_seeded_sampling(engines):
    lean, plain = engines
    params = [{"max_new_tokens": 20, "temperature": 0.8, "top_p": 0.95, "sampling_seed": 100 + i, "ignore_eos": True}
              for i in range(len(PROMPTS))]
    assert assert_same_decoding(decoded(run(plain, PROMPTS, params)), decoded(run(lean, PROMPTS, params))) <= 1


@pytest.mark.skipif(kernels.unsupported() is not None, reason=f"int8 linears: {kernels.unsupported()}")
def test_one_stream_is_bitwise_sglangs_with_int8_linears_and_fused_norms():
    """int8 points the norms of both engines at the fused one, and the lean decode runs its layers in
    one ``decode_layers`` call, whose rotation (``rope_neox``) gives ``_rotate``'s bits: still
    SGLang's step, bit for bit."""
    params = [{"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}]
    results = []
    for env in ({}, {"RKSC_CPU_LEAN_DECODE": "0"}):
        engine = launch(env, "int8")
        try:
            results.append(run(engine, PROMPTS[1:2], params))
            stats = decode_stats(engine)
            results.append((stats["layers_steps"], stats["lean_steps"]))
        finally:
            engine.shutdown()
    ours, lean_steps, theirs, plain_steps = results
    assert (lean_steps, plain_steps) == ((31, 0), (0, 0))
    assert ours == theirs
