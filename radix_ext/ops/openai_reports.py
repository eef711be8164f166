"""ASKS on SGLang's OpenAI-compatible routes (``/v1/chat/completions``, ``/v1/completions``): the
group a client names, and the report of what its request reused.

A client names its ASKS group in ``custom_params``, which both routes pass into the request's
sampling parameters (with the official ``openai`` client:
``extra_body={"custom_params": {"rksc_asks": {"group": g}}}``), or in sglang-router's routing-key
header as ``rksc-asks:<group>`` (``rksc_sgl.protocol.asks_routing_key``; ``extra_headers``), which
behind the router also keeps the group on one worker. sglang-router 0.3.2 rebuilds a chat request
from the fields it knows and drops ``custom_params`` (it keeps them in a completions body, and
forwards the routing-key header), so behind it the header is the one way a chat request names its
group. A BEFORE hook on both routes' ``_convert_to_internal_request`` puts the header's group into
``custom_params`` unless these carry an ASKS entry of their own (a malformed group: HTTP 400).

The scheduler's decision comes back in ``meta_info["rksc_asks"]`` (``radix_ext.asks.decision``, a
list with one dict), which the OpenAI routes drop. These hooks, in the process that serves HTTP,
put it into the response:

* non-streamed: on each choice, ``choices[i].rksc_asks``, that choice's one dict (``mode``,
  ``outcome``, ``reused_tokens``, ``recomputed_tokens``, ...; with the ``openai`` package:
  ``choice.model_extra["rksc_asks"]``). The response keeps its SGLang class (a subclass whose
  choices admit the field), so SGLang's Anthropic route, which reuses the chat handler, still
  gets a ``ChatCompletionResponse``;
* streamed: one more chunk just before ``data: [DONE]``, with no choices and a list of one entry
  per choice, ``{"choices": [], "rksc_asks": [{"index": i, ...}]}`` (``chunk.model_extra``), the way
  SGLang sends its own ``sglext`` and OpenAI its usage. The scheduler reports on a stream's first
  chunk; ``TokenizerManager.generate_request`` is wrapped for such a stream only, to note it.

A request that names no group (in either place) gets no field, and neither does one whose server
reports nothing (no ``--asks``): a response differs from SGLang's only when there is a report to
carry.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from typing import Any, AsyncIterator

from rksc_sgl.protocol import ASKS_KEY, ROUTING_KEY_HEADER, AsksOptions, group_of_routing_key

_OPENAI = "sglang.srt.entrypoints.openai"
CHAT_CONVERT_TARGET = f"{_OPENAI}.serving_chat.OpenAIServingChat._convert_to_internal_request"
COMPLETION_CONVERT_TARGET = f"{_OPENAI}.serving_completions.OpenAIServingCompletion._convert_to_internal_request"
CHAT_RESPONSE_TARGET = f"{_OPENAI}.serving_chat.OpenAIServingChat._build_chat_response"
COMPLETION_RESPONSE_TARGET = f"{_OPENAI}.serving_completions.OpenAIServingCompletion._build_completion_response"
CHAT_STREAM_TARGET = f"{_OPENAI}.serving_chat.OpenAIServingChat._generate_chat_stream"
COMPLETION_STREAM_TARGET = f"{_OPENAI}.serving_completions.OpenAIServingCompletion._generate_completion_stream"
GENERATE_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"
RESPONSE_CLASSES = (  # (response class, its choice class), as the two routes build them
    (f"{_OPENAI}.protocol.ChatCompletionResponse", f"{_OPENAI}.protocol.ChatCompletionResponseChoice"),
    (f"{_OPENAI}.protocol.CompletionResponse", f"{_OPENAI}.protocol.CompletionResponseChoice"),
)
DONE = "data: [DONE]\n\n"  # the last event of both routes' streams
CHUNK_OBJECTS = {CHAT_STREAM_TARGET: "chat.completion.chunk", COMPLETION_STREAM_TARGET: "text_completion"}


def group_of(request: Any) -> str | None:
    """The ASKS group an OpenAI request names in its ``custom_params`` (None: none, or malformed,
    which SGLang's validation refuses with a 400 before anything is generated)."""
    try:
        return AsksOptions.from_custom_params(getattr(request, "custom_params", None)).group
    except ValueError:
        return None


def _group_from_header(serving, request, *args, **kwargs) -> None:
    """BEFORE ``_convert_to_internal_request(request, raw_request)``: the group of a routing key
    ``rksc-asks:<group>`` into ``request.custom_params``, unless these name an ASKS entry."""
    raw_request = kwargs.get("raw_request", args[0] if args else None)
    headers = getattr(raw_request, "headers", None)
    group = group_of_routing_key(headers.get(ROUTING_KEY_HEADER) if headers is not None else None)
    custom_params = getattr(request, "custom_params", None)
    if group is None or not isinstance(custom_params, (dict, type(None))) or (custom_params or {}).get(ASKS_KEY):
        return None  # no group; a malformed custom_params is SGLang's to refuse; the body's entry wins
    request.custom_params = AsksOptions(group=group).to_custom_params(custom_params)
    return None


def report_of(meta_info: Any) -> dict[str, Any] | None:
    """The one decision in a response's ``meta_info["rksc_asks"]``, if any."""
    reports = meta_info.get(ASKS_KEY) if isinstance(meta_info, dict) else None
    if isinstance(reports, list) and reports and isinstance(reports[-1], dict):
        return dict(reports[-1])
    return None


def choice_reports(request: Any, ret: list[dict]) -> list[dict | None] | None:
    """Per generation of a non-streamed response (SGLang's choice ``i`` is ``ret[i]``), its report;
    None when the request names no group or no generation has one."""
    if group_of(request) is None or not isinstance(ret, list):
        return None
    reports = [report_of(item.get("meta_info")) if isinstance(item, dict) else None for item in ret]
    return reports if any(r is not None for r in reports) else None


@functools.cache
def reporting_classes() -> dict[type, tuple[type, type]]:
    """SGLang response class -> (a subclass whose choices are ``choice_class``, ``choice_class``:
    the SGLang choice class that also keeps extra fields, serialized with the others)."""
    from pydantic import ConfigDict

    from rksc_sgl.seams import resolve

    classes = {}
    for response_path, choice_path in RESPONSE_CLASSES:
        response, choice = resolve(response_path), resolve(choice_path)
        reporting_choice = type(f"Rksc{choice.__name__}", (choice,),
                                {"__module__": __name__, "model_config": ConfigDict(extra="allow")})
        reporting = type(f"Rksc{response.__name__}", (response,),
                         {"__module__": __name__, "__annotations__": {"choices": list[reporting_choice]}})
        classes[response] = (reporting, reporting_choice)
    return classes


def with_reports(response: Any, reports: list[dict | None]) -> Any:
    """``response`` with ``reports[i]`` as choice ``i``'s ``rksc_asks`` (None: ``response`` is not
    one of the two routes' classes, or its choices are not one per report)."""
    classes = reporting_classes().get(type(response))
    if classes is None or len(response.choices) != len(reports):
        return None
    reporting, reporting_choice = classes
    choices = [reporting_choice.model_construct(_fields_set=choice.model_fields_set, **vars(choice),
                                                **({} if report is None else {ASKS_KEY: report}))
               for choice, report in zip(response.choices, reports)]
    return reporting.model_construct(_fields_set=response.model_fields_set, **{**vars(response), "choices": choices})


def _report_response(result, serving, *args, **kwargs):
    """AFTER ``_build_chat_response`` / ``_build_completion_response(request, ret, created)``."""
    request = kwargs.get("request", args[0] if args else None)
    ret = kwargs.get("ret", args[1] if len(args) > 1 else None)
    reports = choice_reports(request, ret)
    return None if reports is None else with_reports(result, reports)


# ---- streams ---------------------------------------------------------------------------------

@dataclasses.dataclass
class StreamReports:
    """What one stream's generations reported (index -> report), noted as SGLang yields them."""

    reports: dict[int, dict] = dataclasses.field(default_factory=dict)
    response_id: str | None = None

    def note(self, out: Any) -> None:
        for item in out if isinstance(out, list) else [out]:
            meta_info = item.get("meta_info") if isinstance(item, dict) else None
            report = report_of(meta_info)
            if report is not None:
                self.reports.setdefault(item.get("index", 0), report)
                self.response_id = self.response_id or meta_info.get("id")

    def chunk(self, object_name: str, model: str | None) -> str | None:
        """The stream's report event, None if nothing was reported."""
        if not self.reports:
            return None
        body = {"id": self.response_id, "object": object_name, "created": int(time.time()), "model": model,
                "choices": [], ASKS_KEY: [{"index": i, **self.reports[i]} for i in sorted(self.reports)]}
        return f"data: {json.dumps(body)}\n\n"


_streams: dict[int, StreamReports] = {}  # id(adapted request) -> its notes, while its stream runs


def _report_stream(original, serving, adapted_request, request, *args, object_name: str, **kwargs):
    """AROUND ``_generate_chat_stream`` / ``_generate_completion_stream``: SGLang's stream, plus
    the report event before ``[DONE]`` when the request names a group."""
    stream = original(serving, adapted_request, request, *args, **kwargs)
    if group_of(request) is None:
        return stream
    return _with_report_event(stream, adapted_request, object_name, getattr(request, "model", None))


async def _with_report_event(stream, adapted_request, object_name: str, model: str | None) -> AsyncIterator[str]:
    key, notes = id(adapted_request), StreamReports()
    _streams[key] = notes  # registered before SGLang's stream starts (and asks the tokenizer manager)
    try:
        async for event in stream:
            if event == DONE:
                report = notes.chunk(object_name, model)
                if report is not None:
                    yield report
            yield event
    finally:
        _streams.pop(key, None)
        await stream.aclose()


def _note_reports(original, manager, obj, *args, **kwargs):
    """AROUND ``TokenizerManager.generate_request``: a reported stream's outputs, noted on their
    way; every other request gets SGLang's generator itself."""
    outputs = original(manager, obj, *args, **kwargs)
    notes = _streams.get(id(obj))
    return outputs if notes is None else _noting(outputs, notes)


async def _noting(outputs, notes: StreamReports) -> AsyncIterator[Any]:
    try:
        async for out in outputs:
            notes.note(out)
            yield out
    finally:
        await outputs.aclose()


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target in (CHAT_CONVERT_TARGET, COMPLETION_CONVERT_TARGET):
        HookRegistry.register(target, _group_from_header, HookType.BEFORE)
    for target in (CHAT_RESPONSE_TARGET, COMPLETION_RESPONSE_TARGET):
        HookRegistry.register(target, _report_response, HookType.AFTER)
    for target, object_name in CHUNK_OBJECTS.items():
        HookRegistry.register(target, functools.partial(_report_stream, object_name=object_name), HookType.AROUND)
    HookRegistry.register(GENERATE_TARGET, _note_reports, HookType.AROUND)
