"""Attention backend ``rksc_cpu``: SGLang's ``torch_native`` with one attention call per layer for
the whole batch, whose every row is computed the same way whatever is batched or cached around it.

**Invariant attention** (the default where ``radix_ext.cpu.kernels`` builds: x86 with AVX-512 VNNI
and a C++ compiler). Decode, extend and ASKS blend's kept rows all go through
``kernels.causal_attention``: one call per layer, each query row attending to its request's keys
up to its own position, straight from the KV pool through SGLang's ``req_to_token`` (no gathered
copies). A row's sums run in an order fixed by its position alone, so its output is the same bits
whether the row is a fresh prompt's, sits behind a cached prefix, is decoded alone or beside
other requests. With the int8 linears, which are row-invariant too, a token's whole forward pass
then is: modes that differ only in what they cache or batch (stock prefix caching, no cache, our
cache policies) compute the same numbers, and a benchmark's comparison between them stays exact.
SDPA's CPU flash kernel blocks keys and queries by the sequence's length, which
moves a row by float rounding (~1e-7), enough for int8's input rounding to flip a sampled token
(``tests/integration/test_invariance.py``). ``RKSC_CPU_INVARIANT_ATTENTION=0`` keeps SDPA (below).

**SDPA** (``RKSC_CPU_INVARIANT_ATTENTION=0``, or where the kernels cannot build). Stock
``torch_native`` decodes request by request: per request and per layer it gathers the keys and
values with advanced indexing and calls SDPA once. Here the KV slots of the whole batch are looked
up once per step (``DecodeSlots``, padded to the longest request), and each layer does two
``index_select`` gathers and one SDPA call over ``[batch, heads, 1, head_dim]`` with a padding
mask. Extend keeps stock's per-request loop but queries only the request's new tokens when they
are at most half of it (``extend_attention``). Padding columns get probability exactly 0, so
outputs agree with stock up to float summation order (~1e-7), and exactly for one request, for
equal-length batches, for the prefill of a fresh prompt and for an extend longer than its cached
prefix.

Any layer kind neither covers (cross attention, sliding windows, encoder lengths, SWA pools, a KV
cache not in float32) stays with the parent. ``create_backend`` also applies the CPU speed settings
of ``radix_ext.cpu.speed``: packed linears, and the thread policy, once per forward.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import torch
import torch.nn.functional as F
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from radix_ext.cpu import kernels

BACKEND_NAME = "rksc_cpu"
INVARIANT_ENV = "RKSC_CPU_INVARIANT_ATTENTION"  # "0": SDPA (an ablation); "1": refuse to start without the kernel
BLEND_VIEW_ATTR = "rksc_blend_view"  # on a ForwardBatch reduced by radix_ext.asks_blend: its BlendView
logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DecodeSlots:
    """KV-pool slots of one decode batch, padded to its longest request.

    ``flat``: [batch * max_len] int64, the slot of position ``j`` of request ``i`` at
    ``i * max_len + j``; padding repeats the request's first slot, so gathered padding is always
    finite (a stale or never-written slot could hold NaN, and 0 * NaN poisons the output).
    ``mask``: [batch, 1, 1, max_len] bool, True on real positions; None when all lengths are equal.
    """

    flat: torch.Tensor
    mask: torch.Tensor | None
    batch_size: int
    max_len: int

    @classmethod
    def build(
        cls, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
    ) -> "DecodeSlots":
        """``req_to_token``: [max_reqs, max_context] int32; ``req_pool_indices``, ``seq_lens``: [batch]."""
        batch_size = int(seq_lens.shape[0])
        max_len = int(seq_lens.max())
        slots = req_to_token[req_pool_indices.long(), :max_len].long()  # [batch, max_len]
        mask = None
        if int(seq_lens.min()) != max_len:
            real = torch.arange(max_len, device=slots.device)[None, :] < seq_lens[:, None]
            slots = torch.where(real, slots, slots[:, :1])
            mask = real[:, None, None, :]
        return cls(slots.reshape(-1), mask, batch_size, max_len)


def invariant_attention() -> bool:
    """Whether ``rksc_cpu`` attends with ``kernels.causal_attention``: where the kernels build,
    unless ``RKSC_CPU_INVARIANT_ATTENTION=0``. A value other than 0 or 1, or 1 where the kernels
    cannot build, stops start-up naming the variable."""
    raw = os.environ.get(INVARIANT_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{INVARIANT_ENV} must be 0 or 1, got {raw!r}")
    if raw == "0":
        return False
    why = kernels.unsupported()
    if why and raw == "1":
        raise ValueError(f"{INVARIANT_ENV}=1: {why}")
    return why is None


@dataclasses.dataclass(frozen=True)
class QueryRows:
    """Which request and position each query row of a forward has: ``kernels.causal_attention``'s
    plan. ``req_rows`` [B] int64: each request's row of ``req_to_token``; ``offsets`` [B + 1] int64:
    request ``b``'s query rows are ``offsets[b]:offsets[b + 1]``; ``positions`` [T] int64: each
    row sees its request's positions ``0..positions[t]``."""

    req_rows: torch.Tensor
    offsets: torch.Tensor
    positions: torch.Tensor

    @classmethod
    def of(cls, req_pool_indices: torch.Tensor, counts, positions: torch.Tensor) -> "QueryRows":
        offsets = torch.zeros(len(counts) + 1, dtype=torch.int64)
        offsets[1:] = torch.as_tensor(counts, dtype=torch.int64).cumsum(0)
        return cls(req_pool_indices.to(torch.int64).contiguous(), offsets, positions.to(torch.int64).contiguous())

    @classmethod
    def decode(cls, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> "QueryRows":
        """One row per request, at its last position."""
        return cls.of(req_pool_indices, [1] * int(seq_lens.shape[0]), seq_lens - 1)

    @classmethod
    def extend(cls, req_pool_indices: torch.Tensor, seq_lens: list[int], extend_lens: list[int]) -> "QueryRows":
        """Each request's ``extend_len`` new tokens, at the last positions of its ``seq_len``."""
        positions = torch.cat([torch.arange(n - e, n) for n, e in zip(seq_lens, extend_lens)]) if seq_lens \
            else torch.zeros(0, dtype=torch.int64)
        return cls.of(req_pool_indices, extend_lens, positions)


def batched_decode_attention(
    query: torch.Tensor,  # [batch, q_heads, head_dim]
    k_buffer: torch.Tensor,  # [pool_slots, kv_heads, head_dim]
    v_buffer: torch.Tensor,  # [pool_slots, kv_heads, v_head_dim]
    slots: DecodeSlots,
    scale: float | None = None,
) -> torch.Tensor:  # [batch, q_heads, v_head_dim]
    """Single-token attention of every request of a batch over its own cached keys, in one call."""
    shape = (slots.batch_size, slots.max_len)
    keys = k_buffer.index_select(0, slots.flat).view(*shape, *k_buffer.shape[1:]).transpose(1, 2)
    values = v_buffer.index_select(0, slots.flat).view(*shape, *v_buffer.shape[1:]).transpose(1, 2)
    if keys.dtype != query.dtype:  # e.g. an fp8 KV cache: SDPA wants one dtype
        keys, values = keys.to(query.dtype), values.to(query.dtype)
    out = F.scaled_dot_product_attention(
        query.unsqueeze(2), keys, values, attn_mask=slots.mask, scale=scale,
        enable_gqa=query.shape[1] != keys.shape[1],
    )
    return out.squeeze(2)


def extend_attention(
    query: torch.Tensor,  # [q_heads, extend_len, head_dim]
    keys: torch.Tensor,  # [kv_heads, seq_len, head_dim], the cached prefix then the new tokens
    values: torch.Tensor,  # [kv_heads, seq_len, v_head_dim]
    scale: float | None = None,
) -> torch.Tensor:  # [q_heads, extend_len, v_head_dim]
    """Causal attention of one request's new tokens; new token ``i`` sits at position
    ``seq_len - extend_len + i`` and sees the keys up to and including its own.

    Behind a cached prefix, the new tokens' rows of the causal mask are a bottom-right band that
    SDPA's ``is_causal`` (top-left aligned) cannot express, so they go with an explicit mask:
    ``extend_len x seq_len`` scores, every one computed. The causal kernel skips the blocks above
    the diagonal, ``seq_len^2 / 2`` scores for every row of the sequence; so when the new tokens
    are more than half the sequence (a long prompt behind a short cached one), the cached
    positions get zero queries, the whole sequence goes causal and only the new rows are kept:
    stock's computation, bit for bit, and fewer scores than the mask.
    """
    extend_len, seq_len = query.shape[1], keys.shape[1]
    prefix_len = seq_len - extend_len
    mask = None
    if prefix_len > 0 and extend_len > 1:
        if 2 * extend_len > seq_len:
            padded = query.new_zeros(query.shape[0], seq_len, query.shape[2])
            padded[:, prefix_len:] = query
            return extend_attention(padded, keys, values, scale)[:, prefix_len:]
        positions = torch.arange(seq_len, device=query.device)
        mask = positions[None, :] <= positions[prefix_len:, None]  # [extend_len, seq_len]
    if keys.dtype != query.dtype:
        keys, values = keys.to(query.dtype), values.to(query.dtype)
    return F.scaled_dot_product_attention(
        query.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), attn_mask=mask, scale=scale,
        is_causal=prefix_len == 0 and extend_len > 1, enable_gqa=query.shape[0] != keys.shape[0],
    ).squeeze(0)


