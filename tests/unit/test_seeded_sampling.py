"""Seeded Gumbel-max sampling (``radix_ext.sampling.seeded``): the hash, the distribution, and
batch invariance, on tensors (no engine)."""

from __future__ import annotations

import math

import pytest
import torch

from radix_ext.sampling import seeded as ss

M = 0xFFFFFFFF


def mix32_reference(x: int) -> int:
    """lowbias32 in plain Python integers: the specification the torch version must match."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M
    x ^= x >> 15
    x = (x * 0x846CA68B) & M
    return x ^ (x >> 16)


def key_reference(seed: int, position: int) -> int:
    seed &= 2**64 - 1
    low, high = seed & M, seed >> 32
    key = mix32_reference(mix32_reference(low ^ 0x9E3779B9) ^ high)
    return mix32_reference(key ^ ((position * 0x85EBCA6B + 1) & M))


def uniform_reference(seed: int, position: int, token: int) -> float:
    code = mix32_reference(((token * 0x9E3779B9) & M) ^ 0xC2B2AE35)
    return (mix32_reference(key_reference(seed, position) ^ code) + 0.5) / 2**32


def probs_of(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    return torch.softmax(logits / temperature, dim=-1)


class TestHash:
    # Frozen: changing these changes every sampled token of every benchmark run.
    REFERENCE = {0: 0, 1: 0x688990C0, 0xDEADBEEF: 0xE628C683, 123456789: 0xA8F1DB88}
    # (seed, position) -> row key, through the whole chain.
    KEYS = {(0, 0): 3002921059, (1, 5): 742033679, (-1, 7): 450567140, (2**40, 100): 3639314752}

    def test_mix32_matches_frozen_reference_vectors(self):
        for x, expected in self.REFERENCE.items():
            assert mix32_reference(x) == expected
            assert int(ss.mix32(torch.tensor([x], dtype=torch.int64))) == expected
        for (seed, position), expected in self.KEYS.items():
            assert key_reference(seed, position) == expected
            assert int(ss.row_keys(torch.tensor([seed]), torch.tensor([position]))) == expected

    def test_torch_hash_matches_the_python_reference_on_random_inputs(self):
        g = torch.Generator().manual_seed(1)
        seeds = torch.randint(-(2**62), 2**62, (200,), generator=g)
        positions = torch.randint(0, 100_000, (200,), generator=g)
        tokens = torch.randint(0, 50_000, (200, 3), generator=g)
        keys = ss.row_keys(seeds, positions)
        u = ss.uniforms(keys, tokens, 50_000)
        for i in range(200):
            assert int(keys[i]) == key_reference(int(seeds[i]), int(positions[i]))
            for j in range(3):
                assert float(u[i, j]) == uniform_reference(int(seeds[i]), int(positions[i]), int(tokens[i, j]))

    def test_uniforms_lie_strictly_inside_zero_one(self):
        keys = ss.row_keys(torch.arange(64), torch.arange(64))
        u = ss.uniforms(keys, torch.arange(4096), 4096)
        assert float(u.min()) > 0.0 and float(u.max()) < 1.0
        assert abs(float(u.mean()) - 0.5) < 0.01


class TestDistribution:
    def _draw(self, probs_row: torch.Tensor, n: int, **filters) -> torch.Tensor:
        probs = probs_row.expand(n, -1).contiguous()
        return ss.sample(probs, torch.full((n,), 7), torch.arange(n), **filters)

    @pytest.mark.parametrize("vocab", [50, 3000])  # one block; several blocks plus a partial one
    def test_draws_follow_softmax_of_logits_over_temperature(self, vocab):
        g = torch.Generator().manual_seed(vocab)
        logits = torch.randn(vocab, generator=g) * 2
        logits[:10] += 4  # a few likely tokens, spread over blocks below
        logits = logits[torch.randperm(vocab, generator=g)]
        expected = probs_of(logits, 0.7)
        n = 40_000
        counts = torch.bincount(self._draw(expected.view(1, -1), n), minlength=vocab).double()
        # Chi-square over the tokens with expected count >= 5, the rest pooled into one cell.
        big = expected * n >= 5
        observed = torch.cat([counts[big], counts[~big].sum().view(1)])
        wanted = torch.cat([expected[big].double() * n, (expected[~big].double().sum() * n).view(1)])
        if wanted[-1] < 5:
            observed, wanted = observed[:-1], wanted[:-1]
        chi2 = float(((observed - wanted) ** 2 / wanted).sum())
        df = observed.numel() - 1
        z = 3.09  # one-sided 0.999 quantile of N(0, 1); Wilson-Hilferty approximation of chi2
        critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
        assert chi2 < critical, (chi2, critical, df)

    def test_top_k_keeps_only_the_k_most_likely_tokens_in_proportion(self):
        probs = probs_of(torch.tensor([3.0, 2.5, 2.0, 1.0, 0.5, 0.0]))
        draws = self._draw(probs.view(1, -1), 20_000, top_ks=torch.full((20_000,), 2))
        assert set(draws.tolist()) == {0, 1}
        ratio = float((draws == 0).sum() / (draws == 1).sum())
        assert abs(ratio - math.exp(0.5)) < 0.1

    def test_top_p_keeps_the_smallest_set_reaching_p(self):
        probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
        draws = self._draw(probs.view(1, -1), 5_000, top_ps=torch.full((5_000,), 0.7))
        assert set(draws.tolist()) == {0, 1}  # 0.5 < 0.7, 0.5 + 0.3 >= 0.7

    def test_min_p_drops_tokens_below_a_fraction_of_the_best(self):
        probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
        draws = self._draw(probs.view(1, -1), 5_000, min_ps=torch.full((5_000,), 0.25))
        assert set(draws.tolist()) == {0, 1, 2}

    def test_greedy_rows_take_the_argmax_whatever_the_seed(self):
        probs = probs_of(torch.randn(64, 3000, generator=torch.Generator().manual_seed(3)))
        tokens = ss.sample(probs, torch.arange(64), torch.arange(64), top_ks=torch.ones(64, dtype=torch.int32))
        assert torch.equal(tokens, probs.argmax(-1))

    def test_same_seed_and_position_repeat_and_different_seeds_differ(self):
        probs = probs_of(torch.zeros(8, 5000))  # uniform: every draw is up to the noise
        a = ss.sample(probs, torch.full((8,), 11), torch.arange(8))
        assert torch.equal(a, ss.sample(probs, torch.full((8,), 11), torch.arange(8)))
        assert not torch.equal(a, ss.sample(probs, torch.full((8,), 12), torch.arange(8)))
        assert not torch.equal(a, ss.sample(probs, torch.full((8,), 11), torch.arange(8) + 1))


class TestBatchInvariance:
    def test_a_row_alone_and_in_a_mixed_batch_of_8_draws_the_same_token(self):
        """500 (seed, position) pairs; neighbours greedy, top-k, top-p, min-p, other temperatures."""
        g = torch.Generator().manual_seed(0)
        vocab = 49152
        target_logits = torch.randn(vocab, generator=g) * 3
        neighbours = torch.randn(7, vocab, generator=g) * 3
        temperatures = torch.tensor([0.7, 1.0, 0.3, 1.3, 1.0, 0.9, 0.5, 1.0]).view(-1, 1)
        top_ks = torch.tensor([-1, 1, 40, -1, -1, 5, -1, 1], dtype=torch.int32)
        top_ps = torch.tensor([1.0, 1.0, 1.0, 0.9, 0.5, 1.0, 0.95, 1.0])
        min_ps = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 0.05, 0.0])
        batch_logits = torch.cat([target_logits.view(1, -1), neighbours])
        differing = 0
        for pair in range(500):
            seed, position = 1000 + pair * 7919, pair * 13 + 5
            alone = ss.sample(probs_of(target_logits.view(1, -1), 0.7), torch.tensor([seed]), torch.tensor([position]))
            seeds = torch.tensor([seed] + [pair * 31 + i for i in range(7)])
            positions = torch.tensor([position] + [position + i for i in range(1, 8)])
            perm = torch.randperm(8, generator=g)  # the target row at a random index
            batch = ss.sample(probs_of(batch_logits[perm], temperatures[perm]), seeds[perm], positions[perm],
                              top_ks=top_ks[perm], top_ps=top_ps[perm], min_ps=min_ps[perm])
            row = int((perm == 0).nonzero())
            differing += int(batch[row] != alone[0])
        assert differing == 0

    def test_softmax_of_a_row_does_not_depend_on_its_batch(self):
        g = torch.Generator().manual_seed(5)
        logits = torch.randn(8, 49152, generator=g) * 3
        together = torch.softmax(logits / 0.7, dim=-1)
        for i in range(8):
            assert torch.equal(together[i], torch.softmax(logits[i:i + 1] / 0.7, dim=-1)[0])

    def test_margins_are_reported_per_row_and_positive(self):
        probs = probs_of(torch.randn(4, 3000, generator=torch.Generator().manual_seed(9)))
        tokens, margins = ss.sample(probs, torch.arange(4), torch.arange(4), return_scores=True)
        assert tokens.shape == (4,) and margins.shape == (4, 2)
        assert bool((margins > 0).all())
