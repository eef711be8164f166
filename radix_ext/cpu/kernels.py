"""The CPU kernels of ``--cpu-linear-dtype int8`` (x86 with AVX-512 VNNI): int8-weight linears, a
fused residual add + RMSNorm and the neox rotation (``kernels.cpp``), the invariant causal attention
of the ``rksc_cpu`` backend (``radix_ext.cpu.attention``; ``causal_attention.cpp``) and every decoder
layer of a decode step in one call (``radix_ext.cpu.decode_stack``; ``decode_layers.cpp``), compiled
together once per source and torch version into the user cache; the weight packing, and the calls.

**Why.** A one-stream decode step reads every weight once, and the step's linears are most of its
time (``docs/benchmarks.md``, "Where a decode step's time goes"). oneDNN's packed bf16 GEMV reads
them at about half the rate the machine streams memory (``python -m benchmarks.gemv_bandwidth``);
``w8a16_linear`` reads about half the bytes (int8 and a scale per 32), nearer the stream's rate.
SGLang's RMSNorm on the CPU is eight torch ops per call, 61 calls per step; ``add_rms_norm`` is one.

**Numbers.** Each weight row's group of 32 inputs is rounded to int8 at its own scale (max |w| /
127), once, at load; each input row to int16 at its own scale, at every call. The products are
summed exactly in int32 per group, then scaled back and added in float32 in a fixed order
(``kernels.cpp`` gives the formula). So a token's output depends on its own input alone, never on
the batch around it, which keeps mode comparisons in a benchmark exact. Why these widths: greedy
text of SmolLM2 against float32's, 50 GSM8K prompts x 128 tokens, identical prompts (median first
differing token), from a simulation in torch (not kept): one weight scale per row with int8
inputs 1 (3); per row with float inputs 9 (17); per 32 with int8 inputs 8 (15); per 32 with int16
inputs, this kernel, 15 (51); bf16 linears 14 (52). ``python -m benchmarks.speed
--cpu-linear-dtype int8`` measures the kernel's agreement beside its speed. The norm computes
SGLang's products; only its sum of squares is added in another order.

**AMX.** Where the CPU has AMX-INT8 tiles, ``pack`` keeps a second copy of the weights in the
tiles' layout and a linear of 16 rows or more runs on them (``linear_amx.cpp`` says how its sums are
the VNNI kernel's, bit for bit); ``RKSC_CPU_AMX=0`` keeps VNNI alone (``amx_rows()``).

**Build.** ``python -m radix_ext.cpu.kernels`` (``make model`` runs it) compiles the sources with
the C++ compiler ``$CXX`` (default ``g++``) against the installed torch's headers, about 10 s,
into ``<cache>/kernels/`` (``rksc_sgl.config.cache_dir``); the first engine that needs it
builds it otherwise. ``unsupported()`` names what is missing on a machine where it cannot run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from rksc_sgl.config import cache_dir, cxx_compiler, int8_linears_unsupported

HERE = Path(__file__).parent
SOURCES = (HERE / "kernels.cpp", HERE / "causal_attention.cpp", HERE / "decode_layers.cpp",
           HERE / "linear_amx.cpp")  # one library
HEADERS = (HERE / "kernels.h",)
COMPILE_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-mavx512f", "-mavx512bw",
                 "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mfma", "-ffp-contract=off", "-w")
BLOCK = 16  # output columns per packed block (one zmm of int32 sums)
GROUP = 32  # inputs per weight scale


def unsupported() -> str | None:
    """Why the kernels cannot run here (None: they can): ``rksc_sgl.config.int8_linears_unsupported``,
    which also refuses ``--cpu-linear-dtype int8`` at start-up."""
    return int8_linears_unsupported()


def library_path() -> Path:
    """Where the build of these sources and headers, for this torch and these flags, lives."""
    key = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        key.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    key.update(f"{torch.__version__}|{sys.version_info[:2]}|{cxx_compiler()}|{' '.join(COMPILE_FLAGS)}".encode())
    return cache_dir() / "kernels" / f"rksc_cpu_kernels-{key.hexdigest()[:16]}.so"


def build() -> Path:
    """Compile the kernels unless this build exists; returns its path. Safe against a concurrent build
    (each writes its own file and renames it into place)."""
    target = library_path()
    if target.is_file():
        return target
    why = unsupported()
    if why:
        raise RuntimeError(f"int8 linears: {why}")
    from torch.utils import cpp_extension

    target.parent.mkdir(parents=True, exist_ok=True)
    lib = Path(torch.__file__).parent / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    compiler = [cxx_compiler(), *COMPILE_FLAGS]
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = [Path(tmp) / f"{source.stem}.o" for source in SOURCES]
        jobs = [subprocess.Popen([*compiler, f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                                  *(f"-I{p}" for p in cpp_extension.include_paths()), "-c", str(source),
                                  "-o", str(obj)], stderr=subprocess.PIPE, text=True)
                for source, obj in zip(SOURCES, objects)]  # side by side: the slowest source's time
        errors = [job.communicate()[1] for job in jobs]
        for source, job, stderr in zip(SOURCES, jobs, errors):
            if job.returncode:
                raise RuntimeError(f"int8 linears: compiling {source.name} failed:\n{stderr[-4000:]}")
        out = Path(tmp) / target.name
        done = subprocess.run([*compiler, *map(str, objects), "-o", str(out), f"-L{lib}", f"-Wl,-rpath,{lib}",
                               "-lc10", "-ltorch_cpu"], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"int8 linears: linking {target.name} failed:\n{done.stderr[-4000:]}")
        os.replace(out, target)
    return target


_loaded = None  # torch.ops.rksc_cpu_kernels, once its library is loaded in this process
AMX_ENV = "RKSC_CPU_AMX"  # 0: no AMX tiles (linear_amx.cpp reads it too)
ACTIVE_ATTR = "_rksc_cpu_kernels"  # on a model whose norms use_fused_norms pointed here


def _ops():
    global _loaded
    if _loaded is None:
        torch.ops.load_library(str(build()))
        _loaded = torch.ops.rksc_cpu_kernels
    return _loaded


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float weight -> (int8 values [N, K], float32 scales [N, K / 32]): each row's group of
    32 inputs is rounded to the nearest multiple of its max |w| / 127 (half to even)."""
    n, k = weight.shape
    if k % GROUP:
        raise ValueError(f"int8 linears need an input width divisible by {GROUP}, got {k}")
    w = weight.detach().float().view(n, k // GROUP, GROUP)
    scale = w.abs().amax(dim=2).clamp_min(torch.finfo(torch.float32).tiny) / 127
    return torch.round(w / scale[..., None]).clamp_(-127, 127).to(torch.int8).view(n, k), scale


def loaded() -> bool:
    """Whether this process has loaded the kernels' library already."""
    return _loaded is not None


def amx_rows() -> int:
    """The row count from which a linear runs on AMX tiles (``linear_amx.cpp``: the same bits, in
    fewer instructions), 0 where they do not run: no AMX-INT8, a Linux older than 5.16, or
    ``RKSC_CPU_AMX=0`` (any value but 0 or 1 there raises, naming it: start-up packs the weights)."""
    raw = os.environ.get(AMX_ENV, "").strip() or "1"
    if raw not in ("0", "1"):
        raise ValueError(f"{AMX_ENV} must be 0 or 1, got {raw!r}")
    return int(_ops().amx_rows())


def pack(weight: torch.Tensor, amx: bool | None = None) -> tuple[torch.Tensor, int]:
    """A linear's [N, K] weight as the kernel reads it: (int8 [B, K / 32, 576], N), B = ceil(N / 16)
    blocks of 16 columns. Per block and group of 32 inputs, 512 bytes of weights ([16 input
    pairs][16 columns][2]) then the 16 columns' float32 scales; padding columns are zeros. With
    ``amx`` (default: where ``amx_rows()``), B more blocks follow, the same weights as AMX tiles
    read them ([8 input quads][16 columns][4]), for 16 rows and more."""
    n, k = weight.shape
    q, scale = quantize_weight(weight)
    blocks, groups = -(-n // BLOCK), k // GROUP
    values = q.new_zeros(blocks * BLOCK, k)
    values[:n] = q
    scales = scale.new_zeros(blocks * BLOCK, groups)
    scales[:n] = scale
    scales = scales.view(blocks, BLOCK, groups).permute(0, 2, 1).contiguous().view(torch.int8)
    planes = [(GROUP // 2, 2)] + ([(GROUP // 4, 4)] if (amx_rows() > 0 if amx is None else amx) else [])
    packed = [torch.cat((values.view(blocks, BLOCK, groups, inputs, width).permute(0, 2, 3, 1, 4)
                         .reshape(blocks, groups, -1), scales), dim=2) for inputs, width in planes]
    return torch.cat(packed).contiguous(), n


def linear(x: torch.Tensor, packed: tuple[torch.Tensor, int], bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with ``packed = pack(weight)``, in float32, for x of any
    leading shape."""
    values, n = packed
    if (x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous()  # a decode step's, with or without bias
            and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))):
        return _ops().w8a16_linear(x, values, n, bias)
    rows = x.reshape(-1, x.shape[-1]).to(torch.float32).contiguous()
    out = _ops().w8a16_linear(rows, values, n, None if bias is None else bias.to(torch.float32).contiguous())
    return out.view(*x.shape[:-1], n).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, s): s = x + residual, y = s * rsqrt(mean(s^2) + eps) * weight, per row of float32
    [..., K]; SGLang's ``RMSNorm.forward_native`` up to the order of the sum of squares. Without a
    residual s is x, and the op returns an empty s rather than an alias of its input."""
    if x.dim() == 2 and x.is_contiguous() and (residual is None or residual.is_contiguous()):
        return _ops().add_rms_norm(x, residual, weight, eps)
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    res = None if residual is None else residual.reshape(rows.shape).contiguous()
    out, total = _ops().add_rms_norm(rows, res, weight, eps)
    return out.view(x.shape), (total if residual is None else total.view(x.shape))


def rope_neox(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``radix_ext.cpu.decode._rotate`` in one call, bit for bit: x [n, heads * 2h] (rows may be
    strided), cos / sin contiguous [n, 1, h] -> a new contiguous [n, heads * 2h]."""
    return _ops().rope_neox(x, heads, cos, sin)


def donor_kv(k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor], own: torch.Tensor, donors: torch.Tensor,
             cos: torch.Tensor, sin: torch.Tensor) -> None:
    """ASKS blend's reused rows in every layer at once (``radix_ext.asks.kv_writes``): slot ``own[r]``
    of each K and V buffer ([slots, heads, head] float32) takes slot ``donors[r]``'s, K rotated by
    cos / sin [n, head / 2] (``rope_neox``'s arithmetic). A donor slot that is also written is refused."""
    _ops().donor_kv(k_buffers, v_buffers, own, donors, cos, sin)


def causal_attention(query: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, table: torch.Tensor,
                     req_rows: torch.Tensor, row_offsets: torch.Tensor, row_positions: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """Causal attention of query rows at given positions of their requests (``causal_attention.cpp`` says
    how each row's sums run, so that its output does not depend on the rows computed beside it).
    query [T, q_heads, D] float32; k_buffer / v_buffer: the pool [slots, kv_heads, D / Dv];
    table [R, W] int32 (SGLang's ``req_to_token``); req_rows [B] int64; row_offsets [B + 1] int64;
    row_positions [T] int64 -> [T, q_heads, Dv]."""
    return _ops().causal_attention(query, k_buffer, v_buffer, table, req_rows, row_offsets, row_positions, scale)


@dataclasses.dataclass(frozen=True)
class LayerWeights:
    """What ``decode_layers`` reads of every decoder layer, in layer order (gathered once per model
    by ``radix_ext.cpu.decode_stack``). ``norms`` [2 L]: each layer's input and post-attention norm
    weights, float32 [H], at ``eps`` [2 L]; ``linears`` [4 L]: its qkv, o, gate_up and down weights
    as ``pack`` gives them, ``widths`` [4 L] their output widths; ``scales`` [L]: its attention's
    scaling; every layer has ``q_heads`` and ``kv_heads`` heads of ``head_dim``."""

    norms: list[torch.Tensor]
    eps: list[float]
    linears: list[torch.Tensor]
    widths: list[int]
    scales: list[float]
    q_heads: int
    kv_heads: int
    head_dim: int


def decode_layers(hidden: torch.Tensor, weights: LayerWeights, cos: torch.Tensor, sin: torch.Tensor,
                  k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor], out_cache_loc: torch.Tensor,
                  table: torch.Tensor, rows, first_q: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Every decoder layer of a decode step in one call (``decode_layers.cpp`` lists what each
    layer runs): hidden [n, H] float32, the embedding's output; cos / sin [n, 1, head_dim / 2];
    k_buffers / v_buffers: the KV pool's [slots, kv_heads, head_dim] per layer, written at
    out_cache_loc [n]; table and rows (``radix_ext.cpu.attention.QueryRows``) as
    ``causal_attention`` takes them; ``first_q`` [n, q_heads * head_dim]: the first layer's rotated
    queries, its K and V already in the pool, so it starts at its attention -> (hidden, residual)
    [n, H] before the stack's final norm."""
    w = weights
    return _ops().decode_layers(hidden, w.norms, w.eps, w.linears, w.widths, cos, sin, k_buffers, v_buffers,
                                out_cache_loc, table, rows.req_rows, rows.offsets, rows.positions, w.q_heads,
                                w.kv_heads, w.head_dim, w.scales, first_q)


def use_fused_norms(model: torch.nn.Module) -> int:
    """Point every plain float32 ``RMSNorm`` of the model at ``add_rms_norm`` (a norm's
    ``_forward_method``, which SGLang's forward and the lean decode both call), and its rotary
    embeddings at ``rope_neox`` (``use_fused_rotary``); returns how many norms.
    A call it does not cover (another dtype, a post-residual addition) goes to SGLang's
    ``forward_native``."""
    from sglang.srt.layers.layernorm import RMSNorm

    count = 0
    for norm in model.modules():
        weight = getattr(norm, "weight", None)
        if (type(norm) is not RMSNorm or not isinstance(weight, torch.Tensor) or weight.dtype != torch.float32
                or weight.dim() != 1 or weight.shape[0] % 16 or norm.variance_size_override is not None
                or norm.override_orig_dtype is not None or norm.cast_x_before_out_mul):
            continue
        norm._forward_method = _fused_forward(norm)
        count += 1
    model.__dict__[ACTIVE_ATTR] = True  # the lean decode rotates with rope_neox
    use_fused_rotary(model)
    return count


FUSED_ROTARY_ATTR = "rksc_rotary"  # on use_fused_rotary's forward: the rotary embedding it stands for


def plain_neox(rotary, resolved) -> bool:
    """A rotary embedding whose resolved forward is ``RotaryEmbedding.forward_native`` (or
    ``use_fused_rotary``'s) with the plain neox rotation over whole heads."""
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
    from sglang.srt.layers.rotary_embedding.utils import apply_rotary_emb

    return ((getattr(resolved, "__func__", None) is RotaryEmbedding.forward_native
             or getattr(resolved, FUSED_ROTARY_ATTR, None) is rotary)
            and getattr(rotary, "_apply_rotary_emb_wrapped", None) is apply_rotary_emb
            and rotary.is_neox_style and rotary.rotary_dim == rotary.head_size
            and not hasattr(rotary, "sin_cos_cache"))


def use_fused_rotary(model: torch.nn.Module) -> int:
    """Point every ``plain_neox`` rotary embedding of the model at ``rope_neox`` (its
    ``_forward_method``, which SGLang's prefill calls in every layer): cos / sin looked up as
    ``forward_native`` looks them up, then query and key rotated in one call each, the same bits.
    A call it does not cover (offsets, a fused KV write, not float32) goes to ``forward_native``;
    under a forced fused-op backend nothing is pointed. Returns how many."""
    from sglang.kernels.fused_op import get_fused_op_backend
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    if get_fused_op_backend() is not None:
        return 0
    count = 0
    for rotary in model.modules():
        if not isinstance(rotary, RotaryEmbedding):
            continue
        if rotary._forward_method is None:
            rotary._forward_method = rotary._resolve_forward_method()
        if plain_neox(rotary, rotary._forward_method) and getattr(rotary._forward_method, FUSED_ROTARY_ATTR, None) is None:
            rotary._forward_method = _fused_rotary(rotary)
            count += 1
    return count


def rotary_table(rotary, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The cos and sin [n, 1, head_size / 2] of a ``plain_neox`` rotary embedding at ``positions``,
    looked up as ``forward_native`` looks them up (a decode step does it once for every layer)."""
    cos, sin = rotary.cos_sin_cache.index_select(0, positions.flatten()).chunk(2, dim=-1)
    return cos.unsqueeze(-2).to(dtype).contiguous(), sin.unsqueeze(-2).to(dtype).contiguous()


def _fused_rotary(rotary):
    native = rotary.forward_native

    def rope_neox_forward(positions, query, key, offsets=None, fused_set_kv_buffer_arg=None):
        if (offsets is not None or fused_set_kv_buffer_arg is not None or query.dtype != torch.float32
                or key.dtype != torch.float32 or query.stride(-1) != 1 or key.stride(-1) != 1):
            return native(positions, query, key, offsets, fused_set_kv_buffer_arg)
        n, size = positions.numel(), rotary.head_size
        cos, sin = rotary_table(rotary, positions, query.dtype)
        q = rope_neox(query.reshape(n, -1), query.numel() // (n * size), cos, sin)
        k = rope_neox(key.reshape(n, -1), key.numel() // (n * size), cos, sin)
        return q.view(query.shape), k.view(key.shape)

    setattr(rope_neox_forward, FUSED_ROTARY_ATTR, rotary)
    return rope_neox_forward


def _fused_forward(norm):
    native = norm.forward_native

    def fused_rms_norm(x, residual=None, post_residual_addition=None, quant_linear=None):
        if (x.dtype != torch.float32 or post_residual_addition is not None
                or (residual is not None and residual.dtype != torch.float32)):
            return native(x, residual, post_residual_addition)
        out, total = add_rms_norm(x, residual, norm.weight.data, norm.variance_epsilon)
        return out if residual is None else (out, total)

    fused_rms_norm.rksc_norm = norm  # how radix_ext.cpu.decode_stack knows whose weights it reads
    return fused_rms_norm  # the name benchmarks.decode_profile knows it by


def main() -> int:
    why = unsupported()
    if why:
        print(f"int8 linears not built: {why}")
        return 0
    print(f"int8 linears: {build()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
