"""Bad requests, native and OpenAI-compatible, interleaved with good ones against one server.

Each bad request must get an HTTP 4xx whose body names what was wrong, every good request sent
meanwhile must complete, and afterwards the server still serves and its KV pool balances with
nothing held: no bad request may kill the scheduler, leak a KV slot or stall another request.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import time
import urllib.parse

import pytest
import requests

from rksc_sgl import servers
from tests.integration.kv import assert_no_kv_leak

pytestmark = pytest.mark.integration

LONG = "hello " * 20000  # far past the model's context window
CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]

# Batches beyond --max-fanout (256 by default): 5,000 one-token prompts held stock SGLang for 30 s.
OVERSIZE: list[tuple[str, object, str]] = [
    ("/generate", {"text": ["hi"] * 5000, "sampling_params": {"max_new_tokens": 1}},
     "fans out to 5000 generations (5000 prompt(s) in text x sampling_params.n = 1), more than the server's "
     "limit of 256 per request (--max-fanout)"),
    ("/generate", {"text": ["hi"] * 5000, "stream": True, "sampling_params": {"max_new_tokens": 1}}, "--max-fanout"),
    ("/v1/completions", {"model": "default", "prompt": ["hi"] * 5000, "max_tokens": 1},
     "5000 prompt(s) in prompt x n = 1"),
    ("/v1/completions", {"model": "default", "prompt": [[1, 2]] * 129, "max_tokens": 1, "n": 2, "stream": True},
     "258 generations"),
]

# (route, JSON body or raw text, a word the 4xx body must contain, case-insensitive). Mistyped
# values on /generate are refused by SGLang's own contract check before any hook of ours runs; its
# reason names the value and the expected type, not the field ("invalid type: string \"ten\",
# expected i64").
BAD: list[tuple[str, object, str]] = [
    ("/generate", {"text": ""}, "empty"),
    ("/generate", {"input_ids": []}, "empty"),
    ("/generate", {"text": ["fine", ""]}, "empty"),
    ("/generate", {"text": 123}, "text"),
    ("/generate", "{not json", "json"),
    ("/generate", [], "object"),
    ("/generate", {}, "text"),
    ("/generate", {"text": "Hi", "sampling_params": "hot"}, "sampling_params"),
    ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": -5}}, "max_new_tokens"),
    ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": "ten"}}, "invalid type"),
    ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 10**9}}, "max"),
    ("/generate", {"text": "Hi", "sampling_params": {"temperature": -1}}, "temperature"),
    ("/generate", {"text": "Hi", "sampling_params": {"temperature": "warm"}}, "invalid type"),
    ("/generate", {"text": "Hi", "sampling_params": {"top_p": 0}}, "top_p"),
    ("/generate", {"text": "Hi", "sampling_params": {"top_p": 1.5}}, "top_p"),
    ("/generate", {"text": "Hi", "sampling_params": {"top_k": 0}}, "top_k"),
    ("/generate", {"text": "Hi", "sampling_params": {"min_p": 2}}, "min_p"),
    ("/generate", {"text": "Hi", "sampling_params": {"repetition_penalty": -1}}, "repetition_penalty"),
    ("/generate", {"text": "Hi", "sampling_params": {"frequency_penalty": 9}}, "frequency_penalty"),
    ("/generate", {"text": "Hi", "sampling_params": {"n": 0}}, "sampling_params.n"),
    ("/generate", {"text": "Hi", "sampling_params": {"stop": 123}}, "invalid type"),
    ("/generate", {"text": "Hi", "sampling_params": {"unknown_knob": 1}}, "unknown_knob"),
    ("/generate", {"text": LONG, "sampling_params": {"max_new_tokens": 2}}, "context"),
    ("/generate", {"input_ids": [1, 2, 10**9], "sampling_params": {"max_new_tokens": 2}}, "vocab"),
    ("/generate", {"input_ids": [1, -3, 2], "sampling_params": {"max_new_tokens": 2}}, "vocab"),
    ("/generate", {"input_ids": ["a", "b"], "sampling_params": {"max_new_tokens": 2}}, "input_ids"),
    ("/generate", {"text": "Hi", "return_logprob": True, "top_logprobs_num": -1}, "top_logprobs_num"),
    ("/generate", {"text": "Hi", "return_logprob": True, "logprob_start_len": 99}, "logprob_start_len"),
    ("/generate", {"text": "Hi", "sampling_params": {"custom_params": "x"}}, "custom_params"),
    ("/generate", {"text": "Hi", "sampling_params": {"custom_params": {"rksc": {"depth": -1}}}}, "depth"),
    ("/generate", {"text": "Hi", "sampling_params": {"custom_params": {"rksc": {"depth": 1, "score": 2}}}}, "score"),
    ("/generate", {"text": "Hi", "sampling_params": {"custom_params": {"rksc": {"depth": 1, "bogus": 1}}}}, "bogus"),
    ("/generate", {"text": "Hi", "sampling_params": {"custom_params": {"rksc_asks": {"enabled": "yes"}}}}, "enabled"),
    ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 1, "custom_params":
                                                     {"rksc_early_exit": {"theta": -1, "epsilon": 0.1}}}}, "theta"),
    ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 8, "custom_params":
                                                     {"rksc_early_exit": {"theta": 1, "epsilon": 0.1}}}}, "max_new_tokens"),
    (CHAT, {"model": "default", "messages": []}, "messages"),
    (CHAT, {"model": "default"}, "messages"),
    (CHAT, {"model": "default", "messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    (CHAT, {"model": "default", "messages": HI, "max_tokens": -1}, "max_new_tokens"),
    (CHAT, {"model": "default", "messages": HI, "temperature": -2}, "temperature"),
    (CHAT, {"model": "default", "messages": HI, "top_p": 3}, "top_p"),
    (CHAT, {"model": "default", "messages": HI, "n": 0}, "sampling_params.n"),
    (CHAT, {"model": "default", "messages": "hi"}, "messages"),
    (CHAT, "[[[", "json"),
    (CHAT, {"model": "default", "messages": [{"role": "user", "content": LONG}], "max_tokens": 2}, "context"),
    (CHAT, {"model": "default", "messages": HI, "custom_params": {"rksc": {"depth": "deep"}}}, "depth"),
    ("/v1/completions", {"model": "default", "prompt": ""}, "empty"),
    ("/v1/completions", {"model": "default", "prompt": [[]]}, "empty"),
    ("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": "x"}, "max_tokens"),
    ("/v1/completions", {"model": "default", "prompt": [5, 10**9]}, "vocab"),
    # Request-size fields the scheduler indexes or expands with (radix_ext/ops/request_guards.py); the
    # first two killed or stalled stock SGLang, the third was silently ignored.
    ("/generate", {"text": "hi", "return_logprob": True, "top_logprobs_num": 100000,
                   "sampling_params": {"max_new_tokens": 4}}, "top_logprobs_num must be in [0, 49152]"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, "n": 100000}}, "--max-n"),
    ("/generate", {"text": "hi", "custom_params": {"rksc": {"depth": 1}}, "sampling_params": {"max_new_tokens": 4}},
     "custom_params is not a top-level field"),
    ("/generate", {"text": "hi", "top_logprob_num": 3}, "top_logprob_num"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, "n": 65}}, "--max-n"),
    ("/generate", {"text": "hi", "return_logprob": True, "top_logprobs_num": 49153}, "top_logprobs_num"),
    ("/generate", {"text": "hi", "return_logprob": True, "logprob_start_len": -5}, "logprob_start_len"),
    ("/generate", {"text": "hi", "return_logprob": True, "token_ids_logprob": [1] * 49153}, "token_ids_logprob"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, "min_new_tokens": 2,
                                                     "stop_token_ids": [100000]}}, "stop_token_ids"),
    ("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": 2, "logprobs": 100000}, "top_logprobs_num"),
    ("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": 2, "n": 100000}, "--max-n"),
    ("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": 2, "best_of": 4}, "best_of"),
    (CHAT, {"model": "default", "messages": HI, "max_tokens": 2, "logprobs": True, "top_logprobs": 100000},
     "top_logprobs"),
    (CHAT, {"model": "default", "messages": HI, "max_tokens": 2, "n": 100000}, "--max-n"),
    # An answer pattern is compiled and matched in the scheduler loop: its length is bounded.
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, "n": 2, "custom_params": {
        "rksc_group_policy": {"answer_pattern": "a" * 513, "rule": "beta"}}}}, "answer_pattern must be at most 512"),
    # A request's fan-out, prompts x n, is bounded by --max-fanout (radix_ext/ops/batch_guards.py).
    *OVERSIZE,
    ("/generate", {"text": ["hi"] * 5, "sampling_params": {"max_new_tokens": 1, "n": 64}}, "320 generations"),
    # Malformed batch shapes (radix_ext/ops/batch_guards.py): the first was an HTTP 500, the
    # logprob_start_len list beside one prompt killed the scheduler, the empty batch was a 200 [].
    ("/generate", {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 2}]},
     "sampling_params has 1 entries for the 2 prompts in text"),
    ("/generate", {"text": ["a", "b"], "stream": True, "sampling_params": [{"max_new_tokens": 2}]},
     "sampling_params has 1 entries"),
    ("/generate", {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 2}] * 3},
     "sampling_params has 3 entries"),
    ("/generate", {"input_ids": [[1, 2], [3]], "return_logprob": [True]}, "return_logprob has 1 entries"),
    ("/generate", {"text": ["a", "b"], "return_logprob": True, "token_ids_logprob": [[1]]}, "token_ids_logprob has 1"),
    ("/generate", {"text": "a", "sampling_params": [{"max_new_tokens": 2}]}, "sampling_params is a list, but text"),
    ("/generate", {"text": "a", "return_logprob": True, "logprob_start_len": [0]}, "logprob_start_len is a list"),
    ("/generate", {"text": "a", "rid": ["x"]}, "rid is a list"),
    ("/generate", {"text": [], "sampling_params": {"max_new_tokens": 2}}, "text is an empty list"),
    ("/generate", {"text": [], "sampling_params": [{"max_new_tokens": 2}]}, "text is an empty list"),
    ("/generate", {"sampling_params": [{"max_new_tokens": 2}]}, "text"),
    # ... and so is the ordered list of patterns, each of them, and the normalisation.
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, "n": 2, "custom_params": {
        "rksc_group_policy": {"answer_pattern": ["a"] * 9, "rule": "beta"}}}}, "answer_pattern must list 1 to 8"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, "n": 2, "custom_params": {
        "rksc_group_policy": {"answer_pattern": [], "rule": "beta"}}}}, "answer_pattern must list 1 to 8"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, "n": 2, "custom_params": {
        "rksc_group_policy": {"answer_pattern": ["a", "a" * 513], "rule": "beta"}}}}, "answer_pattern[1] must be at most 512"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, "n": 2, "custom_params": {
        "rksc_group_policy": {"answer_pattern": ["a", "("], "rule": "beta"}}}}, "answer_pattern[1] is not a valid regex"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, "n": 2, "custom_params": {
        "rksc_group_policy": {"answer_pattern": ["a", None], "rule": "beta"}}}}, "answer_pattern[1] must be a non-empty"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, "n": 2, "custom_params": {
        "rksc_group_policy": {"answer_pattern": "a", "answer_normalize": "letter:", "rule": "beta"}}}},
     "answer_normalize must be"),
    (CHAT, {"model": "default", "messages": HI, "max_tokens": 2, "n": 2, "custom_params": {
        "rksc_group_policy": {"answer_pattern": ["a"], "answer_normalize": "roman", "rule": "beta"}}},
     "answer_normalize must be"),
]


def post(url: str, route: str, body) -> requests.Response:
    if isinstance(body, str):
        return requests.post(url + route, data=body, headers={"Content-Type": "application/json"}, timeout=120)
    return requests.post(url + route, json=body, timeout=120)


class HttpPool:
    """``kv_pool()`` over HTTP, for ``tests.integration.kv``."""

    def __init__(self, url: str) -> None:
        self.url = url

    def kv_pool(self) -> dict:
        return servers.kv_pool(self.url)


def good(url: str, i: int) -> requests.Response:
    return post(url, "/generate", {"text": f"Count from {i}:", "sampling_params": {"max_new_tokens": 8, "temperature": 0}})


def test_bad_requests_get_4xx_naming_the_field_while_good_ones_complete(server_url):
    assert len(BAD) >= 40
    failures = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        good_futures = []
        for i, (route, body, word) in enumerate(BAD):
            good_futures.append(pool.submit(good, server_url, i))  # in flight while the bad one arrives
            res = post(server_url, route, body)
            shown = body if isinstance(body, str) else json.dumps(body)[:100]
            if not 400 <= res.status_code < 500:
                failures.append(f"{route} {shown}: HTTP {res.status_code} {res.text[:160]}")
            elif word.lower() not in res.text.lower():
                failures.append(f"{route} {shown}: reason lacks {word!r}: {res.text[:160]}")
        statuses = [f.result().status_code for f in good_futures]
    assert not failures, "\n".join(failures)
    assert statuses == [200] * len(BAD)
    assert good(server_url, 0).status_code == 200
    assert_no_kv_leak(HttpPool(server_url))


@pytest.mark.parametrize("route, body, word", OVERSIZE, ids=["generate", "generate-stream", "completions",
                                                             "completions-stream"])
def test_an_oversize_batch_is_refused_at_once_and_the_next_request_is_served_at_once(server_url, route, body, word):
    start = time.monotonic()
    refused = post(server_url, route, body)
    refused_s = time.monotonic() - start
    assert refused.status_code == 400 and word in refused.text, refused.text[:300]
    assert servers.kv_pool(server_url)["queued_requests"] == 0  # nothing of it reached the scheduler
    start = time.monotonic()
    assert good(server_url, 0).status_code == 200
    served_s = time.monotonic() - start
    assert refused_s < 5 and served_s < 15, (refused_s, served_s)


# n > 1 requests dropped mid-way: SGLang runs each sample as a child with a fresh rid, so the
# parent's abort and the client's disconnect must reach every child (radix_ext/stop/abort_children.py).
# Each child would decode for minutes, far past the pool check's deadline, unless stopped.
LONG_RUN = {"max_new_tokens": 2000, "ignore_eos": True, "temperature": 1.0}


def wait_until_decoding(url: str, timeout_s: float = 120) -> None:
    """Until the pool shows KV held by running requests (the children are mid-way)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pool = servers.kv_pool(url)
        if pool["total"] - pool["available"] - pool["evictable"] >= 16:
            return
        time.sleep(0.2)
    raise TimeoutError("the n=16 request never started decoding")


