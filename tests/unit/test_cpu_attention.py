"""The CPU fast path on tensors: batched decode attention (``radix_ext.cpu.attention``), the thread
policy and the oneDNN linears (``radix_ext.cpu.speed``).

References: a float64 softmax(q k^T) v per request, and SGLang's own ``torch_native`` decode loop
(``TestSGLangContract``: if stock's routine changes underneath, the comparison says so).
"""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

from radix_ext.cpu import attention as cpu_attention, kernels
from radix_ext.cpu.attention import (BACKEND_NAME, DecodeSlots, QueryRows, RkscCpuAttnBackend,
                                     batched_decode_attention)
from radix_ext.cpu.speed import LARGE_TOKENS_ENV, ONEDNN_ENV, THREADS_ENV, ThreadPolicy, use_packed_linears

HEAD_DIM = 64
POOL_SLOTS = 20000  # room for 32 requests of up to MAX_CONTEXT tokens
MAX_CONTEXT = 512


def make_batch(seq_lens, q_heads=9, kv_heads=3, seed=0, dtype=torch.float32):
    """Random pool, queries and a req_to_token table whose rows use scattered, disjoint slots."""
    g = torch.Generator().manual_seed(seed)
    k_buffer = torch.randn(POOL_SLOTS, kv_heads, HEAD_DIM, generator=g, dtype=dtype)
    v_buffer = torch.randn(POOL_SLOTS, kv_heads, HEAD_DIM, generator=g, dtype=dtype)
    query = torch.randn(len(seq_lens), q_heads, HEAD_DIM, generator=g, dtype=dtype)
    req_to_token = torch.zeros(len(seq_lens) + 2, MAX_CONTEXT, dtype=torch.int32)
    free = torch.randperm(POOL_SLOTS - 1, generator=g) + 1  # slot 0 is SGLang's padding slot
    req_pool_indices = torch.arange(2, len(seq_lens) + 2)  # not 0..B-1: rows are looked up
    start = 0
    for row, n in zip(req_pool_indices.tolist(), seq_lens):
        req_to_token[row, :n] = free[start:start + n].to(torch.int32)
        start += n
    return types.SimpleNamespace(
        query=query, k_buffer=k_buffer, v_buffer=v_buffer, req_to_token=req_to_token,
        req_pool_indices=req_pool_indices, seq_lens=torch.tensor(seq_lens), scale=HEAD_DIM**-0.5,
    )


def float64_reference(b) -> torch.Tensor:
    outs = []
    groups = b.query.shape[1] // b.k_buffer.shape[1]
    for i, n in enumerate(b.seq_lens.tolist()):
        slots = b.req_to_token[b.req_pool_indices[i], :n].long()
        keys = b.k_buffer[slots].double().repeat_interleave(groups, dim=1)  # [n, q_heads, dim]
        values = b.v_buffer[slots].double().repeat_interleave(groups, dim=1)
        scores = torch.einsum("hd,nhd->hn", b.query[i].double(), keys) * b.scale
        outs.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), values))
    return torch.stack(outs)


def stock_torch_native(b) -> torch.Tensor:
    out = torch.empty_like(b.query)
    stock = types.SimpleNamespace(_make_sliding_window_mask=TorchNativeAttnBackend._make_sliding_window_mask)
    TorchNativeAttnBackend._run_sdpa_forward_decode(
        stock, b.query, out, b.k_buffer, b.v_buffer, b.req_to_token, b.req_pool_indices, b.seq_lens,
        scaling=b.scale, enable_gqa=b.query.shape[1] != b.k_buffer.shape[1],
    )
    return out


def run_batched(b) -> torch.Tensor:
    slots = DecodeSlots.build(b.req_to_token, b.req_pool_indices, b.seq_lens)
    return batched_decode_attention(b.query, b.k_buffer, b.v_buffer, slots, scale=b.scale)


