"""ASKS in the scheduler: a request adopts a cached sibling span that means the same as its own.

Exact KV only. When the gate passes, the request's prompt becomes ``ids[:s] + donor_span +
ids[e:]`` and SGLang's own prefix matching then reuses the donor span's KV and whatever of the
request's tail is cached below it. Attention and positions stay exact; what changes is the
wording the branch conditions on, so every decision is reported (``meta_info["rksc_asks"]``)
and counted (``cache_stats``).

**The trust boundary** (``docs/asks.md``): a request adopts only from its own substitution group,
the ``group`` of its ``custom_params["rksc_asks"]`` (``rksc_sgl.protocol.AsksOptions``), which a
program's span-commit primitive declares (``rksc_sgl.primitives.paraphrase_fork``). Only a span
commit that carries a group is signed, its signature records the group, and a request considers
only the signed spans of its own group, its own spans and donors alike. A request without a group
is never rewritten (``skipped:no-group``); SGLang's own ``fork()`` prefix commits carry none.

The decision runs once per request, when the scheduler creates it (an AFTER hook on
``Scheduler._create_generation_req``, before any prefix matching), and only reads the tree (no
splits, locks or access-time updates):

1. walk the request's tokens down the tree; the fully matched nodes carrying a signature
   (``radix_ext.asks.capture``) of the request's group are its own spans, deepest first, each
   with tokens after it;
2. donors of a span [s, e) (``s``: where its commit left the cached prefix): other nodes signed
   for the same group below position ``s`` of the path (so they share ``ids[:s]``), outside the
   span's own subtree, ending at most ``max(MIN_REACH, SPAN_REACH * (e - s))`` tokens after
   ``s``, whose subtree continues with the request's ``ids[e:]`` for at least
   ``asks_min_tail`` tokens; a donor replaces ``ids[s:e]`` with its path's tokens from ``s`` to
   its end;
3. the gate (``radix_ext.asks.gate``) on the own and each donor signature; the passing donor with
   the highest sigma is adopted.

Skipped (kept as sent, reported with the reason): requests without a group, requests that opt out
(``custom_params["rksc_asks"] = {"enabled": false}``), ask for input log-probabilities, carry
embeddings, multimodal inputs, embedding overrides or token types, belong to a session, or are
CGEE verification requests. A donor evicted between this decision and the request's admission
costs reuse, never correctness: the request then computes the donor's wording itself, and
``reused_tokens`` reports what was really served from the cache (``cached_tokens - s``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from array import array
from typing import Any

from radix_ext.asks import batching as asks_batching, blend as asks_blend, capture as asks_capture
from radix_ext.asks import segments as asks_segments
from radix_ext.asks.gate import Gate, Signature, adopts
from radix_ext.cgee import requests as exit_requests
from rksc_sgl.protocol import ASKS_KEY, AsksOptions

logger = logging.getLogger(__name__)

SIG_ATTR = "rksc_asks_signature"  # on a TreeNode: the Signature of the span ending at its end
DECISION_ATTR = asks_blend.DECISION_ATTR  # on a Req: its Decision (or blend's BlendDecision)
# Donor spans are searched this far below the span start: SPAN_REACH times the own span's length,
# at least MIN_REACH tokens (a donor far longer than the span is no paraphrase of it, and the
# bound keeps the walk out of the long prompts below the spans).
SPAN_REACH, MIN_REACH = 4, 64
CREATE_REQ = exit_requests.CREATE_REQ
ACCEPT_TARGET = ("sglang.srt.managers.scheduler_components.output_streamer."
                 "_GenerationStreamAccumulator.accept")
REQUEST_LEVEL_TARGET = ("sglang.srt.managers.scheduler_components.output_streamer."
                        "SchedulerOutputStreamer.is_request_level_customized_info_key")


@dataclasses.dataclass
class Decision:
    outcome: str  # adopted | gate | no-donor | no-span | skipped:<why>
    tau: float
    sigma: float | None = None  # the best candidate's (adopted or not)
    span_start: int | None = None
    own_length: int | None = None
    donor_length: int | None = None
    candidates: int = 0
    reused_tokens: int = 0  # filled when the request reports: KV served from the donor's side
    counted: bool = False  # reported (and its reused tokens counted)

    @property
    def adopted(self) -> bool:
        return self.outcome == "adopted"

    def report(self) -> dict[str, Any]:
        return {"adopted": self.adopted, "outcome": self.outcome, "sigma": self.sigma, "tau": self.tau,
                "span_start": self.span_start, "own_length": self.own_length,
                "donor_length": self.donor_length, "candidates": self.candidates,
                "reused_tokens": self.reused_tokens}


@dataclasses.dataclass
class Counters:
    requests: int = 0
    adopted: int = 0
    rejected_by_gate: int = 0
    no_donor: int = 0
    no_span: int = 0
    skipped: int = 0
    reused_tokens: int = 0
    signatures: int = 0
    signature_bytes: int = 0
    signatures_over_cap: int = 0
    decision_seconds: float = 0.0  # scheduler time spent deciding (the gate's overhead)

    def count(self, decision: Decision) -> None:
        self.requests += 1
        field = {"adopted": "adopted", "gate": "rejected_by_gate", "no-donor": "no_donor",
                 "no-span": "no_span"}.get(decision.outcome, "skipped")
        setattr(self, field, getattr(self, field) + 1)


# ---- read-only tree walks -------------------------------------------------------------------

def _key(ids, extra_key=None, cache_salt=None):
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(token_ids=ids if isinstance(ids, array) else array("q", ids), extra_key=extra_key,
                    cache_salt=cache_salt)


def matched_path(root, key, page_size: int = 1) -> list[tuple[Any, int, int]]:
    """(node, start, end) of every node fully matched by ``key`` from the root, top down."""
    path, node, pos = [], root, 0
    while pos + page_size <= len(key):
        child = node.children.get(key.child_key_at(pos, page_size))
        if child is None or child.key.match_at(key, pos, page_size) < len(child.key):
            break
        path.append((child, pos, pos + len(child.key)))
        node, pos = child, pos + len(child.key)
    return path


def matched_below(node, key, pos: int, page_size: int = 1, enough: int | None = None) -> int:
    """How many tokens of ``key[pos:]`` continue below ``node`` (partial last node included)."""
    matched = 0
    while pos + page_size <= len(key) and (enough is None or matched < enough):
        child = node.children.get(key.child_key_at(pos, page_size))
        if child is None:
            break
        m = child.key.match_at(key, pos, page_size)
        matched, pos, node = matched + m, pos + m, child
        if m < len(child.key):
            break
    return matched


def signed_for(node, group: str) -> Signature | None:
    """The node's signature if a commit of ``group`` left it, else None (another group's span is
    neither an own span nor a donor: the trust boundary)."""
    signature = getattr(node, SIG_ATTR, None)
    return signature if signature is not None and signature.group == group else None


def donors(root, path: list[tuple[Any, int, int]], own, start: int, reach: int,
           group: str) -> list[tuple[Any, list[int]]]:
    """Nodes signed for ``group`` below position ``start`` of the request's path (so sharing ``ids[:start]``),
    outside ``own``'s subtree and ending at most ``reach`` tokens after ``start``, each with its
    path's tokens from ``start`` to its end (what would replace the own span)."""
    roots: list[tuple[Any, int]] = [(c, 0) for c in root.children.values()] if start == 0 else []
    for node, a, b in path:
        if b == start:
            roots = [(c, b) for c in node.children.values()]
        elif a < start < b:
            roots = [(node, a)]
    found, stack = [], [(node, a, []) for node, a in roots]
    while stack:
        node, a, tokens = stack.pop()
        if node is own:
            continue
        b = a + len(node.key)
        if b - start > reach:
            continue
        tokens = tokens + list(node.key.token_ids[max(0, start - a): len(node.key)])
        if b > start and signed_for(node, group) is not None:
            found.append((node, tokens))
        if b - start < reach:
            stack.extend((child, b, tokens) for child in node.children.values())
    return found


