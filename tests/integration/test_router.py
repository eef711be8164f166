"""Two rksc-sgl workers behind sglang-router (``rksc_sgl.launch_router``, policy ``pinned``): a
program's requests all reach the worker that holds its prefix, a new program goes to a worker with
no program in flight, and forking programs run through the router with ``RkscEndpoint``."""

from __future__ import annotations

import pytest
import requests

from rksc_sgl.program_state import ROUTING_KEY_HEADER
from rksc_sgl.launch_router import cluster
from tests.conftest import TEST_POOL_TOKENS

pytestmark = pytest.mark.integration

PROMPT = "Question {i}: a farmer has {i} fields with 12 rows of 30 plants each. How many plants are there?\n"


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    args = ["--max-total-tokens", str(TEST_POOL_TOKENS), "--log-level", "warning"]
    with cluster(2, args, policy="pinned", log_dir=tmp_path_factory.mktemp("router")) as (url, c):
        yield url, c


def generate(url: str, text: str, key: str, max_new_tokens: int) -> dict:
    res = requests.post(url + "/generate", headers={ROUTING_KEY_HEADER: key}, timeout=120,
                        json={"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}})
    assert res.status_code == 200, res.text
    return res.json()["meta_info"]


def holds(worker_url: str, text: str) -> bool:
    """Whether ``text`` is in the worker's radix cache (asked directly, not through the router)."""
    res = requests.post(worker_url + "/generate", timeout=120,
                        json={"text": text, "sampling_params": {"max_new_tokens": 0}})
    assert res.status_code == 200, res.text
    meta = res.json()["meta_info"]
    return meta["cached_tokens"] >= meta["prompt_tokens"] - 1


def test_every_fork_of_a_program_finds_its_prefix_cached(routed):
    url, c = routed
    c.flush()
    for i in range(6):
        prefix = PROMPT.format(i=i) * 4
        committed = generate(url, prefix, f"program-{i}", 0)["prompt_tokens"]
        for b in range(3):
            meta = generate(url, prefix + f"Branch {b}:", f"program-{i}", 4)
            assert meta["cached_tokens"] >= committed - 1, (i, b, meta, committed)


def test_a_new_program_goes_to_the_worker_with_no_program_in_flight(routed):
    # ``min_group`` counts the routing keys with a request in flight on each worker (ties at
    # random), so the spread shows while one program is still running: hold its stream open.
    url, c = routed
    c.flush()
    running, arriving = PROMPT.format(i=100) * 4, PROMPT.format(i=200) * 4
    body = {"text": running, "stream": True,
            "sampling_params": {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}}
    with requests.post(url + "/generate", headers={ROUTING_KEY_HEADER: "program-running"}, json=body,
                       stream=True, timeout=120) as held:
        assert held.status_code == 200, held.text
        chunks = held.iter_lines()
        next(chunk for chunk in chunks if chunk)  # its first token: in flight on one worker
        generate(url, arriving, "program-arriving", 0)
        assert any(b"[DONE]" in chunk for chunk in chunks)  # let it finish, so its prompt is cached
    where = [[holds(w, text) for w in c.worker_urls] for text in (running, arriving)]
    assert sorted(map(sum, where)) == [1, 1] and where[0] != where[1], where


def test_forking_programs_through_the_router_reuse_their_prompt(routed):
    from programs.sampling import SamplingConfig
    from programs.sc import run_branches
    from rksc_sgl.endpoint import RkscEndpoint
    from programs.datasets import load

    url, c = routed
    c.flush()
    endpoint = RkscEndpoint(url)
    out = run_branches(load("gsm8k", limit=4), SamplingConfig(num_branches=4, max_new_tokens=8), endpoint)
    assert [len(branches) for branches in out] == [4] * 4
    counters = endpoint.reset_counters()
    # Per program: the prefix commit (nothing cached) and 4 forks that find the whole prompt cached,
    # so 4 of every 5 prompt tokens are reused; a fork on the other worker would prefill it again.
    assert counters.cached_tokens / counters.prompt_tokens >= 0.75, counters