def blend_extend_attention(
    query: torch.Tensor,  # [q_heads, rows, head_dim]
    keys: torch.Tensor,  # [kv_heads, seq_len, head_dim], the request's whole row of the pool
    values: torch.Tensor,  # [kv_heads, seq_len, v_head_dim]
    query_positions: torch.Tensor,  # [rows] int64, each row's position in the request
    scale: float | None = None,
) -> torch.Tensor:  # [q_heads, rows, v_head_dim]
    """Causal attention of rows at arbitrary positions of one request: row ``i`` sees the keys at
    positions ``<= query_positions[i]`` (ASKS blend's kept rows, between reused ones)."""
    mask = torch.arange(keys.shape[1], device=query.device)[None, :] <= query_positions[:, None]
    if keys.dtype != query.dtype:
        keys, values = keys.to(query.dtype), values.to(query.dtype)
    return F.scaled_dot_product_attention(
        query.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), attn_mask=mask, scale=scale,
        enable_gqa=query.shape[0] != keys.shape[0],
    ).squeeze(0)


class RkscCpuAttnBackend(TorchNativeAttnBackend):
    """``TorchNativeAttnBackend`` with one attention call per layer: ``kernels.causal_attention``
    when ``invariant`` (decode, extend and blend rows alike), else one batched SDPA decode call and
    an extend that attends from the new tokens only, unless they outnumber the cached prefix
    (``extend_attention``).

    Stock's extend attends from every position of the request, cached prefix included
    (``per_req_query_redudant``), and keeps the last ``extend_len`` rows: a forked branch that
    adds 5 tokens to a 1,200-token cached prompt paid for 1,200 x 1,200 / 2 scores per head and
    layer instead of 5 x 1,200.
    """

    def __init__(self, model_runner, thread_policy=None, invariant: bool = False):
        super().__init__(model_runner)
        self.thread_policy = thread_policy
        self.invariant = invariant
        self._slots: DecodeSlots | None = None
        self._slots_batch = None  # the ForwardBatch ``_slots`` was built for
        self._rows: QueryRows | None = None
        self._rows_batch = None  # the ForwardBatch ``_rows`` was built for

    def init_forward_metadata(self, forward_batch) -> None:
        super().init_forward_metadata(forward_batch)
        if self.thread_policy is not None:
            ids = forward_batch.input_ids
            self.thread_policy.apply(ids.shape[0] if ids is not None else forward_batch.batch_size)
        self._slots_batch = self._rows_batch = None  # rows are built at the first layer that needs them
        if not self.invariant and forward_batch.forward_mode.is_decode():
            self._decode_slots(forward_batch)

    def _query_rows(self, forward_batch) -> QueryRows:
        """The batch's ``QueryRows`` (decode: one row per request; extend: its new tokens), built
        once per forward."""
        if self._rows_batch is not forward_batch:
            seq_lens = forward_batch.seq_lens_cpu
            if seq_lens is None:
                seq_lens = forward_batch.seq_lens
            if forward_batch.forward_mode.is_decode():
                self._rows = QueryRows.decode(forward_batch.req_pool_indices, seq_lens)
            else:
                extend = forward_batch.extend_seq_lens_cpu
                if extend is None:
                    extend = forward_batch.extend_seq_lens.tolist()
                self._rows = QueryRows.extend(forward_batch.req_pool_indices, seq_lens.tolist(), list(extend))
            self._rows_batch = forward_batch
        return self._rows

    def _invariant_layer(self, layer, forward_batch) -> bool:
        """Whether this layer's attention goes to ``kernels.causal_attention``: a plain causal
        self-attention over a float32 KV pool."""
        window = layer.sliding_window_size
        return (self.invariant and not layer.is_cross_attention and (window is None or window <= -1)
                and forward_batch.encoder_lens is None and not self.use_sliding_window_kv_pool
                and getattr(layer, "attn_type", None) != AttentionType.ENCODER_ONLY
                and self.token_to_kv_pool.get_key_buffer(layer.layer_id).dtype == torch.float32)

    def _causal(self, q, layer, rows: QueryRows) -> torch.Tensor:
        """[rows, heads * v_dim]: ``kernels.causal_attention`` of the layer's queries over the pool."""
        out = kernels.causal_attention(
            q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim).float(),
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            self.req_to_token_pool.req_to_token, rows.req_rows, rows.offsets, rows.positions, layer.scaling)
        return out.view(out.shape[0], -1).to(q.dtype)

    def _decode_slots(self, forward_batch) -> DecodeSlots:
        """Built once per step; rebuilt if SGLang skipped ``init_forward_metadata`` for this batch."""
        if self._slots_batch is not forward_batch:
            seq_lens = forward_batch.seq_lens_cpu
            if seq_lens is None:
                seq_lens = forward_batch.seq_lens
            self._slots = DecodeSlots.build(
                self.req_to_token_pool.req_to_token, forward_batch.req_pool_indices, seq_lens.to(self.device)
            )
            self._slots_batch = forward_batch
        return self._slots

    def _run_sdpa_forward_extend(
        self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
        extend_prefix_lens, extend_seq_lens, encoder_lens=None, scaling=None, enable_gqa=False,
        causal=False, is_cross_attn=False, sliding_window_size=None,
    ):
        """Same contract as the parent's (query/output [num_tokens, heads, dim]), self-attention
        with a plain causal mask only; anything else goes to the parent."""
        if encoder_lens is not None or is_cross_attn or not causal or sliding_window_size is not None:
            return super()._run_sdpa_forward_extend(
                query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                extend_prefix_lens, extend_seq_lens, encoder_lens, scaling, enable_gqa, causal,
                is_cross_attn, sliding_window_size,
            )
        query = query.movedim(0, 1)  # [heads, num_tokens, dim]
        start = 0
        requests = zip(req_pool_indices.tolist(), seq_lens.tolist(), extend_seq_lens.tolist())
        for row, seq_len, extend_len in requests:
            slots = req_to_token[row, :seq_len].long()
            keys = k_cache.index_select(0, slots).movedim(0, 1)  # [kv_heads, seq_len, dim]
            values = v_cache.index_select(0, slots).movedim(0, 1)
            out = extend_attention(query[:, start:start + extend_len], keys, values, scale=scaling)
            output[start:start + extend_len] = out.movedim(0, 1)
            start += extend_len
        return output

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        """Stock's, unless ASKS blend reduced the batch to its kept rows (``radix_ext.asks_blend``):
        then only those rows write their KV, and each attends to its request's whole row of the
        pool up to its own position (``blend_extend_attention``)."""
        view = getattr(forward_batch, BLEND_VIEW_ATTR, None)
        if self._invariant_layer(layer, forward_batch):
            loc = view.out_cache_loc if view is not None else forward_batch.out_cache_loc
            if save_kv_cache and k is not None and v is not None:
                swa = None if view is not None else self.swa_out_cache_loc
                self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(loc, swa), k, v)
            rows = self._query_rows(forward_batch) if view is None else QueryRows.of(
                forward_batch.req_pool_indices, view.query_counts, view.query_positions)
            return self._causal(q, layer, rows)
        if view is None or layer.is_cross_attention or (
                layer.sliding_window_size is not None and layer.sliding_window_size > -1):
            return super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        if save_kv_cache and k is not None and v is not None:
            self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(view.out_cache_loc, None), k, v)
        query = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim).movedim(0, 1)  # [heads, kept, dim]
        output = q.new_empty((q.shape[0], layer.tp_q_head_num, layer.v_head_dim))
        k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        req_to_token = self.req_to_token_pool.req_to_token
        start = 0
        seq_lens = forward_batch.seq_lens_cpu if forward_batch.seq_lens_cpu is not None else forward_batch.seq_lens
        requests = zip(forward_batch.req_pool_indices.tolist(), seq_lens.tolist(), view.query_counts)
        for row, seq_len, count in requests:
            if count:
                slots = req_to_token[row, :seq_len].long()
                out = blend_extend_attention(
                    query[:, start:start + count], k_cache.index_select(0, slots).movedim(0, 1),
                    v_cache.index_select(0, slots).movedim(0, 1), view.query_positions[start:start + count],
                    scale=layer.scaling)
                output[start:start + count] = out.movedim(0, 1)
            start += count
        return output.view(q.shape[0], -1)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        window = layer.sliding_window_size
        if (
            layer.is_cross_attention
            or (window is not None and window > -1)
            or forward_batch.encoder_lens is not None
            or self.use_sliding_window_kv_pool
        ):
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        if save_kv_cache and k is not None and v is not None:
            loc = KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc)
            self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)
        if self._invariant_layer(layer, forward_batch):
            return self._causal(q, layer, self._query_rows(forward_batch))
        out = batched_decode_attention(
            q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim),
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
            self._decode_slots(forward_batch),
            scale=layer.scaling,
        )
        return out.reshape(-1, layer.tp_q_head_num * layer.v_head_dim)


