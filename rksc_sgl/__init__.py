"""Public API of rksc-sgl: what reasoning-program authors and operators import.

Names resolve lazily so that importing ``rksc_sgl`` (which the CPU start-up hook does in every
interpreter) stays cheap and does not import SGLang.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    # Configuration and the runtime: an in-process engine, or a server's URL.
    "RkscConfig": "rksc_sgl.config",
    "launch_engine": "rksc_sgl.engine",
    "default_model_path": "rksc_sgl.model_cache",
    "RkscEngineEndpoint": "rksc_sgl.engine_endpoint",
    "RkscEndpoint": "rksc_sgl.endpoint",
    # Program primitives: per-branch options (seed, depth, score), paraphrase forks and shared
    # chunks (ASKS), scores,
    # verification (a Candidate's token log-probabilities come from token_logprobs; CgeeThresholds.load reads
    # a calibration file). No export shares its name with a module (a submodule import would
    # replace the export in this namespace).
    "branch_options": "rksc_sgl.program_state",
    "paraphrase_fork": "rksc_sgl.primitives",
    "share_chunks": "rksc_sgl.primitives",
    "report_score": "rksc_sgl.scores",
    "Candidate": "rksc_sgl.cgee",
    "CgeeThresholds": "rksc_sgl.cgee",
    "token_logprobs": "rksc_sgl.cgee",
    "verify": "rksc_sgl.cgee",
    # Adaptive sampling: fork until a stop rule decides the vote.
    "adaptive_fork": "rksc_sgl.adaptive",
    "StopRule": "rksc_sgl.adaptive",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rksc_sgl' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
