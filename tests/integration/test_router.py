"""Two rksc-sgl workers behind sglang-router (``rksc_sgl.launch_router``, policy ``pinned``): a
program's requests all reach the worker that holds its prefix, a new program goes to a worker with
no program in flight, forking programs run through the router with ``RkscEndpoint``, and agents on
the OpenAI routes that send their ASKS group as the routing key all reach one worker, where each
reuses what the others read."""

from __future__ import annotations

import time
import uuid

import pytest
import requests

from rksc_sgl.program_state import ROUTING_KEY_HEADER
from rksc_sgl.launch_router import cluster
from rksc_sgl.protocol import ASKS_KEY, asks_routing_key
from tests.conftest import TEST_POOL_TOKENS

pytestmark = pytest.mark.integration

PROMPT = "Question {i}: a farmer has {i} fields with 12 rows of 30 plants each. How many plants are there?\n"


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    args = ["--max-total-tokens", str(TEST_POOL_TOKENS), "--log-level", "warning", "--asks", "--enable-metrics"]
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


def finished_requests(worker_url: str) -> float:
    """SGLang's ``sglang:num_requests_total`` of one worker (asked directly, not through the router)."""
    text = requests.get(worker_url + "/metrics", timeout=30).text
    counts = [line for line in text.splitlines() if line.startswith("sglang:num_requests_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in counts)


def serving_worker(c, send) -> tuple[int, object]:
    """(the index of the one worker that served ``send()``, its result)."""
    before = [finished_requests(w) for w in c.worker_urls]
    result = send()
    for _ in range(50):  # SGLang counts a request as it hands the response over
        grown = [i for i, w in enumerate(c.worker_urls) if finished_requests(w) > before[i]]
        if grown:
            assert len(grown) == 1, grown
            return grown[0], result
        time.sleep(0.1)
    raise AssertionError("no worker counted the request")


def test_agents_of_an_asks_group_meet_on_one_worker_over_the_openai_routes(routed):
    """An agent framework's call names its group in the routing key (``extra_headers``), which
    both pins it and reaches the worker (sglang-router drops a chat request's ``custom_params``).
    Two groups, three agents each with its own opening, reading one passage: every request of a
    group lands on its group's worker, and there the later agents reuse the passage the first one
    read (the report passes the router unchanged)."""
    import openai

    from programs.datasets import load

    url, c = routed
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    story = load("coqa", limit=1)[0].passage
    openings = ["You are a careful reader.", "You are a librarian.", "You summarise stories for children."]
    groups = [f"agents-{uuid.uuid4().hex}" for _ in range(2)]
    workers, outcomes = {g: set() for g in groups}, {g: [] for g in groups}
    for opening in openings:
        for group in groups:
            messages = [{"role": "system", "content": opening}, {"role": "user", "content": story}]
            worker, reply = serving_worker(c, lambda: client.chat.completions.create(
                model="default", messages=messages, max_tokens=2, temperature=0,
                extra_headers={ROUTING_KEY_HEADER: asks_routing_key(group)}))
            workers[group].add(worker)
            outcomes[group].append(reply.choices[0].model_extra[ASKS_KEY]["outcome"])
    for group in groups:  # the completions route, the group in custom_params and the key
        worker, reply = serving_worker(c, lambda: client.completions.create(
            model="default", prompt=f"Read the story.\n\n{story}\nSummary:", max_tokens=2, temperature=0,
            extra_body={"custom_params": {ASKS_KEY: {"group": group}}},
            extra_headers={ROUTING_KEY_HEADER: asks_routing_key(group)}))
        workers[group].add(worker)
        outcomes[group].append(reply.choices[0].model_extra[ASKS_KEY]["outcome"])
    assert all(len(served) == 1 for served in workers.values()), workers
    assert all(o == ["no-donor", "blended", "blended", "blended"] for o in outcomes.values()), outcomes