def decide(cache, ids, gate: Gate, min_tail: int, *, group: str, extra_key=None,
           cache_salt=None) -> tuple[Decision, list[int] | None]:
    """The decision for a request of substitution group ``group`` with token ids ``ids``, and its
    new ids if it adopts."""
    key = _key(ids, extra_key, cache_salt)
    page = cache.page_size
    path = matched_path(cache.root_node, key, page)
    spans = [(node, a, b) for node, a, b in path if signed_for(node, group) is not None
             and len(key) - b >= min_tail]
    if not spans:
        return Decision("no-span", gate.tau), None
    best: Decision | None = None
    for node, _a, end in reversed(spans):
        own: Signature = signed_for(node, group)
        s = own.start
        reach = max(MIN_REACH, SPAN_REACH * (end - s))
        candidates = [(d, toks) for d, toks in donors(cache.root_node, path, node, s, reach, group)
                      if matched_below(d, key, end, page, enough=min_tail) >= min_tail]
        if not candidates:
            continue
        scored = sorted(((gate.sigma(own, signed_for(d, group)), toks) for d, toks in candidates),
                        key=lambda x: -x[0] if x[0] == x[0] else float("inf"))
        sigma, toks = scored[0]
        decision = Decision("adopted" if adopts(sigma, gate.tau) else "gate", gate.tau, sigma=sigma,
                            span_start=s, own_length=end - s, donor_length=len(toks),
                            candidates=len(candidates))
        if decision.adopted:
            return decision, list(ids[:s]) + toks + list(ids[end:])
        best = best or decision
    return best or Decision("no-donor", gate.tau), None


