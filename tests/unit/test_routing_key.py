"""Every request of one program carries the same sglang-router routing key, forks included, and
different programs carry different keys: checked against a local HTTP server that records headers."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
import sglang as sgl

from rksc_sgl.endpoint import RkscEndpoint
from rksc_sgl.program_state import ROUTING_KEY_HEADER


class Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # /get_model_info
        self._reply(200, {"model_path": "fake"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Recorder.seen.append((body["text"], self.headers.get(ROUTING_KEY_HEADER)))
        if body["text"].endswith("bad"):
            return self._reply(400, {"error": {"message": "custom_params.rksc.depth must be >= 0"}})
        meta = {"prompt_tokens": 3, "cached_tokens": 0, "completion_tokens": 1, "finish_reason": {"type": "length"}}
        self._reply(200, {"text": "x", "meta_info": meta})

    def log_message(self, *args):
        pass


@pytest.fixture()
def endpoint():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Recorder.seen = []
    yield RkscEndpoint(f"http://127.0.0.1:{server.server_address[1]}", chat_template_name="chatml")
    server.shutdown()


@sgl.function
def forking(s, question: str):
    s += question
    forks = s.fork(3)
    for f in forks:
        f += sgl.gen("a", max_tokens=1)
    forks.join()


def test_a_programs_forks_carry_its_key_and_other_programs_another(endpoint):
    forking.run(question="Q1: one plus one?", backend=endpoint)
    forking.run(question="Q2: two plus two?", backend=endpoint)
    keys = {}
    for text, key in Recorder.seen:
        keys.setdefault(text.split(":")[0], set()).add(key)
    assert set(keys) == {"Q1", "Q2"}
    assert all(len(k) == 1 and None not in k for k in keys.values()), keys  # one key per program
    assert keys["Q1"] != keys["Q2"]
    assert len(Recorder.seen) == 8  # per program: the prefix commit and 3 forks


def test_a_refused_request_raises_with_the_servers_reason(endpoint):
    error = forking.run(question="Q3: bad", backend=endpoint).error()
    assert error is not None and "depth" in str(error)
