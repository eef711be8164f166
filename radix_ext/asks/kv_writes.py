"""What ASKS blend writes into the KV pool itself, around the layers SGLang's attention writes.

* ``write_check_kv``: the last check layer's K and V for the tokens a donor covers, from the layer's
  input norm, QKV projection and rotation alone. The selection compares them with the donor's;
  the layer's attention and MLP then run for the kept rows only (for a row whose KV is the
  donor's from the next layer on, they would be thrown away).
* ``write_donor_kv``: for every layer after the check, a reused row's KV is its donor's: V as is,
  K re-rotated to the row's position (``radix_ext.asks.selection.rerotation``).
"""

from __future__ import annotations

import torch

from radix_ext.asks.selection import rerotation


def write_check_kv(layer, positions: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, pool) -> None:
    """The K and V that ``layer`` would write for the rows whose stream state is ``state`` (the
    full state, so no residual is pending), written into their ``slots``: its input norm, QKV
    projection and rotation (``LlamaAttention.forward_prepare_native``; Qwen2's forward does the
    same inline). The kept rows run the layer whole afterwards and write theirs again; the reused
    rows' KV at this layer is their own, computed in their own context."""
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc

    attn = layer.self_attn
    qkv, _ = attn.qkv_proj(layer.input_layernorm(state))
    q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    _, k = attn.rotary_emb(positions, q, k)
    radix = attn.attn
    pool.set_kv_buffer(radix, KVWriteLoc(slots, None), k.view(-1, radix.tp_k_head_num, radix.qk_head_dim),
                       v.view(-1, radix.tp_v_head_num, radix.v_head_dim))


def write_donor_kv(pool, stack, layers: list[int], own: torch.Tensor, donors: torch.Tensor,
                   deltas: torch.Tensor) -> None:
    """For each layer still to run: the donors' V, and their K re-rotated by ``deltas``, into the
    request's own slots ``own`` (which the reduced layers never write). The rotation is looked up
    once per rotary table (SGLang's layers share one)."""
    moves = {}
    for i in layers:
        layer_id = stack.layers[i].self_attn.attn.layer_id
        rotary = stack.layers[i].self_attn.rotary_emb
        move = moves.get(id(rotary))
        if move is None:
            move = moves[id(rotary)] = rerotation(deltas, rotary)
        k_buffer, v_buffer = pool.get_key_buffer(layer_id), pool.get_value_buffer(layer_id)
        k_buffer.index_copy_(0, own, move(k_buffer.index_select(0, donors)))
        v_buffer.index_copy_(0, own, v_buffer.index_select(0, donors))
