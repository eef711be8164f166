"""``kernels.decode_layers`` (radix_ext/cpu/decode_layers.cpp) on tensors: a small random stack's
decode step is the lean decode's Python loop bit for bit, KV writes through SGLang's own pool
included; a call it cannot take is refused by name before it writes anything; and the switch
``RKSC_CPU_DECODE_LAYERS`` is validated like ``RKSC_CPU_LEAN_DECODE``."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from radix_ext.cpu import decode, decode_stack, kernels

needs_kernels = pytest.mark.skipif(kernels.unsupported() is not None, reason=f"CPU kernels: {kernels.unsupported()}")

HIDDEN, Q_HEADS, KV_HEADS, HEAD_DIM, INTER, SLOTS = 64, 4, 2, 32, 96, 160


class TestSwitch:
    @pytest.mark.parametrize("value, on", [("1", True), ("0", False), ("", True), (" 0 ", False)])
    def test_values(self, monkeypatch, value, on):
        monkeypatch.setenv(decode_stack.LAYERS_ENV, value)
        assert decode_stack.enabled() is on

    def test_a_bad_value_names_the_variable(self, monkeypatch):
        monkeypatch.setenv(decode_stack.LAYERS_ENV, "yes")
        with pytest.raises(ValueError, match="RKSC_CPU_DECODE_LAYERS must be 0 or 1, got 'yes'"):
            decode_stack.enabled()

    def test_off_is_the_reason_the_python_loop_runs(self, monkeypatch):
        monkeypatch.setenv(decode_stack.LAYERS_ENV, "0")
        assert decode_stack.build(model=None, plans=[], backend=None) == "RKSC_CPU_DECODE_LAYERS=0"


def sglang_pool(layers: int):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    pool = MHATokenToKVPool(size=SLOTS - 1, page_size=1, dtype=torch.float32, head_num=KV_HEADS, head_dim=HEAD_DIM,
                            layer_num=layers, device="cpu", enable_memory_saver=False)
    for buf in pool.k_buffer + pool.v_buffer:
        buf.normal_()  # earlier tokens' keys and values
    return pool


@dataclasses.dataclass
class Step:
    """A decode step of ``rows`` requests over a random ``layers``-layer stack."""

    weights: kernels.LayerWeights
    hidden: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    loc: torch.Tensor
    table: torch.Tensor
    rows: object

    @classmethod
    def make(cls, layers: int = 2, seq_lens: tuple[int, ...] = (5, 17, 9), seed: int = 0) -> "Step":
        from radix_ext.cpu.attention import QueryRows

        gen = torch.Generator().manual_seed(seed)
        widths = [(Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, 2 * INTER, HIDDEN] * layers
        inputs = [HIDDEN, Q_HEADS * HEAD_DIM, HIDDEN, INTER] * layers
        linears = [kernels.pack(torch.randn(n, k, generator=gen) / k ** 0.5)[0] for n, k in zip(widths, inputs)]
        norms = [torch.rand(HIDDEN, generator=gen) + 0.5 for _ in range(2 * layers)]
        weights = kernels.LayerWeights(norms, [1e-5, 1e-6] * layers, linears, widths,
                                       [HEAD_DIM ** -0.5 * (1 + i / 10) for i in range(layers)], Q_HEADS, KV_HEADS,
                                       HEAD_DIM)
        n = len(seq_lens)
        table = torch.randperm(SLOTS - 1, generator=gen)[:4 * 32].add(1).to(torch.int32).view(4, 32).contiguous()
        req_rows = torch.tensor([2, 0, 3, 1][:n])
        loc = table[req_rows, torch.tensor(seq_lens) - 1].long()  # each request's new token's slot
        cos, sin = (t.unsqueeze(-2).contiguous() for t in torch.randn(n, HEAD_DIM, generator=gen).chunk(2, dim=-1))
        return cls(weights, torch.randn(n, HIDDEN, generator=gen), cos, sin, loc, table,
                   QueryRows.decode(req_rows, torch.tensor(seq_lens)))

    def python_loop(self, pool) -> tuple[torch.Tensor, torch.Tensor]:
        """``radix_ext.cpu.decode._decode``'s calls with int8 linears: the fused norm, the linears,
        the rotation (``_rotate``: SGLang's), the pool's ``set_kv_buffer``, the backend's attention
        and SGLang's ``SiluAndMul``."""
        from sglang.srt.layers.activation import SiluAndMul
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        w, act = self.weights, SiluAndMul()
        q_size, kv_size = Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
        hidden, residual = self.hidden, None
        for layer in range(len(w.scales)):
            if residual is None:
                residual, x = hidden, kernels.add_rms_norm(hidden, None, w.norms[0], w.eps[0])[0]
            else:
                x, residual = kernels.add_rms_norm(hidden, residual, w.norms[2 * layer], w.eps[2 * layer])
            linear = [(w.linears[4 * layer + i], w.widths[4 * layer + i]) for i in range(4)]
            q, k, v = kernels.linear(x, linear[0]).split([q_size, kv_size, kv_size], dim=-1)
            q, k = decode._rotate(q, Q_HEADS, self.cos, self.sin), decode._rotate(k, KV_HEADS, self.cos, self.sin)
            pool.set_kv_buffer(types.SimpleNamespace(layer_id=layer), KVWriteLoc(self.loc),
                               k.view(-1, KV_HEADS, HEAD_DIM), v.view(-1, KV_HEADS, HEAD_DIM))
            out = kernels.causal_attention(q.reshape(-1, Q_HEADS, HEAD_DIM), pool.get_key_buffer(layer),
                                           pool.get_value_buffer(layer), self.table, self.rows.req_rows,
                                           self.rows.offsets, self.rows.positions, w.scales[layer])
            hidden = kernels.linear(out.view(out.shape[0], -1), linear[1])
            x, residual = kernels.add_rms_norm(hidden, residual, w.norms[2 * layer + 1], w.eps[2 * layer + 1])
            hidden = kernels.linear(act.forward_native(kernels.linear(x, linear[2])), linear[3])
        return hidden, residual

    def op(self, pool, **changes) -> tuple[torch.Tensor, torch.Tensor]:
        args = {"hidden": self.hidden, "weights": self.weights, "cos": self.cos, "sin": self.sin,
                "k_buffers": pool.k_buffer, "v_buffers": pool.v_buffer, "out_cache_loc": self.loc,
                "table": self.table, "rows": self.rows, **changes}
        return kernels.decode_layers(**args)


@needs_kernels
class TestTheOp:
    @pytest.mark.parametrize("seq_lens", [(32,), (5, 17, 9), (1, 32, 16, 2)])
    def test_a_step_is_the_python_loops_bit_for_bit_kv_writes_included(self, seq_lens):
        step = Step.make(seq_lens=seq_lens, seed=len(seq_lens))
        ours, theirs = sglang_pool(2), sglang_pool(2)
        for a, b in zip(ours.k_buffer + ours.v_buffer, theirs.k_buffer + theirs.v_buffer):
            b.copy_(a)
        hidden, residual = step.op(ours)
        want_hidden, want_residual = step.python_loop(theirs)
        assert torch.equal(hidden, want_hidden) and torch.equal(residual, want_residual)
        for a, b in zip(ours.k_buffer + ours.v_buffer, theirs.k_buffer + theirs.v_buffer):
            assert torch.equal(a, b)
        assert not torch.equal(ours.k_buffer[1][step.loc], sglang_pool(2).k_buffer[1][step.loc])  # it wrote

    def test_one_layer_and_three_layers(self):
        for layers in (1, 3):
            step = Step.make(layers=layers, seed=layers)
            ours, theirs = sglang_pool(layers), sglang_pool(layers)
            for a, b in zip(ours.k_buffer + ours.v_buffer, theirs.k_buffer + theirs.v_buffer):
                b.copy_(a)
            assert all(torch.equal(a, b) for a, b in zip(step.op(ours), step.python_loop(theirs)))

    def test_the_first_layers_given_queries_are_its_own_bit_for_bit(self):
        """ASKS blend's kept rows: the check wrote the first layer's K and V and passes its rotated
        queries (``first_q``); the op starts that layer at its attention, with the same result."""
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        step = Step.make(seed=5)
        ours, theirs, shifted_pool = sglang_pool(2), sglang_pool(2), sglang_pool(2)
        for a, b, c in zip(ours.k_buffer + ours.v_buffer, theirs.k_buffer + theirs.v_buffer,
                           shifted_pool.k_buffer + shifted_pool.v_buffer):
            b.copy_(a)
            c.copy_(a)
        w, q_size, kv_size = step.weights, Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
        x = kernels.add_rms_norm(step.hidden, None, w.norms[0], w.eps[0])[0]
        q, k, v = kernels.linear(x, (w.linears[0], w.widths[0])).split([q_size, kv_size, kv_size], dim=-1)
        q, k = kernels.rope_neox(q, Q_HEADS, step.cos, step.sin), kernels.rope_neox(k, KV_HEADS, step.cos, step.sin)
        for pool in (ours, shifted_pool):
            pool.set_kv_buffer(types.SimpleNamespace(layer_id=0), KVWriteLoc(step.loc),
                               k.view(-1, KV_HEADS, HEAD_DIM), v.view(-1, KV_HEADS, HEAD_DIM))
        given = step.op(ours, first_q=q.contiguous())
        assert all(torch.equal(a, b) for a, b in zip(given, step.op(theirs)))
        for a, b in zip(ours.k_buffer + ours.v_buffer, theirs.k_buffer + theirs.v_buffer):
            assert torch.equal(a, b)
        shifted = step.op(shifted_pool, first_q=(q * 1.01).contiguous())  # the queries are read, not recomputed
        assert not torch.equal(shifted[0], given[0])

    @pytest.mark.parametrize("change, message", [
        (lambda s, p: {"first_q": torch.zeros(3, Q_HEADS * HEAD_DIM + 1)}, "first_q must be contiguous float32"),
        (lambda s, p: {"k_buffers": p.k_buffer[:1]}, "for 1 layers .* got 4 norms"),
        (lambda s, p: {"weights": dataclasses.replace(s.weights, widths=[HIDDEN] + s.weights.widths[1:])},
         "layer 0 linear 0 .* must give 256 columns, got 64"),
        (lambda s, p: {"weights": dataclasses.replace(s.weights, q_heads=3)}, "layer 0 linear 0"),
        (lambda s, p: {"v_buffers": [p.v_buffer[0], p.v_buffer[1].to(torch.bfloat16)]},
         "layer 1 KV buffers must be contiguous float32"),
        (lambda s, p: {"out_cache_loc": s.loc[:1]}, "loc must be int64 or int32 \\[n\\] = \\[3\\]"),
        (lambda s, p: {"hidden": s.hidden[:, :32].contiguous()}, "layer 0 norm 0 must be float32 \\[32\\]"),
        (lambda s, p: {"cos": s.cos[:1]}, "cos, sin must be"),
    ])
    def test_an_odd_call_is_refused_by_name_before_any_write(self, change, message):
        step, pool = Step.make(), sglang_pool(2)
        before = [b.clone() for b in pool.k_buffer + pool.v_buffer]
        with pytest.raises(RuntimeError, match="decode_layers: " + message):
            step.op(pool, **change(step, pool))
        assert all(torch.equal(a, b) for a, b in zip(before, pool.k_buffer + pool.v_buffer))


@needs_kernels
class TestWhichPoolsItWrites:
    """The op writes a pool as ``k_cache[loc] = k``: SGLang's float32 ``MHATokenToKVPool`` on a CPU
    without its AMX store kernel. Any other pool keeps the Python loop."""

    def backend(self, pool, **changes):
        from radix_ext.cpu.attention import RkscCpuAttnBackend

        backend = RkscCpuAttnBackend.__new__(RkscCpuAttnBackend)  # only what _plain_pool reads
        backend.token_to_kv_pool, backend.invariant, backend.use_sliding_window_kv_pool = pool, True, False
        vars(backend).update(changes)
        return backend

    def test_sglangs_float32_pool_is_taken(self):
        pool = sglang_pool(2)
        assert decode_stack._plain_pool(self.backend(pool)) is pool

    @pytest.mark.parametrize("change, reason", [
        ({"use_hnd": True}, "kv-pool:write"),
        ({"store_dtype": torch.uint8}, "kv-pool:write"),
        ({"requires_physical_write_loc": True}, "kv-pool:write"),
    ])
    def test_another_layout_or_dtype_is_refused(self, change, reason):
        pool = sglang_pool(2)
        vars(pool).update(change)
        with pytest.raises(decode_stack._Unsupported, match=reason):
            decode_stack._plain_pool(self.backend(pool))

    def test_sdpa_attention_and_a_pool_subclass_are_refused(self, monkeypatch):
        from sglang.srt.mem_cache import memory_pool

        with pytest.raises(decode_stack._Unsupported, match="attention:not-invariant"):
            decode_stack._plain_pool(self.backend(sglang_pool(2), invariant=False))
        pool = sglang_pool(2)
        pool.__class__ = type("Subclass", (memory_pool.MHATokenToKVPool,), {})
        with pytest.raises(decode_stack._Unsupported, match="kv-pool:Subclass"):
            decode_stack._plain_pool(self.backend(pool))
        monkeypatch.setattr(memory_pool, "_cpu_has_amx_support", True)  # SGLang's store_cache_cpu would write
        with pytest.raises(decode_stack._Unsupported, match="kv-pool:write"):
            decode_stack._plain_pool(self.backend(sglang_pool(2)))
