"""CPU-path speed settings applied with the ``rksc_cpu`` attention backend: thread count per
forward, and linears with pre-packed weights: int8 through our kernel (the default where the CPU
has AVX-512 VNNI), float32 or bfloat16 through oneDNN.

**Threads.** How many OpenMP threads a forward of the scheduler uses. Default: torch's own
count (both cores here), for every forward: the fastest on a machine that runs one engine
(``python -m benchmarks.speed``; with 1 thread decode and prefill read slower in its
``benchmarks/results/speed.jsonl`` rows of commit be69503).

On a machine shared with other busy processes set ``RKSC_CPU_THREADS=1``: there each of the
hundreds of parallel regions of a decode step waits at its barrier for a second thread that the OS
has lent to another process (libgomp's workers spin, which makes it worse).
``RKSC_CPU_LARGE_FORWARD_TOKENS=256`` then gives forwards of more tokens (prefill chunks) torch's
count again. Set them in the environment of the process that starts SGLang; spawned schedulers
inherit it.

**Linears.** ``F.linear`` in float32 goes to MKL, which on this AMD CPU was slower than oneDNN
with pre-packed weights for the shapes of a decode step, and faster for long prefill chunks
(``python -m benchmarks.prefill_compare`` shows the effect on a 2,000-token prefill). So float32
inputs of more than ``RKSC_CPU_ONEDNN_MAX_ROWS`` rows (default 256) keep ``F.linear``.
``use_packed_linears`` swaps the ``quant_method`` of every unquantized float32 linear (and of the
LM head) for a subclass whose ``apply`` calls ``torch.ops.mkldnn._linear_pointwise`` on a weight
packed once; the weight is re-packed if it is modified. Both are IEEE float32 with another
summation order: outputs differ from MKL's by float rounding (~3e-6 relative), as
``tests/integration/test_fast_decode.py`` bounds.

**bfloat16 linears** (``--cpu-linear-dtype bfloat16``). A decode step streams every weight once;
in float32 the linears and the tied LM head are 538 MB of SmolLM2-135M and most of a step's time
(``docs/benchmarks.md``, "Where a decode step's time goes"). Packed in bf16 they are half the
bytes, and AVX-512 BF16 multiplies them. The input is rounded to bf16, oneDNN sums in float32
and rounds the output to bf16, which goes back to float32; norms, attention, the KV cache and
sampling stay float32. Every row count (prefill chunks too) takes this path, so a row's numbers
depend on its batch no more than float32's do (the down projection's split sum, K = 1,536, is
the one shape where they differ). The float32 weights stay in the model (the tied input embedding
reads the LM head's, and a weight updated in place is packed again from them); CGEE's logit lens
applies the packed head, as SGLang's logits processor does (``radix_ext.cgee.forward``).

**int8 linears** (``--cpu-linear-dtype int8``, the default on x86 with AVX-512 VNNI and a C++
compiler, ``rksc_sgl.config.default_cpu_linear_dtype``). The same swap, with the weights packed for
our own kernel (``radix_ext.cpu.kernels``: int8 with a scale per 32 inputs, int16 inputs, exact
int32 sums), at every row count; and the model's RMSNorms point at its fused residual add + norm.
A row's output does not depend on its batch at all. A linear whose input width is not a multiple
of 32 keeps float32 (with a warning).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

import torch
import torch.nn.functional as F

from radix_ext.cpu import kernels
from rksc_sgl.config import ONEDNN_LINEARS_ENV, onednn_linears_off

logger = logging.getLogger(__name__)

THREADS_ENV = "RKSC_CPU_THREADS"
LARGE_TOKENS_ENV = "RKSC_CPU_LARGE_FORWARD_TOKENS"


@dataclasses.dataclass(frozen=True)
class ThreadPolicy:
    """Forwards run on ``threads`` threads (0: ``default_threads``, torch's count when the policy
    was built), except forwards of more than ``large_forward_tokens`` tokens (if > 0), which run
    on ``default_threads``."""

    threads: int = 0
    large_forward_tokens: int = 0
    default_threads: int = dataclasses.field(default_factory=torch.get_num_threads)

    def __post_init__(self) -> None:
        for value, env in ((self.threads, THREADS_ENV), (self.large_forward_tokens, LARGE_TOKENS_ENV)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{env} must be an integer >= 0, got {value!r}")

    @classmethod
    def from_env(cls) -> "ThreadPolicy":
        defaults = cls()
        return cls(
            _env_int(THREADS_ENV, defaults.threads),
            _env_int(LARGE_TOKENS_ENV, defaults.large_forward_tokens),
        )

    def threads_for(self, num_tokens: int) -> int:
        if self.threads == 0 or 0 < self.large_forward_tokens < num_tokens:
            return self.default_threads
        return self.threads

    def apply(self, num_tokens: int) -> None:
        threads = self.threads_for(num_tokens)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


# oneDNN, and torch's ideep layer above it, each keep the primitives they build (JIT code and
# scratch) in a cache of 1,024 by default, one primitive per input shape. A server's forwards
# bring every row count from 1 to MAX_ROWS: with SmolLM2-135M's four linear shapes, a loop over
# every row count left a fresh process ~480 MB larger; that was the scheduler's steady growth
# under benchmarks.soak (150 MB in 30 minutes, still climbing). Capped, a primitive that falls out is
# rebuilt when its shape comes back, which the same loop did not measurably slow.
ONEDNN_CACHE_ENVS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's, ideep's
ONEDNN_CACHE_CAPACITY = 64


def cap_onednn_caches() -> dict[str, str]:
    """Cap both primitive caches at ``ONEDNN_CACHE_CAPACITY`` unless the environment sets them.

    Each library reads its variable once, when it first builds a primitive, so this runs first
    thing in every SGLang process that loads our plugin; returns the values in force.
    """
    return {name: os.environ.setdefault(name, str(ONEDNN_CACHE_CAPACITY)) for name in ONEDNN_CACHE_ENVS}


ONEDNN_ENV = ONEDNN_LINEARS_ENV  # "0" keeps SGLang's F.linear (for ablations)
MAX_ROWS_ENV = "RKSC_CPU_ONEDNN_MAX_ROWS"
MAX_ROWS = _env_int(MAX_ROWS_ENV, 256)  # more float32 rows than this (prefill chunks): MKL's F.linear
PACKED_ATTR = "_rksc_onednn_weight"
LINEAR_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int8": torch.int8}  # --cpu-linear-dtype


def _onednn_linear(layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    weight = layer.weight
    dtype = getattr(layer.quant_method, "compute_dtype", weight.dtype)
    if dtype == weight.dtype and x.numel() > MAX_ROWS * x.shape[-1]:
        return F.linear(x, weight, bias)
    key = (weight.data_ptr(), weight._version)
    packed = layer.__dict__.get(PACKED_ATTR)
    if packed is None or packed[0] != key:  # first use, or the weights were updated in place
        packed = (key, kernels.pack(weight) if dtype == torch.int8
                  else torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), None))
        layer.__dict__[PACKED_ATTR] = packed
    if dtype == torch.int8:
        return kernels.linear(x, packed[1], bias)
    if dtype == x.dtype:
        return torch.ops.mkldnn._linear_pointwise(x, packed[1], bias, "none", [], "")
    # Reduced-precision weights: the input is rounded to their dtype, oneDNN accumulates in float32
    # and rounds its output to that dtype; the bias is added in the input's dtype.
    out = torch.ops.mkldnn._linear_pointwise(x.to(dtype), packed[1], None, "none", [], "").to(x.dtype)
    return out if bias is None else out.add_(bias)


@functools.cache
def _onednn_methods() -> dict[type, type]:
    """SGLang's unquantized method classes -> our subclasses (made once, on first use)."""
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod, UnquantizedLinearMethod

    class OneDnnLinearMethod(UnquantizedLinearMethod):
        compute_dtype = torch.float32  # set per instance by use_packed_linears

        def apply(self, layer, x, bias=None):
            return _onednn_linear(layer, x, bias)

    class OneDnnLmHeadMethod(UnquantizedEmbeddingMethod):
        """Embedding lookups as stock; as LM head (SGLang calls ``apply`` for a method whose
        name it does not know as unquantized) the oneDNN linear."""

        compute_dtype = torch.float32

        def apply(self, layer, x, bias=None):
            return _onednn_linear(layer, x, bias)

    return {UnquantizedLinearMethod: OneDnnLinearMethod, UnquantizedEmbeddingMethod: OneDnnLmHeadMethod}


