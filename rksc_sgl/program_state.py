"""What rksc-sgl keeps on a program's state (SGLang's ``StreamExecutor``): the request options of
each branch, which ``sgl.gen`` has no parameter for, and the program's routing key.

* ``branch_options`` and ``add_custom_params`` set what every later ``gen`` of one state sends
  (a sampling seed; ``custom_params``: the branch tag, ASKS's group, ...); the backends
  (``rksc_sgl.endpoint``) put them into each ``/generate`` body;
* every request of one program (its root state and all its forks) carries the program's routing
  key (``program_key``) in sglang-router's ``X-SMG-Routing-Key`` header, so a router started with
  its ``manual`` policy (``rksc_sgl.launch_router``'s default) sends a program's forks to the
  worker that holds their shared prefix; a single server ignores the header;
* ``fork()`` sends the shared prefix before the branches, as SGLang intends: its
  ``StreamExecutor.fork`` reads ``text_`` before the executor thread has appended the pending
  expressions, so on a fresh state the prefix request was often skipped and sibling branches
  prefilled the prompt separately (``install_fork_prefix_fix``, which also hands the routing key
  to the forks).
"""

from __future__ import annotations

import uuid
from typing import Any

from rksc_sgl.protocol import ROUTING_KEY_HEADER, BranchTag  # noqa: F401 (the header: the backends import it here)

OPTIONS_ATTR = "_rksc_options"  # on a StreamExecutor: what its gens add to the request
PROGRAM_ATTR = "_rksc_program_key"  # on a StreamExecutor: its program's routing key


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
    options = dict(getattr(executor, OPTIONS_ATTR, {}))
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
    setattr(executor, OPTIONS_ATTR, options)


def branch_tag(state) -> BranchTag | None:
    """The ``BranchTag`` set on ``state`` with ``branch_options``, if any."""
    executor = getattr(state, "stream_executor", state)
    return BranchTag.from_custom_params(getattr(executor, OPTIONS_ATTR, {}).get("custom_params"))


def add_custom_params(state, entries: dict[str, Any]) -> None:
    """Merge ``entries`` into the ``custom_params`` every later gen of one program state (or its
    executor) sends, beside what ``branch_options`` set."""
    executor = getattr(state, "stream_executor", state)
    options = dict(getattr(executor, OPTIONS_ATTR, {}))
    options["custom_params"] = {**(options.get("custom_params") or {}), **entries}
    setattr(executor, OPTIONS_ATTR, options)


def program_key(executor) -> str | None:
    """The routing key of the program ``executor`` belongs to: made on its root state's first
    request or fork, inherited by every fork (``install_fork_prefix_fix``)."""
    if executor is None:
        return None
    key = getattr(executor, PROGRAM_ATTR, None)
    if key is None:
        key = uuid.uuid4().hex
        setattr(executor, PROGRAM_ATTR, key)
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
            setattr(child, PROGRAM_ATTR, key)
        return forks

    fork._rksc_fixed = True
    StreamExecutor.fork = fork
