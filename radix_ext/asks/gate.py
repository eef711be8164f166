"""ASKS's gate and span signatures, in pure torch (no SGLang): what the unit tests pin.

A span's signature is, for each probed layer ``l`` (1-based; layer ``l`` is the output of the
``l``-th decoder layer, residual stream included), that full hidden state pooled over the span's
tokens (``--asks-pooling``: their mean, or the last token's state), kept in float16 on the host. Two spans' similarity is

    sigma = sum_l w_l cos(a_l - mu_l, b_l - mu_l) / sum_l w_l,   w_l = exp(alpha * l / L),

where ``mu`` is a background mean (the mean signature of a set of unrelated instructions, from
``benchmarks.calibrate_asks``; zero when there is none) and ``L`` the model's layer count. Raw
cosines of mean-pooled states sit close together for any two instructions (a shared component
dominates them); centring on the background removes it. The gate adopts iff ``tau < 1`` and
``sigma >= tau``; a NaN sigma (a zero vector) never adopts.
"""

from __future__ import annotations

import dataclasses
import math

import torch


@dataclasses.dataclass(frozen=True)
class Signature:
    """One span's signature: ``vectors[i]`` pools layer ``layers[i]`` over tokens [start, start + length)."""

    vectors: torch.Tensor  # [len(layers), hidden], float16, CPU
    layers: tuple[int, ...]
    start: int  # absolute token position of the span's first token
    length: int
    group: str | None = None  # the substitution group of the commit that computed it (radix_ext.asks.decision)

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def nbytes(self) -> int:
        return self.vectors.numel() * self.vectors.element_size()


def layer_weights(layers: tuple[int, ...], num_layers: int, alpha: float) -> torch.Tensor:
    """``exp(alpha * l / L)`` for each probed layer ``l``, float32."""
    return torch.exp(alpha * torch.tensor(layers, dtype=torch.float32) / num_layers)


def similarity(a: torch.Tensor, b: torch.Tensor, weights: torch.Tensor,
               background: torch.Tensor | None = None) -> float:
    """sigma of two signatures' vectors ([layers, hidden] each), in float32."""
    a, b = a.float(), b.float()
    if background is not None:
        a, b = a - background.float(), b - background.float()
    norms = a.norm(dim=-1) * b.norm(dim=-1)
    cosines = (a * b).sum(dim=-1) / norms  # a zero vector gives NaN, which never adopts
    return float((weights * cosines).sum() / weights.sum())


def adopts(sigma: float, tau: float) -> bool:
    return tau < 1.0 and not math.isnan(sigma) and sigma >= tau


@dataclasses.dataclass(frozen=True)
class Gate:
    """The gate with its settings bound (built once per scheduler from the config)."""

    tau: float
    alpha: float
    layers: tuple[int, ...]
    num_layers: int
    background: torch.Tensor | None = None  # [len(layers), hidden] float32, or None
    pooling: str = "mean"  # how radix_ext.asks.capture pools a span: "mean" or "last" (its last token)
    weights: torch.Tensor = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "weights", layer_weights(self.layers, self.num_layers, self.alpha))

    def sigma(self, a: Signature, b: Signature) -> float:
        if a.layers != self.layers or b.layers != self.layers:
            return math.nan  # signatures from another layer set are not comparable
        return similarity(a.vectors, b.vectors, self.weights, self.background)
