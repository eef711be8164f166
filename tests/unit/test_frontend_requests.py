"""What the frontend backends and the primitives put into a ``/generate`` request (no server:
``RecordingEndpoint`` records what would be sent; the integration tests send it)."""

from __future__ import annotations

import types

import pytest

from rksc_sgl.frontend import RkscEndpoint, branch_options, program_key
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