def create_backend(model_runner) -> RkscCpuAttnBackend:
    """SGLang's factory call, in the scheduler once the model is loaded: also applies the CPU
    speed settings of ``radix_ext.cpu.speed`` (thread policy, oneDNN linears)."""
    from radix_ext.cpu.speed import ThreadPolicy, use_packed_linears
    from rksc_sgl.config import RkscConfig

    model = getattr(model_runner, "model", None)
    if model is not None:
        dtype = RkscConfig.from_env().cpu_linear_dtype
        logger.info("rksc_cpu: %d linears packed in %s", use_packed_linears(model, dtype), dtype)
        if dtype == "int8":
            from radix_ext.cpu import kernels

            rows = kernels.amx_rows()
            logger.info("rksc_cpu: int8 linears on AVX-512 VNNI%s", f", AMX tiles from {rows} rows" if rows
                        else " (no AMX tiles here, or RKSC_CPU_AMX=0)")
    invariant = invariant_attention()
    logger.info("rksc_cpu: attention %s", "kernels.causal_attention (invariant)" if invariant else "SDPA")
    return RkscCpuAttnBackend(model_runner, ThreadPolicy.from_env(), invariant)


def install() -> None:
    """Register ``rksc_cpu`` with SGLang's attention registry and CLI choices (idempotent).

    Only on SGLang's CPU path (``SGLANG_USE_CPU_ENGINE=1``, set by ``rksc_sgl.engine``).
    """
    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1":
        return
    invariant_attention()  # a bad RKSC_CPU_INVARIANT_ATTENTION stops start-up here
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if BACKEND_NAME not in ATTENTION_BACKENDS:
        register_attention_backend(BACKEND_NAME)(create_backend)
    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
