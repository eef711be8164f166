"""Seeded, batch-invariant sampling: Gumbel-max with counter-based noise. Pure torch, no SGLang.

A row's draw is a function of its own probabilities, its request seed and the absolute position
of the token it samples, nothing else: not its batch neighbours, its row index, nor whether its
prefix came from the radix cache. So two engines (or benchmark modes) whose logits agree draw the
same tokens, and a branch replayed with its seed reproduces itself.

**Noise.** ``uniform(seed, position, token_id)`` is a 32-bit counter-based hash (``mix32``, the
"lowbias32" integer finaliser, applied in a fixed chain over seed low/high words, position and
token id) mapped to the open interval (0, 1); Gumbel noise is ``-log(-log(u))``. The chain is
frozen by reference vectors in ``tests/unit/test_seeded_sampling.py``: changing it changes every
sampled token of every benchmark.

**Two-stage Gumbel-max.** Hashing the whole vocabulary for every row at every step would cost a
large share of a CPU decode step, so the draw is exact but hierarchical: token ids are
cut into fixed blocks of ``BLOCK`` ids; stage 1 picks a block by Gumbel-max over the log of each
block's probability mass (noise keyed by the block), stage 2 picks a token inside it by Gumbel-max
over log-probabilities (noise keyed by the token id). P(block) * P(token | block) = p(token), so
the draw follows the filtered distribution exactly, with ``num_blocks + BLOCK`` hashes per row.

**Filters** are applied per row and by value, never by sort position, so ties cannot depend on
batch shape: top-k keeps probabilities >= the row's k-th largest, top-p keeps the smallest set of
largest probabilities whose mass reaches p (by the threshold value), min-p keeps p >= min_p * max.
Rows with ``top_k == 1`` (SGLang's form of greedy) take the argmax.
"""

from __future__ import annotations

import functools

import torch

