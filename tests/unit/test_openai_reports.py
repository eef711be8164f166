"""``radix_ext.ops.openai_reports``: ASKS's report reaches clients of the OpenAI routes, on each
choice of a non-streamed response and in one event before a stream's ``[DONE]``, read with the
official ``openai`` client; a request without a group gets SGLang's response untouched."""

from __future__ import annotations

import asyncio
import inspect
import json
from types import SimpleNamespace

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion import Completion
from sglang.srt.entrypoints.openai import protocol

from radix_ext.ops import openai_reports as reports
from rksc_sgl.protocol import ASKS_KEY, ROUTING_KEY_HEADER, asks_routing_key, group_of_routing_key

GROUPED = SimpleNamespace(custom_params={ASKS_KEY: {"group": "g"}}, model="m")
UNGROUPED = SimpleNamespace(custom_params=None, model="m")
BLENDED = {"mode": "blend", "outcome": "blended", "reused_tokens": 250, "recomputed_tokens": 40}
USAGE = protocol.UsageInfo(prompt_tokens=1, completion_tokens=1, total_tokens=2)


def chat(n: int = 1) -> protocol.ChatCompletionResponse:
    message = protocol.ChatMessage(role="assistant", content="hi")
    choices = [protocol.ChatCompletionResponseChoice(index=i, message=message, finish_reason="stop") for i in range(n)]
    return protocol.ChatCompletionResponse(id="c", model="m", choices=choices, usage=USAGE)


def ret(*decisions) -> list[dict]:
    return [{"meta_info": {"id": "c", **({} if d is None else {ASKS_KEY: [d]})}} for d in decisions]


def served(response) -> str:
    """What SGLang's route sends (``utils.json_response.model_json_response``)."""
    return response.model_dump_json(by_alias=True)


class TestNonStreamed:
    def test_each_choice_carries_its_report_for_the_official_client(self):
        out = reports._report_response(chat(2), None, GROUPED, ret(BLENDED, {**BLENDED, "outcome": "no-donor"}), 0)
        assert isinstance(out, protocol.ChatCompletionResponse)  # SGLang's Anthropic route checks this
        parsed = ChatCompletion.model_validate_json(served(out))
        assert [c.model_extra[ASKS_KEY]["outcome"] for c in parsed.choices] == ["blended", "no-donor"]
        assert parsed.choices[0].model_extra[ASKS_KEY] == BLENDED
        assert parsed.choices[0].message.content == "hi" and parsed.usage.total_tokens == 2

    def test_a_completion_choice_carries_it_too(self):
        choice = protocol.CompletionResponseChoice(index=0, text="t", finish_reason="stop")
        response = protocol.CompletionResponse(id="c", model="m", usage=USAGE, choices=[choice])
        out = reports._report_response(response, None, GROUPED, ret(BLENDED), 0)
        assert Completion.model_validate_json(served(out)).choices[0].model_extra[ASKS_KEY] == BLENDED

    def test_a_request_without_a_group_is_left_as_sglang_built_it(self):
        response = chat()
        assert reports._report_response(response, None, UNGROUPED, ret(BLENDED), 0) is None
        assert ASKS_KEY not in served(response)

    def test_no_field_when_the_server_reported_nothing(self):
        assert reports._report_response(chat(), None, GROUPED, ret(None), 0) is None  # no --asks

    def test_a_choice_without_a_report_gets_no_field(self):
        out = reports._report_response(chat(2), None, GROUPED, ret(BLENDED, None), 0)
        assert ASKS_KEY not in json.loads(served(out))["choices"][1]

    def test_an_error_response_passes(self):
        assert reports._report_response(object(), None, GROUPED, ret(BLENDED), 0) is None

    def test_a_malformed_group_reports_nothing(self):
        bad = SimpleNamespace(custom_params={ASKS_KEY: {"group": 3}})  # SGLang's validation refuses it
        assert reports.group_of(bad) is None


def converted(custom_params, key: str | None) -> dict | None:
    """``custom_params`` as SGLang converts a request that came with routing key ``key``."""
    request = SimpleNamespace(custom_params=custom_params)
    raw_request = SimpleNamespace(headers={} if key is None else {ROUTING_KEY_HEADER: key})
    assert reports._group_from_header(None, request, raw_request) is None
    return request.custom_params


class TestGroupInTheRoutingKey:
    def test_the_routing_key_names_the_group_where_custom_params_name_none(self):
        key = asks_routing_key("agents")
        assert key == "rksc-asks:agents" and group_of_routing_key(key) == "agents"
        assert converted(None, key) == {ASKS_KEY: {"enabled": True, "group": "agents"}}
        assert converted({"rksc": {"depth": 1}}, key) == {"rksc": {"depth": 1},
                                                          ASKS_KEY: {"enabled": True, "group": "agents"}}

    def test_custom_params_win(self):
        mine = {ASKS_KEY: {"group": "body"}}
        assert converted(dict(mine), asks_routing_key("header")) == mine
        assert converted({ASKS_KEY: {"enabled": False}}, asks_routing_key("g")) == {ASKS_KEY: {"enabled": False}}

    @pytest.mark.parametrize("key", [None, "a-program-key", "RKSC-ASKS:g"])
    def test_any_other_routing_key_names_no_group(self, key):
        assert converted(None, key) is None and group_of_routing_key(key) is None

    def test_a_malformed_group_in_the_key_is_refused_naming_the_header(self):
        with pytest.raises(ValueError, match=ROUTING_KEY_HEADER):
            converted(None, "rksc-asks:" + "x" * 200)
        with pytest.raises(ValueError, match="group"):
            asks_routing_key("")

    def test_a_request_without_headers_passes(self):
        request = SimpleNamespace(custom_params=None)
        assert reports._group_from_header(None, request, None) is None and request.custom_params is None


