"""Two rksc-sgl workers behind sglang-router (``rksc_sgl.launch_router``, policy ``pinned``): a
program's requests all reach the worker that holds its prefix, programs spread over both workers,
and forking programs run through the router with ``RkscEndpoint``."""

from __future__ import annotations

import pytest
import requests

from rksc_sgl import servers
from rksc_sgl.frontend import ROUTING_KEY_HEADER
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


def test_every_fork_of_a_program_finds_its_prefix_cached_and_programs_use_both_workers(routed):
    url, c = routed
    c.flush()
    for i in range(6):
        prefix = PROMPT.format(i=i) * 4
        committed = generate(url, prefix, f"program-{i}", 0)["prompt_tokens"]
        for b in range(3):
            meta = generate(url, prefix + f"Branch {b}:", f"program-{i}", 4)
            assert meta["cached_tokens"] >= committed - 1, (i, b, meta, committed)
    assert all(servers.kv_pool(w)["evictable"] > 0 for w in c.worker_urls)  # each worker holds programs


def test_forking_programs_through_the_router_reuse_their_prompt(routed):
    from programs.sampling import SamplingConfig
    from programs.sc import run_branches
    from rksc_sgl.frontend import RkscEndpoint
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
