"""Frontend-language backends: ``RkscEndpoint`` (a server's URL) and ``RkscEngineEndpoint`` (an
in-process engine).

SGLang's frontend (``@sgl.function``, ``fork``, ``gen``, ``select``) ships ``RuntimeEndpoint``, which
posts JSON to a server. Both of ours are such endpoints (hence the names; the engine one only swaps
the transport). They differ from SGLang's in these ways:

* per-branch request options (``branch_options``): a sampling seed, and later the fields our
  runtime reads, which ``sgl.gen`` has no parameter for;
* every response's token counters are totalled (``TokenCounters``), which the benchmark reads;
* every request of one program (its root state and all its forks) carries the program's routing
  key in sglang-router's ``X-SMG-Routing-Key`` header, so a router started with its ``manual``
  policy (``rksc_sgl.launch_router``'s default) sends a program's forks to the worker that holds
  their shared prefix; a single server ignores the header;
* ``fork()`` sends the shared prefix before the branches, as SGLang intends: its
  ``StreamExecutor.fork`` reads ``text_`` before the executor thread has appended the pending
  expressions, so on a fresh state the prefix request was often skipped and sibling branches
  prefilled the prompt separately (``install_fork_prefix_fix``);
* ``paraphrase_fork`` forks a program into branches that open with different wordings of one
  instruction, commits their spans and declares them one ASKS substitution group;
* a program's image (``sgl.image``) is sent as SGLang's endpoint sends it, to a model that reads
  images, and refused otherwise (SGLang itself drops it without a word);
* ``RkscEngineEndpoint`` replaces the HTTP transport with ``Engine.async_generate(**body)`` on the
  engine's own event loop, run in one background thread so the fork threads can share it; a
  stream (``stream=True``) is pulled from the engine's async generator one output at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import os
import threading
import uuid
from typing import Any

import requests

from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint
from sglang.lang.chat_template import get_chat_template, get_chat_template_by_model_path
from sglang.lang.global_config import global_config
from sglang.utils import http_request

from rksc_sgl.protocol import ASKS_KEY, KV_POOL_KEY, AsksOptions, BranchTag

_OPTIONS_ATTR = "_rksc_options"
_PROGRAM_ATTR = "_rksc_program_key"
# sglang-router's header for sticky routing (its ``manual`` policy pins each key to one worker).
ROUTING_KEY_HEADER = "X-SMG-Routing-Key"
FLUSH_TIMEOUT_S = 60.0  # how long a flush waits for the requests still in the scheduler
_LOGPROB_FIELDS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")


@dataclasses.dataclass
class TokenCounters:
    """Totals over every request a backend sent (zero-token prefix requests included)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    blended_tokens: int = 0  # prompt tokens whose KV ASKS blend took from a donor, not recomputed

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens whose KV had to be computed (not served from the radix cache or a blend donor)."""
        return self.prompt_tokens - self.cached_tokens - self.blended_tokens

    def add(self, meta_info: dict[str, Any]) -> None:
        self.requests += 1
        self.prompt_tokens += meta_info.get("prompt_tokens", 0)
        self.cached_tokens += meta_info.get("cached_tokens", 0)
        self.completion_tokens += meta_info.get("completion_tokens", 0)
        asks = (meta_info.get(ASKS_KEY) or [None])[0]
        if isinstance(asks, dict) and asks.get("mode") == "blend":
            self.blended_tokens += asks.get("reused_tokens", 0)

    def __add__(self, other: "TokenCounters") -> "TokenCounters":
        return TokenCounters(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))

    def __sub__(self, other: "TokenCounters") -> "TokenCounters":
        return TokenCounters(*(getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self)))


def branch_options(state, *, sampling_seed: int | None = None, depth: int | None = None,
                   score: float | None = None) -> None:
    """Attach options to every later ``gen`` of one program state (typically a fork).

    ``sampling_seed`` makes sampling reproducible whatever the batching and the cache state
    (our runtime's seeded sampler, ``radix_ext.sampling.sampler``; stock SGLang honours it only with
    ``--enable-deterministic-inference``, which its CPU path cannot run). ``depth`` is the
    branch's fork level
    (0 for the program's root, 1 for its forks, ...): RSBCM eviction reads it, and
    ``report_score`` sends it with the branch's score. ``score`` (with a depth) scores the
    branch from its first gen on: ``score=0.0`` marks scratch work the program will not extend,
    such as a verifier exchange, which RSBCM then evicts first (see ``rksc_sgl.scores``).
    """
    executor = getattr(state, "stream_executor", state)
    options = dict(getattr(executor, _OPTIONS_ATTR, {}))
    if sampling_seed is not None:
        options["sampling_seed"] = int(sampling_seed)
    if depth is not None or score is not None:
        custom_params = options.get("custom_params")
        current = BranchTag.from_custom_params(custom_params)
        if depth is None and current is None:
            raise ValueError("branch_options: a score needs the branch's depth")
        tag = BranchTag(depth=current.depth if depth is None else depth,
                        score=current.score if score is None and current else score)
        options["custom_params"] = tag.to_custom_params(custom_params)
    setattr(executor, _OPTIONS_ATTR, options)


def branch_tag(state) -> BranchTag | None:
    """The ``BranchTag`` set on ``state`` with ``branch_options``, if any."""
    executor = getattr(state, "stream_executor", state)
    return BranchTag.from_custom_params(getattr(executor, _OPTIONS_ATTR, {}).get("custom_params"))


def paraphrase_fork(s, openers, tail: Any = "", *, group: str | None = None):
    """Fork ``s`` into one branch per opener: branch ``i`` continues with ``openers[i]`` then
    ``tail`` (a string or SGLang expression, the same for every branch), and the openers are
    declared wordings that may stand in for one another (ASKS, ``docs/asks.md``).

    Before it returns, it commits, as prefill-only requests of substitution group ``group``: each
    distinct opener's span (``s``'s text + opener), then branch 0's full prompt. So every span has
    a signature before any prompt containing it, and a later branch's gen (which carries the group
    too) may adopt branch 0's wording and reuse the KV of its whole prompt. Only spans of
    ``group`` are ever considered: ``group`` defaults to the program's routing key (a random id,
    one per program); pass one id to several programs of yours to let them share spans, never a
    name another client could guess. Returns the forks (SGLang's ``ProgramStateGroup``).
    """
    openers = _texts("paraphrase_fork", "openers", openers)
    backend, group = _grouped_backend("paraphrase_fork", s, group)
    params = AsksOptions(group=group).to_custom_params()
    forks = s.fork(len(openers))
    head = s.text()
    for opener in dict.fromkeys(openers):
        backend.prefill(head + opener, custom_params=params)
    for fork, opener in zip(forks, openers):
        fork += opener
        fork += tail
        add_custom_params(fork, params)
    backend.prefill(forks[0].text(), custom_params=params)
    return forks


def share_chunks(s, chunks, *, group: str | None = None) -> str:
    """Declare ``chunks`` (documents, exemplar blocks: strings) reusable by later requests of
    substitution group ``group`` that contain them after ``s``'s text, in any order and at any
    position (ASKS blend, ``docs/asks.md``): commits, as prefill-only requests of the group,
    ``s``'s text (the anchor every chunk hangs below), then ``s``'s text + each chunk. A later
    request of the group (``add_custom_params(state, AsksOptions(group=...).to_custom_params())``)
    reuses each chunk's KV, re-rotated to where the chunk sits in it, recomputing a selected
    share. Returns the group (default: the program's routing key)."""
    chunks = _texts("share_chunks", "chunks", chunks)
    backend, group = _grouped_backend("share_chunks", s, group)
    params = AsksOptions(group=group).to_custom_params()
    head = s.text()
    backend.prefill(head, custom_params=params)
    for chunk in dict.fromkeys(chunks):
        backend.prefill(head + chunk, custom_params=params)
    return group


def _texts(primitive: str, name: str, texts) -> list[str]:
    texts = list(texts)
    if not texts or not all(isinstance(t, str) and t for t in texts):
        raise ValueError(f"{primitive}: {name} must be a non-empty list of non-empty strings, got {texts!r}")
    return texts


def _grouped_backend(primitive: str, s, group: str | None) -> tuple["RkscEndpoint", str]:
    """The program's rksc-sgl backend and its substitution group (default: the routing key)."""
    executor = s.stream_executor
    if not isinstance(executor.backend, RkscEndpoint):
        raise TypeError(f"{primitive} needs an rksc-sgl backend (RkscEndpoint or RkscEngineEndpoint), "
                        f"got {type(executor.backend).__name__}")
    return executor.backend, program_key(executor) if group is None else group


def add_custom_params(state, entries: dict[str, Any]) -> None:
    """Merge ``entries`` into the ``custom_params`` every later gen of one program state (or its
    executor) sends, beside what ``branch_options`` set."""
    executor = getattr(state, "stream_executor", state)
    options = dict(getattr(executor, _OPTIONS_ATTR, {}))
    options["custom_params"] = {**(options.get("custom_params") or {}), **entries}
    setattr(executor, _OPTIONS_ATTR, options)


def program_key(executor) -> str | None:
    """The routing key of the program ``executor`` belongs to: made on its root state's first
    request or fork, inherited by every fork (``install_fork_prefix_fix``)."""
    if executor is None:
        return None
    key = getattr(executor, _PROGRAM_ATTR, None)
    if key is None:
        key = uuid.uuid4().hex
        setattr(executor, _PROGRAM_ATTR, key)
    return key


def install_fork_prefix_fix() -> None:
    """Make ``StreamExecutor.fork`` drain its queue before deciding whether to commit the prefix,
    and hand the program's routing key to the forks."""
    from sglang.lang.interpreter import StreamExecutor

    original = StreamExecutor.fork
    if getattr(original, "_rksc_fixed", False):
        return
    from rksc_sgl import seams

    seams.check({"frontend backends": seams.CLIENT["frontend backends"]})  # once, before patching

    def fork(self, size: int = 1, position_ids_offset=None):
        key = program_key(self)  # before the prefix commit, which is sent with it
        if size > 1:
            self.sync()  # text_ is written by the executor thread; wait until it is current
        forks = original(self, size, position_ids_offset)
        for child in forks:
            setattr(child, _PROGRAM_ATTR, key)
        return forks

    fork._rksc_fixed = True
    StreamExecutor.fork = fork


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
        return _post(self, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]

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
                **getattr(s, _OPTIONS_ATTR, {}),
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


class RkscEngineEndpoint(RkscEndpoint):
    """``sgl.set_default_backend(RkscEngineEndpoint(engine))`` runs frontend programs in-process."""

    def __init__(self, engine, chat_template_name: str | None = None, timeout_s: float | None = 1800.0):
        # RuntimeEndpoint.__init__ would query a server over HTTP; set its fields directly.
        install_fork_prefix_fix()
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self.support_concate_and_append = False
        self.engine = engine
        self.model_info = {  # the fields of the server's /model_info that we read
            "model_path": engine.server_args.model_path,
            "has_image_understanding": engine.tokenizer_manager.model_config.is_image_understandable_model,
        }
        self.chat_template = (
            get_chat_template(chat_template_name) if chat_template_name
            else chat_template_for(self.model_info["model_path"])
        )
        self._init_counters()
        self._loop: asyncio.AbstractEventLoop = engine.loop
        self._thread = threading.Thread(target=self._loop.run_forever, name="rksc-engine-loop", daemon=True)
        self._thread.start()

    def run(self, coro, timeout_s: float | None = None):
        """Run a coroutine on the engine's event loop from any thread and return its result.

        Waits at most ``timeout_s`` (default: the backend's ``timeout_s``; None waits forever),
        then cancels the coroutine and raises ``TimeoutError``, so a stuck request cannot hang a
        program (or a test) for ever.
        """
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"RkscEngineEndpoint: no result after {timeout_s} s (timeout_s)") \
                from None

    def _send(self, data: dict[str, Any], routing_key: str | None = None):  # one engine: no routing
        return self.run(self.engine.async_generate(**_engine_body(data)))

    def _send_stream(self, data: dict[str, Any], routing_key: str | None = None):
        """The engine's streamed outputs, each pulled from its async generator on the loop."""
        events = self.run(self.engine.async_generate(**_engine_body(data)))  # stream=True: a generator
        try:
            while (event := self.run(_next_or_none(events))) is not None:
                yield event
        finally:  # also when the consumer stops early
            self.run(events.aclose())

    def token_ids(self, text: str) -> list[int]:
        return list(self.engine.tokenizer_manager.tokenizer.encode(text, add_special_tokens=False))

    def flush_cache(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        result = self.run(self.engine.tokenizer_manager.flush_cache(timeout_s=timeout_s), timeout_s + 30)
        if not result.success:
            raise RuntimeError(f"flush_cache failed: {result.message or 'the scheduler was not idle'}")

    def get_server_info(self):
        states = self.run(self.engine.tokenizer_manager.get_internal_state())
        return {**self.model_info, "internal_states": states}

    def shutdown(self):
        """Stop the loop thread, then the engine (which cancels its tasks on the stopped loop)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self.engine.shutdown()


def _engine_body(data: dict[str, Any]) -> dict[str, Any]:
    """A ``/generate`` body as ``Engine.async_generate`` keywords (it calls the text ``prompt``)."""
    body = dict(data)
    body["prompt"] = body.pop("text", None)
    return body


async def _next_or_none(events):
    try:
        return await events.__anext__()
    except StopAsyncIteration:
        return None


# What rksc-sgl's primitives (report_score, verify) send goes through these two, so that they work
# through any backend that speaks SGLang's HTTP API, SGLang's own RuntimeEndpoint included.


def send_generate(backend, data: dict[str, Any], state=None):
    """Send the ``/generate`` body ``data`` through ``backend``; the response (a list for a batch).

    Ours add the routing key of ``state``'s program (if given) and count the tokens. SGLang's
    plain ``RuntimeEndpoint`` has ``data`` posted to its server directly: its
    ``_generate_http_request`` reads the images of a program state, which these requests lack.
    """
    if isinstance(backend, RkscEndpoint):
        return backend._generate_http_request(state, data)
    return _post(_require_endpoint(backend), "/generate", data)


def token_ids(backend, text: str) -> list[int]:
    """``text``'s token ids in ``backend``'s vocabulary, no special tokens added."""
    if isinstance(backend, RkscEndpoint):
        return backend.token_ids(text)
    return _post(_require_endpoint(backend), "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]


def _require_endpoint(backend) -> RuntimeEndpoint:
    if not isinstance(backend, RuntimeEndpoint):
        raise TypeError(
            "rksc-sgl's primitives send SGLang /generate requests, so they need an RkscEndpoint, an "
            f"RkscEngineEndpoint or SGLang's RuntimeEndpoint as the program's backend, not {type(backend).__name__}")
    return backend


def _post(endpoint: RuntimeEndpoint, route: str, body: dict[str, Any]):
    res = http_request(endpoint.base_url + route, json=body, api_key=endpoint.api_key, verify=endpoint.verify)
    endpoint._assert_success(res)
    return res.json()
