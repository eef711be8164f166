"""Blend's prefill order on the real engine (``radix_ext.asks.order``): a member that reuses most of
its prompt goes ahead of another member's prefill, which runs in chunks and sits one out for it, and
that member's output is the same bits as a whole prefill on the stock engine. A request outside any
group is never chunked. Nothing leaks."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from radix_ext.asks.order import HEAVY_CHUNK
from radix_ext.cpu import kernels
from rksc_sgl import RkscConfig
from rksc_sgl.protocol import AsksOptions
from tests.integration.engines import Engines
from tests.integration.kv import assert_no_kv_leak

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(kernels.unsupported() is not None, reason=f"CPU kernels: {kernels.unsupported()}"),
]

PASSAGE = " ".join(f"The {w} of the harbour town traded item {i} every spring." for i, w in enumerate(
    ("mayor", "baker", "smith", "clerk", "priest", "doctor", "captain", "teacher", "miller", "judge") * 3))
LONG = " ".join(f"Crate {i}: the {('red', 'blue', 'green')[i % 3]} box holds {i * 7 % 13} pears." for i in range(110))
NEW_TOKENS = 6


def chat(persona: str, text: str, question: str) -> str:
    return (f"<|im_start|>system\n{persona}<|im_end|>\n<|im_start|>user\nPassage: {text}\n"
            f"Question: {question}<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def asks():
    pool = Engines({"asks": dict(rksc=RkscConfig(asks=True))})
    yield pool.get("asks")
    pool.close()


def params(group: str | None, new_tokens: int = NEW_TOKENS) -> dict:
    out = {"max_new_tokens": new_tokens, "temperature": 0}
    if group is not None:
        out["custom_params"] = AsksOptions(group=group).to_custom_params()
    return out


def reading(out: dict) -> tuple[list[int], list[float]]:
    return ([t for _, t, _ in out["meta_info"]["output_token_logprobs"]],
            [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])


def blend_counters(backend) -> dict:
    return backend.get_server_info()["internal_states"][0]["rksc_cache"]["asks"]["blend"]


def generate(backend, prompt: str, sampling_params: dict) -> dict:
    return backend.run(backend.engine.async_generate(prompt=prompt, sampling_params=sampling_params))


def heavy_then_light(backend, heavy_ids: list[int], heavy_group: str | None, light_prompt: str, group: str):
    """The heavy prompt, and 0.3 s later (while it prefills) a reader of ``group``'s passage."""
    engine = backend.engine

    async def both():
        heavy = asyncio.ensure_future(engine.async_generate(
            input_ids=heavy_ids, sampling_params=params(heavy_group), return_logprob=True))
        await asyncio.sleep(0.3)
        light = await engine.async_generate(prompt=light_prompt, sampling_params=params(group))
        return await heavy, light

    return backend.run(both())


def test_a_reader_goes_ahead_of_a_members_chunked_prefill_whose_output_is_a_whole_prefills(engine_backend, asks):
    heavy_ids = engine_backend.engine.tokenizer_manager.tokenizer.encode(chat("You list crates.", LONG, "Which box?"))
    assert len(heavy_ids) > 8 * HEAVY_CHUNK
    engine_backend.flush_cache()
    whole = reading(engine_backend.run(engine_backend.engine.async_generate(
        input_ids=heavy_ids, sampling_params=params(None), return_logprob=True)))

    group = uuid.uuid4().hex
    generate(asks, chat("You find the sentence that answers.", PASSAGE, "What did the baker trade?"), params(group))
    reader = generate(asks, chat("You draft a short answer.", PASSAGE, "What did the baker trade?"), params(group, 1))
    assert reader["meta_info"]["rksc_asks"][0]["outcome"] == "blended"
    before = blend_counters(asks)
    assert before["light_requests"] >= 1

    heavy, light = heavy_then_light(asks, heavy_ids, uuid.uuid4().hex,
                                    chat("You check the answer.", PASSAGE, "What did the smith trade?"), group)
    after = blend_counters(asks)
    assert light["meta_info"]["rksc_asks"][0]["outcome"] == "blended"
    assert after["chunked_requests"] == before["chunked_requests"] + 1
    assert after["parked_chunks"] > before["parked_chunks"]  # its chunk sat out the reader's batch
    assert heavy["meta_info"]["rksc_asks"][0]["outcome"] == "skipped:chunked"  # nothing to reuse anyway
    assert reading(heavy) == whole  # chunked and parked, the same bits as one whole prefill

    other_ids = engine_backend.engine.tokenizer_manager.tokenizer.encode(chat("You count pears.", LONG, "How many?"))
    heavy, light = heavy_then_light(asks, other_ids, None,
                                    chat("You answer in one word.", PASSAGE, "What did the mayor trade?"), group)
    assert blend_counters(asks)["chunked_requests"] == after["chunked_requests"]  # outside any group: whole
    assert heavy["meta_info"]["cached_tokens"] < 16 and not heavy["meta_info"].get("rksc_asks")
    assert_no_kv_leak(asks)
