"""ASKS blend in steady state, on the real engine: a long-lived engine whose agents' openings are
already cached with other text after them, requests sent one by one with only a group (no
commit), as an agent framework sends them.

Eight agents, each its own system prompt, then the user turn ``Passage:\\n<story>...``: every
agent's opening is followed in the tree by the label and earlier problems' stories (whose first
words are often the same), so each member leaves the cache inside the label or the story's first
tokens. A member that shares at least ``WINDOW`` tokens with text its group has cached exactly
must find it, wherever it stands: the DESIGN's steady-state invariant. Then the relay: what one
agent generated is the next agent's donor, whether it computed exactly or blended.
"""

from __future__ import annotations

import uuid

import pytest

from programs.datasets import load
from programs.role_sc import ROLES, user_prompt
from rksc_sgl import RkscConfig
from rksc_sgl.protocol import ASKS_KEY, AsksOptions
from tests.integration.engines import Engines
from tests.integration.kv import assert_no_kv_leak

pytestmark = pytest.mark.integration

WARM_PROBLEMS = 3


@pytest.fixture(scope="module")
def backend():
    pool = Engines({"blend": dict(rksc=RkscConfig(asks=True), max_total_tokens=16384)})
    yield pool.get("blend")
    pool.close()


@pytest.fixture(scope="module")
def stories():
    problems = load("coqa")
    return [p for p in problems if 150 < len(p.passage.split()) < 260][: WARM_PROBLEMS + 2]


def _text(backend, system: str, user: str) -> str:
    template = backend.chat_template
    prefix, suffix = template.get_prefix_and_suffix("system", [])
    user_prefix, user_suffix = template.get_prefix_and_suffix("user", [])
    return prefix + system + suffix + user_prefix + user + user_suffix + template.get_prefix_and_suffix(
        "assistant", [])[0]


def ask(backend, group: str | None, system: str, user: str, max_new_tokens: int = 1) -> dict:
    """One chat turn as a member of ``group`` (None: no group): its response."""
    text = _text(backend, system, user)
    params = {"max_new_tokens": max_new_tokens, "temperature": 0.0}
    if group is not None:
        params["custom_params"] = AsksOptions(group=group).to_custom_params()
    out = backend._generate_http_request(None, {"text": text, "sampling_params": params})
    return out


def report(meta: dict) -> dict:
    return meta["meta_info"][ASKS_KEY][0]


def test_every_agent_after_the_first_finds_its_group_text_in_steady_state(backend, stories):
    for problem in stories[:WARM_PROBLEMS]:  # earlier problems: each opening then label + another story
        group = uuid.uuid4().hex
        for role in ROLES:
            ask(backend, group, role, user_prompt(problem.passage, problem.question))
    problem, group = stories[WARM_PROBLEMS], uuid.uuid4().hex
    reports = [report(ask(backend, group, role, user_prompt(problem.passage, problem.question))) for role in ROLES]
    assert [r["outcome"] for r in reports[1:]] == ["blended"] * (len(ROLES) - 1), reports
    # the story is most of each prompt: all but the label's and the opening's tokens come from the donor
    assert all(r["reused_tokens"] + r["recomputed_tokens"] > 0.6 * r["prompt_tokens"] for r in reports[1:]), reports
    assert_no_kv_leak(backend)


def test_what_an_agent_generated_is_the_next_agents_donor(backend, stories):
    problem, group = stories[WARM_PROBLEMS + 1], uuid.uuid4().hex
    first = ask(backend, group, ROLES[0], user_prompt(problem.passage, "Retell the story in detail."), 48)
    said = first["text"]
    assert first["meta_info"]["completion_tokens"] >= 24, first["meta_info"]
    relay = f"Another reader wrote:\n{said}\n\nIs that account faithful? Answer yes or no."
    reports = [report(ask(backend, group, role, relay)) for role in ROLES[1:3]]
    assert all(r["outcome"] == "blended" for r in reports), reports
    assert all(r["reused_tokens"] + r["recomputed_tokens"] >= 16 for r in reports), reports
    assert_no_kv_leak(backend)


