"""Public API of rksc-sgl: what reasoning-program authors and operators import.

Names resolve lazily so that importing ``rksc_sgl`` (which the CPU start-up hook does in every
interpreter) stays cheap and does not import SGLang.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "RkscConfig": "rksc_sgl.config",
    "launch_engine": "rksc_sgl.engine",
    "EngineBackend": "rksc_sgl.frontend",
    "default_model_path": "rksc_sgl.model_cache",
    "report_score": "rksc_sgl.scores",
    "verify": "rksc_sgl.verify",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rksc_sgl' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
