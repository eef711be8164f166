"""Every decoder layer of a decode step in one call from Python: ``kernels.decode_layers``.

With int8 linears the lean decode (``radix_ext.cpu.decode``) still makes about 12 op calls from
Python per layer, 30 layers per step: two fused norms, four linears through ``quant_method.apply``
(each checking its packed weights), two rotations, the pool's ``set_kv_buffer``, the attention
backend's ``forward_decode``, the activation. At one stream that Python was about as long as the
linears' kernels (``docs/benchmarks.md``, "Where a decode step's time goes"). ``decode_layers.cpp``
runs the same layers in C++: the kernel functions the Python calls reach, called directly, and the
ATen ops its torch calls dispatch to, in the same order on the same tensors, so a step's numbers
are the lean loop's bit for bit (``tests/integration/test_decode_layers.py``).

It applies only where each of those Python calls is known to reach what the op runs; ``build``
checks once per model (and each step, that the model's weights and the pool are the ones it was
built from): int8 kernels active, every linear packed int8 with no bias, every norm the fused one,
the activation SGLang's plain ``SiluAndMul`` (``forward_native``: silu times the second half), one
plain neox rotary for all layers, the backend's invariant attention over SGLang's own
``MHATokenToKVPool`` in float32 written by its plain ``k_cache[loc] = k`` (not quantized, not
HND, no layer-wise loading, no AMX store kernel), uniform heads. Anything else keeps the Python
loop, and ``stats()`` of ``radix_ext.cpu.decode`` says why. ``RKSC_CPU_DECODE_LAYERS=0`` turns it
off (ablations; a value other than 0 or 1 stops start-up, naming the variable).

**Numbers** (SmolLM2-135M, int8, 2 cores; ``python -m benchmarks.speed --streams 1,8,32
--sampled-streams '' --agreement-prompts 0``, median of 3, 2026-12-07, against the same with
``RKSC_CPU_DECODE_LAYERS=0``): greedy decode 64.8 / 281.9 / 541.7 tok/s at 1 / 8 / 32 streams
against the Python loop's 44.7 / 240.6 / 465.8 (1.45x, 1.17x, 1.16x). The machine read slow that
day (the Python loop had made 62-72 tok/s at one stream in earlier runs). The 30 layers alone, one
row at 40 positions: 8.2 ms a call against the loop's 10.5 ms; their linears' kernels are 7.2 ms
of it, and a call with no rows (the lists in, every op's set-up) 0.35 ms.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from radix_ext.cpu import kernels

LAYERS_ENV = "RKSC_CPU_DECODE_LAYERS"
STACK_ATTR = "_rksc_decode_stack"  # on the model: its DecodeStack, or why its steps keep the Python loop


def enabled() -> bool:
    raw = os.environ.get(LAYERS_ENV, "").strip() or "1"
    if raw not in ("0", "1"):
        raise ValueError(f"{LAYERS_ENV} must be 0 or 1, got {raw!r}")
    return raw == "1"


class _Unsupported(Exception):
    pass


@dataclasses.dataclass
class DecodeStack:
    """A model's layers as ``kernels.decode_layers`` takes them, built against one attention backend."""

    weights: kernels.LayerWeights
    rotary: torch.nn.Module  # every layer's (one module): the step's cos / sin are looked up once
    buffers: slice  # the model's layers in the KV pool's per-layer buffer lists
    backend: object
    watched: list[torch.Tensor]  # the linears' and norms' float32 weights, whose (data_ptr, _version) ...
    keys: list[tuple[int, int]]  # ... were these when the linears were packed and the norms gathered

    def stale(self, backend) -> str | None:
        """Why this step cannot use the stack as built (None: it can)."""
        if backend is not self.backend:
            return "attention-backend-changed"
        if backend.token_to_kv_pool.layer_transfer_counter is not None:
            return "kv-pool:layer-wise-loading"
        if [(w.data_ptr(), w._version) for w in self.watched] != self.keys:
            return "weights-changed"
        return None