def test_what_a_blended_agent_generated_is_the_next_agents_donor_for_its_group_only(backend, stories):
    """The relay through a blended request (``radix_ext.asks.private``): agent B blends the passage
    from agent A and generates; B's output exists only as B's approximate KV, yet agent C, which
    reads it, reuses it. Prefix matching never reaches it, nor does another group."""
    problem, group = stories[2], uuid.uuid4().hex
    ask(backend, group, ROLES[0], user_prompt(problem.passage, problem.question))
    second = ask(backend, group, ROLES[1], user_prompt(problem.passage, "Retell the story in detail."), 48)
    assert report(second)["outcome"] == "blended" and second["meta_info"]["completion_tokens"] >= 24, second
    kept = backend.get_server_info()["internal_states"][0]["rksc_cache"]["asks"]["blend"]["kept_tokens"]
    assert kept >= second["meta_info"]["completion_tokens"] - 1
    relay = f"Another reader wrote:\n{second['text']}\n\nIs that account faithful? Answer yes or no."
    third = report(ask(backend, group, ROLES[2], relay))
    assert third["outcome"] == "blended" and third["reused_tokens"] + third["recomputed_tokens"] >= 16, third
    assert report(ask(backend, f"other-{uuid.uuid4().hex}", ROLES[2], relay))["outcome"] == "no-donor"
    exact = report(second)["exact_tokens"]
    text = _text(backend, ROLES[1], user_prompt(problem.passage, "Retell the story in detail.")) + second["text"]
    plain = backend._generate_http_request(None, {"text": text, "sampling_params": {"max_new_tokens": 1}})
    assert plain["meta_info"]["cached_tokens"] == exact, (plain["meta_info"], exact)
    assert_no_kv_leak(backend)


def test_a_client_without_the_group_or_of_another_group_gets_exact_and_no_reuse(backend, stories):
    problem = stories[0]
    user = user_prompt(problem.passage, problem.question)
    plain = ask(backend, None, ROLES[3], user)
    assert ASKS_KEY not in plain["meta_info"], plain["meta_info"]
    other = report(ask(backend, f"other-{uuid.uuid4().hex}", ROLES[5], user))
    assert other["outcome"] == "no-donor", other
    assert_no_kv_leak(backend)


def test_a_blended_requests_exact_part_is_cached_and_serves_as_a_fresh_forward_would(backend, stories):
    """A blended member's tokens before its first reused one (its opening, the label, the leading
    tokens it computed) enter the tree, so a long-lived opening stays cached after blends; they are
    the same bits as a fresh forward's, so a request of no group served from them decodes exactly
    what it decodes on an empty cache."""
    problem, group = stories[1], uuid.uuid4().hex
    user = user_prompt(problem.passage, problem.question)
    ask(backend, group, ROLES[0], user)
    blended = ask(backend, group, ROLES[6], user)
    exact_tokens = report(blended)["exact_tokens"]
    assert report(blended)["outcome"] == "blended" and 0 < exact_tokens < blended["meta_info"]["prompt_tokens"] // 2
    logprobs = {"return_logprob": True, "top_logprobs_num": 5}
    served = backend._generate_http_request(None, {"text": _text(backend, ROLES[6], user), **logprobs,
                                                   "sampling_params": {"max_new_tokens": 12, "temperature": 0.0}})
    assert served["meta_info"]["cached_tokens"] == exact_tokens, (served["meta_info"], exact_tokens)
    backend.flush_cache()
    fresh = backend._generate_http_request(None, {"text": _text(backend, ROLES[6], user), **logprobs,
                                                  "sampling_params": {"max_new_tokens": 12, "temperature": 0.0}})
    assert fresh["meta_info"]["cached_tokens"] == 0
    assert served["meta_info"]["output_token_logprobs"] == fresh["meta_info"]["output_token_logprobs"]
    assert served["meta_info"]["output_top_logprobs"] == fresh["meta_info"]["output_top_logprobs"]
    assert_no_kv_leak(backend)
