"""The one-call decode layers (``radix_ext.cpu.decode_stack``) compute the lean loop's step bit for bit.

Two ``rksc_cpu`` engines with int8 linears, one with ``kernels.decode_layers`` (the default) and
one with ``RKSC_CPU_DECODE_LAYERS=0`` (the Python loop of ``radix_ext.cpu.decode``, itself SGLang's
step bit for bit: ``test_lean_decode``), run the same requests. One stream's tokens and every
reported log-probability must be equal. So must a batch's: with int8 linears and the invariant
attention a row's numbers do not depend on the rows batched with it (``test_invariance``), so
which requests happen to share a step cannot move them, and a looser comparison (as
``test_lean_decode``'s for float32) would hide a batch-only slip such as a KV write at the wrong
slot. The readback proves which path each engine took.
"""

from __future__ import annotations

import pytest

from radix_ext.cpu import decode_stack, kernels
from tests.integration.test_fast_decode import assert_same_decoding
from tests.integration.test_lean_decode import PROMPTS, decode_stats, decoded, launch, run

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(kernels.unsupported() is not None, reason=f"int8 linears: {kernels.unsupported()}"),
]


@pytest.fixture(scope="module")
def engines():
    layers = launch({}, "int8")
    try:
        loop = launch({decode_stack.LAYERS_ENV: "0"}, "int8")
        try:
            yield layers, loop
        finally:
            loop.shutdown()
    finally:
        layers.shutdown()


def steps(engine) -> tuple[int, int, int]:
    stats = decode_stats(engine)
    return stats["layers_steps"], stats["lean_steps"], stats["stock_steps"]


def test_one_stream_is_the_python_loops_bit_for_bit(engines):
    layers, loop = engines
    before = steps(layers), steps(loop)
    params = [{"max_new_tokens": 32, "temperature": 0.0, "ignore_eos": True}]
    ours = run(layers, PROMPTS[1:2], params)
    assert ours == run(loop, PROMPTS[1:2], params)
    (l0, p0, s0), (l1, p1, s1) = before
    assert steps(layers) == (l0 + 31, p0, s0)  # every step after the prefill's token, in one call
    assert steps(loop) == (l1, p1 + 31, s1)
    assert decode_stats(layers)["layers_unsupported"] is None
    assert decode_stats(loop)["layers_unsupported"] == "RKSC_CPU_DECODE_LAYERS=0"


def test_a_ragged_greedy_batch_is_the_same_bits(engines):
    layers, loop = engines
    params = [{"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True} for n in (24, 6, 24, 12, 18, 24)]
    before = steps(layers)
    ours, theirs = run(layers, PROMPTS, params), run(loop, PROMPTS, params)
    assert assert_same_decoding(decoded(theirs), decoded(ours)) == 0
    assert ours == theirs
    assert steps(layers)[0] > before[0] and steps(layers)[1:] == before[1:]


def test_seeded_sampling_is_the_same_bits(engines):
    layers, loop = engines
    params = [{"max_new_tokens": 20, "temperature": 0.8, "top_p": 0.95, "sampling_seed": 100 + i, "ignore_eos": True}
              for i in range(len(PROMPTS))]
    ours, theirs = run(layers, PROMPTS, params), run(loop, PROMPTS, params)
    assert assert_same_decoding(decoded(theirs), decoded(ours)) == 0
    assert ours == theirs
