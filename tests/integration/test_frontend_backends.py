"""Both frontend backends, ``RkscEndpoint`` (the session's server) and ``RkscEngineEndpoint`` (the
session's engine), through SGLang's frontend: ``stream=True`` streams, images are refused by a
model that cannot read them, and ``flush_cache`` empties the cache or says why it could not."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import sglang as sgl

from rksc_sgl import branch_options
from tests.integration.kv import assert_no_kv_leak

pytestmark = pytest.mark.integration

PNG = b"\x89PNG\r\n\x1a\n"  # what the image holds does not matter: a text-only model reads none


@pytest.fixture(params=["server", "engine"])
def backend(request):
    if request.param == "server":
        from rksc_sgl import RkscEndpoint

        return RkscEndpoint(request.getfixturevalue("server_url"))
    return request.getfixturevalue("engine_backend")


@sgl.function
def counting(s, seed: int | None):
    if seed is not None:
        branch_options(s, sampling_seed=seed)
    s += "Count to twenty: 1, 2, 3,"
    s += sgl.gen("numbers", max_tokens=16, temperature=0 if seed is None else 1.0)


@sgl.function
def described(s):
    s += sgl.image(PNG)
    s += "What is in the picture?"
    s += sgl.gen("answer", max_tokens=4, temperature=0)


@sgl.function
def long_count(s):
    s += "Count to two hundred: 1, 2, 3,"
    s += sgl.gen("numbers", max_tokens=96, temperature=0, ignore_eos=True)


def wait_until_running(backend, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while backend.kv_pool()["running_requests"] == 0:
        assert time.monotonic() < deadline, "the request never started running"
        time.sleep(0.05)


def recording_stream(backend, monkeypatch) -> list[str]:
    """The pieces of text ``backend.generate_stream`` yields to the program's executor."""
    pieces, stream = [], backend.generate_stream

    def recorded(s, sampling_params):
        for text, meta_info in stream(s, sampling_params):
            pieces.append(text)
            yield text, meta_info

    monkeypatch.setattr(backend, "generate_stream", recorded)
    return pieces


class TestStreaming:
    @pytest.mark.parametrize("seed", [None, 7], ids=["greedy", "seeded"])
    def test_stream_true_yields_the_text_in_pieces_as_generate_would(self, backend, seed, monkeypatch):
        counting.run(seed=seed, backend=backend).sync()  # the prompt cached, as for both runs compared
        whole = counting.run(seed=seed, backend=backend)["numbers"]
        backend.reset_counters()
        pieces = recording_stream(backend, monkeypatch)
        state = counting.run(seed=seed, backend=backend, stream=True)
        assert "".join(state.text_iter("numbers")) == whole  # the seed (a branch option) came along
        assert len(pieces) > 1 and "".join(pieces) == whole
        counted = backend.reset_counters()
        assert counted.requests == 1
        assert counted.completion_tokens == state.get_meta_info("numbers")["completion_tokens"] > 0

    def test_a_stream_leaves_no_kv_held(self, backend):
        state = counting.run(seed=None, backend=backend, stream=True)
        assert "".join(state.text_iter("numbers"))
        assert_no_kv_leak(backend)


class TestImages:
    def test_an_image_for_a_text_only_model_is_refused_before_any_request(self, backend):
        backend.reset_counters()
        for stream in (False, True):
            state = described.run(backend=backend, stream=stream)
            state.sync()
            assert isinstance(state.error(), ValueError)
            assert "does not read images" in str(state.error())
        assert backend.reset_counters().requests == 0


class TestFlushCache:
    def test_a_flush_waits_for_the_running_request_then_empties_the_cache(self, backend):
        with ThreadPoolExecutor(1) as executor:
            running = executor.submit(lambda: long_count.run(backend=backend)["numbers"])
            wait_until_running(backend)
            backend.flush_cache()  # SGLang alone refuses while a request runs; ours waits for it
            assert running.result(timeout=60)
        pool = backend.kv_pool()
        assert pool["evictable"] == 0 and pool["available"] == pool["total"], pool

    def test_a_flush_that_may_not_wait_raises_with_the_reason(self, backend):
        with ThreadPoolExecutor(1) as executor:
            running = executor.submit(lambda: long_count.run(backend=backend)["numbers"])
            wait_until_running(backend)
            with pytest.raises(RuntimeError, match="flush_cache failed"):
                backend.flush_cache(timeout_s=0)
            assert running.result(timeout=60)
        assert_no_kv_leak(backend)
