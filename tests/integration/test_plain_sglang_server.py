"""Operators' path: plain ``python -m sglang.launch_server``, run as ``docs/serving.md`` writes it,
with our backends named by SGLang's own flags and our options from ``RKSC_SGL_CONFIG``; SGLang's
``/metrics`` with our series; per-request options and seeds through the OpenAI-compatible API (the
official client's ``extra_body``); our primitives through SGLang's own frontend backend,
``RuntimeEndpoint``."""

from __future__ import annotations

import re
import time

import openai
import pytest
import requests
import sglang as sgl

from rksc_sgl import Candidate, RkscEndpoint, report_score, verify
from rksc_sgl.servers import http_server, kv_pool
from tests.integration.serving_doc import documented_command

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def plain_url(tmp_path_factory):
    """The documented command, on a free port (``http_server`` appends ``--host``/``--port``,
    which override the doc's ``--port``)."""
    env, module, args = documented_command()
    with http_server(module, args, tmp_path_factory.mktemp("plain"), env) as url:
        yield url


def server_info(url: str) -> dict:
    return requests.get(f"{url}/server_info", timeout=30).json()


def cache_state(url: str) -> dict:
    return server_info(url)["internal_states"][0]["rksc_cache"]


def chat(url: str, **kwargs):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    return client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=12, **kwargs)


def test_backend_and_options_come_from_sglang_flags_and_the_environment(plain_url):
    info = server_info(plain_url)
    assert info["attention_backend"] == "rksc_cpu"
    assert info["max_total_tokens"] == 32768  # the doc's cap, not SGLang's sizing to the RAM
    assert kv_pool(plain_url)["total"] <= 32768
    state = cache_state(plain_url)
    assert state["cache_class"].endswith("RkscRadixCache")
    assert state["eviction_policy"] == "rsbcm"
    assert "asks" in state  # RKSC_SGL_CONFIG's "asks": true reached the scheduler


def test_openai_extra_body_custom_params_reach_the_runtime(plain_url):
    before = cache_state(plain_url)["score_reports"]
    chat(plain_url, temperature=0, extra_body={"custom_params": {"rksc": {"depth": 1, "score": 0.8}}})
    assert cache_state(plain_url)["score_reports"] == before + 1
    with pytest.raises(openai.BadRequestError, match="depth"):
        chat(plain_url, extra_body={"custom_params": {"rksc": {"depth": -1}}})
    assert chat(plain_url, temperature=0).choices[0].message.content  # still serving


def test_openai_seed_reaches_the_seeded_sampler(plain_url):
    texts = {seed: [chat(plain_url, temperature=1.0, seed=seed).choices[0].message.content for _ in range(2)]
             for seed in (11, 12, 13)}
    for seed, (first, second) in texts.items():
        assert first == second, f"seed {seed} sampled two different texts"
    assert len({pair[0] for pair in texts.values()}) > 1, "three seeds gave one text"


def test_metrics_endpoint_has_our_series(plain_url):
    chat(plain_url, temperature=0, extra_body={"custom_params": {"rksc": {"depth": 0, "score": 0.5}}})
    deadline = time.monotonic() + 10  # published on an idle poll, at most every PUBLISH_INTERVAL_S
    while True:
        text = requests.get(f"{plain_url}/metrics", timeout=30).text
        series = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(rksc_[^\s{]+)(?:\{[^}]*\})? (\S+)$", text, re.M)}
        if series.get("rksc_rsbcm_score_reports_total", 0) >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert series.get("rksc_rsbcm_score_reports_total", 0) >= 1, sorted(series)
    assert "rksc_asks_signature_bytes" in series
    assert "sglang:" in text or "sglang_" in text  # SGLang's own series are still there


CONTEXT = (
    "<|im_start|>user\nTom has 3 boxes with 4 apples each. He eats 2. How many are left?<|im_end|>\n"
    "<|im_start|>assistant\n3 times 4 is 12, and 12 - 2 = 10. The answer is 10.<|im_end|>\n"
)
CANDIDATES = (Candidate(CONTEXT, "10", (-0.1,)),
              Candidate(CONTEXT.replace("12 - 2 = 10. The answer is 10", "12 + 2 = 14. The answer is 14"), "14", (-0.2,)))


@pytest.fixture(scope="module")
def sglang_endpoint(plain_url):
    """SGLang's own frontend backend (chatml, the model's template, as ours picks by itself)."""
    from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

    return RuntimeEndpoint(plain_url, chat_template_name="chatml")


@sgl.function
def one_branch(s):
    s += "The capital of France is"
    s += sgl.gen("answer", max_tokens=4, temperature=0)


def test_report_score_works_through_sglangs_runtime_endpoint(plain_url, sglang_endpoint):
    state = one_branch.run(backend=sglang_endpoint)
    before = cache_state(plain_url)["score_reports"]
    report_score(state, 0.9, depth=0)
    assert cache_state(plain_url)["score_reports"] == before + 1


def test_verify_through_sglangs_runtime_endpoint_scores_as_ours_does(plain_url, sglang_endpoint):
    theirs = verify(sglang_endpoint, CANDIDATES, mode="full")
    ours = verify(RkscEndpoint(plain_url), CANDIDATES, mode="full")
    assert all(0.0 < p < 1.0 for p in theirs.scores)
    assert theirs.scores == pytest.approx(ours.scores, abs=1e-4)
    assert theirs.winner == ours.winner
