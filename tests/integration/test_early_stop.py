"""Confident early stop on the real server (``radix_ext.stop.stopper``): a trace-confidence stop
through ``/generate`` and through OpenAI ``n > 1`` with ``extra_body``, a group whose vote is
decided stopping its other members and refusing later ones, the KV pool balancing afterwards,
and a 400 naming the field for each bad option.

The thresholds are chosen so the outcome does not depend on what the model writes: a token's
confidence (``-mean`` of top-k log-probabilities) is a positive number, so a threshold of 1e6
stops every trace at its first full window and a threshold of 0 never stops one.
"""

from __future__ import annotations

import threading

import pytest
import requests

from rksc_sgl import servers
from rksc_sgl.stop_options import EARLY_STOP_STATE_KEY, STOP_KEY, STOP_MESSAGE_PREFIX

pytestmark = pytest.mark.integration

POOL_TOKENS = 8192
PROMPT = "Write a long story about a lighthouse keeper and the sea."
ALWAYS = {"window": 4, "top_k": 3, "threshold": 1e6}  # stops at the first full window
NEVER = {"window": 4, "top_k": 3, "threshold": 0.0}


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    args = ["--max-total-tokens", str(POOL_TOKENS), "--log-level", "warning"]
    with servers.http_server("rksc_sgl.launch_server", args, tmp_path_factory.mktemp("early_stop"),
                             timeout_s=900) as base:
        yield base


def generate(url: str, custom_params: dict, max_new_tokens: int = 48, **body) -> requests.Response:
    payload = {"text": PROMPT, "return_logprob": True, "top_logprobs_num": 3,
               "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.8, "ignore_eos": True,
                                   "sampling_seed": 11, "custom_params": custom_params}, **body}
    return requests.post(f"{url}/generate", json=payload, timeout=600)


def assert_idle_and_balanced(url: str) -> None:
    """Nothing runs or waits, nothing is tracked for a stop, the KV pool balances, nothing locked."""
    pool = servers.settled_pool(lambda: servers.kv_pool(url), 60)
    assert pool["available"] + pool["evictable"] + pool["protected"] == pool["total"], pool
    assert pool["protected"] == 0, pool
    state = requests.get(f"{url}/server_info", timeout=30).json()["internal_states"][0][EARLY_STOP_STATE_KEY]
    assert state["running_requests"] == 0 and state["waiting_requests"] == 0, state
    assert state["tracked_requests"] == 0, state


class TestTraceStop:
    def test_a_trace_stops_at_its_first_full_window_and_reports_it(self, url):
        out = generate(url, {"rksc_conf_stop": ALWAYS})
        assert out.status_code == 200, out.text
        meta = out.json()["meta_info"]
        assert meta["finish_reason"]["type"] == "abort" and meta["finish_reason"]["status_code"] is None
        assert meta["finish_reason"]["message"].startswith(STOP_MESSAGE_PREFIX + "trace confidence")
        (report,) = meta[STOP_KEY]
        assert report["reason"] == "confidence" and report["at_token"] == ALWAYS["window"]
        assert report["window_confidence"] < ALWAYS["threshold"]
        assert meta["completion_tokens"] == ALWAYS["window"] + 1  # applied at the next step, as SGLang's abort
        assert_idle_and_balanced(url)

    def test_a_threshold_never_reached_leaves_the_request_alone(self, url):
        meta = generate(url, {"rksc_conf_stop": NEVER}, max_new_tokens=12).json()["meta_info"]
        assert meta["finish_reason"]["type"] == "length" and STOP_KEY not in meta
        assert meta["completion_tokens"] == 12

    def test_the_reported_confidence_is_the_window_mean_of_the_returned_logprobs(self, url):
        meta = generate(url, {"rksc_conf_stop": ALWAYS}).json()["meta_info"]
        steps = meta["output_top_logprobs"][: ALWAYS["window"]]
        expected = sum(-sum(t[0] for t in step[:3]) / 3 for step in steps) / ALWAYS["window"]
        assert meta[STOP_KEY][0]["window_confidence"] == pytest.approx(expected, rel=1e-5)

    def test_openai_n_above_1_with_extra_body_stops_every_child(self, url):
        import openai

        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
        out = client.completions.create(model="default", prompt=PROMPT, max_tokens=48, temperature=0.8, n=3,
                                        seed=5, logprobs=3,
                                        extra_body={"ignore_eos": True, "custom_params": {"rksc_conf_stop": ALWAYS}})
        assert [c.finish_reason for c in out.choices] == ["abort"] * 3
        assert out.usage.completion_tokens == 3 * (ALWAYS["window"] + 1)
        assert len({c.text for c in out.choices}) == 3  # each child drew its own sample
        assert_idle_and_balanced(url)


