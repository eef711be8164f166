"""Branch depth and score for RSBCM eviction: the program-side primitive (``report_score``).

The wire format, ``BranchTag``, is in ``rksc_sgl.protocol``.

RSBCM (``radix_ext.eviction.policy``) needs two facts per branch that only the program knows: its fork
level and, once generated or verified, its score. Both travel in SGLang's free-form
``sampling_params.custom_params``, which reaches the scheduler's ``Req`` unchanged over HTTP
(``/generate``) and in-process (``Engine.async_generate``) with no server flag:

* every ``gen`` of a branch carries ``{"rksc": {"depth": d}}`` (set once per fork with
  ``branch_options(state, depth=d)``); the cache tags the tree nodes that this gen computed;
* ``report_score(state, s)`` sends a zero-token request (``max_new_tokens=0``) whose text is the
  branch's full text and whose custom_params are ``{"rksc": {"depth": d, "score": s}}``. It matches
  the branch's whole path in the tree, so the cache sets ``s`` on the nodes of that path at fork
  level >= d (the branch's own tokens, not the prefix it shares with its parent). While the tree
  holds the path, the report computes nothing new except the branch's last token (SGLang always
  recomputes one) and any text the tree lacks after re-tokenisation. Its cost: if the branch was
  evicted before the report arrives, the report prefills it again (send reports promptly);
* a gen may carry a score from the start (``branch_options(state, depth=d, score=0.0)``): its
  own tokens are scored as they enter the tree, which is how a program marks scratch work
  (verifier forks, read-once answers) that it will never extend.

Over HTTP the same fields go in the ``/generate`` body's ``sampling_params.custom_params``; a
malformed entry is refused with a 400 naming the field (check installed by ``radix_ext.plugin``).
"""

from __future__ import annotations

from rksc_sgl.primitives import send_generate
from rksc_sgl.program_state import branch_tag
from rksc_sgl.protocol import BranchTag


def branch_depth(state) -> int | None:
    """The depth set on ``state`` with ``branch_options(state, depth=...)``, if any."""
    tag = branch_tag(state)
    return None if tag is None else tag.depth


def report_score(state, score: float, *, depth: int | None = None) -> None:
    """Tell the runtime's cache that the branch ``state`` scored ``score`` (in [0, 1]).

    Call it after the branch's text is generated (it waits for pending gens). ``depth`` defaults
    to the one set with ``branch_options``; a branch without either raises ValueError. Works with
    any SGLang frontend backend that speaks ``/generate`` (``RkscEndpoint``, ``RkscEngineEndpoint``,
    SGLang's ``RuntimeEndpoint``; another raises TypeError); the scores take effect under
    ``--radix-eviction-policy rsbcm`` and are harmless otherwise. Through ours the report carries
    the program's routing key, so a router sends it to the worker that holds the branch.
    """
    if depth is None:
        depth = branch_depth(state)
    if depth is None:
        raise ValueError("report_score needs the branch's depth: call branch_options(state, depth=...) first")
    tag = BranchTag(depth=depth, score=score)
    executor = getattr(state, "stream_executor", state)
    text = executor.text()  # syncs: the branch's gens are done and in the tree
    body = {"text": text, "sampling_params": {"max_new_tokens": 0, "custom_params": tag.to_custom_params()}}
    send_generate(executor.backend, body, executor)
