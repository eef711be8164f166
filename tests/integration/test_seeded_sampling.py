"""Seeded sampling on the real engine (``radix_ext.sampling.sampler``): a seeded request draws the same
tokens whatever its batch and whether its prompt was cached; different seeds draw differently;
the OpenAI-compatible routes' ``seed`` reaches the sampler.

Float32 logits of a row differ by rounding with batch shape (~1e-6), so a sequence alone and the
same sequence in a ragged batch may part ways where two Gumbel scores nearly tie: at the first
differing token, the decision margin (``meta_info["rksc_sample_margin"]``, best minus runner-up
perturbed score) of one of the two runs must be below ``TIE_MARGIN``, and at most one of 8
sequences may part ways.
"""

from __future__ import annotations

import pytest
import requests

from tests.integration.test_fast_decode import PROMPTS

pytestmark = pytest.mark.integration

POOL_TOKENS = 4096
NEW_TOKENS = 24
TIE_MARGIN = 1e-3


@pytest.fixture(scope="module")
def margin_engine():
    from rksc_sgl.config import RkscConfig
    from rksc_sgl.engine import launch_engine

    engine = launch_engine(rksc=RkscConfig(report_sampling_margins=True), max_total_tokens=POOL_TOKENS,
                           log_level="error")
    yield engine
    engine.shutdown()


def params(seed: int | None, temperature: float = 0.8, **extra) -> dict:
    out = {"max_new_tokens": NEW_TOKENS, "temperature": temperature, "ignore_eos": True, **extra}
    if seed is not None:
        out["sampling_seed"] = seed
    return out


def generate(engine, prompts: list[str], sampling_params: list[dict]) -> list[dict]:
    outs = engine.generate(prompt=prompts, sampling_params=sampling_params, return_logprob=True)
    return [{"ids": [t[1] for t in o["meta_info"]["output_token_logprobs"]],
             "margins": o["meta_info"].get("rksc_sample_margin"),
             "cached": o["meta_info"]["cached_tokens"]} for o in outs]


class TestSeededRequests:
    def test_the_same_seeded_request_twice_draws_the_same_tokens_cached_or_not(self, margin_engine):
        margin_engine.flush_cache()
        first = generate(margin_engine, [PROMPTS[1]], [params(123)])[0]
        second = generate(margin_engine, [PROMPTS[1]], [params(123)])[0]
        assert first["cached"] == 0 and second["cached"] > 0  # the second prefill came from the cache
        assert len(first["ids"]) == NEW_TOKENS
        assert first["ids"] == second["ids"]

    def test_different_seeds_draw_different_tokens(self, margin_engine):
        outs = generate(margin_engine, [PROMPTS[3]] * 4, [params(s) for s in (1, 2, 3, 4)])
        assert len({tuple(o["ids"]) for o in outs}) == 4

    def test_unseeded_requests_get_their_own_random_seed(self, margin_engine):
        outs = generate(margin_engine, [PROMPTS[3]] * 3, [params(None)] * 3)
        assert len({tuple(o["ids"]) for o in outs}) == 3

    def test_greedy_rows_in_a_sampled_batch_stay_greedy(self, margin_engine):
        greedy = generate(margin_engine, [PROMPTS[0]], [params(None, temperature=0.0)])[0]
        mixed = generate(margin_engine, [PROMPTS[0], PROMPTS[2]], [params(None, temperature=0.0), params(5)])[0]
        assert greedy["ids"] == mixed["ids"]

    def test_alone_and_in_a_ragged_batch_of_8_draw_the_same_tokens_until_a_near_tie(self, margin_engine):
        seeds = [1000 + i for i in range(len(PROMPTS))]
        filters = [{}, {"top_k": 20}, {"top_p": 0.9}, {}, {"min_p": 0.05}, {}, {"top_k": 50, "top_p": 0.95}, {}]
        sampling = [params(s, 0.6 + 0.1 * i, **f) for i, (s, f) in enumerate(zip(seeds, filters))]
        margin_engine.flush_cache()
        alone = [generate(margin_engine, [p], [sp])[0] for p, sp in zip(PROMPTS, sampling)]
        margin_engine.flush_cache()
        together = generate(margin_engine, PROMPTS, sampling)
        parted = 0
        for a, b in zip(alone, together):
            assert a["margins"] is not None and len(a["margins"]) == NEW_TOKENS
            if a["ids"] == b["ids"]:
                continue
            parted += 1
            step = next(i for i, (x, y) in enumerate(zip(a["ids"], b["ids"])) if x != y)
            assert min(a["margins"][step], b["margins"][step]) < TIE_MARGIN, (step, a, b)
        assert parted <= 1


class TestOpenAiSeed:
    def test_the_completions_routes_seed_reproduces_a_sample(self, server_url):
        body = {"model": "default", "prompt": PROMPTS[5], "max_tokens": 16, "temperature": 0.9}
        texts = [requests.post(f"{server_url}/v1/completions", json={**body, "seed": seed}, timeout=120)
                 .json()["choices"][0]["text"] for seed in (7, 7, 8)]
        assert texts[0] == texts[1]
        assert texts[0] != texts[2]

    def test_the_chat_routes_seed_reproduces_a_sample(self, server_url):
        body = {"model": "default", "messages": [{"role": "user", "content": PROMPTS[6]}], "max_tokens": 16,
                "temperature": 0.9}
        texts = [requests.post(f"{server_url}/v1/chat/completions", json={**body, "seed": seed}, timeout=120)
                 .json()["choices"][0]["message"]["content"] for seed in (7, 7, 8)]
        assert texts[0] == texts[1]
        assert texts[0] != texts[2]


class TestOpenAiSeedWithN:
    """One ``seed`` with ``n > 1``: every child draws its own sample (``radix_ext.stop.groups``), and the
    same ``n`` samples come back on a second call (the official OpenAI client, against the server)."""

    def test_n_4_seed_7_draws_4_distinct_texts_and_the_same_4_again(self, server_url):
        import openai

        client = openai.OpenAI(base_url=f"{server_url}/v1", api_key="none", max_retries=0, timeout=300)
        calls = [client.completions.create(model="default", prompt=PROMPTS[5], max_tokens=16, temperature=0.9,
                                           n=4, seed=7) for _ in range(2)]
        texts = [[c.text for c in sorted(call.choices, key=lambda c: c.index)] for call in calls]
        assert len(set(texts[0])) == 4, texts[0]
        assert texts[0] == texts[1]

    def test_the_first_child_draws_what_the_same_seed_draws_alone(self, server_url):
        body = {"model": "default", "prompt": PROMPTS[5], "max_tokens": 16, "temperature": 0.9, "seed": 7}
        alone = requests.post(f"{server_url}/v1/completions", json=body, timeout=300).json()["choices"][0]["text"]
        choices = requests.post(f"{server_url}/v1/completions", json={**body, "n": 3}, timeout=300).json()["choices"]
        assert next(c["text"] for c in choices if c["index"] == 0) == alone
