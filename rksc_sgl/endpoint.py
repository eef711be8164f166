"""``RkscEndpoint``: the frontend-language backend of a server's URL (``RkscEngineEndpoint``, in
``rksc_sgl.engine_endpoint``, is the same backend for an in-process engine).

SGLang's frontend (``@sgl.function``, ``fork``, ``gen``, ``select``) ships ``RuntimeEndpoint``, which
posts JSON to a server. Both of ours are such endpoints (hence the names; the engine one only swaps
the transport). They differ from SGLang's in these ways:

* per-branch request options (``rksc_sgl.program_state.branch_options``): a sampling seed, and
  the fields our runtime reads, which ``sgl.gen`` has no parameter for;
* every response's token counters are totalled (``rksc_sgl.counters.TokenCounters``), which the
  benchmark reads;
* every request of one program (its root state and all its forks) carries the program's routing
  key (``rksc_sgl.program_state``) in sglang-router's ``X-SMG-Routing-Key`` header;
* ``fork()`` sends the shared prefix before the branches, as SGLang intends
  (``rksc_sgl.program_state.install_fork_prefix_fix``);
* ``prefill`` commits a text as a prefill-only request, which ``paraphrase_fork`` and
  ``share_chunks`` (``rksc_sgl.primitives``) use to declare ASKS substitution groups;
* a program's image (``sgl.image``) is sent as SGLang's endpoint sends it, to a model that reads
  images, and refused otherwise (SGLang itself drops it without a word);
* ``flush_cache`` (and ``flush_server`` for any server URL, which the router cluster uses) waits
  for the scheduler to go idle and raises when the cache was not flushed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from typing import Any

import requests

from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint
from sglang.lang.chat_template import get_chat_template, get_chat_template_by_model_path
from sglang.lang.global_config import global_config
from sglang.utils import http_request

from rksc_sgl.counters import TokenCounters
from rksc_sgl.program_state import OPTIONS_ATTR, ROUTING_KEY_HEADER, install_fork_prefix_fix, program_key
from rksc_sgl.protocol import KV_POOL_KEY

FLUSH_TIMEOUT_S = 60.0  # how long a flush waits for the requests still in the scheduler
_LOGPROB_FIELDS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")


def flush_server(base_url: str, timeout_s: float = FLUSH_TIMEOUT_S, post=requests.post) -> None:
    """Empty the radix cache of the server at ``base_url`` once its scheduler is idle (SGLang's
    ``/flush_cache?timeout=``); raises ``RuntimeError`` with the server's reason if it was not."""
    res = post(base_url + "/flush_cache", params={"timeout": timeout_s}, timeout=timeout_s + 30)
    if res.status_code != 200:
        raise RuntimeError(f"flush_cache failed on {base_url}: {res.text.strip()}")


def chat_template_for(model_path: str):
    """SGLang's frontend matches templates by path name; fall back to the model's own tokenizer."""
    template = get_chat_template_by_model_path(model_path)
    if template.name != "default":
        return template
    # transformers 5 writes the template to chat_template.jinja, older versions into the config.
    sources = []
    jinja_file = os.path.join(model_path, "chat_template.jinja")
    if os.path.exists(jinja_file):
        with open(jinja_file) as f:
            sources.append(f.read())
    config_file = os.path.join(model_path, "tokenizer_config.json")
    if os.path.exists(config_file):
        with open(config_file) as f:
            sources.append(str(json.load(f).get("chat_template", "")))
    if any("<|im_start|>" in text for text in sources):
        return get_chat_template("chatml")
    return template


