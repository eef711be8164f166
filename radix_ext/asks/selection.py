"""ASKS blend, the pure part: which reused tokens to recompute, and moving a key to a new position.

``select`` chooses a share ``r`` of a request's reused tokens (``--asks-recompute``) to compute
anyway, so that their KV attends to the request's own opening:

* ``deviation`` (the default; CacheBlend's check plus EPIC's leading tokens): the first
  ``--asks-check-layers`` layers run for every token; at the last of them each reused token's KV is
  compared with the donor's (``deviations``: V, and K re-rotated to the request's position, each
  distance divided by its mean over the request's reused tokens). The first ``LEAD_TOKENS`` of
  each segment (right after the text that differs) come first,
  then the tokens that deviate most, up to ``ceil(r * reused)``. The gate
  (``--asks-max-deviation``) then adds every token whose relative deviation (``deviations``: its KV's
  distance from the donor's in its own scale) exceeds it, whatever the share: the share adapts to
  how far the donor's context stood from the request's.
* ``leading`` (EPIC): the first ``ceil(r * len)`` tokens of each segment, from layer 1.

The defaults were chosen on the benchmark's first 10 problems, one run each, by first-token KL
against exact (median over branches) and wall time against exact's in the same run:

* ``--asks-check-layers`` 2: the first layer's K and V are projections of each token's own embedding,
  the same after any context (its relative deviation is 0 on every token of the three
  workloads), so layer 2 is the first whose KV tells a donor's context from the request's.
  Against 4 layers with the gate at 0.07 (which flags about the same share of tokens at layer 4
  as 0.025 at layer 2: 2.4% / 4.2% / 66% against 2.3% / 4.7% / 67% on paraphrase-sc / role-sc /
  multi-doc, 4 problems each), 2 layers read 2.11x / 2.00x / 1.26x exact's wall against 1.97x /
  1.89x / 1.25x, at KL 0.0013 / 0.0017 / 0.016 against 0.0013 / 0.0014 / 0.013. The bench's
  ``--asks-check-sweep`` repeats the comparison (docs/benchmarks.md, "How deep the check runs").
* the gate, 0.025 at layer 2: the median relative deviation there is 0.0019 on paraphrase-sc,
  0.0032 on role-sc and 0.033 on multi-doc, whose documents were computed alone after the shared
  head and are read after other documents; the gate passes most of multi-doc's tokens and keeps
  its KL under 0.02 (share 0.05 alone read KL 0.11 there).

``rerotate``: SGLang stores K after RoPE, and RoPE composes (``R(p + d) = R(d) R(p)``), so one
rotation by ``delta`` moves a stored key to position ``p + delta``; ``pure_rotation`` refuses
tables that are not rotations (YaRN's scaled ones).
"""

from __future__ import annotations

import math

import torch

from radix_ext.asks.segments import Segment

PURE_ATTR = "_rksc_pure_rotation"  # on a RotaryEmbedding: (its table, whether it is a pure rotation)
LEAD_TOKENS = 4  # deviation selection: the first tokens of each segment, recomputed first


def select(segments: list[Segment], recompute: float, selector: str,
           deviation: torch.Tensor | None = None, lead: int = LEAD_TOKENS,
           relative: torch.Tensor | None = None, max_deviation: float = math.inf) -> torch.Tensor:
    """Which reused tokens to recompute: a bool mask over the segments' tokens, concatenated.
    ``deviation``: [reused] float, per token (``selector == "deviation"``); there the first
    ``lead`` tokens of each segment outrank every other token, and rank among themselves by it,
    and every token whose ``relative`` deviation exceeds ``max_deviation`` is added."""
    total = sum(s.length for s in segments)
    keep = torch.zeros(total, dtype=torch.bool)
    if recompute <= 0 or total == 0:
        return keep
    if recompute >= 1:
        return ~keep
    if selector == "leading":
        offset = 0
        for s in segments:
            keep[offset: offset + math.ceil(recompute * s.length)] = True
            offset += s.length
        return keep
    score = deviation.float().clone()
    leading, offset = torch.zeros(total, dtype=torch.bool), 0
    for s in segments:
        leading[offset: offset + min(lead, s.length)] = True
        offset += s.length
    score[leading] += float(score.max()) + 1.0
    keep[torch.topk(score, math.ceil(recompute * total)).indices] = True
    if relative is not None:
        keep |= relative > max_deviation
    return keep


