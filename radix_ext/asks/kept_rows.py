"""ASKS blend's kept rows after the selection: the view the attention backend reads, and the layers.

Once ``radix_ext.asks.blend`` has chosen which rows of a reduced EXTEND batch are computed (the
rest take their donors' KV), those rows run the remaining layers alone:

* ``view_of``: the ``BlendView`` of the batch, which ``radix_ext.cpu.attention`` reads so that each
  kept row writes its own KV slot and attends to its request's row of the pool up to its position;
* ``kept_layers``: the kept rows through the remaining layers and the final norm. Where the
  model's decode runs its layers in one C++ call (``layer_stack``, ``radix_ext.cpu.decode.layer_stack``:
  int8 linears, the invariant attention, SGLang's plain pool), the kept rows take that call: the
  kernels SGLang's layers reach, in their order, so the same bits as the layers themselves, without
  their Python per layer (``tests/integration/test_decode_layers.py`` compares the two). There the
  first layer starts at its attention, from the queries the check computed for every row with its
  K and V (``radix_ext.asks.kv_writes.write_check_kv``, the same kernels: its norm, QKV and
  rotation run once per row). Else SGLang's layers run over the view, the first one whole.
"""

from __future__ import annotations

import dataclasses

import torch

from radix_ext.cpu.attention import BLEND_VIEW_ATTR as VIEW_ATTR  # on a ForwardBatch: its BlendView
from radix_ext.model_stack import norm_kwargs


@dataclasses.dataclass(frozen=True)
class BlendView:
    """The kept rows of a reduced EXTEND batch, for the attention backend.

    ``out_cache_loc``: [kept] the KV slots the kept rows write; ``query_counts``: per batch row,
    how many of its rows are kept; ``query_positions``: [kept] each kept row's position in its
    request (its keys are that request's row of the pool up to and including it)."""

    out_cache_loc: torch.Tensor
    query_counts: list[int]
    query_positions: torch.Tensor


def view_of(forward_batch, keep: torch.Tensor, kept: torch.Tensor, positions: torch.Tensor) -> BlendView:
    """The view of the batch's rows where ``keep`` [tokens] is set (``kept``: their indices)."""
    counts, offset = [], 0
    for length in forward_batch.extend_seq_lens_cpu:
        counts.append(int(keep[offset: offset + length].sum()))
        offset += length
    return BlendView(forward_batch.out_cache_loc[kept], counts, positions[kept].long())


def layer_stack(model):
    """The model's layers as one C++ call for the kept rows (``radix_ext.cpu.decode.layer_stack``:
    a ``DecodeStack``), or why SGLang's layers run them (a string); looked up once per forward."""
    from sglang.srt.model_executor.forward_context import get_attn_backend

    from radix_ext.cpu import decode

    return decode.layer_stack(model, get_attn_backend())


def kept_layers(model, layers, hidden: torch.Tensor, positions: torch.Tensor, forward_batch, view: BlendView,
                first: int, first_q: torch.Tensor | None = None) -> torch.Tensor:
    """The kept rows (``hidden``: their stream state entering layer ``first`` of the stack, which
    restarts there) through layers ``first..`` and the final norm, by ``layers`` (``layer_stack``'s;
    module docstring). ``first_q``: their rotated queries at layer ``first``, whose K and V are in
    the pool (the one call only)."""
    from sglang.srt.layers.layer_boundary.residual import batch as residual_batch
    from sglang.srt.model_executor.forward_context import get_attn_backend

    from radix_ext.cpu import decode, decode_stack
    from radix_ext.cpu.attention import QueryRows

    stack = model.model
    if not isinstance(layers, str):
        backend = get_attn_backend()
        residual_batch.clear(forward_batch)
        rows = QueryRows.of(forward_batch.req_pool_indices, view.query_counts, view.query_positions)
        hidden, residual = decode_stack.layers_from(layers, backend, first, hidden, positions, view.out_cache_loc,
                                                    rows, first_q)
        decode.count("kept_rows_calls")
        return stack.norm(hidden, residual)[0]
    setattr(forward_batch, VIEW_ATTR, view)
    try:
        for i in range(stack.start_layer + first, stack.end_layer):
            hidden = stack.layers[i](positions, hidden, forward_batch)
        return residual_batch.final_norm(hidden, forward_batch, stack.norm, **norm_kwargs(stack))
    finally:
        setattr(forward_batch, VIEW_ATTR, None)
