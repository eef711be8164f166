"""ASKS signatures captured while a span is prefilled (installed by ``radix_ext.asks.decision``).

A *span* is what a prefill-only request (``max_new_tokens = 0``, as a program's span commit or
``fork`` prefix) computes itself: its tokens after the cached prefix it found, in one prefill
chunk. For such a request (registered here by rid when it is created), a BEFORE hook on the
model's forward (the ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` entries of
``radix_ext.cgee.forward.TARGETS``) puts a capture plan on the EXTEND ``ForwardBatch``: the rows
of the batch's flat token dimension that are each request's span. PyTorch forward hooks on the
probed decoder layers (registered once per model) then read the layer's full hidden state
(``residual_batch.snapshot``: output plus residual stream, no side effect) and pool it over
each span's rows (the gate's ``pooling``: their mean, or the last row). Nothing is read or written for batches without a plan, and the model's
computation is never changed. ``radix_ext.eviction.backend`` moves the finished signature onto the tree
node that ends at the span's end at the request's checkpoint. Only commits that carry a
substitution group are registered (``radix_ext.asks.decision``), and the signature records that group.

A chunked span (its prefill split over several forwards) gets no signature: a mean over its last
chunk would not describe it. Neither does a commit that computes fewer than ``MIN_SPAN_TOKENS``
(re-committing a cached span recomputes only its last token).
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import torch

from radix_ext.asks.gate import Signature

PLAN_ATTR = "rksc_asks_plan"  # on a ForwardBatch: list[_Pending]
PENDING_ATTR = "rksc_asks_pending"  # on a Req: its _Pending until checkpoint
GROUP_ATTR = "rksc_asks_group"  # on a registered Req: the substitution group its signature gets
HOOKED_ATTR = "_rksc_asks_hooked"  # on a model: its layer hooks are registered
# A commit of a span that is already cached computes only its last token: that is no span.
MIN_SPAN_TOKENS = 2

CAPTURE_SECONDS = [0.0]  # time spent pooling signatures in this process (read by radix_ext.eviction.stats)
# rid -> Req of every live prefill-only request whose span is to be captured.
_capturing: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()


class _Pending:
    """A span's per-layer means, filled layer by layer during one forward."""

    def __init__(self, req, offset: int, start: int, length: int, layers: tuple[int, ...],
                 group: str | None = None, pooling: str = "mean"):
        self.req, self.offset, self.start, self.length = req, offset, start, length
        self.layers, self.group, self.pooling = layers, group, pooling
        self.vectors: list[torch.Tensor | None] = [None] * len(layers)

    def signature(self) -> Signature | None:
        if any(v is None for v in self.vectors):
            return None  # a forward that stopped early (never for captured batches) or failed
        return Signature(torch.stack(self.vectors).half(), self.layers, self.start, self.length, self.group)


def register(req, group: str) -> None:
    """Capture ``req``'s span for substitution group ``group`` (set on its signature)."""
    setattr(req, GROUP_ATTR, group)
    _capturing[req.rid] = req


def take_signature(req) -> Signature | None:
    """The request's finished signature, once (the first checkpoint after its prefill)."""
    pending = getattr(req, PENDING_ATTR, None)
    if pending is None:
        return None
    setattr(req, PENDING_ATTR, None)
    return pending.signature()


def plan(forward_batch, layers: tuple[int, ...], pooling: str = "mean") -> list[_Pending]:
    """The span rows of an EXTEND batch (empty for any other batch)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    if not _capturing or forward_batch.forward_mode != ForwardMode.EXTEND or not forward_batch.rids:
        return []
    pending, offset = [], 0
    for rid, prefix_len, length in zip(forward_batch.rids, forward_batch.extend_prefix_lens_cpu,
                                       forward_batch.extend_seq_lens_cpu):
        req = _capturing.pop(rid, None)
        whole_span = req is not None and req.extend_end == len(req.full_untruncated_fill_ids) \
            and prefix_len == req.cached_tokens  # one chunk, starting where the cache hit ended
        if whole_span and length >= MIN_SPAN_TOKENS:
            item = _Pending(req, offset, prefix_len, length, layers, getattr(req, GROUP_ATTR), pooling)
            setattr(req, PENDING_ATTR, item)
            pending.append(item)
        offset += length
    return pending


def before_forward(settings_of):
    """The BEFORE hook on a model's forward: plan the batch's captures, hook the layers once.
    ``settings_of(model)``: the probed layers (empty: capture nothing) and the pooling."""

    def hook(model, input_ids, positions, forward_batch, *args, **kwargs):
        if not _capturing:
            return None
        layers, pooling = settings_of(model)
        items = plan(forward_batch, layers, pooling) if layers else []
        if items:
            if not getattr(model, HOOKED_ATTR, False):
                _hook_layers(model, layers)
            setattr(forward_batch, PLAN_ATTR, items)
        return None

    return hook


def _hook_layers(model, layers: tuple[int, ...]) -> None:
    stack = model.model
    for slot, layer in enumerate(layers):
        index = stack.start_layer + layer - 1
        stack.layers[index].register_forward_hook(_pool_hook(slot))
    setattr(model, HOOKED_ATTR, True)


def _pool_hook(slot: int):
    @torch.no_grad()
    def hook(module, args, output):
        forward_batch = args[2] if len(args) > 2 else None
        items = getattr(forward_batch, PLAN_ATTR, None)
        if not items:
            return None
        from sglang.srt.layers.layer_boundary.residual import batch as residual_batch

        started = time.perf_counter()
        state = residual_batch.snapshot(output, forward_batch)  # [tokens, hidden], a copy
        for item in items:
            span = state[item.offset: item.offset + item.length]
            pooled = span[-1].float() if item.pooling == "last" else span.float().mean(dim=0)
            item.vectors[slot] = pooled.cpu()
        CAPTURE_SECONDS[0] += time.perf_counter() - started
        return None

    return hook