class TestBatchedDecodeAttention:
    @pytest.mark.parametrize("seq_lens", [[1], [37], [5, 300, 17, 64, 1, 129, 128, 2], [200] * 4])
    def test_matches_float64_reference(self, seq_lens):
        b = make_batch(seq_lens)
        torch.testing.assert_close(run_batched(b).double(), float64_reference(b), atol=2e-6, rtol=1e-5)

    @pytest.mark.parametrize("seed", range(5))
    def test_matches_stock_torch_native_within_float_rounding(self, seed):
        g = torch.Generator().manual_seed(100 + seed)
        seq_lens = torch.randint(1, MAX_CONTEXT, (int(torch.randint(1, 33, (1,), generator=g)),), generator=g)
        b = make_batch(seq_lens.tolist(), seed=seed)
        torch.testing.assert_close(run_batched(b), stock_torch_native(b), atol=1e-6, rtol=1e-5)

    def test_one_request_is_bit_identical_to_stock(self):
        b = make_batch([213])
        assert torch.equal(run_batched(b), stock_torch_native(b))

    def test_multi_head_attention_without_grouping(self):
        b = make_batch([3, 40, 9], q_heads=4, kv_heads=4)
        torch.testing.assert_close(run_batched(b).double(), float64_reference(b), atol=2e-6, rtol=1e-5)

    def test_padding_never_reads_unwritten_slots(self):
        b = make_batch([4, 50, 7])
        used = b.req_to_token[b.req_pool_indices].long().flatten()
        poisoned = torch.full((POOL_SLOTS,), True)
        poisoned[used[used > 0]] = False
        b.k_buffer[poisoned] = float("nan")  # stale/unwritten slots, slot 0 included
        b.v_buffer[poisoned] = float("nan")
        out = run_batched(b)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), float64_reference(b), atol=2e-6, rtol=1e-5)


def make_extend_batch(prefix_lens, extend_lens, seed=0):
    """A decode-style batch whose requests have ``prefix + extend`` cached slots, and the queries
    of the ``extend`` new tokens of each, concatenated: [num_tokens, q_heads, dim]."""
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    b = make_batch(seq_lens, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    b.query = torch.randn(sum(extend_lens), b.query.shape[1], HEAD_DIM, generator=g)
    b.prefix_lens, b.extend_lens = torch.tensor(prefix_lens), torch.tensor(extend_lens)
    return b


def extend_float64_reference(b) -> torch.Tensor:
    groups = b.query.shape[1] // b.k_buffer.shape[1]
    outs, start = [], 0
    for i, (prefix, extend) in enumerate(zip(b.prefix_lens.tolist(), b.extend_lens.tolist())):
        slots = b.req_to_token[b.req_pool_indices[i], :prefix + extend].long()
        keys = b.k_buffer[slots].double().repeat_interleave(groups, dim=1)
        values = b.v_buffer[slots].double().repeat_interleave(groups, dim=1)
        for j in range(extend):
            visible = prefix + j + 1
            scores = torch.einsum("hd,nhd->hn", b.query[start + j].double(), keys[:visible]) * b.scale
            outs.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), values[:visible]))
        start += extend
    return torch.stack(outs)


def run_extend(b, backend_class) -> torch.Tensor:
    backend = object.__new__(backend_class)  # the loop reads no instance state
    out = torch.empty_like(b.query)
    return backend._run_sdpa_forward_extend(
        b.query, out, b.k_buffer, b.v_buffer, b.req_to_token, b.req_pool_indices, b.seq_lens,
        b.prefix_lens, b.extend_lens, scaling=b.scale, enable_gqa=True, causal=True,
    )