MASK32 = 0xFFFFFFFF
BLOCK = 1024  # token ids per stage-1 block
_GOLDEN = 0x9E3779B9
_POSITION_SALT = 0x85EBCA6B
_TOKEN_SALT = 0xC2B2AE35
_BLOCK_SALT = 0x27D4EB2F


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding 32-bit values; returns 32-bit values (int64)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Per row, a 32-bit key of (seed, absolute position). ``seeds``: [rows] int64 (any value,
    negative ones by two's complement), ``positions``: [rows] int; returns [rows] int64."""
    seeds = seeds.to(torch.int64)
    low, high = seeds & MASK32, (seeds >> 32) & MASK32
    key = mix32(mix32(low ^ _GOLDEN) ^ high)
    return mix32(key ^ ((positions.to(torch.int64) * _POSITION_SALT + 1) & MASK32))


@functools.lru_cache(maxsize=8)
def _id_codes(num_ids: int, salt: int, device: torch.device) -> torch.Tensor:
    """``mix32(id * golden ^ salt)`` for ids 0..num_ids-1: the per-id half of the hash, made once
    per (id space, salt, device): the vocabulary's token ids, or its blocks."""
    ids = torch.arange(num_ids, dtype=torch.int64, device=device)
    return mix32(((ids * _GOLDEN) & MASK32) ^ salt)


def uniforms(keys: torch.Tensor, ids: torch.Tensor, num_ids: int, salt: int = _TOKEN_SALT) -> torch.Tensor:
    """u in (0, 1), float64, for every (row key, id): ``keys`` [rows], ``ids`` [rows, k] or [k],
    every id in ``[0, num_ids)``."""
    codes = _id_codes(num_ids, salt, ids.device)[ids]
    bits = mix32(keys.view(-1, 1) ^ codes)
    return (bits.to(torch.float64) + 0.5) * (1.0 / 2**32)


def gumbel(u: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(u))


def filter_probs(probs: torch.Tensor, top_ks: torch.Tensor | None, top_ps: torch.Tensor | None,
                 min_ps: torch.Tensor | None) -> torch.Tensor:
    """``probs`` [rows, vocab] with every filtered-out token set to 0 (a new tensor when a filter
    applies; ``probs`` itself, untouched, when none does). ``top_ks`` <= 0 or >= vocab, ``top_ps``
    >= 1 and ``min_ps`` <= 0 mean "no filter" for that row."""
    rows, vocab = probs.shape
    keep_min = probs.new_zeros(rows)
    if top_ks is not None:
        k = top_ks.to(torch.int64)
        active = (k > 0) & (k < vocab)
        if bool(active.any()):
            k_max = int(k[active].max())
            top = torch.topk(probs[active], k_max, dim=-1).values  # [active, k_max], descending
            kth = top.gather(1, (k[active] - 1).view(-1, 1)).view(-1)
            keep_min[active] = torch.maximum(keep_min[active], kth)
    if top_ps is not None:
        active = top_ps < 1.0
        if bool(active.any()):
            ordered = torch.sort(probs[active], dim=-1, descending=True).values
            before = torch.cumsum(ordered, dim=-1) - ordered  # mass strictly above each one
            kept = before <= top_ps[active].view(-1, 1).to(ordered.dtype)  # SGLang's rule
            last = kept.sum(-1).clamp(min=1) - 1
            threshold = ordered.gather(1, last.view(-1, 1)).view(-1)
            keep_min[active] = torch.maximum(keep_min[active], threshold)
    if min_ps is not None:
        active = min_ps > 0
        if bool(active.any()):
            floor = probs[active].max(-1).values * min_ps[active].to(probs.dtype)
            keep_min[active] = torch.maximum(keep_min[active], floor)
    if not bool((keep_min > 0).any()):
        return probs
    return probs.masked_fill(probs < keep_min.view(-1, 1), 0.0)


def sample(probs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, *,
           top_ks: torch.Tensor | None = None, top_ps: torch.Tensor | None = None,
           min_ps: torch.Tensor | None = None, return_scores: bool = False):
    """One token id per row of ``probs`` [rows, vocab] (softmax of logits / temperature).

    ``seeds`` [rows] int64, ``positions`` [rows] (absolute position of the last input token).
    Returns int64 token ids [rows]; with ``return_scores``, also the winning and runner-up
    perturbed scores of each row's deciding stage (float64 [rows, 2]), which tell how close a
    draw was to flipping (tests compare draws across batch shapes with them).
    """
    rows, vocab = probs.shape
    greedy = top_ks is not None and bool((top_ks == 1).any())
    filtered = filter_probs(probs, top_ks, top_ps, min_ps)
    keys = row_keys(seeds, positions)
    num_blocks = -(-vocab // BLOCK)
    padded = filtered if num_blocks * BLOCK == vocab else torch.nn.functional.pad(filtered, (0, num_blocks * BLOCK - vocab))
    blocks = padded.view(rows, num_blocks, BLOCK)
    device = probs.device
    block_ids = torch.arange(num_blocks, device=device)
    block_noise = gumbel(uniforms(keys, block_ids, num_blocks, _BLOCK_SALT))
    block_scores = torch.log(blocks.sum(-1).to(torch.float64)) + block_noise
    chosen = block_scores.argmax(-1)  # [rows]
    in_block = blocks[torch.arange(rows, device=device), chosen]  # [rows, BLOCK]
    token_ids = chosen.view(-1, 1) * BLOCK + torch.arange(BLOCK, device=device).view(1, -1)
    token_noise = gumbel(uniforms(keys, token_ids.clamp(max=vocab - 1), vocab))
    token_scores = torch.log(in_block.to(torch.float64)) + token_noise
    token_scores = token_scores.masked_fill(token_ids >= vocab, float("-inf"))
    tokens = token_ids.gather(1, token_scores.argmax(-1, keepdim=True)).view(-1)
    if greedy:
        tokens = torch.where(top_ks.to(torch.int64) == 1, probs.argmax(-1), tokens)
    if not return_scores:
        return tokens
    return tokens, torch.stack([_margin(block_scores), _margin(token_scores)], dim=1)


def _margin(scores: torch.Tensor) -> torch.Tensor:
    """Per row, best minus second-best perturbed score (inf when only one candidate)."""
    top = torch.topk(scores, min(2, scores.shape[-1]), dim=-1).values
    return top[:, 0] - top[:, 1] if top.shape[-1] > 1 else torch.full_like(top[:, 0], float("inf"))