def deviations(own_k: torch.Tensor, own_v: torch.Tensor, donor_k: torch.Tensor,
               donor_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """How far a donor's KV stands from the request's own at one layer (``donor_k`` already
    re-rotated to the request's positions), from one pass over the distances: ``(ranking,
    relative)``, each [n] per token.

    ``ranking`` (what the share takes first): the L2 distance of V plus that of K, each divided by
    its mean over the ``n`` tokens, so that neither dominates by its scale. ``relative`` (the
    gate's measure): the larger of ``|v - v'| / |v|`` and ``|k - k'| / |k|`` per token, so one
    threshold reads alike on every model and layer."""
    own_k, own_v = own_k.float().flatten(1), own_v.float().flatten(1)
    dv = (own_v - donor_v.float().flatten(1)).norm(dim=1)
    dk = (own_k - donor_k.float().flatten(1)).norm(dim=1)
    ranking = dv / dv.mean().clamp_min(1e-12) + dk / dk.mean().clamp_min(1e-12)
    relative = torch.maximum(dv / own_v.norm(dim=1).clamp_min(1e-12), dk / own_k.norm(dim=1).clamp_min(1e-12))
    return ranking, relative


def rerotate(keys: torch.Tensor, deltas: torch.Tensor, rotary) -> torch.Tensor:
    """Keys stored after RoPE at positions p, moved to p + delta: keys [n, heads, head_size],
    deltas [n] int64, ``rotary`` the layer's RotaryEmbedding (a pure-rotation table)."""
    return rerotation(deltas, rotary)(keys)


def rerotation(deltas: torch.Tensor, rotary):
    """``rerotate`` by ``deltas`` as a function of the keys, its cosines and sines looked up once
    (blend moves every later layer's keys by the same deltas). Float32 keys rotated whole in the
    neox style go through ``radix_ext.cpu.kernels.rope_neox`` where it is built: SGLang's
    ``apply_rotary_emb`` in one call, the same bits."""
    from sglang.srt.layers.rotary_embedding.utils import apply_rotary_emb

    cos, sin = rotation_tables(deltas, rotary)
    rot, neox = rotary.rotary_dim, rotary.is_neox_style
    fused = _rope_neox() if neox else None

    def move(keys: torch.Tensor) -> torch.Tensor:
        n, heads, size = keys.shape
        if fused is not None and rot == size and keys.dtype == torch.float32 and n:
            return fused(keys.reshape(n, heads * size), heads, cos.unsqueeze(1), sin.unsqueeze(1)).view(n, heads, size)
        moved = apply_rotary_emb(keys[..., :rot].float(), cos, sin, neox).to(keys.dtype)
        return torch.cat((moved, keys[..., rot:]), dim=-1) if rot < size else moved

    return move


def rotation_tables(deltas: torch.Tensor, rotary) -> tuple[torch.Tensor, torch.Tensor]:
    """The cosines and sines [n, rotary_dim / 2] (contiguous float32) that move a key by ``deltas``."""
    cos, sin = rotary.cos_sin_cache.index_select(0, deltas.abs()).float().chunk(2, dim=-1)
    return cos.contiguous(), torch.where(deltas[:, None] < 0, -sin, sin).contiguous()


def _rope_neox():
    """``kernels.rope_neox`` where this process has the CPU kernels loaded (never a build mid-request),
    else None."""
    from radix_ext.cpu import kernels

    return kernels.rope_neox if kernels.loaded() else None


def pure_rotation(rotary) -> bool:
    """RoPE tables whose rows are rotations (cos^2 + sin^2 = 1) compose by adding positions;
    scaled tables (YaRN's mscale) do not. Checked once per table (kept on the module)."""
    table = getattr(rotary, "cos_sin_cache", None)
    if table is None or not hasattr(rotary, "rotary_dim") or not hasattr(rotary, "is_neox_style"):
        return False
    checked = getattr(rotary, PURE_ATTR, None)
    if checked is None or checked[0] is not table:
        cos, sin = table[:64].float().chunk(2, dim=-1)
        checked = (table, bool(torch.allclose(cos * cos + sin * sin, torch.ones_like(cos), atol=1e-4)))
        setattr(rotary, PURE_ATTR, checked)
    return checked[1]
