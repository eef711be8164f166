"""int8 linears on x86 CPUs with AVX-512 VNNI (``--cpu-linear-dtype int8``): the kernel in
``vnni.cpp``, compiled once per source and torch version into the user cache, its weight packing,
and the call.

**Why.** A one-stream decode step reads every weight once, and the step's linears are most of its
time (``docs/benchmarks.md``, "Where a decode step's time goes"). oneDNN's packed bf16 GEMV reads
them at about half the rate the machine streams memory (``python -m benchmarks.gemv_bandwidth``);
this kernel reads half the bytes, at nearer the stream's rate, and multiplies 64 byte pairs per
instruction, so batches of 8-32 rows gain too.

**Numbers.** Each weight row is rounded to int8 at its own scale (max |w| / 127), once, at
load; each input row likewise, at every call. The products are summed exactly in int32, then
scaled back to float32 (``vnni.cpp`` gives the formula). So a token's output depends on its own
input alone, never on the batch around it, which keeps mode comparisons in a benchmark exact.
The text differs from float32's as bf16's does: ``python -m benchmarks.speed --cpu-linear-dtype
int8`` reports greedy agreement with float32 beside the speed.

**Build.** ``python -m radix_ext.cpu.vnni`` (``make model`` runs it) compiles the kernel with the
C++ compiler ``$CXX`` (default ``g++``) against the installed torch's headers, about 10 s, into
``<cache>/kernels/`` (``rksc_sgl.model_cache.cache_dir``); the first engine that needs it builds
it otherwise. ``unsupported()`` names what is missing on a machine where it cannot run.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("vnni.cpp")
CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni")
COMPILE_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-mavx512f", "-mavx512bw",
                 "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mfma", "-ffp-contract=off", "-w")
BLOCK = 16  # output columns per packed block (one zmm of int32 sums)
GROUP = 32  # inputs per weight scale


def _compiler() -> str:
    return os.environ.get("CXX", "").strip() or "g++"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def unsupported() -> str | None:
    """Why the kernel cannot run here (None: it can)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"needs an x86-64 CPU (this is {platform.machine()})"
    missing = [flag for flag in CPU_FLAGS if flag not in _cpu_flags()]
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    if shutil.which(_compiler()) is None:
        return f"no C++ compiler {_compiler()!r} on PATH (set CXX)"
    return None


def library_path() -> Path:
    """Where the build of this source, for this torch and these flags, lives."""
    from rksc_sgl.model_cache import cache_dir

    key = hashlib.sha256(SOURCE.read_bytes())
    key.update(f"{torch.__version__}|{sys.version_info[:2]}|{_compiler()}|{' '.join(COMPILE_FLAGS)}".encode())
    return cache_dir() / "kernels" / f"rksc_vnni-{key.hexdigest()[:16]}.so"


def build() -> Path:
    """Compile the kernel unless this build exists; returns its path. Safe against a concurrent build
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
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        cmd = [_compiler(), *COMPILE_FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
               *(f"-I{p}" for p in cpp_extension.include_paths()), str(SOURCE), "-o", str(out),
               f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"int8 linears: compiling {SOURCE.name} failed:\n{done.stderr[-4000:]}")
        os.replace(out, target)
    return target


@functools.cache
def _op():
    torch.ops.load_library(str(build()))
    return torch.ops.rksc_vnni.w8a16_linear


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float weight -> (int8 values [N, K], float32 scales [N, K / 32]): each row's group of
    32 inputs is rounded to the nearest multiple of its max |w| / 127 (half to even)."""
    n, k = weight.shape
    if k % GROUP:
        raise ValueError(f"int8 linears need an input width divisible by {GROUP}, got {k}")
    w = weight.detach().float().view(n, k // GROUP, GROUP)
    scale = w.abs().amax(dim=2).clamp_min(torch.finfo(torch.float32).tiny) / 127
    return torch.round(w / scale[..., None]).clamp_(-127, 127).to(torch.int8).view(n, k), scale


def pack(weight: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A linear's [N, K] weight as the kernel reads it: (int8 [ceil(N / 16), K / 32, 576], N). Per
    block of 16 columns and group of 32 inputs, 512 bytes of weights ([16 input pairs][16
    columns][2]) then the 16 columns' float32 scales; padding columns are zeros."""
    n, k = weight.shape
    q, scale = quantize_weight(weight)
    blocks, groups = -(-n // BLOCK), k // GROUP
    values = q.new_zeros(blocks * BLOCK, k)
    values[:n] = q
    scales = scale.new_zeros(blocks * BLOCK, groups)
    scales[:n] = scale
    values = values.view(blocks, BLOCK, groups, GROUP // 2, 2).permute(0, 2, 3, 1, 4).reshape(blocks, groups, -1)
    scales = scales.view(blocks, BLOCK, groups).permute(0, 2, 1).contiguous().view(torch.int8)
    return torch.cat((values, scales), dim=2).contiguous(), n


def linear(x: torch.Tensor, packed: tuple[torch.Tensor, int], bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with ``packed = pack(weight)``, in float32, for x of any
    leading shape."""
    values, n = packed
    rows = x.reshape(-1, x.shape[-1]).to(torch.float32).contiguous()
    out = _op()(rows, values, n, None if bias is None else bias.to(torch.float32).contiguous())
    return out.view(*x.shape[:-1], n).to(x.dtype)


def main() -> int:
    why = unsupported()
    if why:
        print(f"int8 linears not built: {why}")
        return 0
    print(f"int8 linears: {build()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
