"""rksc-sgl's options: one frozen dataclass, the single source of defaults for flags and engine.

The options travel to SGLang's spawned scheduler as JSON in the ``RKSC_SGL_CONFIG`` environment
variable (set by ``launch_engine`` / ``rksc_sgl.launch_server``, or by hand before
``python -m sglang.launch_server``), because spawn carries no Python state over.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

ENV_VAR = "RKSC_SGL_CONFIG"
BACKEND_NAME = "rksc"


@dataclasses.dataclass(frozen=True)
class RkscConfig:
    """All mechanisms default to off: then SGLang runs exactly as stock."""

    rsbcm: bool = False  # eviction by branch_score / (depth + 1)

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type in ("bool", bool) and not isinstance(value, bool):
                raise ValueError(f"--{flag_name(field.name)} must be true or false, got {value!r}")

    @property
    def uses_backend(self) -> bool:
        return self.rsbcm

    def server_overrides(self) -> dict[str, Any]:
        """SGLang ``ServerArgs`` fields implied by these options."""
        return {"radix_cache_backend": BACKEND_NAME} if self.uses_backend else {}

    def export_to_env(self) -> None:
        os.environ[ENV_VAR] = json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls) -> "RkscConfig":
        raw = os.environ.get(ENV_VAR)
        if not raw:
            return cls()
        try:
            values = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"{ENV_VAR} is not valid JSON: {e}") from None
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{ENV_VAR} has unknown option(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


def flag_name(field_name: str) -> str:
    return field_name.replace("_", "-")
