"""The int8 kernel of ``--cpu-linear-dtype int8`` (radix_ext/cpu/kernels.py, kernels.cpp) on tensors: it
computes the formula its source states, a row's output does not depend on its batch, and what it
cannot take is refused by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radix_ext.cpu import kernels

pytestmark = pytest.mark.skipif(kernels.unsupported() is not None, reason=f"int8 linears: {kernels.unsupported()}")


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """kernels.cpp's formula in float64: int8 weights at a scale per row and 32 inputs, each input row
    at int16 with its own scale."""
    q, scale = kernels.quantize_weight(weight)
    n, k = weight.shape
    w = (q.double().view(n, k // 32, 32) * scale.double()[..., None]).view(n, k)
    xs = x.double().abs().amax(dim=1, keepdim=True) / 32767
    qx = torch.round(x.double() / xs).clamp(-32767, 32767)
    out = (qx @ w.T) * xs
    return (out if bias is None else out + bias.double()).float()


@pytest.mark.parametrize("rows, n, k", [(1, 960, 576), (3, 576, 1536), (7, 100, 64), (5, 16, 32)])
def test_it_computes_the_stated_formula(rows, n, k):
    torch.manual_seed(rows * n + k)
    weight, x, bias = torch.randn(n, k), torch.randn(rows, k), torch.randn(n)
    out = kernels.linear(x, kernels.pack(weight), bias)
    torch.testing.assert_close(out, reference(x, weight, bias), rtol=1e-5, atol=1e-4)
    # and it is a linear: within int8 rounding of float32's
    exact = F.linear(x, weight, bias)
    assert (out - exact).abs().max() <= 0.02 * exact.abs().max()


def test_a_row_gives_the_same_bits_alone_and_in_any_batch():
    torch.manual_seed(1)
    weight, x = torch.randn(200, 576), torch.randn(11, 576)  # 11 rows: tiles of 3, then 2
    packed = kernels.pack(weight)
    together = kernels.linear(x, packed)
    for i in range(x.shape[0]):
        assert torch.equal(kernels.linear(x[i:i + 1], packed)[0], together[i]), i
    assert torch.equal(kernels.linear(x[3:5], packed), together[3:5])


def test_leading_shapes_padding_columns_and_zero_rows():
    torch.manual_seed(2)
    weight = torch.randn(40, 64)  # 40 columns: the last block is half padding
    packed = kernels.pack(weight)
    x = torch.randn(2, 3, 64)
    out = kernels.linear(x, packed)
    assert out.shape == (2, 3, 40)
    torch.testing.assert_close(out, reference(x.view(6, 64), weight, None).view(2, 3, 40), rtol=1e-5, atol=1e-4)
    assert kernels.linear(torch.zeros(0, 64), packed).shape == (0, 40)
    assert torch.equal(kernels.linear(torch.zeros(1, 64), packed), torch.zeros(1, 40))  # a zero row: no 0 / 0


@pytest.mark.skipif(kernels.amx_rows() == 0, reason="no AMX tiles here (or RKSC_CPU_AMX=0)")
@pytest.mark.parametrize("n, k", [(576, 576), (100, 64), (17, 96), (40, 1536)])
def test_amx_tiles_give_the_vnni_kernels_bits(n, k):
    """From ``amx_rows()`` rows on, a pack with the AMX copy runs on tiles; a pack without it, at any
    row count, on VNNI: the same bits, whatever the rows (a tile of 16, padded, several chunks)."""
    torch.manual_seed(n + k)
    weight, bias = torch.randn(n, k), torch.randn(n)
    both, vnni = kernels.pack(weight, amx=True), kernels.pack(weight, amx=False)
    assert both[0].shape[0] == 2 * vnni[0].shape[0] and torch.equal(both[0][: vnni[0].shape[0]], vnni[0])
    for rows in (kernels.amx_rows(), 17, 31, 48, 129, 300):
        x = torch.randn(rows, k) * 4
        x[1] = 0  # a zero row: scale 1, every byte 0
        for b in (None, bias):
            assert torch.equal(kernels.linear(x, both, b), kernels.linear(x, vnni, b)), (rows, b is None)
    x = torch.randn(40, k)  # and a row alone (VNNI) is the same bits as in a batch of 40 (tiles)
    assert torch.equal(kernels.linear(x[7:8], both)[0], kernels.linear(x, both)[7])


def test_a_prefills_rotation_through_rope_neox_is_sglangs_forward_native_bit_for_bit():
    """``use_fused_rotary`` points SGLang's RotaryEmbedding at ``rope_neox``: the seam is its
    ``_forward_method``, and what it must equal is SGLang's own ``forward_native`` (this fails if
    either changes under us)."""
    from tests.unit.test_asks_selection import sglang_rope

    model = torch.nn.Module()
    model.rope = sglang_rope()
    assert kernels.use_fused_rotary(model) == 1 and kernels.use_fused_rotary(model) == 0  # once
    assert kernels.plain_neox(model.rope, model.rope._forward_method)
    torch.manual_seed(4)
    positions = torch.randint(0, 2000, (37,))
    qkv = torch.randn(37, (9 + 2 * 3) * 64) * 3
    q, k, _ = qkv.split([9 * 64, 3 * 64, 3 * 64], dim=-1)  # strided views, as the layers pass them
    ours = model.rope(positions, q, k)
    theirs = model.rope.forward_native(positions, q.clone(), k.clone())
    assert all(torch.equal(a, b) and a.shape == b.shape for a, b in zip(ours, theirs))
    q3, k3 = q.reshape(37, 9, 64), k.reshape(37, 3, 64)
    assert all(torch.equal(a, b) for a, b in zip(model.rope(positions, q3, k3),
                                                 model.rope.forward_native(positions, q3, k3)))
    offsets = torch.full((37,), 5)  # not covered: forward_native's own
    assert all(torch.equal(a, b) for a, b in zip(model.rope(positions, q, k, offsets),
                                                 model.rope.forward_native(positions, q, k, offsets)))


def test_rksc_cpu_amx_other_than_0_or_1_is_refused_naming_it(monkeypatch):
    for value in ("0", "1", " "):
        monkeypatch.setenv(kernels.AMX_ENV, value)
        kernels.amx_rows()
    monkeypatch.setenv(kernels.AMX_ENV, "yes")
    with pytest.raises(ValueError, match="RKSC_CPU_AMX must be 0 or 1, got 'yes'"):
        kernels.amx_rows()


def test_weights_round_to_half_a_step_of_their_group():
    torch.manual_seed(3)
    weight = torch.randn(8, 96)
    weight[0, :32] *= 100  # one loud group does not coarsen the others
    q, scale = kernels.quantize_weight(weight)
    assert q.dtype == torch.int8 and scale.shape == (8, 3)
    back = q.float().view(8, 3, 32) * scale[..., None]
    assert ((back - weight.view(8, 3, 32)).abs() <= scale[..., None] / 2 + 1e-6).all()
    assert scale[0, 1] < scale[0, 0] / 20


def test_an_input_width_off_the_group_is_refused_by_name():
    with pytest.raises(ValueError, match="divisible by 32, got 48"):
        kernels.pack(torch.randn(16, 48))
    packed = kernels.pack(torch.randn(16, 64))
    with pytest.raises(RuntimeError, match="packed int8"):
        kernels.linear(torch.randn(1, 96), packed)


def test_a_cpu_without_vnni_is_named_and_refused_at_start_up(monkeypatch):
    from rksc_sgl import config

    monkeypatch.setattr(config, "_cpu_flags", lambda: {"avx512f", "avx512bw", "avx512vl", "avx512dq"})
    assert kernels.unsupported() == "the CPU lacks avx512_vnni"
    with pytest.raises(ValueError, match="--cpu-linear-dtype int8: the CPU lacks avx512_vnni"):
        config.RkscConfig(cpu_linear_dtype="int8")
    config.RkscConfig(cpu_linear_dtype="bfloat16")  # the others do not need it
    monkeypatch.setattr(config, "_cpu_flags", lambda: set(config.INT8_CPU_FLAGS))
    monkeypatch.setenv("CXX", "no-such-compiler")
    assert "no-such-compiler" in kernels.unsupported()


def test_the_default_linears_are_int8_where_the_machine_runs_them_else_float32(monkeypatch):
    from rksc_sgl import config
    from rksc_sgl.launch_server import split_args

    monkeypatch.setattr(config, "_cpu_flags", lambda: set(config.INT8_CPU_FLAGS))
    monkeypatch.setenv("CXX", "true")  # on PATH everywhere; the check only looks it up
    assert config.RkscConfig().cpu_linear_dtype == "int8" and split_args([])[0].cpu_linear_dtype == "int8"
    monkeypatch.setattr(config, "_cpu_flags", lambda: {"avx512f"})
    assert config.RkscConfig().cpu_linear_dtype == "float32" and split_args([])[0].cpu_linear_dtype == "float32"
    assert split_args(["--cpu-linear-dtype", "bfloat16"])[0].cpu_linear_dtype == "bfloat16"


def test_with_onednn_linears_off_the_default_is_float32_and_packed_dtypes_are_refused_at_start_up(monkeypatch):
    from rksc_sgl import config
    from rksc_sgl.launch_server import split_args

    monkeypatch.setattr(config.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(config, "_cpu_flags", lambda: set(config.INT8_CPU_FLAGS))
    monkeypatch.setenv("CXX", "true")
    monkeypatch.setenv(config.ONEDNN_LINEARS_ENV, "0")
    assert config.RkscConfig().cpu_linear_dtype == "float32" and split_args([])[0].cpu_linear_dtype == "float32"
    for dtype in ("int8", "bfloat16"):
        with pytest.raises(ValueError, match=f"--cpu-linear-dtype {dtype} .*RKSC_CPU_ONEDNN_LINEARS=0"):
            config.RkscConfig(cpu_linear_dtype=dtype)
        with pytest.raises(SystemExit):
            split_args(["--cpu-linear-dtype", dtype])
    monkeypatch.setenv(config.ONEDNN_LINEARS_ENV, "1")
    assert config.RkscConfig().cpu_linear_dtype == "int8"


def test_the_compiler_is_looked_up_once_per_name(monkeypatch):
    from rksc_sgl import config

    calls = []
    monkeypatch.setattr(config.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(config, "_cpu_flags", lambda: set(config.INT8_CPU_FLAGS))
    monkeypatch.setattr(config.shutil, "which", lambda name: calls.append(name) or "/bin/" + name)
    monkeypatch.setenv("CXX", "some-compiler")
    config._which.cache_clear()
    try:
        for _ in range(3):
            assert config.RkscConfig().cpu_linear_dtype == "int8"
        assert calls == ["some-compiler"]
    finally:
        config._which.cache_clear()  # no answer of the patched lookup stays behind for later tests


def test_the_build_is_keyed_by_every_source_and_header(monkeypatch, tmp_path):
    monkeypatch.setenv("RKSC_SGL_CACHE", str(tmp_path))
    first = kernels.library_path()
    assert first.parent == tmp_path / "kernels"
    files = {"SOURCES": kernels.SOURCES, "HEADERS": kernels.HEADERS}
    assert {p.name for p in kernels.SOURCES} == {p.name for p in kernels.HERE.glob("*.cpp")}  # none left out
    for attr, paths in files.items():
        for i, path in enumerate(paths):
            changed = tmp_path / path.name
            changed.write_text(path.read_text() + "\n// changed\n")
            with monkeypatch.context() as patch:
                patch.setattr(kernels, attr, (*paths[:i], changed, *paths[i + 1:]))
                assert kernels.library_path() != first, path.name
    assert kernels.library_path() == first


def test_add_rms_norm_is_sglangs_rmsnorm_up_to_the_order_of_its_sum():
    from sglang.srt.layers.layernorm import RMSNorm

    torch.manual_seed(4)
    norm = RMSNorm(576, eps=1e-5)
    norm.weight.data = torch.randn(576)
    x, residual = torch.randn(5, 576), torch.randn(5, 576)
    with torch.no_grad():
        want, want_sum = norm.forward_native(x.clone(), residual.clone())
        got, got_sum = kernels.add_rms_norm(x, residual, norm.weight.data, norm.variance_epsilon)
        assert torch.equal(got_sum, want_sum)  # one rounded addition, as torch's
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(kernels.add_rms_norm(x, None, norm.weight.data, 1e-5)[0], norm.forward_native(x),
                                   rtol=1e-5, atol=1e-5)
        alone, alone_sum = kernels.add_rms_norm(x, None, norm.weight.data, 1e-5)
        assert not torch.equal(got, alone)  # the residual counted
        assert alone_sum.shape == (0, 576)  # without a residual no second tensor, so no alias of x


def test_fused_norms_take_sglangs_forward_and_leave_other_norms_alone():
    from sglang.srt.layers.layernorm import RMSNorm

    plain, other = RMSNorm(64), RMSNorm(64, cast_x_before_out_mul=True)
    model = torch.nn.ModuleList([plain, other])
    assert kernels.use_fused_norms(model) == 1 and model.__dict__[kernels.ACTIVE_ATTR]
    x, residual = torch.randn(3, 64), torch.randn(3, 64)
    with torch.no_grad():
        out, total = plain(x, residual)  # SGLang's dispatch calls the norm's _forward_method
        assert torch.equal(out, kernels.add_rms_norm(x, residual, plain.weight.data, plain.variance_epsilon)[0])
        assert torch.equal(total, x + residual)
        extra = torch.randn(3, 64)  # a call it does not cover goes to SGLang's own forward
        torch.testing.assert_close(plain(x, residual, extra)[0], plain.forward_native(x, residual, extra)[0])
    assert other._forward_method is None  # SGLang's dispatch left as it was


def test_rope_neox_gives_the_lean_decodes_bits_on_strided_rows():
    from radix_ext.cpu.decode import _rotate

    torch.manual_seed(5)
    qkv = torch.randn(4, 960)  # q, k, v side by side: q and k are strided views
    cos, sin = (t.unsqueeze(-2).contiguous() for t in torch.randn(4, 64).chunk(2, dim=-1))
    for view, heads in ((qkv[:, :576], 9), (qkv[:, 576:768], 3)):
        out = kernels.rope_neox(view, heads, cos, sin)
        assert out.is_contiguous() and torch.equal(out, _rotate(view, heads, cos, sin))
    with pytest.raises(RuntimeError, match="cos, sin"):
        kernels.rope_neox(qkv[:, :576], 9, cos[:2], sin[:2])
