"""``SamplingConfig``: how every branch of a reasoning program samples.

Its own module, free of SGLang imports, so the benchmark's command line (``benchmarks.bench``)
can build and validate one without starting SGLang's frontend.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    num_branches: int = 4
    max_new_tokens: int = 128
    temperature: float = 0.7
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_branches < 1:
            raise ValueError(f"--num-branches must be >= 1, got {self.num_branches}")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"--temperature must be >= 0, got {self.temperature}")
