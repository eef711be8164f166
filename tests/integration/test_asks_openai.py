"""ASKS blend for agents on the OpenAI routes (``python -m rksc_sgl.launch_server --asks``, the
official ``openai`` client): two agents of one group, each with its own system prompt, read the
same passage; the second reuses the KV the first computed, and each response says so on its
choice (``radix_ext.ops.openai_reports``). A client without a group gets SGLang's response as it
was, a client of another group reuses nothing, the completions route and streams report too.

Every test takes a fresh group, so none depends on what another left in the tree."""

from __future__ import annotations

import json
import uuid

import pytest
import requests

from programs.datasets import load
from rksc_sgl.protocol import ASKS_KEY, ROUTING_KEY_HEADER, asks_routing_key

pytestmark = pytest.mark.integration

SYSTEM_A = "You are a careful reader. Answer the question about the story in a few words."
SYSTEM_B = "You are a children's librarian. Read the story, then answer the question briefly."
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def asks_url(tmp_path_factory):
    from rksc_sgl.servers import http_server

    args = ["--asks", "--max-total-tokens", "8000", "--log-level", "warning"]
    with http_server("rksc_sgl.launch_server", args, tmp_path_factory.mktemp("asks-openai")) as url:
        yield url


@pytest.fixture(scope="module")
def client(asks_url):
    import openai

    return openai.OpenAI(base_url=f"{asks_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def story() -> str:
    problem = load("coqa", limit=1)[0]  # a story of about 330 tokens
    return f"{problem.passage}\n\nQuestion: {problem.question}"


def group() -> str:
    return f"agents-{uuid.uuid4().hex}"


def asks(group_name: str | None, header: bool = False) -> dict:
    """What an agent framework passes to the official client to name its ASKS group: in the body,
    or (``header``) in the routing key, as behind sglang-router."""
    if group_name is None:
        return {}
    if header:
        return {"extra_headers": {ROUTING_KEY_HEADER: asks_routing_key(group_name)}}
    return {"extra_body": {"custom_params": {ASKS_KEY: {"group": group_name}}}}


def chat(client, system: str, story: str, group_name: str | None, header: bool = False, **kwargs):
    messages = [{"role": "system", "content": system}, {"role": "user", "content": story}]
    return client.chat.completions.create(model="default", messages=messages, max_tokens=MAX_TOKENS,
                                          temperature=0, **asks(group_name, header), **kwargs)


def report(response) -> dict:
    extra = response.choices[0].model_extra
    assert ASKS_KEY in extra, extra
    return extra[ASKS_KEY]


def test_every_response_of_a_group_reports_its_decision(client, story):
    """The plumbing: the scheduler's decision, as ``/generate`` would give it, on the choice."""
    first = report(chat(client, SYSTEM_A, story, group()))
    assert first["mode"] == "blend" and first["outcome"] == "no-donor", first  # its group has no text yet
    assert first["reused_tokens"] == 0 and first["prompt_tokens"] > 300, first


@pytest.mark.parametrize("header", [False, True], ids=["custom_params", "routing-key"])
def test_an_agent_reuses_what_another_agent_of_its_group_read(client, story, header):
    """Agent B (its own system prompt) reads the passage agent A read: B's prompt leaves the cache
    at its system prompt, and the passage's KV comes from A's request (no prefill commit). The
    group named in the body or in the routing-key header alike."""
    g = group()
    a = report(chat(client, SYSTEM_A, story, g, header))
    b = report(chat(client, SYSTEM_B, story, g, header))
    assert a["outcome"] == "no-donor", a
    assert b["outcome"] == "blended" and b["reused_tokens"] > 0, b
    assert b["segments"] >= 1 and b["reused_tokens"] + b["recomputed_tokens"] > 200, b


def test_a_client_without_a_group_gets_no_report(client, story):
    reply = chat(client, SYSTEM_B, story, None)
    assert ASKS_KEY not in reply.choices[0].model_extra and ASKS_KEY not in (reply.model_extra or {})
    assert reply.choices[0].message.content is not None


def test_a_client_of_another_group_reuses_nothing(client, story):
    chat(client, SYSTEM_A, story, group())  # the passage is in the tree, as that group's text
    other = report(chat(client, SYSTEM_B, story, group()))
    assert other["outcome"] == "no-donor" and other["reused_tokens"] == 0, other


def test_a_group_in_custom_params_wins_over_the_routing_key(client, story):
    g = group()
    chat(client, SYSTEM_A, story, g)
    body_other = {ASKS_KEY: {"group": group()}}
    reply = chat(client, SYSTEM_B, story, g, header=True, extra_body={"custom_params": body_other})
    assert report(reply)["outcome"] == "no-donor", report(reply)


def test_a_malformed_group_in_the_routing_key_is_refused_naming_the_header(asks_url):
    body = {"model": "default", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    res = requests.post(f"{asks_url}/v1/chat/completions", json=body, timeout=60,
                        headers={ROUTING_KEY_HEADER: "rksc-asks:" + "x" * 200})
    assert res.status_code == 400 and ROUTING_KEY_HEADER in res.text, res.text


def test_the_completions_route_reports_the_same_way(client, story):
    g = group()

    def complete(opening: str):
        reply = client.completions.create(model="default", prompt=f"{opening}\n\n{story}\nAnswer:",
                                          max_tokens=MAX_TOKENS, temperature=0, **asks(g))
        return report(reply)

    a, b = complete(SYSTEM_A), complete(SYSTEM_B)
    assert a["mode"] == "blend" and a["outcome"] == "no-donor", a
    assert b["outcome"] == "blended" and b["reused_tokens"] > 0, b


def test_a_stream_reports_in_one_event_before_done(asks_url, client, story):
    """With the official client, the event is a chunk with no choices; on the wire it is the last
    data event before ``[DONE]``."""
    g = group()
    chunks = list(chat(client, SYSTEM_A, story, g, stream=True))
    reported = [c.model_extra[ASKS_KEY] for c in chunks if ASKS_KEY in (c.model_extra or {})]
    assert len(reported) == 1 and not chunks[-1].choices, chunks[-1]
    assert [r["index"] for r in reported[0]] == [0] and reported[0][0]["mode"] == "blend", reported
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)  # the text still streams

    body = {"model": "default", "stream": True, "max_tokens": MAX_TOKENS, "temperature": 0,
            "messages": [{"role": "user", "content": story}], "custom_params": {ASKS_KEY: {"group": g}}}
    with requests.post(f"{asks_url}/v1/chat/completions", json=body, stream=True, timeout=300) as res:
        events = [line for line in res.iter_lines(decode_unicode=True) if line]
    assert events[-1] == "data: [DONE]" and ASKS_KEY in json.loads(events[-2].removeprefix("data: ")), events[-3:]
    assert sum(ASKS_KEY in e for e in events) == 1


def test_a_dspy_program_names_its_group_and_reads_each_calls_report(asks_url):
    """``programs/agent_dspy.py --asks-group`` (DSPy in ``.venv-front``): the group goes in the
    routing key through litellm, and each call's report comes back through it."""
    from tests.integration.test_agent_dspy import agent

    run = agent(asks_url, "--questions", "1", "--branches", "2", "--max-tokens", "32", "--asks-group", group())
    assert run.returncode == 0, run.stderr[-2000:]
    calls = json.loads(run.stdout)["questions"][0]["calls"]
    assert calls and all(c["asks"]["mode"] == "blend" for c in calls), calls
    assert calls[0]["asks"]["outcome"] == "no-donor", calls[0]
