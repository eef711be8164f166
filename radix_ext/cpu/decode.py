"""A decode step without SGLang's per-layer Python machinery, on the ``rksc_cpu`` backend.

A one-stream decode step of SmolLM2-135M spends about as long in Python as in kernels
(``docs/benchmarks.md``, "Where a decode step's time goes"): 30 layers, each through module
calls, the fused-op dispatch of every norm, rotary and activation, the layer-boundary residual
stream and the linear layers' ``forward``. On a GPU a captured graph hides that; here it is
most of what stands between a step and its weights' read time.

``lean_decode`` is the AROUND hook on the model's forward that runs a decode batch as one plain
loop: per layer the same callables SGLang's dispatch resolves to (the norms' and rotary's
resolved forward, the linears' ``quant_method.apply``, our backend's ``forward_decode``), in the
same order on the same tensors; where the rotary forward is the plain neox one, its cos / sin are
looked up once per step instead of once per layer and the rotation (``_rotate``) does the same
products and sums. So a step's numbers are SGLang's bit for bit
(``tests/integration/test_lean_decode.py``: one stream's log-probabilities equal, batches within
float rounding, since which requests share a step differs between two engines). It applies only
where that holds: a decode batch of a plain Llama / Qwen2 stack on one rank, unquantized linears
at tensor parallel 1, no module hooks, no captured hidden states; anything else keeps SGLang's
forward. ``RKSC_CPU_LEAN_DECODE=0`` turns it off (ablations). With int8 linears the loop's layers
run in one C++ call where the model allows it (``radix_ext.cpu.decode_stack``, the same bits;
``RKSC_CPU_DECODE_LAYERS=0`` keeps the Python loop). How many decode steps took each path, and why
a model keeps SGLang's or the Python loop, is in the server's internal state (``rksc_decode``).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from radix_ext.cpu import decode_stack, kernels
from radix_ext.model_stack import TARGETS, plain_call, plain_stack

LEAN_ENV = "RKSC_CPU_LEAN_DECODE"
PLAN_ATTR = "_rksc_lean_decode_plan"  # on the model: its LayerPlan list, or the reason it has none
_counts = {"layers_steps": 0, "lean_steps": 0, "stock_steps": 0,  # this scheduler's decode steps
           "unsupported": None, "layers_unsupported": None,
           "kept_rows_calls": 0,  # ASKS blend forwards whose kept rows ran in one call (layer_stack)
           "donor_kv_calls": 0}  # ... and whose donor KV went into every layer in one call (kernels.donor_kv)


def stats() -> dict[str, Any]:
    """Decode steps run here since start-up by ``decode_stack.decode`` (``layers_steps``: the
    layers in one C++ call), by ``_decode`` (``lean_steps``: the Python loop) and by SGLang's
    forward (``stock_steps``); why the last step kept SGLang's forward (``unsupported``) and why
    the last lean step kept the Python loop (``layers_unsupported``); None: it did not; and how
    many ASKS blend forwards ran their kept rows in one call (``kept_rows_calls``) and wrote their
    donors' KV in one call (``donor_kv_calls``)."""
    return dict(_counts)


def count(what: str) -> None:
    _counts[what] += 1


def enabled() -> bool:
    raw = os.environ.get(LEAN_ENV, "").strip() or "1"
    if raw not in ("0", "1"):
        raise ValueError(f"{LEAN_ENV} must be 0 or 1, got {raw!r}")
    return raw == "1"


class LayerPlan:
    """One decoder layer's callables, resolved once per model."""

    __slots__ = ("ln1", "ln2", "qkv", "o", "gate_up", "down", "act", "rope", "rotary", "attn", "q_size",
                 "kv_size", "q_heads", "k_heads", "v_heads", "qk_dim", "v_dim")

    def __init__(self, layer) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.ln1, self.ln2 = _resolved(layer.input_layernorm), _resolved(layer.post_attention_layernorm)
        self.qkv, self.o = _linear(attn.qkv_proj), _linear(attn.o_proj)
        self.gate_up, self.down = _linear(mlp.gate_up_proj), _linear(mlp.down_proj)
        self.act = _resolved(mlp.act_fn)
        self.rope = _resolved(attn.rotary_emb)
        self.rotary = attn.rotary_emb if kernels.plain_neox(attn.rotary_emb, self.rope) else None
        self.attn = attn.attn
        self.q_size, self.kv_size = attn.q_size, attn.kv_size
        self.q_heads, self.k_heads, self.v_heads = (self.attn.tp_q_head_num, self.attn.tp_k_head_num,
                                                    self.attn.tp_v_head_num)
        self.qk_dim, self.v_dim = self.attn.qk_head_dim, self.attn.v_head_dim


def _resolved(op):
    """The callable a fused op's ``forward`` dispatches to (SGLang resolves and caches it at the
    first call; steps 1-2 of its dispatch, an explicit or a forced backend, are per call: a forced
    backend makes the model unsupported)."""
    from sglang.kernels.fused_op import get_fused_op_backend

    if get_fused_op_backend() is not None:
        raise _Unsupported("forced-fused-op-backend")
    if op._forward_method is None:
        op._forward_method = op._resolve_forward_method()
    return op._forward_method


