"""The one-call decode layers (``radix_ext.cpu.decode_stack``) compute the lean loop's step bit for bit.

Two ``rksc_cpu`` engines with int8 linears, one with ``kernels.decode_layers`` (the default) and
one with ``RKSC_CPU_DECODE_LAYERS=0`` (the Python loop of ``radix_ext.cpu.decode``, itself SGLang's
step bit for bit: ``test_lean_decode``), run the same requests. One stream's tokens and every
reported log-probability must be equal. So must a batch's: with int8 linears and the invariant
attention a row's numbers do not depend on the rows batched with it (``test_invariance``), so
which requests happen to share a step cannot move them, and a looser comparison (as
``test_lean_decode``'s for float32) would hide a batch-only slip such as a KV write at the wrong
slot. The readback proves which path each engine took. Both engines have ASKS on (blend), which
changes no decode step; a blended request's kept rows take the same call
(``radix_ext.asks.kept_rows``), and must give SGLang's layers' bits as well.
"""

from __future__ import annotations

import uuid

import pytest

from radix_ext.cpu import decode_stack, kernels
from rksc_sgl.protocol import ASKS_KEY, AsksOptions
from tests.integration.test_fast_decode import assert_same_decoding
from tests.integration.test_lean_decode import PROMPTS, decode_stats, decoded, launch, run

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(kernels.unsupported() is not None, reason=f"int8 linears: {kernels.unsupported()}"),
]


@pytest.fixture(scope="module")
def engines():
    layers = launch({}, "int8", asks=True)
    try:
        loop = launch({decode_stack.LAYERS_ENV: "0"}, "int8", asks=True)
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


PASSAGE = " ".join(f"In year {1900 + i} the village of Aldwick planted {7 * i % 23 + 2} oak trees along the river "
                   f"and the mill ground {i * 13 % 40 + 10} sacks of flour." for i in range(12))


def blended(engine, opening: str) -> tuple[dict, tuple[list, list]]:
    """A donor (another opening, then the passage) then a member of its group reading the passage
    after ``opening``: the member's ASKS report and its output."""
    params = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True,
              "custom_params": AsksOptions(group=f"layers-{uuid.uuid4().hex}").to_custom_params()}
    engine.generate(prompt=f"You summarize village records.\n\n{PASSAGE}\n\nHow many oaks in 1905?",
                    sampling_params=dict(params))
    out = engine.generate(prompt=f"{opening}\n\n{PASSAGE}\n\nHow many oaks in 1905?", sampling_params=dict(params),
                          return_logprob=True, top_logprobs_num=5)
    report = out["meta_info"][ASKS_KEY]
    return (report[0] if isinstance(report, list) else report), (out["meta_info"]["output_token_logprobs"],
                                                                 out["meta_info"]["output_top_logprobs"])


def test_a_blended_requests_kept_rows_are_sglangs_layers_bits(engines):
    layers, loop = engines
    calls = ("kept_rows_calls", "donor_kv_calls")
    before = [[decode_stats(e)[c] for c in calls] for e in (layers, loop)]
    (ours_report, ours), (theirs_report, theirs) = (blended(e, "You are a careful historian of small towns.")
                                                    for e in (layers, loop))
    assert ours_report["outcome"] == theirs_report["outcome"] == "blended", (ours_report, theirs_report)
    assert ours_report["reused_tokens"] == theirs_report["reused_tokens"] > 0
    assert ours == theirs
    # the kept rows' layers and the donors' KV each in one call here, in Python there
    assert [decode_stats(layers)[c] for c in calls] == [n + 1 for n in before[0]]
    assert [decode_stats(loop)[c] for c in calls] == before[1]

