"""ASKS blend: a request keeps every word, and reuses the KV its group computed after another opening.

A request of substitution group ``g`` (``custom_params["rksc_asks"]["group"]``) that leaves the
cached path at its own opening finds, at its prefill, the runs of its later tokens that ``g``
computed after another opening (``radix_ext.asks.segments``). For each run:

* **what is copied** (``radix_ext.asks.kv_writes.write_donor_kv``): V as is; K re-rotated by the position difference
  (``radix_ext.asks.selection.rerotate``; models whose rotary table is not a pure rotation are
  refused).
* **what is recomputed** (``radix_ext.asks.selection.select``): a share ``r`` of the reused
  tokens (``--asks-recompute``, per request ``AsksOptions.recompute``), chosen by deviation at an
  early layer or by position in the run, plus, by deviation, every token whose KV there stands
  further from the donor's than ``--asks-max-deviation`` (the gate). The request's last
  ``fresh_tail`` tokens (the question, the assistant header) are always computed.

``blend_forward`` (an AROUND hook on the model's forward) runs the first layers for every token
when the selector needs them (the last of them only as far as its K and V and queries,
``radix_ext.asks.kv_writes``: the attention and MLP of a row whose KV is then the donor's would be
thrown away), then carries only the kept rows: the others' KV is the donor's,
written into the request's own slots, and each kept row attends to its whole row of the KV pool
up to its own position (``radix_ext.asks.kept_rows``: in one C++ call of the remaining layers,
from the check's queries, where the model's decode runs so, else SGLang's layers over a
``BlendView``).

At ``r = 1``, or where every reused token is recomputed, every row is kept and runs those same
layers, whose rows' numbers do not depend on the rows beside them: the request's tokens and KV
are exactly exact's. Below 1, the request's KV from its first reused token on is approximate,
so it never enters the tree: ``RkscRadixCache.checkpoint`` inserts only the tokens before it
(``EXACT_LEN_ATTR``: the cached prefix, the opening, the leading tokens computed in full, whose
rows are the same bits as in a full forward, since every row depends only on the rows before it),
so a long-lived opening is cached for later requests. When it finishes, the rest of its row
(approximate prompt tokens and its output) is kept as a donor for its own group alone, which no
prefix match ever reaches (``radix_ext.asks.private``; ``--no-asks-blended-donors`` frees it).
Every blended request reports what it reused and recomputed (``meta_info["rksc_asks"]``, ``radix_ext.asks.decision``) and the counters feed
``/metrics``.

A batch that also carries a CGEE verification row, a chunked prefill, a model or attention backend
this does not cover, or page size > 1: the request computes every token (``outcome`` says why).
How batches are built around members (members first, long full prefills beside them held out
once, a member not chunked only because it came second): ``radix_ext.asks.batching``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any

import torch

from radix_ext.asks import segments as tree
from radix_ext.asks.segments import OPTIONS_ATTR, Segment, find_segments
from radix_ext.asks.kept_rows import kept_layers, layer_stack, view_of
from radix_ext.asks.kv_writes import write_check_kv, write_donor_kv
from radix_ext.asks.selection import deviations, pure_rotation, rerotate, select
from radix_ext.model_stack import TARGETS, plain_call, plain_stack
from rksc_sgl.config import RkscConfig
from rksc_sgl.protocol import AsksOptions

logger = logging.getLogger(__name__)

# On a Req: its ASKS decision, a BlendDecision here or radix_ext.asks's Decision (which reports both).
DECISION_ATTR = "rksc_asks_decision"
# On a blended Req: how many of its first tokens hold exact KV (the rest of its row is approximate or
# computed after it, and never enters the tree: ``RkscRadixCache.checkpoint`` inserts only these).
EXACT_LEN_ATTR = "rksc_blend_exact_len"


@dataclasses.dataclass
class BlendDecision:
    """What blend did to one request (its ``meta_info["rksc_asks"]`` entry)."""

    outcome: str  # blended | no-donor | full:<why> | skipped:<why>
    recompute: float
    selector: str
    prompt_tokens: int = 0
    segments: int = 0
    reused_tokens: int = 0  # KV taken from a donor and not recomputed
    recomputed_tokens: int = 0  # covered by a donor, recomputed anyway (selected)
    deviating_tokens: int = 0  # of the covered, those past the gate (--asks-max-deviation)
    max_deviation: float = math.inf  # the gate this request's selection applied (inf: none)
    exact_tokens: int | None = None  # its first tokens whose KV is exact (they enter the tree); None: all
    counted: bool = False

    adopted = False  # the adopt-mode interface of radix_ext.asks._report
    span_start = None

    def report(self) -> dict[str, Any]:
        return {"mode": "blend", "outcome": self.outcome, "recompute": self.recompute, "select": self.selector,
                "prompt_tokens": self.prompt_tokens, "segments": self.segments,
                "reused_tokens": self.reused_tokens, "recomputed_tokens": self.recomputed_tokens,
                "max_deviation": self.max_deviation if math.isfinite(self.max_deviation) else None,
                "deviating_tokens": self.deviating_tokens, "exact_tokens": self.exact_tokens}


@dataclasses.dataclass
class BlendCounters:
    requests: int = 0
    blended: int = 0
    no_donor: int = 0
    full: int = 0  # had donors, computed every token (unsupported batch or model)
    reused_tokens: int = 0
    recomputed_tokens: int = 0
    seconds: float = 0.0  # scheduler time spent planning and copying KV
    kept_requests: int = 0  # finished blended requests whose approximate tail stayed (radix_ext.asks.private)
    kept_tokens: int = 0

    def count(self, decision: BlendDecision) -> None:
        self.requests += 1
        if decision.outcome == "blended":
            self.blended += 1
        elif decision.outcome == "no-donor":
            self.no_donor += 1
        else:
            self.full += 1
        self.reused_tokens += decision.reused_tokens
        self.recomputed_tokens += decision.recomputed_tokens


@dataclasses.dataclass(frozen=True)
class BlendSettings:
    recompute: float
    selector: str
    fresh_tail: int
    max_deviation: float = math.inf  # the gate; inf: the share alone
    check_layers: int = RkscConfig.asks_check_layers  # selector "deviation": the check's layers
    blended_donors: bool = RkscConfig.asks_blended_donors  # a finished blended request's tail: private donor


# ---- the forward ---------------------------------------------------------------------------

@dataclasses.dataclass
class RowPlan:
    req: Any
    row: int  # batch row
    offset: int  # its first flat token in the batch
    prefix_len: int  # x: its first computed position
    extend_len: int
    segments: list[Segment]
    decision: BlendDecision

    def reused_rows(self) -> torch.Tensor:
        """[reused] flat batch indices of the segments' tokens, in segment order."""
        return torch.cat([torch.arange(s.length) + self.offset + s.start - self.prefix_len for s in self.segments])

    def reused_deltas(self) -> torch.Tensor:
        return torch.cat([torch.full((s.length,), s.delta, dtype=torch.int64) for s in self.segments])

    def donor_slots(self) -> torch.Tensor:
        return torch.cat([s.donor_slots for s in self.segments])