class TestExtendAttention:
    # Fresh prompts, one new token, and short (masked) and long (padded causal) extends.
    CASES = [([0], [7]), ([30], [1]), ([0, 120, 5, 0, 250], [1, 5, 40, 33, 3]), ([2, 64], [200, 65])]

    @pytest.mark.parametrize("prefix_lens,extend_lens", CASES)
    def test_matches_float64_reference(self, prefix_lens, extend_lens):
        b = make_extend_batch(prefix_lens, extend_lens)
        got = run_extend(b, RkscCpuAttnBackend).double()
        torch.testing.assert_close(got, extend_float64_reference(b), atol=2e-6, rtol=1e-5)

    @pytest.mark.parametrize("prefix_lens,extend_lens", CASES)
    def test_matches_stock_extend_within_float_rounding(self, prefix_lens, extend_lens):
        b = make_extend_batch(prefix_lens, extend_lens)
        torch.testing.assert_close(
            run_extend(b, RkscCpuAttnBackend), run_extend(b, TorchNativeAttnBackend), atol=1e-6, rtol=1e-5
        )

    def test_fresh_prompt_is_bit_identical_to_stock(self):
        b = make_extend_batch([0], [300])
        assert torch.equal(run_extend(b, RkscCpuAttnBackend), run_extend(b, TorchNativeAttnBackend))

    def test_extend_longer_than_its_prefix_is_bit_identical_to_stock(self):
        b = make_extend_batch([3], [300])
        assert torch.equal(run_extend(b, RkscCpuAttnBackend), run_extend(b, TorchNativeAttnBackend))

    @pytest.mark.parametrize("prefix_len,extend_len,kernel",
                             [(3, 300, "causal"), (149, 151, "causal"), (150, 150, "mask")])
    def test_an_extend_takes_the_kernel_with_fewer_scores(self, monkeypatch, prefix_len, extend_len, kernel):
        calls = []
        sdpa = F.scaled_dot_product_attention
        monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(kw) or sdpa(*a, **kw))
        run_extend(make_extend_batch([prefix_len], [extend_len]), RkscCpuAttnBackend)
        kernels = ["mask" if kw["attn_mask"] is not None else "causal" if kw["is_causal"] else "none" for kw in calls]
        assert kernels == [kernel]


class TestDecodeSlots:
    def test_equal_lengths_need_no_mask(self):
        b = make_batch([16, 16, 16])
        slots = DecodeSlots.build(b.req_to_token, b.req_pool_indices, b.seq_lens)
        assert slots.mask is None and (slots.batch_size, slots.max_len) == (3, 16)

    def test_short_requests_are_padded_with_their_own_first_slot(self):
        b = make_batch([2, 5])
        slots = DecodeSlots.build(b.req_to_token, b.req_pool_indices, b.seq_lens)
        first_row = slots.flat.view(2, 5)[0]
        own_first = int(b.req_to_token[b.req_pool_indices[0], 0])
        assert first_row[2:].tolist() == [own_first] * 3
        assert slots.mask.shape == (2, 1, 1, 5)
        assert slots.mask[:, 0, 0].tolist() == [[True, True, False, False, False], [True] * 5]


class TestThreadPolicy:
    def test_every_forward_uses_torchs_count_by_default(self):
        policy = ThreadPolicy(default_threads=2)
        assert [policy.threads_for(n) for n in (1, 8, 2000)] == [2, 2, 2]

    def test_a_fixed_count_applies_to_every_forward(self):
        policy = ThreadPolicy(threads=1, default_threads=2)
        assert [policy.threads_for(n) for n in (1, 8, 2000)] == [1, 1, 1]

    def test_large_forwards_can_get_the_default_count(self):
        policy = ThreadPolicy(threads=1, large_forward_tokens=256, default_threads=2)
        assert [policy.threads_for(n) for n in (1, 256, 257, 2000)] == [1, 1, 2, 2]

    def test_zero_threads_means_torch_default(self):
        assert ThreadPolicy(threads=0, default_threads=2).threads_for(1) == 2

    def test_apply_sets_torch_threads(self):
        before = torch.get_num_threads()
        try:
            torch.set_num_threads(2)
            ThreadPolicy(threads=1).apply(4)
            assert torch.get_num_threads() == 1
            ThreadPolicy(threads=0, default_threads=2).apply(4)
            assert torch.get_num_threads() == 2
        finally:
            torch.set_num_threads(before)

    def test_environment_overrides_defaults(self, monkeypatch):
        monkeypatch.setenv(THREADS_ENV, "2")
        monkeypatch.setenv(LARGE_TOKENS_ENV, "512")
        policy = ThreadPolicy.from_env()
        assert (policy.threads, policy.large_forward_tokens) == (2, 512)

    @pytest.mark.parametrize("env,value", [(THREADS_ENV, "many"), (THREADS_ENV, "-1"), (LARGE_TOKENS_ENV, "-5")])
    def test_bad_environment_value_names_the_variable(self, monkeypatch, env, value):
        monkeypatch.setenv(env, value)
        with pytest.raises(ValueError, match=env):
            ThreadPolicy.from_env()