def for_step(model, plans, backend) -> DecodeStack | str:
    """The model's ``DecodeStack`` for this step, or why the step keeps the Python loop; built at
    the first step and again when the weights or the backend changed underneath."""
    stack = model.__dict__.get(STACK_ATTR)
    if isinstance(stack, DecodeStack) and stack.stale(backend) is not None:
        stack = None  # rebuilt below, from weights packed again
    if stack is None:
        stack = model.__dict__[STACK_ATTR] = build(model, plans, backend)
    return stack


def build(model, plans, backend) -> DecodeStack | str:
    if not enabled():
        return f"{LAYERS_ENV}=0"
    try:
        return _build(model, plans, backend)
    except (_Unsupported, AttributeError) as why:
        return str(why) if isinstance(why, _Unsupported) else f"model:{why}"


def _build(model, plans, backend) -> DecodeStack:
    from sglang.srt.layers.radix_attention import AttentionType

    stack = model.model
    if not model.__dict__.get(kernels.ACTIVE_ATTR) or stack.embed_tokens.weight.dtype != torch.float32:
        raise _Unsupported("int8-kernels-off")
    pool = _plain_pool(backend)
    rotary, first = plans[0].rotary, plans[0].attn
    norms, eps, linears, widths, scales, watched = [], [], [], [], [], []
    for i, p in zip(range(stack.start_layer, stack.end_layer), plans):
        layer, attn = stack.layers[i], p.attn
        if p.rotary is None or p.rotary is not rotary:
            raise _Unsupported("rotary")
        if not _silu_and_mul(layer.mlp.act_fn, p.act):
            raise _Unsupported("activation")
        heads = (attn.tp_q_head_num, attn.tp_k_head_num, attn.tp_v_head_num, attn.qk_head_dim, attn.v_head_dim)
        if (attn.layer_id != pool.start_layer + len(scales) or getattr(attn, "attn_type", None) != AttentionType.DECODER
                or heads != (first.tp_q_head_num, first.tp_k_head_num, first.tp_k_head_num, first.qk_head_dim,
                             first.qk_head_dim)
                or (p.q_size, p.kv_size) != (heads[0] * heads[3], heads[1] * heads[3])):
            raise _Unsupported("attention-shape")
        for norm, ln in ((layer.input_layernorm, p.ln1), (layer.post_attention_layernorm, p.ln2)):
            if getattr(ln, "rksc_norm", None) is not norm:
                raise _Unsupported("norm")
            norms.append(norm.weight.data)
            eps.append(norm.variance_epsilon)
            watched.append(norm.weight)
        attn_module, mlp = layer.self_attn, layer.mlp
        for linear in (attn_module.qkv_proj, attn_module.o_proj, mlp.gate_up_proj, mlp.down_proj):
            values, n = _packed_int8(linear)
            linears.append(values)
            widths.append(n)
            watched.append(linear.weight)
        scales.append(attn.scaling)
    weights = kernels.LayerWeights(norms, eps, linears, widths, scales, first.tp_q_head_num, first.tp_k_head_num,
                                   first.qk_head_dim)
    buffers = slice(0, len(plans))
    if len(pool.k_buffer[buffers]) != len(plans):
        raise _Unsupported("kv-pool:layers")
    return DecodeStack(weights, rotary, buffers, backend, watched, [(w.data_ptr(), w._version) for w in watched])


def _plain_pool(backend):
    """The backend's KV pool, if ``set_kv_buffer`` on it is ``k_cache[loc] = k; v_cache[loc] = v``
    into float32 buffers that ``get_key_buffer`` returns as they are."""
    from sglang.srt import environ
    from sglang.srt.mem_cache import memory_pool

    from radix_ext.cpu.attention import RkscCpuAttnBackend

    pool = backend.token_to_kv_pool
    if not backend.invariant or backend.use_sliding_window_kv_pool:
        raise _Unsupported("attention:not-invariant")
    if any(getattr(type(backend), name) is not getattr(RkscCpuAttnBackend, name)
           for name in ("forward_decode", "_causal", "_invariant_layer", "_query_rows")):
        raise _Unsupported(f"attention:{type(backend).__name__}")
    if type(pool) is not memory_pool.MHATokenToKVPool:
        raise _Unsupported(f"kv-pool:{type(pool).__name__}")
    if (pool.is_quantized_kv_cache or pool.dtype != torch.float32 or pool.store_dtype != torch.float32
            or pool.use_hnd or pool.kv_cache_layout != "nhd" or pool.requires_physical_write_loc
            or (memory_pool._cpu_has_amx_support and pool.v_row_dim == pool.row_dim)
            or environ.envs.SGLANG_ENABLE_ASYNC_ASSERT.get()):
        raise _Unsupported("kv-pool:write")
    return pool


