"""CPU-path speed settings applied with the ``rksc_cpu`` attention backend: thread count per
forward, and float32 linears through oneDNN with pre-packed weights.

**Threads.** How many OpenMP threads one forward of the scheduler uses, by its number of tokens.

Measured on the 2-core machine while other engines ran (load average 5-9): with 2 threads an
8- or 32-row matmul of decode took 16-32 ms instead of 0.2-2 ms, because each of the ~400
parallel regions of a decode step waits at its barrier for the second thread, which the OS has
lent to another process. Stock ``torch_native`` decode ran at 0.7 tok/s for one stream and 4.6 tok/s
for 8 there. With 1 thread a small forward never waits; a 1-row step loses nothing (it is
memory-bound), an 8-row step on an idle machine loses at most the second core's share. Large
forwards (prefill chunks) keep torch's default, as stock: their matmuls are long enough to
amortise a barrier, and an idle machine gives them both cores.

Set ``RKSC_CPU_SMALL_FORWARD_TOKENS`` (forwards of at most this many tokens are "small"; 0 turns
the policy off) and ``RKSC_CPU_SMALL_FORWARD_THREADS`` in the environment of the process that
starts SGLang; spawned schedulers inherit it.

**Linears.** ``F.linear`` in float32 goes to MKL, which on this AMD CPU ran 2.3-4x slower than
oneDNN with pre-packed weights at every size measured (1 thread: 8 rows 0.66 vs 0.24 ms for a
3072x576 + 576x1536 pair, 2000 rows 203 vs 86 ms; a whole decode step's linears, weights streamed
from memory: 1 row 32 vs 16 ms, 8 rows 58 vs 23 ms). ``use_onednn_linears`` swaps the
``quant_method`` of every unquantized float32 linear (and of the LM head) for a subclass whose
``apply`` calls ``torch.ops.mkldnn._linear_pointwise`` on a weight packed once; the weight is
re-packed if it is modified. Both are IEEE float32 with another summation order: outputs differ from
MKL's by float rounding (~3e-6 relative), as ``tests/integration/test_fast_decode.py`` bounds.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import torch

TOKENS_ENV = "RKSC_CPU_SMALL_FORWARD_TOKENS"
THREADS_ENV = "RKSC_CPU_SMALL_FORWARD_THREADS"


@dataclasses.dataclass(frozen=True)
class ThreadPolicy:
    """Forwards of at most ``small_forward_tokens`` tokens run on ``small_forward_threads``
    threads, larger ones on ``default_threads`` (torch's count when the policy was built)."""

    small_forward_tokens: int = 256  # decode of up to 256 streams, short extends (fork prefixes)
    small_forward_threads: int = 1
    default_threads: int = dataclasses.field(default_factory=torch.get_num_threads)

    def __post_init__(self) -> None:
        if not isinstance(self.small_forward_tokens, int) or self.small_forward_tokens < 0:
            raise ValueError(f"{TOKENS_ENV} must be an integer >= 0, got {self.small_forward_tokens!r}")
        if not isinstance(self.small_forward_threads, int) or self.small_forward_threads < 1:
            raise ValueError(f"{THREADS_ENV} must be an integer >= 1, got {self.small_forward_threads!r}")

    @classmethod
    def from_env(cls) -> "ThreadPolicy":
        defaults = cls()
        return cls(
            _env_int(TOKENS_ENV, defaults.small_forward_tokens),
            _env_int(THREADS_ENV, defaults.small_forward_threads),
        )

    def threads_for(self, num_tokens: int) -> int:
        return self.small_forward_threads if num_tokens <= self.small_forward_tokens else self.default_threads

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


ONEDNN_ENV = "RKSC_CPU_ONEDNN_LINEARS"  # "0" keeps SGLang's F.linear (for ablations)
PACKED_ATTR = "_rksc_onednn_weight"


def _onednn_linear(layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    weight = layer.weight
    key = (weight.data_ptr(), weight._version)
    packed = layer.__dict__.get(PACKED_ATTR)
    if packed is None or packed[0] != key:  # first use, or the weights were updated in place
        packed = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None))
        layer.__dict__[PACKED_ATTR] = packed
    return torch.ops.mkldnn._linear_pointwise(x, packed[1], bias, "none", [], "")


@functools.cache
def _onednn_methods() -> dict[type, type]:
    """SGLang's unquantized method classes -> our subclasses (made once, on first use)."""
    from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod, UnquantizedLinearMethod

    class OneDnnLinearMethod(UnquantizedLinearMethod):
        def apply(self, layer, x, bias=None):
            return _onednn_linear(layer, x, bias)

    class OneDnnLmHeadMethod(UnquantizedEmbeddingMethod):
        """Embedding lookups as stock; as LM head (SGLang calls ``apply`` for a method whose
        name it does not know as unquantized) the oneDNN linear."""

        def apply(self, layer, x, bias=None):
            return _onednn_linear(layer, x, bias)

    return {UnquantizedLinearMethod: OneDnnLinearMethod, UnquantizedEmbeddingMethod: OneDnnLmHeadMethod}


def use_onednn_linears(model: torch.nn.Module) -> int:
    """Route the model's float32 CPU linears and LM head through oneDNN; returns how many layers
    were newly packed (0 on a second call).

    Only layers whose method is exactly SGLang's unquantized one are touched; the input embedding
    (not an LM head unless tied, as in SmolLM2) keeps ``F.embedding``.
    """
    if not torch.backends.mkldnn.is_available() or os.environ.get(ONEDNN_ENV, "1") == "0":
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
        if type(method) in swaps.values() and PACKED_ATTR not in module.__dict__:
            _onednn_linear(module, weight.new_zeros(1, weight.shape[1]), None)  # pack now, not mid-request
            count += 1
    return count