def causal(b, req_pool_indices, counts, positions) -> torch.Tensor:
    """``kernels.causal_attention`` of ``b.query`` rows: ``counts`` rows per request, at ``positions``."""
    rows = QueryRows.of(req_pool_indices, counts, torch.as_tensor(positions))
    return kernels.causal_attention(b.query, b.k_buffer, b.v_buffer, b.req_to_token, rows.req_rows, rows.offsets,
                                    rows.positions, b.scale)


@pytest.mark.skipif(kernels.unsupported() is not None, reason=f"CPU kernels: {kernels.unsupported()}")
class TestInvariantAttention:
    """``kernels.causal_attention``: right against float64, and each row's bits fixed by its own
    query, position and keys, whatever is computed beside it."""

    @pytest.mark.parametrize("seq_lens", [[1], [37], [5, 300, 17, 64, 1, 129, 128, 2], [200] * 4])
    def test_decode_rows_match_float64_reference(self, seq_lens):
        b = make_batch(seq_lens)
        rows = QueryRows.decode(b.req_pool_indices, b.seq_lens)
        out = kernels.causal_attention(b.query, b.k_buffer, b.v_buffer, b.req_to_token, rows.req_rows, rows.offsets,
                                       rows.positions, b.scale)
        torch.testing.assert_close(out.double(), float64_reference(b), atol=2e-6, rtol=1e-5)

    @pytest.mark.parametrize("prefix_lens,extend_lens", TestExtendAttention.CASES)
    def test_extend_rows_match_float64_reference(self, prefix_lens, extend_lens):
        b = make_extend_batch(prefix_lens, extend_lens)
        rows = QueryRows.extend(b.req_pool_indices, b.seq_lens.tolist(), extend_lens)
        out = kernels.causal_attention(b.query, b.k_buffer, b.v_buffer, b.req_to_token, rows.req_rows, rows.offsets,
                                       rows.positions, b.scale)
        torch.testing.assert_close(out.double(), extend_float64_reference(b), atol=2e-6, rtol=1e-5)

    def test_multi_head_attention_without_grouping(self):
        b = make_batch([3, 40, 9], q_heads=4, kv_heads=4)
        out = causal(b, b.req_pool_indices, [1, 1, 1], b.seq_lens - 1)
        torch.testing.assert_close(out.double(), float64_reference(b), atol=2e-6, rtol=1e-5)

    def test_a_row_is_the_same_bits_prefilled_behind_a_prefix_decoded_or_batched(self):
        b = make_extend_batch([0, 0], [333, 90])  # request 0: a 333-token prompt; request 1: another
        prompt, row = b.query[:333], b.req_pool_indices[:1]
        whole = causal(types.SimpleNamespace(**{**vars(b), "query": prompt}), row, [333], torch.arange(333))
        for cached in (1, 16, 17, 200, 332):  # the new tokens behind a cached prefix of this length
            tail = types.SimpleNamespace(**{**vars(b), "query": prompt[cached:].contiguous()})
            assert torch.equal(causal(tail, row, [333 - cached], torch.arange(cached, 333)), whole[cached:]), cached
        for position in (0, 15, 16, 250, 332):  # one row alone, as a decode step computes it
            one = types.SimpleNamespace(**{**vars(b), "query": prompt[position:position + 1].contiguous()})
            assert torch.equal(causal(one, row, [1], [position]), whole[position:position + 1]), position
        # beside another request's prefill, and its own rows in another grouping
        mixed = types.SimpleNamespace(**{**vars(b), "query": torch.cat((b.query[333:340], prompt[100:105]))})
        out = causal(mixed, b.req_pool_indices.flip(0), [7, 5], torch.cat((torch.arange(50, 57), torch.arange(100, 105))))
        assert torch.equal(out[7:], whole[100:105])

    def test_sdpa_rows_are_not_invariant_which_is_why_the_kernel_exists(self):
        # The control: SDPA's causal pass over a 250-token prompt and over the same prompt grown to
        # 333 tokens give its first 250 rows other bits (the flash kernel blocks keys by the
        # sequence's length). If a torch update changes that, this says so.
        g = torch.Generator().manual_seed(0)
        query, keys, values = (torch.randn(heads, 333, HEAD_DIM, generator=g) for heads in (9, 3, 3))
        whole = cpu_attention.extend_attention(query, keys, values, HEAD_DIM**-0.5)
        part = cpu_attention.extend_attention(query[:, :250], keys[:, :250], values[:, :250], HEAD_DIM**-0.5)
        assert not torch.equal(part, whole[:, :250])
        torch.testing.assert_close(part, whole[:, :250], atol=1e-6, rtol=1e-5)

    def test_a_position_outside_the_table_or_a_slot_outside_the_pool_is_refused(self):
        b = make_batch([5])
        with pytest.raises(RuntimeError, match="position 600 outside"):
            causal(b, b.req_pool_indices, [1], [600])
        b.req_to_token[b.req_pool_indices[0], 2] = POOL_SLOTS + 3
        with pytest.raises(RuntimeError, match="slot .* outside the pool"):
            causal(b, b.req_pool_indices, [1], [4])

    def test_environment_switch(self, monkeypatch):
        monkeypatch.delenv(cpu_attention.INVARIANT_ENV, raising=False)
        assert cpu_attention.invariant_attention()
        monkeypatch.setenv(cpu_attention.INVARIANT_ENV, "0")
        assert not cpu_attention.invariant_attention()
        monkeypatch.setenv(cpu_attention.INVARIANT_ENV, "yes")
        with pytest.raises(ValueError, match=cpu_attention.INVARIANT_ENV):
            cpu_attention.invariant_attention()