# ---- scheduler hooks ------------------------------------------------------------------------

def _skip_reason(req, recv_req, options: AsksOptions | None) -> str | None:
    if options is None:
        return "bad-options"
    if not options.enabled:
        return "opted-out"
    if options.group is None:
        return "no-group"  # the trust boundary: no group, no substitution (and no signature)
    if recv_req.return_logprob and getattr(recv_req, "logprob_start_len", -1) != -1:
        return "input-logprobs"  # (-1: output log-probabilities only, which a rewrite keeps valid)
    for attr, why in (("input_embeds", "embeddings"), ("positional_embed_overrides", "embed-overrides"),
                      ("token_type_ids", "token-types"), ("session", "session"),
                      ("multi_item_delimiter_indices", "multi-item")):
        if getattr(req, attr, None) is not None:
            return why
    if getattr(recv_req, "mm_inputs", None) is not None or getattr(recv_req, "session_params", None) is not None:
        return "multimodal-or-session"
    if exit_requests.params_of(req) is not None:
        return "verification"
    return None


def _on_create(req, scheduler, recv_req, *args, **kwargs):
    cache = scheduler.tree_cache  # ASKS's state is on our cache (RkscRadixCache.asks); stock caches have none
    if getattr(cache, "asks", None) is None or cache.disable:
        return None
    started = time.perf_counter()
    try:
        _decide_on_create(req, scheduler, recv_req, cache)
    finally:
        cache.asks.counters.decision_seconds += time.perf_counter() - started
    return None


def _decide_on_create(req, scheduler, recv_req, cache) -> None:
    state = cache.asks
    try:
        options = AsksOptions.from_custom_params(getattr(req.sampling_params, "custom_params", None))
    except ValueError:
        options = None
    reason = _skip_reason(req, recv_req, options)
    if state.mode == "blend":
        _register_blend(req, options, reason, state)
        return
    if reason is None and req.sampling_params.max_new_tokens == 0:
        asks_capture.register(req, options.group)  # a span commit: its prefill leaves a signature
    if state.gate.tau >= 1.0:
        return  # tau = 1: stock SGLang exactly (no decision, no report)
    if reason is not None:
        decision, new_ids = Decision(f"skipped:{reason}", state.gate.tau), None
    else:
        try:
            decision, new_ids = decide(cache, req.origin_input_ids, state.gate, state.min_tail,
                                       group=options.group, extra_key=req.extra_key,
                                       cache_salt=req.cache_salt)
        except Exception:  # never fail the scheduler on a decision: keep the prompt as sent
            logger.exception("ASKS decision failed for request %s; prompt kept", req.rid)
            decision, new_ids = Decision("skipped:error", state.gate.tau), None
        context = getattr(scheduler.model_config, "context_len", None)
        if new_ids is not None and context and len(new_ids) + req.sampling_params.max_new_tokens > context:
            decision, new_ids = dataclasses.replace(decision, outcome="skipped:too-long"), None
    if new_ids is not None:
        aliased = req.origin_input_ids_unpadded is req.origin_input_ids
        req.origin_input_ids = array("q", new_ids)
        if aliased:
            req.origin_input_ids_unpadded = req.origin_input_ids
    state.counters.count(decision)
    setattr(req, DECISION_ATTR, decision)