class RkscEndpoint(RuntimeEndpoint):
    """``RuntimeEndpoint`` plus branch options and token counters, for a server at ``base_url``."""

    def __init__(self, base_url: str, chat_template_name: str | None = None, **kwargs: Any):
        install_fork_prefix_fix()
        super().__init__(base_url, chat_template_name=chat_template_name, **kwargs)
        if not chat_template_name:
            self.chat_template = chat_template_for(self.model_info["model_path"])
        self._init_counters()

    def _init_counters(self) -> None:
        self.counters = TokenCounters()
        self._counter_lock = threading.Lock()

    def reset_counters(self) -> TokenCounters:
        """Return the totals so far and start new ones."""
        with self._counter_lock:
            totals, self.counters = self.counters, TokenCounters()
        return totals

    def counters_snapshot(self) -> TokenCounters:
        """The totals so far, leaving them running (a phase's tokens are the difference of two)."""
        with self._counter_lock:
            return dataclasses.replace(self.counters)

    def _post_generate(self, data: dict[str, Any], routing_key: str | None, stream: bool = False):
        """POST ``data`` to ``/generate``, with the program's routing key as a header if given.
        (SGLang's ``http_request`` takes no headers; ``requests`` honours ``verify`` as it does.)"""
        headers = {} if routing_key is None else {ROUTING_KEY_HEADER: routing_key}
        res = self._http_post(self.base_url + "/generate", json=data, headers=headers, stream=stream)
        self._assert_success(res)
        return res

    def _http_post(self, url: str, headers: dict[str, str] | None = None, **kwargs: Any) -> requests.Response:
        """``requests.post`` with the endpoint's API key and TLS ``verify`` setting."""
        headers = dict(headers or {})
        if self.api_key is not None:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return requests.post(url, headers=headers, verify=True if self.verify is None else self.verify,
                             **kwargs)

    def _send(self, data: dict[str, Any], routing_key: str | None = None):
        """The response to the ``/generate`` body ``data`` (a list for a batch)."""
        return self._post_generate(data, routing_key).json()

    def _send_stream(self, data: dict[str, Any], routing_key: str | None = None):
        """Each event of the streamed response to ``data``: the text so far and its ``meta_info``."""
        with self._post_generate(data, routing_key, stream=True) as res:
            for line in res.iter_lines():
                if not line.startswith(b"data:"):
                    continue
                if line == b"data: [DONE]":
                    return
                event = json.loads(line[len(b"data:"):])
                if "error" in event:  # SGLang reports a failure inside the stream, after the 200
                    raise RuntimeError(event["error"])
                yield event

    def _add_images(self, s, data: dict[str, Any]) -> None:
        """Send the program's image as SGLang's ``RuntimeEndpoint`` does, to a model that reads
        images; refuse it otherwise, since SGLang drops the images a text-only model is sent."""
        if s is None or not s.images_:
            return
        if not self.model_info.get("has_image_understanding"):
            raise ValueError(f"the served model {self.model_info['model_path']} does not read images "
                             "(has_image_understanding is false); remove the program's sgl.image")
        if len(s.images_) != 1:
            raise ValueError(f"a program can send one image (sgl.image), this one has {len(s.images_)}")
        data["image_data"] = s.images_[0][1]

    def flush_cache(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Empty the radix cache, waiting up to ``timeout_s`` for the scheduler to go idle.

        SGLang refuses a flush while its last batch still holds a request that just finished (the
        client has its answer one scheduler step before the batch is filtered), so an immediate
        flush after a program can fail; its ``timeout`` defers the flush until idle instead. Raises
        ``RuntimeError`` with the server's reason if the cache was not flushed.
        """
        flush_server(self.base_url, timeout_s, post=self._http_post)

    def kv_pool(self) -> dict[str, int]:
        """The scheduler's KV pool accounting in tokens (see ``radix_ext.ops.introspection``)."""
        return self.get_server_info()["internal_states"][0][KV_POOL_KEY]

    def token_ids(self, text: str) -> list[int]:
        """``text``'s token ids, no special tokens added (the server's ``/tokenize``)."""
        return post_json(self, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]

    def _count(self, meta_infos) -> None:
        with self._counter_lock:
            for meta_info in meta_infos:
                self.counters.add(meta_info)

    def _generate_http_request(self, s, data: dict[str, Any]):
        self._add_images(s, data)
        result = self._send(data, program_key(s))
        self._count(item["meta_info"] for item in (result if isinstance(result, list) else [result]))
        return result

    def _generate_body(self, s, sampling_params) -> dict[str, Any]:
        """SGLang's ``RuntimeEndpoint.generate`` body plus the state's branch options."""
        self._handle_dtype_to_regex(sampling_params)
        data: dict[str, Any] = {
            "text": s.text_,
            "sampling_params": {
                "skip_special_tokens": global_config.skip_special_tokens_in_output,
                "spaces_between_special_tokens": global_config.spaces_between_special_tokens_in_out,
                **sampling_params.to_srt_kwargs(),
                **getattr(s, OPTIONS_ATTR, {}),
            },
        }
        for item in _LOGPROB_FIELDS:
            value = getattr(sampling_params, item, None)
            if value is not None:
                data[item] = value
        return data

    def generate(self, s, sampling_params):
        obj = self._generate_http_request(s, self._generate_body(s, sampling_params))
        return obj["text"], obj["meta_info"]

    def generate_stream(self, s, sampling_params):
        """Yield (new text, meta_info) as the runtime produces them (``gen(..., stream=True)`` or
        ``run(stream=True)``), as SGLang's ``RuntimeEndpoint`` does; counted once, when done."""
        data = {**self._generate_body(s, sampling_params), "stream": True}
        self._add_images(s, data)
        done, meta_info = 0, None
        for event in self._send_stream(data, program_key(s)):  # each event has the whole text so far
            meta_info = event["meta_info"]
            yield event["text"][done:], meta_info
            done = len(event["text"])
        if meta_info is not None:
            self._count([meta_info])

    def commit_lazy_operations(self, s):
        self._generate_http_request(s, {"text": s.text_, "sampling_params": {"max_new_tokens": 0}})

    def fill_image(self, s):  # as SGLang's: a prefill of the state with its image
        self.commit_lazy_operations(s)

    def cache_prefix(self, prefix_str: str):
        self._generate_http_request(None, {"text": prefix_str, "sampling_params": {"max_new_tokens": 0}})

    def prefill(self, text: str, custom_params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Commit ``text`` to the radix cache (a prefill-only request) and return its ``meta_info``:
        how a program commits a shared head or an ASKS span before the prompts that contain it."""
        params: dict[str, Any] = {"max_new_tokens": 0}
        if custom_params:
            params["custom_params"] = custom_params
        return self._generate_http_request(None, {"text": text, "sampling_params": params})["meta_info"]


def post_json(endpoint: RuntimeEndpoint, route: str, body: dict[str, Any]):
    """POST ``body`` to ``route`` of ``endpoint``'s server with its API key and TLS setting; the JSON answer."""
    res = http_request(endpoint.base_url + route, json=body, api_key=endpoint.api_key, verify=endpoint.verify)
    endpoint._assert_success(res)
    return res.json()