class TestQueryRows:
    def test_extend_rows_sit_at_the_end_of_each_request(self):
        rows = QueryRows.extend(torch.tensor([4, 2]), [5, 3], [2, 3])
        assert rows.offsets.tolist() == [0, 2, 5] and rows.positions.tolist() == [3, 4, 0, 1, 2]
        assert rows.req_rows.dtype == torch.int64 and rows.req_rows.tolist() == [4, 2]

    def test_decode_rows_are_each_requests_last_position(self):
        rows = QueryRows.decode(torch.tensor([7, 1, 3], dtype=torch.int32), torch.tensor([10, 1, 4]))
        assert rows.offsets.tolist() == [0, 1, 2, 3] and rows.positions.tolist() == [9, 0, 3]


class TestRegistration:
    def test_install_registers_the_backend_on_the_cpu_path(self, monkeypatch):
        from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

        # Start unregistered: an engine started earlier in this process has registered it already.
        monkeypatch.delitem(ATTENTION_BACKENDS, BACKEND_NAME, raising=False)
        before = list(ATTENTION_BACKEND_CHOICES)
        ATTENTION_BACKEND_CHOICES[:] = [c for c in before if c != BACKEND_NAME]
        try:
            monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
            cpu_attention.install()
            cpu_attention.install()
            assert ATTENTION_BACKENDS[BACKEND_NAME] is cpu_attention.create_backend
            assert ATTENTION_BACKEND_CHOICES.count(BACKEND_NAME) == 1
        finally:
            ATTENTION_BACKEND_CHOICES[:] = before


class TestSGLangContract:
    """What ``RkscCpuAttnBackend`` assumes of SGLang 0.5.23's ``TorchNativeAttnBackend``."""

    def test_stock_decode_loop_still_has_the_signature_we_compare_against(self):
        b = make_batch([3, 9])
        torch.testing.assert_close(stock_torch_native(b).double(), float64_reference(b), atol=2e-6, rtol=1e-5)

    def test_the_parent_hooks_we_override_exist(self):
        for name in ("init_forward_metadata", "forward_decode", "forward_extend", "_run_sdpa_forward_decode"):
            assert callable(getattr(TorchNativeAttnBackend, name))


