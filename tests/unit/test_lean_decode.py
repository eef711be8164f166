import pytest

from radix_ext.cpu import decode, kernels


@pytest.mark.parametrize("value, on", [("1", True), ("0", False), ("", True), (" 0 ", False)])
def test_switch(monkeypatch, value, on):
    monkeypatch.setenv(decode.LEAN_ENV, value)
    assert decode.enabled() is on


def test_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(decode.LEAN_ENV, "yes")
    with pytest.raises(ValueError, match="RKSC_CPU_LEAN_DECODE must be 0 or 1, got 'yes'"):
        decode.enabled()


def test_rotation_is_sglangs_bit_for_bit():
    """``_rotate`` from one cos / sin lookup per step equals ``RotaryEmbedding.forward_native``."""
    import torch

    from tests.unit.test_asks_selection import sglang_rope

    rope = sglang_rope()
    assert kernels.plain_neox(rope, rope.forward_native)
    assert not kernels.plain_neox(rope, rope.forward_cuda)  # another resolved forward keeps SGLang's
    for rows in (1, 5):
        positions = torch.randint(0, 2048, (rows,))
        qkv = torch.randn(rows, 9 * 64 + 2 * 3 * 64)
        q, k, _ = qkv.split([9 * 64, 3 * 64, 3 * 64], dim=-1)
        want_q, want_k = rope.forward_native(positions, q, k)
        cos, sin = rope.cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        assert torch.equal(decode._rotate(q, 9, cos, sin), want_q)
        assert torch.equal(decode._rotate(k, 3, cos, sin), want_k)