def plan_batch(forward_batch, state) -> list[RowPlan]:
    """The rows of an EXTEND batch that blend, with their segments (read-only on the tree)."""
    if not tree.members:
        return []
    cache = state.cache
    plans, offset = [], 0
    for row, (rid, prefix_len, extend_len) in enumerate(zip(
            forward_batch.rids, forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu)):
        req = tree.members.pop(rid, None)
        if req is not None:
            plan = _plan_row(req, row, offset, prefix_len, extend_len, cache, state)
            if plan is not None:
                plans.append(plan)
        offset += extend_len
    return plans


def _plan_row(req, row, offset, prefix_len, extend_len, cache, state) -> RowPlan | None:
    from sglang.srt.mem_cache.radix_cache import RadixKey

    options: AsksOptions = getattr(req, OPTIONS_ATTR)
    settings: BlendSettings = state.blend
    recompute = _recompute(options, state)
    ids = req.origin_input_ids
    decision = BlendDecision("no-donor", recompute, settings.selector, prompt_tokens=len(ids))
    setattr(req, DECISION_ATTR, decision)
    if prefix_len + extend_len != len(ids) or req.output_ids:
        decision.outcome = "skipped:chunked"  # its prefill spans several forwards: no plan
    elif cache.page_size != 1:
        decision.outcome = "skipped:page-size"
    if decision.outcome != "no-donor":
        state.blend_counters.count(decision)
        return None
    key = RadixKey(token_ids=ids, extra_key=req.extra_key, cache_salt=req.cache_salt)
    segments = find_segments(state.index, key, prefix_len, len(ids) - settings.fresh_tail, options.group)
    if not segments:
        state.blend_counters.count(decision)
        return None
    decision.segments = len(segments)
    return RowPlan(req, row, offset, prefix_len, extend_len, segments, decision)


