"""ASKS blend's selection (which reused tokens to recompute) and K re-rotation, against SGLang's
own RoPE (``radix_ext.asks.selection``)."""

from __future__ import annotations

import math

import pytest
import torch

from radix_ext.asks.segments import Segment
from radix_ext.asks.selection import deviations, pure_rotation, rerotate, rotation_tables, select


class TestSelection:
    SEGMENTS = [Segment(10, torch.arange(10), 0), Segment(30, torch.arange(4), 0)]

    def test_no_share_recomputes_nothing_and_all_recomputes_everything(self):
        assert not select(self.SEGMENTS, 0.0, "leading").any()
        assert select(self.SEGMENTS, 1.0, "deviation", torch.rand(14)).all()

    def test_leading_takes_the_first_tokens_of_each_segment(self):
        chosen = select(self.SEGMENTS, 0.25, "leading")
        assert chosen.nonzero().squeeze(1).tolist() == [0, 1, 2, 10]  # ceil(2.5), ceil(1.0)

    def test_deviation_takes_the_tokens_that_moved_most(self):
        scores = torch.zeros(14)
        scores[[3, 12]] = torch.tensor([5.0, 9.0])
        assert select(self.SEGMENTS, 0.1, "deviation", scores, lead=0).nonzero().squeeze(1).tolist() == [3, 12]

    def test_deviation_recomputes_each_segments_lead_first_then_what_moved_most(self):
        scores = torch.zeros(14)
        scores[[1, 7, 10, 12]] = torch.tensor([0.5, 50.0, 2.0, 9.0])
        chosen = select(self.SEGMENTS, 0.4, "deviation", scores, lead=2)  # ceil(5.6) = 6 of 14
        assert chosen.nonzero().squeeze(1).tolist() == [0, 1, 7, 10, 11, 12]
        # within a budget smaller than the leads, the leads rank among themselves by deviation
        assert select(self.SEGMENTS, 0.1, "deviation", scores, lead=2).nonzero().squeeze(1).tolist() == [1, 10]

    def test_deviation_weighs_v_and_k_by_their_own_scale(self):
        own_k, own_v = torch.zeros(4, 2, 8), torch.zeros(4, 2, 8)
        donor_k, donor_v = own_k.clone(), own_v.clone()
        donor_v[0] += 1000.0  # V moved far on token 0, K moved a little on token 2 and 3
        donor_k[2] += 1.0
        donor_k[3] += 2.0
        scores = deviations(own_k, own_v, donor_k, donor_v)[0]
        assert scores.argmax().item() == 0 and scores[3] > scores[2] > scores[1] == 0
        assert torch.allclose(scores, deviations(own_k * 10, own_v, donor_k * 10, donor_v)[0])  # K's scale cancels
        assert torch.isfinite(deviations(own_k, own_v, own_k, own_v)[0]).all()  # identical KV: zeros, no NaN


    def test_the_gate_adds_every_token_past_it_beyond_the_share(self):
        scores = torch.zeros(14)
        scores[12] = 9.0
        relative = torch.full((14,), 0.01)
        relative[[3, 5]] = torch.tensor([0.2, 0.11])
        chosen = select(self.SEGMENTS, 0.05, "deviation", scores, lead=0, relative=relative, max_deviation=0.1)
        assert chosen.nonzero().squeeze(1).tolist() == [3, 5, 12]  # ceil(0.7) = 1 by rank, 2 past the gate
        # an infinite gate is the share alone; a gate nothing passes adds nothing
        for gate in (math.inf, 0.5):
            assert select(self.SEGMENTS, 0.05, "deviation", scores, lead=0, relative=relative,
                          max_deviation=gate).nonzero().squeeze(1).tolist() == [12]

    def test_relative_deviation_reads_each_tokens_kv_in_its_own_scale(self):
        own_k, own_v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
        donor_k, donor_v = own_k.clone(), own_v.clone()
        donor_v[1] += 0.1 * own_v[1]  # V off by a tenth of its norm
        donor_k[2] -= 0.3 * own_k[2]  # K off by three tenths
        rel = deviations(own_k, own_v, donor_k, donor_v)[1]
        assert torch.allclose(rel, torch.tensor([0.0, 0.1, 0.3]), atol=1e-5)
        scaled = deviations(own_k * 7, own_v * 0.01, donor_k * 7, donor_v * 0.01)[1]
        assert torch.allclose(rel, scaled, atol=1e-5)  # the threshold reads alike at any scale
        assert torch.isfinite(deviations(own_k * 0, own_v * 0, own_k * 0, own_v * 0)[1]).all()


def sglang_rope(base: float = 100000.0):
    """SGLang's RotaryEmbedding as the CPU engine builds it (its module reads is_cpu() at import;
    the scheduler has SGLANG_USE_CPU_ENGINE=1 by then, a test process need not)."""
    from sglang.srt.layers.rotary_embedding import base as rope_module

    saved, rope_module._is_cpu = rope_module._is_cpu, True
    try:
        return rope_module.RotaryEmbedding(head_size=64, rotary_dim=64, max_position_embeddings=2048, base=base,
                                           is_neox_style=True, dtype=torch.float32)
    finally:
        rope_module._is_cpu = saved