def use_packed_linears(model: torch.nn.Module, dtype: str = "float32") -> int:
    """Route the model's float32 CPU linears and LM head through weights packed once in ``dtype``
    (a ``LINEAR_DTYPES`` name: oneDNN for float32 and bfloat16, ``radix_ext.cpu.kernels`` for int8);
    returns how many layers were newly packed (0 on a second call).

    Only layers whose method is exactly SGLang's unquantized one are touched; the input embedding
    (not an LM head unless tied, as in SmolLM2) keeps ``F.embedding``. In float32 the weights stay
    the model's; another dtype keeps a packed copy beside them, and every row count (prefill chunks
    included) goes through it, so a token's numbers do not depend on what it was batched with.
    """
    if dtype not in LINEAR_DTYPES:
        raise ValueError(f"--cpu-linear-dtype must be one of {', '.join(LINEAR_DTYPES)}, got {dtype!r}")
    if dtype == "int8" and kernels.unsupported():
        raise ValueError(f"--cpu-linear-dtype int8: {kernels.unsupported()}; use bfloat16 or float32")
    if not torch.backends.mkldnn.is_available() or onednn_linears_off():
        if dtype != "float32":
            raise ValueError(f"--cpu-linear-dtype {dtype} needs oneDNN linears ({ONEDNN_ENV}=0 or no oneDNN)")
        return 0
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod

    swaps = _onednn_methods()
    lm_head = getattr(model, "lm_head", None)
    count = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dtype != torch.float32:
            continue
        if weight.dim() != 2 or weight.device.type != "cpu":
            continue
        if type(method) is UnquantizedEmbeddingMethod and module is not lm_head:
            continue
        new_type = swaps.get(type(method))
        if new_type is not None:
            method.__class__ = new_type  # keep the method's state; only ``apply`` differs
            method.compute_dtype = LINEAR_DTYPES[dtype]
            if dtype == "int8" and weight.shape[1] % kernels.GROUP:  # the kernel's groups do not divide it
                method.compute_dtype = torch.float32
                logger.warning("rksc_cpu: a linear of input width %d keeps float32 (int8 needs a multiple of %d)",
                               weight.shape[1], kernels.GROUP)
        if type(method) in swaps.values() and PACKED_ATTR not in module.__dict__:
            _onednn_linear(module, weight.new_zeros(1, weight.shape[1]), None)  # pack now, not mid-request
            count += 1
    if dtype == "int8":
        kernels.use_fused_norms(model)
    return count