def _supported(model, forward_batch, extra_args, kwargs) -> str | None:
    """Why this batch cannot be reduced (None: it can)."""
    from radix_ext.cgee import requests as exit_requests
    from radix_ext.cpu.attention import RkscCpuAttnBackend

    from sglang.srt.model_executor.forward_context import get_attn_backend

    stack = model.model
    backend = get_attn_backend()
    if not isinstance(backend, RkscCpuAttnBackend) or backend.use_sliding_window_kv_pool:
        return "attention-backend"
    if exit_requests.any_flagged() and any(p is not None for p in exit_requests.rows_of(forward_batch.rids)):
        return "verification-batch"
    if not plain_call(extra_args, kwargs) or plain_stack(model) is not None:
        return "model"
    if getattr(forward_batch, "return_logprob", False) and any(
            start < length for start, length in zip(forward_batch.extend_logprob_start_lens_cpu or (),
                                                    forward_batch.extend_seq_lens_cpu)):
        return "input-logprobs"
    rotary = getattr(stack.layers[stack.start_layer].self_attn, "rotary_emb", None)
    if rotary is None or not pure_rotation(rotary):
        return "rotary"
    return None


def around_forward(original, model, input_ids, positions, forward_batch, *args, **kwargs):
    """The AROUND hook on the model's forward: blend the batch's planned rows, else SGLang's."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    state = _live[0] if _live else None
    if (state is None or not tree.members or forward_batch.forward_mode != ForwardMode.EXTEND
            or not forward_batch.rids):
        return original(model, input_ids, positions, forward_batch, *args, **kwargs)
    started = time.perf_counter()
    plans = plan_batch(forward_batch, state)
    why = _supported(model, forward_batch, args, kwargs) if plans else None
    if why is not None:
        for plan in plans:
            plan.decision.outcome = f"full:{why}"
            state.blend_counters.count(plan.decision)
        plans = []
    state.blend_counters.seconds += time.perf_counter() - started
    if not plans:
        return original(model, input_ids, positions, forward_batch, *args, **kwargs)
    return blend_forward(model, input_ids, positions, forward_batch, plans, state)


@torch.no_grad()
def blend_forward(model, input_ids, positions, forward_batch, plans: list[RowPlan], state):
    """``LlamaModel.forward`` + ``LlamaForCausalLM.forward`` (sglang 0.5.23; Qwen2's the same but
    for ``skip_empty``) whose layers after the selection carry only the kept rows."""
    from sglang.srt.layers.layer_boundary.residual import batch as residual_batch
    from sglang.srt.model_executor.forward_context import get_attn_backend

    stack = model.model
    layers = list(range(stack.start_layer, stack.end_layer))
    selector = state.blend.selector
    # The check layers run for every token only where a share strictly between 0 and 1 is chosen
    # by deviation: at 0 nothing is recomputed, at 1 everything is. All but the last run whole;
    # the last only as far as its K and V, which the selection compares with the donor's.
    checked = selector == "deviation" and any(0 < p.decision.recompute < 1 for p in plans)
    full_layers = min(state.blend.check_layers, len(layers)) if checked else 0
    resume = max(full_layers - 1, 0)  # the first layer the rest of the forward runs whole
    hidden = stack.embed_tokens(input_ids)
    residual_batch.start(forward_batch)
    for i in layers[:resume]:
        hidden = stack.layers[i](positions, hidden, forward_batch)
    started = time.perf_counter()
    pool = get_attn_backend().token_to_kv_pool
    reused = [(plan, plan.reused_rows(), plan.donor_slots(), plan.reused_deltas()) for plan in plans]
    checked_state = first_q = None  # the stream's full state entering the last check layer, its queries
    kept_stack = layer_stack(model)  # the kept rows' layers: one C++ call (from the check's queries), or why not
    # The last check layer's K and V, for every row that may take its donors' KV from the next layer
    # on (the check compares those of plans with a share strictly between 0 and 1); in one call every
    # row's, and the kept rows continue from its queries.
    if full_layers:
        checked_state, check_layer = residual_batch.snapshot(hidden, forward_batch), stack.layers[layers[resume]]
        if not isinstance(kept_stack, str):
            first_q = write_check_kv(check_layer, positions, checked_state, forward_batch.out_cache_loc, pool)
        else:
            covered = torch.cat([rows for _, rows, _, _ in reused])
            write_check_kv(check_layer, positions[covered], checked_state[covered],
                           forward_batch.out_cache_loc[covered], pool)
    num_tokens = int(input_ids.shape[0])
    keep = torch.ones(num_tokens, dtype=torch.bool)
    skipped_rows, skipped_donors, skipped_deltas = [], [], []
    for plan, rows, donors, deltas in reused:
        scores = relative = None
        if full_layers and 0 < plan.decision.recompute < 1:
            check = stack.layers[layers[resume]].self_attn
            keys, values = pool.get_key_buffer(check.attn.layer_id), pool.get_value_buffer(check.attn.layer_id)
            own = forward_batch.out_cache_loc[rows].long()
            scores, relative = deviations(keys[own], values[own], rerotate(keys[donors], deltas, check.rotary_emb),
                                          values[donors])
            plan.decision.max_deviation = _max_deviation(getattr(plan.req, OPTIONS_ATTR), state)  # only here
            plan.decision.deviating_tokens = int((relative > plan.decision.max_deviation).sum())
        chosen = select(plan.segments, plan.decision.recompute, selector, scores,
                        relative=relative, max_deviation=plan.decision.max_deviation)
        plan.decision.outcome = "blended"
        plan.decision.recomputed_tokens = int(chosen.sum())
        plan.decision.reused_tokens = int((~chosen).sum())
        keep[rows[~chosen]] = False
        skipped_rows.append(rows[~chosen])
        skipped_donors.append(donors[~chosen])
        skipped_deltas.append(deltas[~chosen])
        if plan.decision.reused_tokens:  # approximate KV never enters the tree; what precedes it may
            exact = plan.prefix_len + int(rows[~chosen].min()) - plan.offset
            plan.decision.exact_tokens = exact
            setattr(plan.req, EXACT_LEN_ATTR, exact)
        state.blend_counters.count(plan.decision)
    rows = torch.cat(skipped_rows)  # none when everything is recomputed: the kept rows are all, exact
    if rows.numel():
        write_donor_kv(pool, stack, layers[full_layers:], forward_batch.out_cache_loc[rows].long(),
                       torch.cat(skipped_donors), torch.cat(skipped_deltas))
    kept = keep.nonzero().squeeze(1)
    view = view_of(forward_batch, keep, kept, positions)
    state.blend_counters.seconds += time.perf_counter() - started
    if full_layers:  # the full state so far, restarted as the input of the kept rows
        hidden = checked_state
        residual_batch.clear(forward_batch)
        residual_batch.start(forward_batch)
    hidden = kept_layers(model, kept_stack, hidden[kept], positions[kept], forward_batch, view, resume,
                         None if first_q is None else first_q[kept])
    full = hidden.new_zeros(num_tokens, hidden.shape[1])
    full[kept] = hidden  # the rows the logits processor reads (each request's last) are kept
    return model.logits_processor(input_ids, full, model.lm_head, forward_batch)


_live: list[Any] = []  # the scheduler's AsksState (set by radix_ext.asks.AsksState)


def _recompute(options: AsksOptions, state) -> float:
    return state.blend.recompute if options.recompute is None else float(options.recompute)


def _max_deviation(options: AsksOptions, state) -> float:
    """The request's gate (``custom_params["rksc_asks"]["max_deviation"]``), else the server's."""
    return state.blend.max_deviation if options.max_deviation is None else float(options.max_deviation)


def install() -> None:
    from radix_ext import hooks

    for target in TARGETS:
        hooks.around(target, around_forward)
