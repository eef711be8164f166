"""What the frontend backends and the primitives put into a ``/generate`` request (no server:
``RecordingEndpoint`` records what would be sent; the integration tests send it)."""

from __future__ import annotations

import types

import pytest

from rksc_sgl.endpoint import RkscEndpoint
from rksc_sgl.program_state import branch_options, program_key
from rksc_sgl.scores import report_score


class RecordingEndpoint(RkscEndpoint):
    """An ``RkscEndpoint`` whose transport records each body and routing key instead of sending."""

    def __init__(self, **model_info):
        self.model_info = {"model_path": "a-model", **model_info}
        self._init_counters()
        self.sent = []

    def _send(self, data, routing_key=None):
        self.sent.append((data, routing_key))
        return {"meta_info": {}}


class TestReportScore:
    def test_sends_a_zero_token_request_with_the_branch_text_and_the_programs_routing_key(self):
        backend = RecordingEndpoint()
        state = types.SimpleNamespace(backend=backend, text=lambda: "prompt and branch", images_=[])
        branch_options(state, depth=2)
        report_score(state, 0.75)
        assert backend.sent == [({"text": "prompt and branch", "sampling_params": {
            "max_new_tokens": 0, "custom_params": {"rksc": {"depth": 2, "score": 0.75}}}}, program_key(state))]

    def test_a_backend_without_sglangs_generate_is_a_type_error_naming_what_works(self):
        state = types.SimpleNamespace(backend=object(), text=lambda: "prompt and branch")
        with pytest.raises(TypeError, match="RkscEndpoint, an RkscEngineEndpoint or SGLang's RuntimeEndpoint"):
            report_score(state, 0.5, depth=1)


class TestImages:
    """SGLang's RuntimeEndpoint sends a program's one image as ``image_data``; a model that cannot
    read it would have it dropped without a word, so ours refuse it there."""

    def executor(self, *images):
        return types.SimpleNamespace(text_="<image>What is this?", images_=[(f"{i}.png", b64) for i, b64 in enumerate(images)])

    def test_an_image_is_passed_to_a_model_that_reads_images(self):
        backend = RecordingEndpoint(has_image_understanding=True)
        backend.commit_lazy_operations(self.executor("aW1hZ2U="))
        assert backend.sent[0][0]["image_data"] == "aW1hZ2U="

    def test_an_image_for_a_text_only_model_is_refused_naming_the_model(self):
        backend = RecordingEndpoint(has_image_understanding=False)
        with pytest.raises(ValueError, match="a-model does not read images"):
            backend.commit_lazy_operations(self.executor("aW1hZ2U="))
        assert backend.sent == []

    def test_two_images_are_refused(self):
        with pytest.raises(ValueError, match="one image"):
            RecordingEndpoint(has_image_understanding=True).commit_lazy_operations(self.executor("YQ==", "Yg=="))

    def test_a_program_without_images_sends_none(self):
        backend = RecordingEndpoint(has_image_understanding=False)
        backend.commit_lazy_operations(self.executor())
        assert "image_data" not in backend.sent[0][0]
