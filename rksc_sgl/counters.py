"""Token counters: what the requests a frontend backend sent cost, totalled from each response's
``meta_info``; the benchmark reads a phase's tokens as the difference of two snapshots."""

from __future__ import annotations

import dataclasses
from typing import Any

from rksc_sgl.protocol import ASKS_KEY


@dataclasses.dataclass
class TokenCounters:
    """Totals over every request a backend sent (zero-token prefix requests included)."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    blended_tokens: int = 0  # prompt tokens whose KV ASKS blend took from a donor, not recomputed

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens whose KV had to be computed (not served from the radix cache or a blend donor)."""
        return self.prompt_tokens - self.cached_tokens - self.blended_tokens

    def add(self, meta_info: dict[str, Any]) -> None:
        self.requests += 1
        self.prompt_tokens += meta_info.get("prompt_tokens", 0)
        self.cached_tokens += meta_info.get("cached_tokens", 0)
        self.completion_tokens += meta_info.get("completion_tokens", 0)
        asks = (meta_info.get(ASKS_KEY) or [None])[0]
        if isinstance(asks, dict) and asks.get("mode") == "blend":
            self.blended_tokens += asks.get("reused_tokens", 0)

    def __add__(self, other: "TokenCounters") -> "TokenCounters":
        return TokenCounters(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))

    def __sub__(self, other: "TokenCounters") -> "TokenCounters":
        return TokenCounters(*(getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self)))