POLICY = {"answer_pattern": "^", "rule": "esc", "window": 2}  # every finished member votes "": 2 agree


class TestGroupStop:
    def test_a_decided_group_stops_its_running_members_and_refuses_later_ones(self, url):
        group = "test-group-1"
        long_outs: dict[int, dict] = {}

        def long_member(index: int) -> None:
            custom = {"rksc_group": {"id": group, "index": index}, "rksc_group_policy": POLICY}
            long_outs[index] = generate(url, custom, max_new_tokens=200).json()

        threads = [threading.Thread(target=long_member, args=(i,)) for i in (2, 3, 4)]
        for t in threads:
            t.start()
        short = [generate(url, {"rksc_group": {"id": group, "index": i}, "rksc_group_policy": POLICY},
                          max_new_tokens=2).json() for i in (0, 1)]
        for t in threads:
            t.join(timeout=600)
        assert [s["meta_info"]["finish_reason"]["type"] for s in short] == ["length", "length"]
        for index, out in long_outs.items():
            meta = out["meta_info"]
            assert meta["finish_reason"]["type"] == "abort", (index, meta["finish_reason"])
            assert meta["finish_reason"]["message"].startswith(STOP_MESSAGE_PREFIX + f"group {group}")
            assert meta["completion_tokens"] < 200
            (report,) = meta[STOP_KEY]
            assert report["reason"] == "group" and report["rule"] == "esc" and report["answer"] == ""
        late = generate(url, {"rksc_group": {"id": group, "index": 5}, "rksc_group_policy": POLICY})
        assert late.status_code == 200, late.text
        late_meta = late.json()["meta_info"]
        assert late_meta["finish_reason"]["type"] == "abort" and late.json()["text"] == ""
        assert late_meta["finish_reason"]["message"].startswith(STOP_MESSAGE_PREFIX + f"group {group}")
        assert_idle_and_balanced(url)

    def test_openai_n_above_1_gets_adaptive_n(self, url):
        """The 8 children of one request form a group. Each stops at its first "e" (so at its own
        step); under Beta at c = 0.7 the first one to finish decides (P = 0.75), and the children
        still running then are stopped (``abort``) instead of running on."""
        import openai

        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600)
        policy = {"answer_pattern": "^", "rule": "beta", "confidence": 0.7}
        out = client.completions.create(model="default", prompt=PROMPT, max_tokens=64, temperature=1.0, n=8,
                                        seed=3, stop=["e"], extra_body={"custom_params": {"rksc_group_policy": policy}})
        reasons = [c.finish_reason for c in out.choices]
        assert "stop" in reasons and "abort" in reasons, reasons
        assert out.usage.completion_tokens < 8 * 64
        assert_idle_and_balanced(url)


class TestBadOptions:
    @pytest.mark.parametrize("custom, field", [
        ({"rksc_conf_stop": {"window": 0, "top_k": 3, "threshold": 1.0}}, "rksc_conf_stop.window"),
        ({"rksc_conf_stop": {"window": 4, "top_k": 9, "threshold": 1.0}}, "top_logprobs_num"),
        ({"rksc_group_policy": {"answer_pattern": "(", "rule": "esc"}, "rksc_group": {"id": "g", "index": 0}},
         "rksc_group_policy.answer_pattern"),
        ({"rksc_group_policy": {"answer_pattern": "x", "rule": "esc"}}, "rksc_group_policy needs a group"),
        ({"rksc_group": {"id": "g", "index": -1}}, "rksc_group.index"),
    ])
    def test_a_bad_option_is_a_400_naming_the_field_and_the_server_keeps_serving(self, url, custom, field):
        out = generate(url, custom, max_new_tokens=4)
        assert out.status_code == 400, out.text
        assert field in out.text
        assert generate(url, {}, max_new_tokens=2).status_code == 200

    def test_openai_a_confidence_stop_without_logprobs_is_a_400(self, url):
        body = {"model": "default", "prompt": PROMPT, "max_tokens": 4,
                "custom_params": {"rksc_conf_stop": ALWAYS}}
        out = requests.post(f"{url}/v1/completions", json=body, timeout=300)
        assert out.status_code == 400, out.text
        assert "rksc_conf_stop" in out.text and "logprobs=3" in out.text
