"""The scheduler side's SGLang seams, by mechanism (checked by ``radix_ext.plugin.load``, see
``rksc_sgl.seams``): hook targets, overridden private methods and module attributes read."""

from __future__ import annotations

# The plugin's own hook target, where it checks a request's rksc entries: the plugin imports it
# from here, so these seams never import the plugin (which imports them).
SAMPLING_VERIFY_TARGET = "sglang.srt.sampling.sampling_params.SamplingParams.verify"
_RADIX = "sglang.srt.mem_cache.radix_cache.RadixCache"
_TORCH_NATIVE = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"
_RESIDUAL = "sglang.srt.layers.layer_boundary.residual.batch"


def scheduler_seams() -> dict[str, tuple[str, ...]]:
    from radix_ext.asks import batching as asks_batching, decision as asks
    from radix_ext import model_stack
    from radix_ext.cgee import requests as exit_requests
    from radix_ext.cpu import heap_trim
    from radix_ext.ops import batch_guards, introspection, metrics, openai_reports, request_guards
    from radix_ext.sampling import sampler
    from radix_ext.stop import abort_children, groups, stopper as early_stop

    return {
        "plugin": (
            SAMPLING_VERIFY_TARGET,
            "sglang.srt.plugins.hook_registry.HookRegistry.register",
            "sglang.srt.mem_cache.registry.register_radix_cache_backend",
            "sglang.srt.mem_cache.registry.get_radix_cache_factory",
            "sglang.srt.arg_groups.choices.RADIX_EVICTION_POLICY_CHOICES",
            "sglang.srt.arg_groups.choices.add_radix_eviction_policy_choices",
            request_guards.VALIDATE_TARGET, request_guards.PARALLEL_SAMPLING_TARGET,
            request_guards.SAMPLING_VERIFY_TARGET, request_guards.CONTRACT_TARGET,
            request_guards.COMPLETION_VALIDATE_TARGET, request_guards.MAX_QUEUED_SOURCE,
            request_guards.SAMPLING_FIELDS,
            batch_guards.CHAT_VALIDATE_TARGET,
            abort_children.BATCH_TARGET, abort_children.ABORT_TARGET,
        ),
        "readback (KV pool, cache stats)": (introspection.TARGET, *introspection.EVICTION_TARGETS),
        "Prometheus metrics": (metrics.PROCESS_BATCH_RESULT, metrics.ON_IDLE),
        "RSBCM backend": (
            f"{_RADIX}.checkpoint", f"{_RADIX}._split_node", f"{_RADIX}.reset", f"{_RADIX}.evict",
            "sglang.srt.mem_cache.radix_cache.TreeNode",
            "sglang.srt.mem_cache.evict_policy.EvictionStrategy",
        ),
        "CGEE early exit": (
            *model_stack.TARGETS, *(stack for stack, _ in model_stack.TARGETS.values()),
            exit_requests.CREATE_REQ, exit_requests.ADD_ONE_REQ,
            "sglang.srt.managers.schedule_policy.AddReqResult.OTHER",
            f"{_RESIDUAL}.start", f"{_RESIDUAL}.snapshot", f"{_RESIDUAL}.final_norm",
        ),
        "rksc_cpu attention": (
            f"{_TORCH_NATIVE}._run_sdpa_forward_extend", f"{_TORCH_NATIVE}.forward_decode",
            f"{_TORCH_NATIVE}.forward_extend", f"{_TORCH_NATIVE}.init_forward_metadata",
            "sglang.srt.layers.radix_attention.AttentionType.ENCODER_ONLY",
            "sglang.srt.model_executor.forward_batch_info.ForwardBatch.extend_seq_lens_cpu",
            "sglang.srt.layers.attention.attention_registry.register_attention_backend",
            "sglang.srt.arg_groups.choices.add_attention_backend_choices",
            "sglang.srt.mem_cache.memory_pool.KVWriteLoc",
            "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply",
            "sglang.srt.layers.quantization.unquant.UnquantizedEmbeddingMethod.apply",
        ),
        "lean CPU decode": (
            *model_stack.TARGETS, *(stack for stack, _ in model_stack.TARGETS.values()),
            "sglang.kernels.fused_op.get_fused_op_backend",
            "sglang.kernels.fused_op.BaseFusedOp._resolve_forward_method",
            "sglang.srt.layers.linear.ColumnParallelLinear.forward",
            "sglang.srt.layers.linear.RowParallelLinear.forward",
            "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply",
            "sglang.srt.model_executor.forward_batch_info.ForwardMode.DECODE",
        ),
        "ASKS": (
            asks.CREATE_REQ, asks.ACCEPT_TARGET, asks.REQUEST_LEVEL_TARGET, *model_stack.TARGETS,
            asks_batching.ADD_ONE_REQ, asks_batching.CALC_PRIORITY,
            "sglang.srt.managers.schedule_policy.AddReqResult.CONTINUE",
            f"{_RADIX}._delete_leaf", f"{_RADIX}.checkpoint", f"{_RADIX}._split_node",
            "sglang.srt.mem_cache.radix_cache.RadixKey.child_key_at",
            "sglang.srt.mem_cache.radix_cache.RadixKey.match_at",
            "sglang.srt.model_executor.forward_batch_info.ForwardBatch.extend_prefix_lens_cpu",
            "sglang.srt.model_executor.forward_batch_info.ForwardBatch.extend_seq_lens_cpu",
            f"{_RESIDUAL}.snapshot",
        ),
        "ASKS on the OpenAI routes (group, report)": (
            openai_reports.CHAT_CONVERT_TARGET, openai_reports.COMPLETION_CONVERT_TARGET,
            openai_reports.CHAT_RESPONSE_TARGET, openai_reports.COMPLETION_RESPONSE_TARGET,
            *openai_reports.CHUNK_OBJECTS, openai_reports.GENERATE_TARGET,
            *(name for pair in openai_reports.RESPONSE_CLASSES for name in pair),
        ),
        "early stop (trace confidence, group votes)": (
            early_stop.SAMPLING_VERIFY, early_stop.VALIDATE_TARGET, early_stop.CREATE_REQ, early_stop.ADD_TO_QUEUE,
            early_stop.PROCESS_BATCH_RESULT, early_stop.REQUEST_LEVEL_TARGET, early_stop.MAKE_ABORT_REQ,
            introspection.TARGET,
            *early_stop.SCHEDULER_METHODS,
            "sglang.srt.managers.schedule_batch.BaseFinishReason",
            "sglang.srt.managers.schedule_batch.FINISH_ABORT",
            "sglang.srt.managers.schedule_batch.Req.update_finish_state",  # applies to_finish first
        ),
        "heap trim": (heap_trim.ON_IDLE, heap_trim.PROCESS_BATCH_RESULT,
                      "sglang.srt.managers.scheduler.Scheduler.is_fully_idle", introspection.TARGET),
        "seeded sampling": (
            sampler.SEED_TARGET,
            "sglang.srt.layers.sampler.Sampler._sample_from_probs",
            "sglang.srt.layers.sampler.register_sampler_backend",
            "sglang.srt.layers.sampler._CUSTOM_SAMPLER_FACTORIES",
            groups.SEND_TARGET, groups.SAMPLING_VERIFY,  # n > 1 children's own seeds
        ),
    }