class TinyModel(torch.nn.Module):
    """SGLang-shaped layers: each linear holds ``weight`` and a ``quant_method`` that runs it."""

    def __init__(self, tied_lm_head: bool = True, dtype=torch.float32, width: int = 16):
        from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod, UnquantizedLinearMethod

        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embed_tokens = torch.nn.Module()
        self.embed_tokens.weight = torch.nn.Parameter(torch.randn(40, width, generator=g, dtype=dtype), requires_grad=False)
        self.embed_tokens.quant_method = UnquantizedEmbeddingMethod()
        self.proj = torch.nn.Module()
        self.proj.weight = torch.nn.Parameter(torch.randn(24, width, generator=g, dtype=dtype), requires_grad=False)
        self.proj.quant_method = UnquantizedLinearMethod()
        self.lm_head = self.embed_tokens if tied_lm_head else torch.nn.Linear(width, 40)


class TestOneDnnLinears:
    def test_linears_and_tied_lm_head_are_swapped_and_still_compute_x_w_t(self):
        from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

        model = TinyModel()
        x = torch.randn(5, 16)
        assert use_packed_linears(model) == 2
        assert isinstance(model.proj.quant_method, UnquantizedLinearMethod)  # SGLang's isinstance checks hold
        for layer in (model.proj, model.embed_tokens):
            out = layer.quant_method.apply(layer, x)
            torch.testing.assert_close(out, F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)

    def test_embedding_lookup_is_unchanged(self):
        model = TinyModel()
        use_packed_linears(model)
        ids = torch.tensor([0, 7, 39])
        assert torch.equal(model.embed_tokens.quant_method.embedding(model.embed_tokens, ids), model.embed_tokens.weight[ids])

    def test_untied_input_embedding_and_other_dtypes_are_left_alone(self):
        assert use_packed_linears(TinyModel(tied_lm_head=False)) == 1  # proj only
        assert use_packed_linears(TinyModel(dtype=torch.bfloat16)) == 0

    def test_second_call_swaps_nothing_more(self):
        model = TinyModel()
        use_packed_linears(model)
        assert use_packed_linears(model) == 0

    def test_weights_updated_in_place_are_repacked(self):
        model = TinyModel()
        use_packed_linears(model)
        x = torch.randn(3, 16)
        model.proj.weight.mul_(2.0)
        out = model.proj.quant_method.apply(model.proj, x)
        torch.testing.assert_close(out, F.linear(x, model.proj.weight), rtol=1e-5, atol=1e-5)

    def test_environment_switch_turns_it_off(self, monkeypatch):
        monkeypatch.setenv(ONEDNN_ENV, "0")
        assert use_packed_linears(TinyModel()) == 0

    def test_bfloat16_weights_round_like_a_bf16_matmul_and_leave_the_weights_alone(self):
        model = TinyModel()
        before = model.proj.weight.clone()
        use_packed_linears(model, "bfloat16")
        x = torch.randn(300, 16)  # more than MAX_ROWS: bf16 too, not MKL's float32
        out = model.proj.quant_method.apply(model.proj, x)
        assert out.dtype == torch.float32 and torch.equal(model.proj.weight, before)
        reference = F.linear(x.bfloat16().float(), before.bfloat16().float()).bfloat16().float()
        torch.testing.assert_close(out, reference, rtol=1e-2, atol=1e-2)
        assert not torch.allclose(out, F.linear(x, before), rtol=1e-5, atol=1e-5)  # it did round

    def test_bfloat16_rows_barely_depend_on_their_batch(self):
        # oneDNN's bf16 kernel for 64 rows sums in another order than for one: the bf16 output
        # hides that in most rows (on 2 of 200 random inputs, not in every row). int8 linears and
        # the invariant attention are the strictly row-invariant path.
        model = TinyModel()
        use_packed_linears(model, "bfloat16")
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
        apply = model.proj.quant_method.apply
        alone = torch.cat([apply(model.proj, x[i:i + 1]) for i in range(64)])
        batched = apply(model.proj, x)
        torch.testing.assert_close(batched, alone, rtol=1e-2, atol=1e-2)
        assert sum(torch.equal(a, b) for a, b in zip(batched, alone)) >= 60

    def test_bfloat16_adds_the_bias_in_float32(self):
        model = TinyModel()
        model.proj.bias = torch.randn(24)
        use_packed_linears(model, "bfloat16")
        x = torch.randn(2, 16)
        torch.testing.assert_close(model.proj.quant_method.apply(model.proj, x, model.proj.bias),
                                   model.proj.quant_method.apply(model.proj, x) + model.proj.bias)

    @pytest.mark.skipif(kernels.unsupported() is not None, reason=f"int8 linears: {kernels.unsupported()}")
    def test_int8_runs_the_vnni_kernel_for_linears_and_lm_head_and_repacks_updated_weights(self):
        model = TinyModel(width=64)
        model.proj.bias = torch.randn(24)
        before = model.proj.weight.clone()
        assert use_packed_linears(model, "int8") == 2
        x = torch.randn(300, 64)
        for layer, bias in ((model.proj, model.proj.bias), (model.embed_tokens, None)):
            out = layer.quant_method.apply(layer, x, bias)
            assert torch.equal(out, kernels.linear(x, kernels.pack(layer.weight), bias))
        assert torch.equal(model.proj.weight, before)
        model.proj.weight.mul_(2.0)
        out, exact = model.proj.quant_method.apply(model.proj, x), F.linear(x, model.proj.weight)
        assert (out - exact).abs().max() <= 0.02 * exact.abs().max()

    @pytest.mark.skipif(kernels.unsupported() is not None, reason=f"int8 linears: {kernels.unsupported()}")
    def test_int8_keeps_float32_for_a_width_its_groups_do_not_divide(self, monkeypatch):
        from radix_ext.cpu import speed

        warnings = []  # the module's logger, whatever an earlier test did to logging's propagation
        monkeypatch.setattr(speed.logger, "warning", lambda msg, *args: warnings.append(msg % args))
        model = TinyModel(width=48)
        use_packed_linears(model, "int8")
        assert model.proj.quant_method.compute_dtype == torch.float32
        x = torch.randn(2, 48)
        torch.testing.assert_close(model.proj.quant_method.apply(model.proj, x), F.linear(x, model.proj.weight),
                                   rtol=1e-5, atol=1e-5)
        assert any("input width 48 keeps float32" in w for w in warnings)

    @pytest.mark.skipif(kernels.unsupported() is not None, reason=f"int8 linears: {kernels.unsupported()}")
    def test_cgees_logit_lens_reads_the_head_as_sglangs_logits_processor_applies_it(self):
        from types import SimpleNamespace

        from radix_ext.cgee.forward import _lens_logits

        model = TinyModel(width=64)
        model.config = SimpleNamespace(vocab_size=38)  # the head's last 2 rows are padding
        x = torch.randn(3, 64)
        torch.testing.assert_close(_lens_logits(model, x), F.linear(x, model.lm_head.weight[:38]))  # stock: matmul
        use_packed_linears(model, "int8")
        lens = _lens_logits(model, x)
        assert lens.shape == (3, 38) and torch.equal(lens, model.lm_head.quant_method.apply(model.lm_head, x)[:, :38])

    def test_int8_on_a_cpu_without_vnni_is_refused_by_name(self, monkeypatch):
        from rksc_sgl import config

        monkeypatch.setattr(config, "_cpu_flags", lambda: {"avx512f"})
        with pytest.raises(ValueError, match="--cpu-linear-dtype int8: the CPU lacks"):
            use_packed_linears(TinyModel(width=64), "int8")

    def test_an_unknown_dtype_is_refused_by_name(self):
        with pytest.raises(ValueError, match="--cpu-linear-dtype.*int4"):
            use_packed_linears(TinyModel(), "int4")

    def test_bfloat16_without_onednn_linears_is_refused(self, monkeypatch):
        monkeypatch.setenv(ONEDNN_ENV, "0")
        with pytest.raises(ValueError, match="--cpu-linear-dtype bfloat16"):
            use_packed_linears(TinyModel(), "bfloat16")

    def test_sglang_calls_our_apply_for_the_lm_head(self):
        from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method

        model = TinyModel()
        assert not should_apply_lm_head_quant_method(model.lm_head, model.lm_head.quant_method)  # stock: matmul
        use_packed_linears(model)
        assert should_apply_lm_head_quant_method(model.lm_head, model.lm_head.quant_method)