def _silu_and_mul(act, resolved) -> bool:
    """SGLang's ``SiluAndMul`` resolved to ``forward_native`` (on the CPU: ``forward_cpu`` without
    the AMX kernel, which calls it)."""
    from sglang.srt.layers import activation

    fn = getattr(resolved, "__func__", None)
    return (type(act) is activation.SiluAndMul and getattr(resolved, "__self__", None) is act
            and (fn is activation.SiluAndMul.forward_native
                 or (fn is activation.SiluAndMul.forward_cpu and not activation._is_cpu_amx_available)))


def _packed_int8(linear) -> tuple[torch.Tensor, int]:
    """The linear's packed int8 weights (packed now if its weights changed since), if its
    ``quant_method.apply`` is ``radix_ext.cpu.speed``'s int8 one with no bias."""
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    from radix_ext.cpu import speed

    method = linear.quant_method
    if (type(method).apply is not speed._onednn_methods()[UnquantizedLinearMethod].apply
            or method.compute_dtype != torch.int8 or linear.bias is not None):
        raise _Unsupported(f"linear:{getattr(method, 'compute_dtype', type(method).__name__)}")
    weight = linear.weight
    packed = linear.__dict__.get(speed.PACKED_ATTR)
    if packed is None or packed[0] != (weight.data_ptr(), weight._version):
        speed._onednn_linear(linear, weight.new_zeros(1, weight.shape[1]), None)  # packs as its next call would
        packed = linear.__dict__[speed.PACKED_ATTR]
    return packed[1]


@torch.no_grad()
def decode(model, stack: DecodeStack, backend, input_ids, positions, forward_batch):
    """``radix_ext.cpu.decode._decode`` with its layer loop in one ``kernels.decode_layers`` call."""
    layers = model.model
    hidden, residual = layers_from(stack, backend, 0, layers.embed_tokens(input_ids), positions,
                                   forward_batch.out_cache_loc, backend._query_rows(forward_batch))
    hidden, _ = layers.norm(hidden, residual)
    return model.logits_processor(input_ids, hidden, model.lm_head, forward_batch)


@torch.no_grad()
def layers_from(stack: DecodeStack, backend, first: int, hidden: torch.Tensor, positions: torch.Tensor,
                out_cache_loc: torch.Tensor, rows, first_q: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The stack's layers ``first..`` in one ``kernels.decode_layers`` call for any query rows:
    ``hidden`` [n, H] each row's input to layer ``first`` (the stream restarted there: it is also
    the first residual), written at ``out_cache_loc`` [n], each row attending to its request's row
    of the pool up to its own position (``rows``, ``radix_ext.cpu.attention.QueryRows``). A decode
    step takes it from layer 0, ASKS blend's kept rows from the layer the check restarts the stream
    at (``radix_ext.asks.kept_rows``), with ``first_q`` the rotated queries of layer ``first``
    whose K and V its check already wrote -> (hidden, residual) before the final norm."""
    w = stack.weights
    if first:
        w = kernels.LayerWeights(w.norms[2 * first:], w.eps[2 * first:], w.linears[4 * first:],
                                 w.widths[4 * first:], w.scales[first:], w.q_heads, w.kv_heads, w.head_dim)
    cos, sin = kernels.rotary_table(stack.rotary, positions, hidden.dtype)
    pool = backend.token_to_kv_pool
    return kernels.decode_layers(hidden.contiguous(), w, cos, sin, pool.k_buffer[stack.buffers][first:],
                                 pool.v_buffer[stack.buffers][first:], out_cache_loc,
                                 backend.req_to_token_pool.req_to_token, rows, first_q)
