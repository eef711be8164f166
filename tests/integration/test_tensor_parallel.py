"""``--tp-size 2`` on the CPU (one core per rank): ordinary requests run; a CGEE early-exit
request is refused with a 400, since each rank reads the logit lens on its own vocabulary shard
and ranks could stop at different layers and wait on each other forever; so are the early-stop
options (trace confidence, group policy), which each rank's scheduler would decide on its own."""

from __future__ import annotations

import pytest
import requests

from rksc_sgl.protocol import EarlyExitParams
from rksc_sgl.servers import http_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tp2_url(tmp_path_factory):
    # Without a core per rank SGLang's CPU path asserts ranks <= NUMA nodes (one here).
    env = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "RKSC_CPU_THREADS": "1"}
    args = ["--tp-size", "2", "--max-total-tokens", "4096", "--log-level", "warning"]
    with http_server("rksc_sgl.launch_server", args, tmp_path_factory.mktemp("tp2"), env, timeout_s=300) as url:
        yield url


def generate(url: str, custom_params=None, max_new_tokens: int = 4, **body):
    params = {"max_new_tokens": max_new_tokens, "temperature": 0}
    if custom_params:
        params["custom_params"] = custom_params
    return requests.post(f"{url}/generate", json={"text": "2 + 2 =", "sampling_params": params, **body},
                         timeout=300)


def test_early_exit_request_is_refused_and_the_server_keeps_serving(tp2_url):
    assert generate(tp2_url).status_code == 200
    flagged = EarlyExitParams(theta=1.0, epsilon=0.2, min_layer=4).to_custom_params()
    res = generate(tp2_url, flagged, max_new_tokens=1)
    assert res.status_code == 400, res.text
    assert "--tp-size 1" in res.text
    after = generate(tp2_url)
    assert after.status_code == 200 and after.json()["text"]


@pytest.mark.parametrize("custom_params", [
    {"rksc_conf_stop": {"window": 4, "top_k": 2, "threshold": 1.0}},
    {"rksc_group": {"id": "g", "index": 0}, "rksc_group_policy": {"answer_pattern": "x", "rule": "esc"}},
])
def test_early_stop_requests_are_refused_and_the_server_keeps_serving(tp2_url, custom_params):
    res = generate(tp2_url, custom_params, return_logprob=True, top_logprobs_num=2)
    assert res.status_code == 400, res.text
    assert "--tp-size 1" in res.text
    assert generate(tp2_url).status_code == 200
