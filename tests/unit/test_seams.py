"""Every SGLang name rksc-sgl relies on resolves in the installed SGLang; a missing one stops
start-up naming it (``rksc_sgl.seams``, ``radix_ext.seams``)."""

from __future__ import annotations

import pytest

from radix_ext.seams import scheduler_seams
from rksc_sgl import seams


def test_every_client_and_scheduler_seam_resolves():
    assert seams.missing(seams.CLIENT) == {}
    assert seams.missing(scheduler_seams()) == {}


def test_every_mechanism_lists_its_seams():
    listed = scheduler_seams()
    assert {"RSBCM backend", "CGEE early exit", "rksc_cpu attention", "seeded sampling", "ASKS"} <= set(listed)
    assert all(listed.values())


def test_a_renamed_target_stops_start_up_naming_it(monkeypatch):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    monkeypatch.delattr(TorchNativeAttnBackend, "_run_sdpa_forward_extend")
    with pytest.raises(seams.SeamMissing) as exc:
        seams.check(scheduler_seams())
    message = str(exc.value)
    assert "rksc_cpu attention" in message and "_run_sdpa_forward_extend" in message
    assert isinstance(exc.value, SystemExit) and not isinstance(exc.value, Exception)


def test_a_renamed_hook_target_of_the_client_side_is_reported(monkeypatch):
    from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

    monkeypatch.delattr(RuntimeEndpoint, "_generate_http_request")
    assert "frontend backends" in seams.missing(seams.CLIENT)


def test_the_plugin_refuses_to_load_without_a_seam(monkeypatch):
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    from radix_ext import plugin

    monkeypatch.delattr(SamplingBatchInfo, "adjusted_from_schedule_batch")
    with pytest.raises(seams.SeamMissing, match="seeded sampling"):
        plugin.load()


def test_prefix_len_is_what_the_request_found_cached_when_checkpoint_runs():
    """``RkscRadixCache.checkpoint`` reads ``req.prefix_len`` as the length the request found
    in the tree: SGLang sets it when it matches the prefix and its checkpoint leaves it alone."""
    import inspect

    from sglang.srt.mem_cache import common
    from sglang.srt.mem_cache.radix_cache import RadixCache

    assert "req.prefix_len = match_result.device_prefix_len" in inspect.getsource(common.match_kv_cache)
    assert "prefix_len" not in inspect.getsource(RadixCache.checkpoint)


def test_a_created_request_is_rewritten_before_sglang_validates_and_sizes_it():
    """ASKS rewrites ``req.origin_input_ids`` in an AFTER hook of ``_create_generation_req``: SGLang
    must validate the prompt length and derive the output log-probability start from the
    request's ids after that call, not from the ids it received."""
    import inspect

    from sglang.srt.managers.scheduler import Scheduler

    source = inspect.getsource(Scheduler)
    created = source.index("req = self._create_generation_req(")
    assert created < source.index("error_msg = validate_input_length(", created)
    assert created < source.index("req.logprob_start_len = len(req.origin_input_ids)", created)