def _register_blend(req, options: AsksOptions | None, reason: str | None, state: "AsksState") -> None:
    """Blend mode: a prefill-only commit of a group computes its text exactly, for the group; a
    generating member may blend at its prefill (``radix_ext.asks.blend``); a member that cannot says why."""
    if reason is None and req.sampling_params.max_new_tokens == 0:
        asks_segments.register_commit(req, options.group)
    elif reason is None:
        asks_segments.register_member(req, options)
    elif reason not in ("no-group", "opted-out", "bad-options"):
        decision = asks_blend.BlendDecision(f"skipped:{reason}", state.blend.recompute, state.blend.selector,
                                            prompt_tokens=len(req.origin_input_ids))
        state.blend_counters.count(decision)
        setattr(req, asks_blend.DECISION_ATTR, decision)


def _report(accumulator, *args, req=None, **kwargs):
    """BEFORE the output accumulator takes a request: its decision into ``customized_info``, once,
    when SGLang emits request-level keys (a streamed request's first chunk, else at its finish),
    so decoding steps in between pay one attribute check."""
    decision = getattr(req, DECISION_ATTR, None)
    if decision is None or decision.counted or not (req.stream or req.finished()):
        return None
    decision.counted = True
    if decision.adopted:
        decision.reused_tokens = max(0, req.cached_tokens - decision.span_start)
        if _live_state:
            _live_state[0].counters.reused_tokens += decision.reused_tokens
    if req.customized_info is None:
        req.customized_info = {}
    req.customized_info[ASKS_KEY] = [decision.report()]
    return None


_live_state: list[Any] = []  # the scheduler's AsksState (one per scheduler process)


def _request_level(result, streamer, key, *args, **kwargs):
    return True if key == ASKS_KEY else result


@dataclasses.dataclass
class AsksState:
    """What ASKS keeps per scheduler (on ``RkscRadixCache.asks``): the mode, adopt's gate and
    counters, blend's settings, counters and content index (each group's exact text, by window)."""

    gate: Gate
    min_tail: int
    cap_bytes: int
    counters: Counters = dataclasses.field(default_factory=Counters)
    mode: str = "adopt"
    blend: asks_blend.BlendSettings | None = None
    blend_counters: asks_blend.BlendCounters = dataclasses.field(default_factory=asks_blend.BlendCounters)
    index: asks_segments.ContentIndex = dataclasses.field(default_factory=asks_segments.ContentIndex)
    cache: Any = None  # the RkscRadixCache holding this state (set by it)

    def __post_init__(self) -> None:
        _live_state[:] = [self]
        asks_blend._live[:] = [self]


def install() -> None:
    """Hooks of the scheduler process (``radix_ext.plugin`` calls this when ``asks`` is on)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from radix_ext.model_stack import TARGETS

    HookRegistry.register(CREATE_REQ, _on_create, HookType.AFTER)
    HookRegistry.register(ACCEPT_TARGET, _report, HookType.BEFORE)
    HookRegistry.register(REQUEST_LEVEL_TARGET, _request_level, HookType.AFTER)
    for target in TARGETS:
        HookRegistry.register(target, asks_capture.before_forward(_capture_settings), HookType.BEFORE)
    asks_blend.install()
    asks_batching.install()


def _capture_settings(model) -> tuple[tuple[int, ...], str]:
    gate = _live_state[0].gate if _live_state else None
    return (gate.layers, gate.pooling) if gate else ((), "mean")
