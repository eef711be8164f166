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
    """All mechanisms default to off: then SGLang runs as stock, but for seeded sampling."""

    rsbcm: bool = False  # eviction by branch_score / (depth + 1)
    # Seeded, batch-invariant sampling on SGLang's "pytorch" sampling backend (the CPU's):
    # a request's draws depend only on its logits, its sampling_seed (random if absent) and the
    # token position (radix_ext.sampler). Off: SGLang's own sampler, which drops seeds on CPU.
    seeded_sampling: bool = True
    # Diagnostics: each sampled token's Gumbel decision margin in meta_info (rksc_sample_margin).
    report_sampling_margins: bool = False
    # CGEE verify() defaults (rksc_sgl.verify). Level 1 skips verification when the winner's
    # confidence >= tau_conf and beats the runner-up by the relative margin; level 2 exits at the
    # first layer >= min_layer with lens entropy < theta that moved < epsilon (nats). Values:
    # benchmarks/results/cgee_thresholds.json, calibrated for SmolLM2-135M with seeded sampling on
    # 400 held-apart problems (the last 100 of each dataset) for a 5% bound on CGEE error
    # (`python -m benchmarks.calibrate_cgee`, see its docstring). Its logit lens decides like the
    # full depth on at most 62% of problems before layer 30, so the calibration switches level 2
    # off (min_layer = L = 30): recalibrate for another model.
    cgee_tau_conf: float = 0.2
    cgee_margin: float = 0.8
    cgee_theta: float = 0.1
    cgee_epsilon: float = 0.02
    cgee_min_layer: int = 30

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type in ("bool", bool) and not isinstance(value, bool):
                raise ValueError(f"--{flag_name(field.name)} must be true or false, got {value!r}")
        _check_cgee(self)

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


def _check_cgee(config: RkscConfig) -> None:
    for name in ("cgee_tau_conf", "cgee_margin", "cgee_theta", "cgee_epsilon"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"--{flag_name(name)} must be a number >= 0, got {value!r}")
    for name in ("cgee_tau_conf", "cgee_margin"):
        if getattr(config, name) > 1:
            raise ValueError(f"--{flag_name(name)} must be in [0, 1], got {getattr(config, name)!r}")
    value = config.cgee_min_layer
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ValueError(f"--cgee-min-layer must be an int >= 2, got {value!r}")


def flag_name(field_name: str) -> str:
    return field_name.replace("_", "-")
