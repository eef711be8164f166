"""One chat request sent through a program's backend, streamed, and timed to its first token.

The agent workloads (``programs.agents``, ``programs.grader``) report time to first token (TTFT)
beside wall time. SGLang's ``meta_info`` carries a per-request ``first_token_latency`` only under
``--enable-metrics``, whose Prometheus collectors cannot be created twice in one process (the
benchmark starts one in-process engine per mode), and a non-streamed response arrives whole. So
each request is streamed (``stream: true``) and timed at the client: ``ttft_s`` from sending it to
its first output, ``latency_s`` to its last. Its ``stream_interval`` is above ``max_new_tokens``,
so the scheduler sends the first token at once and then nothing until the request finishes (two
outputs, where a non-streamed request has one): streaming adds no per-token traffic that would
slow the run being timed. (For one-token requests, the client's TTFT read SGLang's own
``e2e_latency`` to within 10 ms in a bench run.) What the request does otherwise is what ``sgl.gen`` sends through
ours (``rksc_sgl.endpoint``): the sampling seed and ``custom_params`` (the ASKS group), the first
token's top log-probabilities, the program's routing key, and its tokens counted once, when done.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any


@dataclasses.dataclass(frozen=True)
class TimedOutput:
    text: str
    meta_info: dict[str, Any]  # the last output's (token log-probabilities, ASKS report, counters)
    ttft_s: float  # from sending the request to its first streamed output
    latency_s: float  # from sending it to its last


def request_body(text: str, *, max_new_tokens: int, temperature: float, top_logprobs_num: int,
                 seed: int | None = None, custom_params: dict[str, Any] | None = None,
                 token_ids_logprob: list[int] | None = None) -> dict[str, Any]:
    """The streamed ``/generate`` body (module docstring), every output token's log-probability
    and each one's top ``top_logprobs_num``."""
    params: dict[str, Any] = {"max_new_tokens": max_new_tokens, "temperature": temperature,
                              "stream_interval": max_new_tokens + 1, "skip_special_tokens": True}
    if seed is not None:
        params["sampling_seed"] = int(seed)
    if custom_params:
        params["custom_params"] = custom_params
    body: dict[str, Any] = {"text": text, "sampling_params": params, "stream": True, "return_logprob": True,
                            "top_logprobs_num": top_logprobs_num}
    if token_ids_logprob:
        body["token_ids_logprob"] = list(token_ids_logprob)
    return body


def generate_timed(backend, body: dict[str, Any], routing_key: str | None = None) -> TimedOutput:
    """Send the streamed ``body`` through ``backend`` (an ``RkscEndpoint`` or
    ``RkscEngineEndpoint``), count its tokens and time it (module docstring)."""
    if not body.get("stream"):
        raise ValueError("generate_timed times a streamed request: the body needs stream=True")
    start = time.perf_counter()
    first, last = None, None
    for event in backend._send_stream(body, routing_key):
        if first is None:
            first = time.perf_counter()
        last = event
    end = time.perf_counter()
    if last is None:
        raise RuntimeError("generate_timed: the stream ended without an output")
    backend._count([last["meta_info"]])
    return TimedOutput(last["text"], last["meta_info"], first - start, end - start)
