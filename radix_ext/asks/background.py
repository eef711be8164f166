"""The background mean ASKS's gate centres signatures on, per model (see ``radix_ext.asks.gate``).

``benchmarks.calibrate_asks`` writes it: the mean signature of its calibration instructions at
every layer, one per pooling (``--asks-pooling``: mean over the span, or its last token), with the model's fingerprint (a hash of its final norm's weights, which any two
checkpoints of different weights tell apart). ``--asks-background auto`` loads the packaged file
whose fingerprint matches the served model (``radix_ext/asks/backgrounds/``), ``none`` uses raw
cosines, and a path loads that file (refused if its fingerprint is another model's).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

PACKAGED = Path(__file__).parent / "backgrounds"


def fingerprint(norm_weight: torch.Tensor) -> str:
    return hashlib.sha256(norm_weight.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def model_fingerprint(model) -> str | None:
    norm = getattr(getattr(model, "model", None), "norm", None)
    weight = getattr(norm, "weight", None)
    return fingerprint(weight) if isinstance(weight, torch.Tensor) else None


def save(path: Path, *, backgrounds: dict[str, torch.Tensor], model_fp: str, model_name: str) -> None:
    """``backgrounds``: by pooling (``--asks-pooling``), [num_layers, hidden], row ``l - 1`` for layer ``l``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"fingerprint": model_fp, "model": model_name,
                "backgrounds": {k: v.half() for k, v in backgrounds.items()}}, path)


def load(spec: str, model_fp: str | None, layers: tuple[int, ...], pooling: str = "mean") -> torch.Tensor | None:
    """[len(layers), hidden] float32 for ``--asks-background spec`` and ``--asks-pooling``, or
    None (raw cosines)."""
    if spec == "none":
        return None
    if spec == "auto":
        files = sorted(PACKAGED.glob("*.pt"))
        matches = [f for f in files if model_fp is not None and _read(f)["fingerprint"] == model_fp]
        if not matches:
            logger.warning("ASKS: no packaged background for this model (fingerprint %s): the gate "
                           "uses raw cosines; run benchmarks.calibrate_asks and pass --asks-background",
                           model_fp)
            return None
        data = _read(matches[0])
    else:
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"--asks-background {spec!r}: no such file")
        data = _read(path)
        if model_fp is not None and data["fingerprint"] != model_fp:
            raise ValueError(f"--asks-background {spec!r} was calibrated for model {data['model']!r} "
                             f"(fingerprint {data['fingerprint']}), not the served one ({model_fp})")
    if pooling not in data.get("backgrounds", {}):
        raise ValueError(f"--asks-background {spec!r} has no background for --asks-pooling {pooling} "
                         f"(has {sorted(data.get('backgrounds', {}))}); rerun benchmarks.calibrate_asks")
    background = data["backgrounds"][pooling].float()
    if max(layers) > background.shape[0]:
        raise ValueError(f"--asks-background has {background.shape[0]} layers; --asks-layers asks for {max(layers)}")
    return background[[layer - 1 for layer in layers]]


def _read(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)
