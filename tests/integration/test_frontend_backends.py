"""Both frontend backends, ``RkscEndpoint`` (the session's server) and ``RkscEngineEndpoint`` (the
session's engine), through SGLang's frontend: ``stream=True`` streams, and images are refused by
a model that cannot read them."""

from __future__ import annotations

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
