"""What ASKS blend writes into the KV pool itself, around the layers SGLang's attention writes.

* ``write_check_kv``: the last check layer's K and V for the tokens a donor covers (for every row
  where the kept rows continue in one call), from the layer's input norm, QKV projection and
  rotation alone, and the rotated queries. The selection compares the K and V with the donor's;
  the layer's attention and MLP then run for the kept rows only (for a row whose KV is the
  donor's from the next layer on, they would be thrown away).
* ``write_donor_kv``: for every layer after the check, a reused row's KV is its donor's: V as is,
  K re-rotated to the row's position (``radix_ext.asks.selection.rerotation``), in one C++ call
  over every layer where it can (``radix_ext.cpu.kernels.donor_kv``).
"""

from __future__ import annotations

import torch

from radix_ext.asks.selection import rerotation, rotation_tables


def write_check_kv(layer, positions: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, pool) -> torch.Tensor:
    """The K and V that ``layer`` would write for the rows whose stream state is ``state`` (the
    full state, so no residual is pending), written into their ``slots``: its input norm, QKV
    projection and rotation (``LlamaAttention.forward_prepare_native``; Qwen2's forward does the
    same inline) -> their rotated queries [rows, q_size], contiguous. The reused rows' KV at this
    layer is their own, computed in their own context; the kept rows continue from their queries
    (``radix_ext.asks.kept_rows``), or run the layer whole and write theirs again."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    attn = layer.self_attn
    qkv, _ = attn.qkv_proj(layer.input_layernorm(state))
    q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    q, k = attn.rotary_emb(positions, q, k)
    radix = attn.attn
    pool.set_kv_buffer(radix, KVWriteLoc(slots, None), k.view(-1, radix.tp_k_head_num, radix.qk_head_dim),
                       v.view(-1, radix.tp_v_head_num, radix.v_head_dim))
    return q.reshape(-1, attn.q_size).contiguous()


def write_donor_kv(pool, stack, layers: list[int], own: torch.Tensor, donors: torch.Tensor,
                   deltas: torch.Tensor) -> None:
    """For each layer still to run: the donors' V, and their K re-rotated by ``deltas``, into the
    request's own slots ``own`` (which the reduced layers never write). Where the layers share one
    neox table over whole float32 heads and the CPU kernels are loaded, every layer in one call
    (``radix_ext.cpu.kernels.donor_kv``, the same bits); else per layer, the rotation looked up once
    per rotary table (SGLang's layers share one), as under ``RKSC_CPU_DECODE_LAYERS=0``."""
    if not layers:
        return
    attns = [stack.layers[i].self_attn for i in layers]
    k_buffers = [pool.get_key_buffer(a.attn.layer_id) for a in attns]
    v_buffers = [pool.get_value_buffer(a.attn.layer_id) for a in attns]
    rotary = attns[0].rotary_emb
    if _one_call(rotary, attns, k_buffers, v_buffers):
        from radix_ext.cpu import decode, kernels

        cos, sin = rotation_tables(deltas, rotary)
        kernels.donor_kv(k_buffers, v_buffers, own.long().contiguous(), donors.long().contiguous(), cos, sin)
        decode.count("donor_kv_calls")
        return
    moves = {}
    for attn, k_buffer, v_buffer in zip(attns, k_buffers, v_buffers):
        move = moves.get(id(attn.rotary_emb))
        if move is None:
            move = moves[id(attn.rotary_emb)] = rerotation(deltas, attn.rotary_emb)
        k_buffer.index_copy_(0, own, move(k_buffer.index_select(0, donors)))
        v_buffer.index_copy_(0, own, v_buffer.index_select(0, donors))


def _one_call(rotary, attns, k_buffers, v_buffers) -> bool:
    from radix_ext.cpu import decode_stack, kernels

    size = k_buffers[0].shape[-1]
    return (kernels.loaded() and decode_stack.enabled() and rotary.is_neox_style and rotary.rotary_dim == size
            and all(a.rotary_emb is rotary for a in attns)
            and all(b.dtype == torch.float32 and b.is_contiguous() and b.dim() == 3 and b.shape[-1] == size
                    for b in (*k_buffers, *v_buffers)))
