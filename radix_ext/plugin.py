"""SGLang plugin entry point (group ``sglang.srt.plugins``), run in every SGLang process.

SGLang calls ``load()`` early in the engine process and in each spawned scheduler, before the
radix cache is built, so registrations made here are visible where the cache is created:

* radix-cache backend ``rksc`` (``radix_ext.eviction.backend``), for
  ``--radix-cache-backend rksc``;
* eviction policy name ``rsbcm`` in SGLang's ``--radix-eviction-policy`` choices (our backend
  builds the strategy; SGLang's own caches do not know the name and fail at start-up);
* a check of the ``rksc`` entry of ``sampling_params.custom_params`` where SGLang validates
  sampling parameters, so a malformed branch tag is an HTTP 400 naming the field, not a
  scheduler error;
* the KV pool and cache readbacks (``radix_ext.ops.introspection``,
  ``radix_ext.eviction.stats``) and our series in SGLang's Prometheus ``/metrics`` with
  ``--enable-metrics`` (``radix_ext.ops.metrics``);
* a refusal (HTTP 400, naming the field and its limit) of requests that would kill, stall or be
  misread by stock SGLang: empty prompts, out-of-range logprob fields, n beyond ``--max-n``
  (``radix_ext.ops.request_guards``); malformed batch shapes and batches whose prompts x n
  exceed ``--max-fanout`` (``radix_ext.ops.batch_guards``);
* an abort or disconnect of an ``n > 1`` request reaching its children
  (``radix_ext.stop.abort_children``);
* CGEE's early-exit verification forward and its request hooks (``radix_ext.cgee``);
* seeded, batch-invariant sampling for SGLang's ``pytorch`` sampling backend
  (``radix_ext.sampling``);
* with ``--asks``, ASKS's capture, decision and report hooks (``radix_ext.asks``), and its report
  on the OpenAI routes' responses (``radix_ext.ops.openai_reports``);
* the confident early stop: trace-confidence stops, group votes and the stamping of ``n > 1``
  children with their group and own seeds (``radix_ext.stop``);
* the scheduler's freed heap returned to the OS when it is idle (``radix_ext.cpu.heap_trim``).

SGLang only logs an exception raised here, and then reports "--radix-cache-backend='rksc' is not
registered": look for the plugin's traceback above that message. A missing SGLang name we rely
on is different: it raises ``rksc_sgl.seams.SeamMissing`` (a SystemExit), which stops start-up.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def load() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from radix_ext.cpu import speed as cpu_speed
    from radix_ext.eviction import stats
    from radix_ext.ops import introspection, metrics
    from radix_ext.seams import SAMPLING_VERIFY_TARGET, scheduler_seams
    from rksc_sgl import seams
    from rksc_sgl.config import RkscConfig

    cpu_speed.cap_onednn_caches()  # before any oneDNN primitive of this process is built
    config = RkscConfig.from_env()  # fails loudly on a malformed RKSC_SGL_CONFIG
    seams.check(scheduler_seams())  # SystemExit naming any SGLang name we rely on that is gone
    introspection.install()
    register_backend()
    HookRegistry.register(SAMPLING_VERIFY_TARGET, _check_branch_tag, HookType.AFTER)
    stats.install()
    metrics.install()
    from radix_ext.ops import request_guards  # requests that would kill, stall or be misread by SGLang

    request_guards.install(max_n=config.max_n)
    from radix_ext.ops import batch_guards  # malformed batch shapes; prompts x n beyond --max-fanout

    batch_guards.install(max_fanout=config.max_fanout, max_n=config.max_n)
    from radix_ext.stop import abort_children  # an abort of an n > 1 request reaches its samples

    abort_children.install()
    from radix_ext.cpu import attention  # attention backend "rksc_cpu": batched CPU decode

    attention.install()
    from radix_ext.cpu import decode  # a decode batch on rksc_cpu as one loop, SGLang's numbers

    decode.install()
    from radix_ext.cgee import forward  # CGEE: verification requests may exit after layer l*

    forward.install()
    from radix_ext.stop import groups, stopper

    groups.install()  # n > 1 children: their group tag and own seed
    stopper.install()  # trace-confidence stops, group votes
    from radix_ext.cpu import heap_trim  # malloc_trim when idle: a fragmented heap's pages go back

    heap_trim.install()
    if config.asks:
        from radix_ext.asks import decision  # ASKS: span signatures, the decision, its report

        decision.install()
        from radix_ext.ops import openai_reports  # the report on /v1/chat/completions, /v1/completions

        openai_reports.install()
    if config.seeded_sampling:
        from radix_ext.sampling import sampler  # seeded, batch-invariant sampling on the CPU's backend

        sampler.install(report_margins=config.report_sampling_margins)
    logger.debug("rksc-sgl plugin loaded with %s", config)


def register_backend() -> None:
    """Register backend ``rksc`` and policy name ``rsbcm`` (idempotent)."""
    from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES, add_radix_eviction_policy_choices
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

    from radix_ext.eviction.backend import build_cache
    from radix_ext.eviction.policy import POLICY_NAME
    from rksc_sgl.config import BACKEND_NAME

    if get_radix_cache_factory(BACKEND_NAME) is None:
        register_radix_cache_backend(BACKEND_NAME, build_cache)
    if POLICY_NAME not in RADIX_EVICTION_POLICY_CHOICES:
        add_radix_eviction_policy_choices([POLICY_NAME])


def _check_branch_tag(result, sampling_params, *args, **kwargs):
    from rksc_sgl.protocol import AsksOptions, BranchTag

    BranchTag.from_custom_params(sampling_params.custom_params)  # ValueError -> HTTP 400
    AsksOptions.from_custom_params(sampling_params.custom_params)
    return None