async def sglang_stream(manager, adapted, chunks: list[dict]):
    """A stand-in for SGLang's stream: one event per output of ``generate_request``, then DONE."""
    async for out in manager.generate_request(adapted):
        yield f"data: {json.dumps({'text': out['text']})}\n\n"
    yield reports.DONE


class Manager:
    def __init__(self, outputs):
        self.outputs = outputs

    def generate_request(self, obj, request=None):
        return reports._note_reports(Manager._generate, self, obj, request)

    async def _generate(self, obj, request=None):
        for out in self.outputs:
            yield out


def run_stream(request, outputs) -> list[str]:
    manager, adapted = Manager(outputs), object()

    def original(serving, adapted_request, req, raw_request):
        return sglang_stream(manager, adapted_request, outputs)

    async def collect():
        stream = reports._report_stream(original, None, adapted, request, None, object_name="chat.completion.chunk")
        return [event async for event in stream]

    return asyncio.run(collect())


def outputs(*decisions):
    return [{"text": f"t{i}", "index": index, "meta_info": {"id": "c", **({ASKS_KEY: [d]} if d else {})}}
            for i, (index, d) in enumerate(decisions)]


class TestStreamed:
    def test_one_event_before_done_lists_each_choices_report(self):
        events = run_stream(GROUPED, outputs((0, BLENDED), (1, None), (1, {**BLENDED, "outcome": "no-donor"}),
                                             (0, BLENDED)))
        assert events[-1] == reports.DONE and events[:4] == [f'data: {{"text": "t{i}"}}\n\n' for i in range(4)]
        chunk = ChatCompletionChunk.model_validate_json(events[-2].removeprefix("data: "))
        assert chunk.choices == [] and chunk.id == "c" and chunk.model == "m"
        assert chunk.model_extra[ASKS_KEY] == [{"index": 0, **BLENDED}, {"index": 1, **BLENDED, "outcome": "no-donor"}]
        assert not reports._streams  # forgotten once the stream ended

    def test_a_stream_without_a_group_is_sglangs_own(self):
        events = run_stream(UNGROUPED, outputs((0, BLENDED)))
        assert events == ['data: {"text": "t0"}\n\n', reports.DONE]

    def test_a_stream_with_nothing_reported_has_no_event(self):
        assert run_stream(GROUPED, outputs((0, None))) == ['data: {"text": "t0"}\n\n', reports.DONE]

    def test_a_request_of_no_reported_stream_gets_sglangs_generator(self):
        generator = Manager._generate(None, None)
        assert reports._note_reports(lambda *a: generator, None, object()) is generator


class TestSglangStillDoesWhatTheHooksAssume:
    """Source checks of the installed SGLang: if one fails, the hooks above see less than they need."""

    @pytest.mark.parametrize("source, line", [
        (protocol.ChatCompletionRequest.to_sampling_params, '"custom_params": self.custom_params'),
        ("sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._build_sampling_params",
         '"custom_params": request.custom_params'),
    ])
    def test_both_routes_pass_custom_params_into_the_sampling_params(self, source, line):
        from rksc_sgl.seams import resolve

        assert line in inspect.getsource(resolve(source) if isinstance(source, str) else source)

    @pytest.mark.parametrize("target", [reports.CHAT_CONVERT_TARGET, reports.COMPLETION_CONVERT_TARGET])
    def test_custom_params_are_read_when_the_request_is_converted(self, target):
        from rksc_sgl.seams import resolve

        assert "raw_request" in inspect.signature(resolve(target)).parameters
        assert "_build_sampling_params(" in inspect.getsource(resolve(target)) or "to_sampling_params(" in \
            inspect.getsource(resolve(target))

    @pytest.mark.parametrize("target", [reports.CHAT_RESPONSE_TARGET, reports.COMPLETION_RESPONSE_TARGET])
    def test_every_non_streamed_response_is_built_by_the_hooked_method(self, target):
        from rksc_sgl.seams import resolve

        cls_path, method = target.rsplit(".", 1)
        handler = inspect.getsource(resolve(cls_path)._handle_non_streaming_request)
        assert f"self.{method}(" in handler and "request,\n            ret," in handler

    @pytest.mark.parametrize("target", list(reports.CHUNK_OBJECTS))
    def test_streams_ask_the_tokenizer_manager_and_end_with_done(self, target):
        from rksc_sgl.seams import resolve

        source = inspect.getsource(resolve(target))
        assert "self.tokenizer_manager.generate_request(\n                adapted_request," in source
        assert source.rstrip().endswith('yield "data: [DONE]\\n\\n"')
        assert json.dumps(reports.DONE)[1:-1] in source