def _rotate(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``apply_rotary_emb`` (neox) of [n, heads * head_size] with cos / sin [n, 1, head_size / 2]:
    the same products and sums, so the same bits."""
    n, half = x.shape[0], cos.shape[-1]
    x = x.view(n, heads, 2 * half)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).view(n, heads * 2 * half)


def _linear(layer):
    """``quant_method.apply`` bound to an unquantized tensor-parallel-1 linear whose ``forward`` is
    stock (a LoRA wrapper, a quantized method or a sharded layer is unsupported)."""
    from sglang.srt.layers import linear
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    stock = (linear.ColumnParallelLinear.forward, linear.RowParallelLinear.forward)
    if (type(layer).forward not in stock or not isinstance(layer.quant_method, UnquantizedLinearMethod)
            or getattr(layer, "tp_size", 1) != 1 or getattr(layer, "skip_bias_add", False)):
        raise _Unsupported(f"linear:{type(layer).__name__}")
    method, bias = layer.quant_method, layer.bias

    def apply(x: torch.Tensor) -> torch.Tensor:
        return method.apply(layer, x, bias)

    return apply


class _Unsupported(Exception):
    pass


def _plan(model) -> list[LayerPlan] | str:
    """The model's layer plans, or why it keeps SGLang's decode (resolved once per model)."""
    cached = model.__dict__.get(PLAN_ATTR)
    if cached is not None:
        return cached
    stack = model.model
    try:
        why = plain_stack(model)
        if why is not None:
            raise _Unsupported(why)
        if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
            raise _Unsupported("module-hooks")
        plans = []
        for i in range(stack.start_layer, stack.end_layer):
            layer = stack.layers[i]
            mlp = layer.mlp
            if getattr(mlp, "dual_gemm", None) is not None and mlp.dual_gemm.mode is not None:
                raise _Unsupported("dual-gemm")
            if getattr(getattr(mlp, "activation_quant", None), "enabled", False):
                raise _Unsupported("activation-quant")
            attn = layer.self_attn.attn
            if attn.is_cross_attention or (attn.sliding_window_size is not None and attn.sliding_window_size > -1):
                raise _Unsupported("attention-kind")
            plans.append(LayerPlan(layer))
        result: list[LayerPlan] | str = plans
    except (_Unsupported, AttributeError) as why:
        result = str(why) if isinstance(why, _Unsupported) else f"model:{why}"
    model.__dict__[PLAN_ATTR] = result
    return result


def layer_stack(model, backend) -> decode_stack.DecodeStack | str:
    """The model's layers in one C++ call (``decode_stack``) for query rows other than a decode
    step's (ASKS blend's kept rows), or why its rows keep SGLang's layers."""
    if not enabled():
        return f"{LEAN_ENV}=0"
    plans = _plan(model)
    return plans if isinstance(plans, str) else decode_stack.for_step(model, plans, backend)


def lean_decode(original, model, input_ids, positions, forward_batch, *args, **kwargs):
    """The AROUND hook on the model's forward: a plain decode batch runs ``_decode``."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    if forward_batch.forward_mode != ForwardMode.DECODE or not plain_call(args, kwargs):
        return original(model, input_ids, positions, forward_batch, *args, **kwargs)
    from sglang.srt.model_executor.forward_context import get_attn_backend

    from radix_ext.cpu.attention import RkscCpuAttnBackend

    backend = get_attn_backend()
    plans = _plan(model)
    if (isinstance(plans, str) or not isinstance(backend, RkscCpuAttnBackend)
            or backend.use_sliding_window_kv_pool or forward_batch.encoder_lens is not None):
        _counts["stock_steps"] += 1
        _counts["unsupported"] = plans if isinstance(plans, str) else "attention-backend"
        return original(model, input_ids, positions, forward_batch, *args, **kwargs)
    stack = decode_stack.for_step(model, plans, backend)
    if isinstance(stack, str):
        _counts["lean_steps"] += 1
        _counts["layers_unsupported"] = stack
        return _decode(model, plans, backend, input_ids, positions, forward_batch)
    _counts["layers_steps"] += 1
    return decode_stack.decode(model, stack, backend, input_ids, positions, forward_batch)


@torch.no_grad()
def _decode(model, plans: list[LayerPlan], backend, input_ids, positions, forward_batch) -> Any:
    """``LlamaForCausalLM.forward`` of a decode batch (sglang 0.5.23), as one loop."""
    stack = model.model
    hidden = stack.embed_tokens(input_ids)
    residual = None
    tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # rotary module -> this step's cos, sin
    rotate = kernels.rope_neox if model.__dict__.get(kernels.ACTIVE_ATTR) else _rotate  # the same bits
    for p in plans:
        if residual is None:  # the stack's input is the first residual
            residual, x = hidden, p.ln1(hidden)
        else:
            x, residual = p.ln1(hidden, residual)
        q, k, v = p.qkv(x).split([p.q_size, p.kv_size, p.kv_size], dim=-1)
        if p.rotary is None:
            q, k = p.rope(positions, q, k)
        else:
            table = tables.get(id(p.rotary))
            if table is None:
                table = tables[id(p.rotary)] = kernels.rotary_table(p.rotary, positions, q.dtype)
            q, k = rotate(q, p.q_heads, *table), rotate(k, p.k_heads, *table)
        out = backend.forward_decode(q, k.view(-1, p.k_heads, p.qk_dim), v.view(-1, p.v_heads, p.v_dim),
                                     p.attn, forward_batch)
        hidden = p.o(out)
        x, residual = p.ln2(hidden, residual)
        hidden = p.down(p.act(p.gate_up(x)))
    hidden, _ = stack.norm(hidden, residual)
    return model.logits_processor(input_ids, hidden, model.lm_head, forward_batch)


def install() -> None:
    """On SGLang's CPU path, unless ``RKSC_CPU_LEAN_DECODE=0`` (a value other than 0 or 1 there or
    in ``RKSC_CPU_DECODE_LAYERS`` stops start-up, naming the variable)."""
    if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1":
        return
    decode_stack.enabled()
    if not enabled():
        return
    from radix_ext import hooks

    for target in TARGETS:
        hooks.around(target, lean_decode)