class TestRerotation:
    @pytest.mark.parametrize("delta", [37, -21, 0])
    def test_a_key_rotated_at_p_moves_to_p_plus_delta(self, delta):
        rope = sglang_rope()
        raw = torch.randn(6, 3 * 64)
        positions = torch.arange(100, 106)
        _, at_p = rope.forward_native(positions, raw.clone(), raw.clone())
        _, at_moved = rope.forward_native(positions + delta, raw.clone(), raw.clone())
        moved = rerotate(at_p.view(6, 3, 64), torch.full((6,), delta), rope)
        torch.testing.assert_close(moved, at_moved.view(6, 3, 64), atol=2e-5, rtol=1e-5)

    def test_the_fused_rotation_is_the_torch_one_bit_for_bit(self, monkeypatch):
        from radix_ext.asks import selection
        from radix_ext.cpu import kernels

        if kernels.unsupported():
            pytest.skip(f"CPU kernels: {kernels.unsupported()}")
        rope = sglang_rope()
        kernels.amx_rows()  # loads the library: a blended request never builds it itself
        assert selection._rope_neox() is kernels.rope_neox
        keys, deltas = torch.randn(40, 3, 64) * 3, torch.randint(-300, 300, (40,))
        fused = selection.rerotation(deltas, rope)(keys)
        monkeypatch.setattr(selection, "_rope_neox", lambda: None)
        assert torch.equal(fused, selection.rerotation(deltas, rope)(keys))
        assert selection.rerotation(deltas[:0], rope)(keys[:0]).shape == (0, 3, 64)

    def test_a_wrong_delta_is_far_off(self):
        rope = sglang_rope()
        raw = torch.randn(4, 64)
        _, at_p = rope.forward_native(torch.arange(4), raw.clone(), raw.clone())
        _, at_moved = rope.forward_native(torch.arange(4) + 50, raw.clone(), raw.clone())
        assert (rerotate(at_p.view(4, 1, 64), torch.full((4,), 49), rope) - at_moved.view(4, 1, 64)).abs().max() > 1e-2

    def test_only_pure_rotation_tables_qualify(self):
        rope = sglang_rope()
        assert pure_rotation(rope)
        rope.cos_sin_cache = rope.cos_sin_cache * 1.2  # a YaRN-style mscale
        assert not pure_rotation(rope)


class TestDonorKv:
    """``write_donor_kv``: every layer in one C++ call, or per layer in torch; the same bits."""

    @staticmethod
    def pool_and_stack(rope, layers=4, slots=64):
        from types import SimpleNamespace as NS

        buffers = [(torch.randn(slots, 3, 64), torch.randn(slots, 3, 64)) for _ in range(layers)]
        pool = NS(get_key_buffer=lambda i: buffers[i][0], get_value_buffer=lambda i: buffers[i][1])
        stack = NS(layers=[NS(self_attn=NS(attn=NS(layer_id=i), rotary_emb=rope)) for i in range(layers)])
        return pool, stack, buffers

    def test_one_call_is_the_per_layer_copy_bit_for_bit(self, monkeypatch):
        from radix_ext.asks import kv_writes
        from radix_ext.cpu import kernels

        if kernels.unsupported():
            pytest.skip(f"CPU kernels: {kernels.unsupported()}")
        kernels.amx_rows()  # loads the library
        rope = sglang_rope()
        own, donors = torch.arange(40, 60), torch.randperm(40)[:20]
        deltas = torch.randint(-300, 300, (20,))
        results, calls = [], []
        for one_call in (True, False):
            torch.manual_seed(3)
            pool, stack, buffers = self.pool_and_stack(rope)
            before = [(k.clone(), v.clone()) for k, v in buffers]
            monkeypatch.setattr(kv_writes, "_one_call", lambda *a, one=one_call: one)
            monkeypatch.setattr(kernels, "donor_kv", lambda *a, f=kernels.donor_kv: (calls.append(1), f(*a)))
            kv_writes.write_donor_kv(pool, stack, [1, 2, 3], own, donors, deltas)
            results.append(buffers)
            k0, v0 = buffers[0]
            assert torch.equal(k0, before[0][0]) and torch.equal(v0, before[0][1])  # layer 0 not asked for
            untouched = torch.ones(64, dtype=torch.bool)
            untouched[own] = False
            for (k, v), (k_was, v_was) in zip(buffers, before):
                assert torch.equal(k[untouched], k_was[untouched]) and torch.equal(v[untouched], v_was[untouched])
        assert calls == [1]
        for (k1, v1), (k2, v2) in zip(*results):
            assert torch.equal(k1, k2) and torch.equal(v1, v2)
        k2, v2 = results[0][2]
        assert torch.equal(k2[own], rerotate(k2[donors], deltas, rope)) and torch.equal(v2[own], v2[donors])

    def test_the_kernel_refuses_aliased_out_of_range_and_mismatched_slots(self):
        from radix_ext.cpu import kernels

        if kernels.unsupported():
            pytest.skip(f"CPU kernels: {kernels.unsupported()}")
        rope = sglang_rope()
        _, _, buffers = self.pool_and_stack(rope, layers=1)
        (k, v), cos_sin = buffers[0], rotation_tables(torch.tensor([1, 2]), rope)
        with pytest.raises(RuntimeError, match="donor slot 5 is also written"):
            kernels.donor_kv([k], [v], torch.tensor([5, 6]), torch.tensor([7, 5]), *cos_sin)
        with pytest.raises(RuntimeError, match="slot out of range"):
            kernels.donor_kv([k], [v], torch.tensor([5, 6]), torch.tensor([7, 64]), *cos_sin)
        with pytest.raises(RuntimeError, match="K and V buffers"):
            kernels.donor_kv([k], [v[:32]], torch.tensor([5, 6]), torch.tensor([7, 8]), *cos_sin)
