"""CGEE level 2 in the runtime: a logit-lens forward that stops after the exit layer.

An AROUND hook on ``LlamaForCausalLM.forward`` (Llama-3, Mistral, Falcon3, SmolLM2: SGLang runs them
all with its Llama classes) and on ``Qwen2ForCausalLM.forward`` (Qwen2, Qwen2.5), whose decoder
stacks SGLang writes the same way, sends every batch to SGLang's own forward unless
a row of an EXTEND batch carries ``rksc_early_exit`` options (``radix_ext.cgee.requests``). Such a
batch runs ``_lens_forward``: the layer loop of ``LlamaModel.forward``, which after each layer
reads the residual stream's full hidden state at each flagged row's last token
(``residual_batch.snapshot``, no side effect), applies the final norm and the LM head (the logit
lens), and applies ``EarlyExitParams.should_exit`` to its entropy. A row that exits keeps its
exit-layer normed state, which replaces its last-token state before the logits processor, so its
sampled token and log-probabilities are the exit layer's verdict. The loop breaks once every row
of the batch has exited: the remaining layers do not run. Rows without options, or still
running, are computed exactly as SGLang computes them (the same layer calls, the same final norm
and logits processor), which ``tests/integration/test_cgee.py`` checks.

Each row's diagnostics go back through ``LogitsProcessorOutput.customized_info``, which SGLang
puts in the response's ``meta_info`` as one-element lists (one per generated token):
``rksc_exit_layer``, ``rksc_entropies`` (per layer, None where no lens ran), ``rksc_lens_logprobs``,
``rksc_layers_run`` (layers the batch ran), ``rksc_batch_rows`` and, when the
``count_layer_calls`` forward hook is registered, ``rksc_layer_calls``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from radix_ext.cgee import requests as exit_requests
from radix_ext.cgee.rule import lens_entropy
from radix_ext.model_stack import TARGETS, norm_kwargs, plain_call, plain_stack
from radix_ext.ops.metrics import EXIT_ROWS
from rksc_sgl.protocol import EarlyExitParams

logger = logging.getLogger(__name__)

CALLS_ATTR = "rksc_layer_calls"
# SGLang ``forward_hooks`` entry for the counter (fnmatch's * would also match the submodules).
LAYER_CALL_COUNTER = {
    "name": "rksc_layer_calls",
    "target_modules": ["model.layers.[0-9]", "model.layers.[0-9][0-9]", "model.layers.[0-9][0-9][0-9]"],
    "hook_factory": "radix_ext.cgee.forward:count_layer_calls",
}


def _flagged_rows(forward_batch) -> list[EarlyExitParams | None] | None:
    """Per row, the options of a flagged prefill (last chunk); None for a batch without one."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    if not exit_requests.any_flagged() or forward_batch.forward_mode != ForwardMode.EXTEND or not forward_batch.rids:
        return None  # decode batches included: a flagged request never decodes a token it keeps
    rows = exit_requests.rows_of(forward_batch.rids)
    return rows if any(p is not None for p in rows) else None


def _supported(model, extra_args: tuple, kwargs: dict[str, Any]) -> bool:
    """The lens loop replicates the plain Llama / Qwen2 stacks only (``radix_ext.model_stack``),
    with an unquantized LM head; anything else keeps SGLang's forward (and is reported once)."""
    supported = (
        plain_call(extra_args, kwargs)
        and plain_stack(model) is None
        and getattr(model, "quant_config", None) is None
        and isinstance(getattr(model.lm_head, "weight", None), torch.Tensor)
    )
    if not supported and not getattr(model, "_rksc_warned", False):
        model._rksc_warned = True
        logger.warning("early exit is not supported for %s here: flagged requests run full depth",
                       type(model).__name__)
    return supported


def _around_forward(original, model, input_ids, positions, forward_batch, *args, **kwargs):
    rows = _flagged_rows(forward_batch)
    if rows is None:
        return original(model, input_ids, positions, forward_batch, *args, **kwargs)
    setattr(forward_batch, CALLS_ATTR, 0)
    num_layers = model.model.end_layer - model.model.start_layer
    probes = any(p is not None and p.first_lens_layer(num_layers) <= num_layers for p in rows)
    if probes and _supported(model, args, kwargs):
        return _lens_forward(model, input_ids, positions, forward_batch, _LensPass(rows, num_layers))
    out = original(model, input_ids, positions, forward_batch, *args, **kwargs)
    return _attach_info(out, forward_batch, _LensPass(rows, num_layers), layers_run=num_layers)


