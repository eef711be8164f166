"""Program primitives that send requests of their own: ``paraphrase_fork`` and ``share_chunks``
(ASKS: spans and chunks committed as one substitution group), and ``send_generate`` and
``token_ids``, how ``report_score`` and ``verify`` reach the runtime through any backend.
"""

from __future__ import annotations

from typing import Any

from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

from rksc_sgl.endpoint import RkscEndpoint, post_json
from rksc_sgl.program_state import add_custom_params, program_key
from rksc_sgl.protocol import AsksOptions


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
    return post_json(_require_endpoint(backend), "/generate", data)


def token_ids(backend, text: str) -> list[int]:
    """``text``'s token ids in ``backend``'s vocabulary, no special tokens added."""
    if isinstance(backend, RkscEndpoint):
        return backend.token_ids(text)
    return post_json(_require_endpoint(backend), "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]


def _require_endpoint(backend) -> RuntimeEndpoint:
    if not isinstance(backend, RuntimeEndpoint):
        raise TypeError(
            "rksc-sgl's primitives send SGLang /generate requests, so they need an RkscEndpoint, an "
            f"RkscEngineEndpoint or SGLang's RuntimeEndpoint as the program's backend, not {type(backend).__name__}")
    return backend
