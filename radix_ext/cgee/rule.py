"""CGEE level 2's entropy rule, in torch: the logit lens's entropy, and the stopping rule
replayed offline on a full-depth pass (what calibration searches thresholds with). A request's
early-exit options (``EarlyExitParams``) are part of the wire protocol, ``rksc_sgl.protocol``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rksc_sgl.protocol import EarlyExitParams


def lens_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each row's softmax.  logits: [rows, vocab] -> [rows], float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def first_exit_layer(entropies: Sequence[float | None], params: EarlyExitParams) -> int:
    """Replay the rule on a full-depth pass's entropies (index 0 = layer 1); L if it never exits.

    The runtime applies ``should_exit`` layer by layer as the pass runs; this is the same rule
    offline, which is what calibration searches thresholds with.
    """
    previous = None
    for layer, entropy in enumerate(entropies, start=1):
        if entropy is not None and params.should_exit(layer, entropy, previous):
            return layer
        previous = entropy
    return len(entropies)
