"""Our sampler in SGLang's scheduler: seeded, batch-invariant draws (``radix_ext.sampling.seeded``).

Stock SGLang 0.5.23 honours ``sampling_seed`` only under ``--enable-deterministic-inference``,
which the CPU path cannot run (it refuses ``torch_native``-family attention, its batch-invariant
ops are GPU-only); otherwise the CPU samples with the global generator and seeds are dropped.
Two small seams put ours in their place:

* ``register_sampler_backend("pytorch", RkscSampler)``: on the CPU, SGLang forces the sampling
  backend name ``pytorch`` and ``create_sampler`` consults registered factories first.
  ``RkscSampler`` is SGLang's ``Sampler`` with ``_sample_from_probs`` replaced: it receives the
  temperature-scaled probabilities, so log-probabilities returned to clients (CGEE reads them)
  stay those of the unperturbed distribution, exactly as stock computes them. All-greedy batches
  never reach it (SGLang takes the argmax), nor do requests asking for sampling masks.
* an AFTER hook on ``SamplingBatchInfo.adjusted_from_schedule_batch`` (SGLang's placeholder,
  called for every new batch) fills ``sampling_seed`` with each request's seed. A request without
  one gets a random seed once, stored on its ``SamplingParams``, so a retracted and re-prefilled
  request keeps drawing from the same stream. SGLang's batch merge and filter carry the tensor.

The OpenAI-compatible routes already map ``seed`` to ``sampling_seed`` in 0.5.23, so ``seed``
works there too (``tests/integration/test_seeded_sampling.py::TestOpenAiSeed``). With
``report_sampling_margins`` on (``RkscConfig``), every sampled token's decision margin (best
minus second-best perturbed score at the closer of the two Gumbel stages) goes back in
``meta_info["rksc_sample_margin"]``; tests use it to tell near-ties from bugs.
"""

from __future__ import annotations

import secrets

import torch

from radix_ext.sampling import seeded as seeded_sampling

BACKEND = "pytorch"
SEED_TARGET = "sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.adjusted_from_schedule_batch"
from rksc_sgl.protocol import SAMPLE_MARGIN_KEY as MARGIN_KEY
_SEED_LIMIT = 2**63 - 1


def _sampler_class():
    from sglang.srt.layers.sampler import Sampler

    class RkscSampler(Sampler):
        report_margins = False

        def forward(self, logits_output, sampling_info, *args, **kwargs):
            self._margins = None
            tokens = super().forward(logits_output, sampling_info, *args, **kwargs)
            if self.report_margins:
                rows = tokens.shape[0]
                margins = [None] * rows if self._margins is None else [float(m) for m in self._margins]
                logits_output.customized_info = {**(logits_output.customized_info or {}), MARGIN_KEY: margins}
            return tokens

        def _sample_from_probs(self, probs, sampling_info, positions, simple_sampling_case):
            seeds = sampling_info.sampling_seed
            if seeds is None or sampling_info.sampling_mask_batch_indices is not None:
                return super()._sample_from_probs(probs, sampling_info, positions, simple_sampling_case)
            need = not simple_sampling_case
            result = seeded_sampling.sample(
                probs, seeds, positions,
                top_ks=sampling_info.top_ks if need and sampling_info.need_top_k_sampling else None,
                top_ps=sampling_info.top_ps if need and sampling_info.need_top_p_sampling else None,
                min_ps=sampling_info.min_ps if need and sampling_info.need_min_p_sampling else None,
                return_scores=self.report_margins,
            )
            if self.report_margins:
                result, margins = result
                self._margins = margins.min(dim=1).values.tolist()
            return result.to(torch.int32), None

    return RkscSampler


def assign_seeds(reqs) -> torch.Tensor:
    """Each request's seed as an int64 tensor; unseeded requests get a random one, kept."""
    seeds = []
    for req in reqs:
        params = req.sampling_params
        if params.sampling_seed is None:
            params.sampling_seed = secrets.randbelow(_SEED_LIMIT)
        seeds.append(int(params.sampling_seed))
    return torch.tensor(seeds, dtype=torch.int64)


def _fill_seeds(result, sampling_info, batch, *args, **kwargs):
    sampling_info.sampling_seed = assign_seeds(batch.reqs).to(sampling_info.device)
    return result


def install(report_margins: bool = False) -> None:
    from sglang.srt.layers.sampler import _CUSTOM_SAMPLER_FACTORIES, register_sampler_backend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    sampler_class = _sampler_class()
    sampler_class.report_margins = report_margins
    if getattr(_CUSTOM_SAMPLER_FACTORIES.get(BACKEND), "_rksc", False):
        return
    factory = lambda: sampler_class()  # noqa: E731 (SGLang wants a zero-argument callable)
    factory._rksc = True
    register_sampler_backend(BACKEND, factory)
    HookRegistry.register(SEED_TARGET, _fill_seeds, HookType.AFTER)