class _LensPass:
    """Per-row lens bookkeeping of one forward (rows without options never exit)."""

    def __init__(self, rows: list[EarlyExitParams | None], num_layers: int):
        self.rows, self.num_layers = rows, num_layers
        self.entropies: list[list[float | None] | None] = [
            [None] * num_layers if p is not None and p.uses_lens else None for p in rows
        ]
        self.token_logprobs: list[list[Any] | None] = [
            [None] * num_layers if p is not None and p.lens_token_ids else None for p in rows
        ]
        self.exit_layer: list[int | None] = [None] * len(rows)
        self.exit_states: dict[int, torch.Tensor] = {}  # row -> [hidden] normed state at its exit

    def rows_to_probe(self, layer: int) -> list[int]:
        return [
            r for r, p in enumerate(self.rows)
            if p is not None and p.uses_lens and self.exit_layer[r] is None
            and layer >= p.first_lens_layer(self.num_layers)
        ]

    def observe(self, layer: int, rows: list[int], normed: torch.Tensor, logits: torch.Tensor) -> None:
        """normed: [len(rows), hidden]; logits: [len(rows), vocab]."""
        entropies = lens_entropy(logits).tolist()
        for j, (r, entropy) in enumerate(zip(rows, entropies)):
            params, history = self.rows[r], self.entropies[r]
            history[layer - 1] = entropy
            if params.lens_token_ids:
                logp = torch.log_softmax(logits[j].float(), dim=-1)
                self.token_logprobs[r][layer - 1] = logp[list(params.lens_token_ids)].tolist()
            previous = history[layer - 2] if layer >= 2 else None
            if layer < self.num_layers and params.should_exit(layer, entropy, previous):
                self.exit_layer[r] = layer
                self.exit_states[r] = normed[j]

    def all_exited(self) -> bool:
        return all(p is not None and not p.full_depth and e is not None for p, e in zip(self.rows, self.exit_layer))

    def info(self, layers_run: int, layer_calls: int) -> dict[str, list[Any]]:
        flagged = [p is not None for p in self.rows]
        exit_layers = [(e if e is not None else self.num_layers) if f else None for f, e in zip(flagged, self.exit_layer)]
        EXIT_ROWS.update(e for e in exit_layers if e is not None)
        info = {
            "rksc_exit_layer": exit_layers,
            "rksc_entropies": self.entropies,
            "rksc_layers_run": [layers_run if f else None for f in flagged],
            "rksc_batch_rows": [len(self.rows) if f else None for f in flagged],
        }
        if any(t is not None for t in self.token_logprobs):
            info["rksc_lens_logprobs"] = self.token_logprobs
        if layer_calls:
            info["rksc_layer_calls"] = [layer_calls if f else None for f in flagged]
        return info


def _lens_logits(model, normed: torch.Tensor) -> torch.Tensor:
    """normed: [rows, hidden] -> [rows, vocab] float32: the LM head as SGLang's logits processor
    applies it (the head's own method where SGLang calls it, e.g. the CPU path's packed int8 or
    oneDNN head, radix_ext.cpu.speed; else a matmul), on the unpadded vocabulary."""
    from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method

    head, vocab = model.lm_head, model.config.vocab_size
    if should_apply_lm_head_quant_method(head, getattr(head, "quant_method", None)):
        return head.quant_method.apply(head, normed)[:, :vocab].float()
    weight = head.weight[:vocab]
    return torch.matmul(normed.to(weight.dtype), weight.T).float()


@torch.no_grad()
def _lens_forward(model, input_ids, positions, forward_batch, lens: _LensPass):
    """``LlamaModel.forward`` + ``LlamaForCausalLM.forward`` (sglang 0.5.23; Qwen2's are the same
    but for ``skip_empty`` on the final norm) with lens and exit."""
    from sglang.srt.layers.layer_boundary.residual import batch as residual_batch

    stack = model.model
    hidden = stack.embed_tokens(input_ids)
    residual_batch.start(forward_batch)
    last_token = torch.cumsum(forward_batch.extend_seq_lens, dim=0) - 1  # [rows] flat index
    layers_run = 0
    for i in range(stack.start_layer, stack.end_layer):
        hidden = stack.layers[i](positions, hidden, forward_batch)
        layers_run += 1
        probe = lens.rows_to_probe(layers_run)
        if probe:
            state = residual_batch.snapshot(hidden, forward_batch)[last_token[probe]]  # [probe, hidden]
            normed = stack.norm(state)  # one-argument RMSNorm: not in place
            lens.observe(layers_run, probe, normed, _lens_logits(model, normed))
        if lens.all_exited():
            break
    hidden = residual_batch.final_norm(hidden, forward_batch, stack.norm, **norm_kwargs(stack))  # releases the stream
    for row, state in lens.exit_states.items():
        hidden[last_token[row]] = state.to(hidden.dtype)
    out = model.logits_processor(input_ids, hidden, model.lm_head, forward_batch)
    return _attach_info(out, forward_batch, lens, layers_run)


def _attach_info(out, forward_batch, lens: _LensPass, layers_run: int):
    info = lens.info(layers_run, getattr(forward_batch, CALLS_ATTR, 0))
    out.customized_info = {**(out.customized_info or {}), **info}
    return out


def count_layer_calls(config: dict[str, Any]):
    """``--forward-hooks`` factory (see ``LAYER_CALL_COUNTER``): counts the decoder-layer calls of
    a flagged forward, independently of the loop above (tests use it to see skipped layers)."""

    def hook(module, args, output):
        forward_batch = args[2] if len(args) > 2 else None
        if forward_batch is not None and hasattr(forward_batch, CALLS_ATTR):
            setattr(forward_batch, CALLS_ATTR, getattr(forward_batch, CALLS_ATTR) + 1)

    return hook


def install() -> None:
    from radix_ext import hooks

    exit_requests.install()
    for target in TARGETS:
        hooks.around(target, _around_forward)