def assert_idle_and_no_leak(url: str) -> None:
    assert_no_kv_leak(HttpPool(url))
    pool = servers.kv_pool(url)
    assert (pool["queued_requests"], pool["running_requests"]) == (0, 0), pool


def test_an_aborted_n16_request_stops_every_child(server_url):
    body = {"text": "Tell a long story:", "rid": "fuzz-parent", "sampling_params": {**LONG_RUN, "n": 16}}
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        answer = pool.submit(post, server_url, "/generate", body)
        wait_until_decoding(server_url)
        assert requests.post(server_url + "/abort_request", json={"rid": "fuzz-parent"}, timeout=30).status_code == 200
        answer.result(timeout=60)  # the request answers (its children aborted) rather than decoding on
    assert_idle_and_no_leak(server_url)


@pytest.mark.parametrize("route, body", [
    ("/generate", {"text": "Tell a long story:", "stream": True, "sampling_params": {**LONG_RUN, "n": 16}}),
    ("/generate", {"text": "Tell a long story:", "sampling_params": {**LONG_RUN, "n": 16}}),
    (CHAT, {"model": "default", "messages": [{"role": "user", "content": "Tell a long story."}], "stream": True,
            "n": 16, "max_tokens": 2000, "ignore_eos": True}),
    ("/v1/completions", {"model": "default", "prompt": "Tell a long story:", "n": 16, "max_tokens": 2000,
                         "ignore_eos": True}),
], ids=["generate-stream", "generate", "chat-stream", "completions"])
def test_a_client_that_walks_away_from_an_n16_request_leaves_no_child(server_url, route, body):
    conn = http.client.HTTPConnection(urllib.parse.urlsplit(server_url).netloc, timeout=120)
    try:
        conn.request("POST", route, json.dumps(body), {"Content-Type": "application/json"})
        if body.get("stream"):
            assert conn.getresponse().readline()  # the first chunk arrived: the children are running
        wait_until_decoding(server_url)
    finally:
        conn.close()  # the client goes away mid-way
    assert_idle_and_no_leak(server_url)


def test_the_idle_scheduler_gives_its_freed_heap_back(server_url):
    """``radix_ext.cpu.heap_trim``: the scheduler (this server's trim interval is 2 s: tests/conftest.py)
    has ``malloc_trim`` called once it has been idle for the interval, on its trim thread, not on its
    loop, and says so in ``/server_info``. No bound on the trim's milliseconds: a loaded machine
    stretches them (20,166 ms seen once), and the loop neither calls the trim nor waits for it to
    return (``tests/unit/test_heap_trim.py`` holds a trim open and sees the loop's hook return; what
    the loop can still wait on, the main arena's lock, is in ``radix_ext/cpu/heap_trim.py``)."""
    assert good(server_url, 0).status_code == 200
    deadline, state = time.monotonic() + 60, {}
    while time.monotonic() < deadline:
        state = requests.get(server_url + "/server_info", timeout=30).json()["internal_states"][0]["rksc_heap_trim"]
        if state["trims"] >= 1:
            break
        time.sleep(0.5)
    assert state["enabled"] and state["interval_s"] == 2.0
    assert state["trims"] >= 1 and state["released_mb"] >= 0 and state["thread"] == "rksc-heap-trim", state
