"""A keyed cluster (``--api-key`` and ``--admin-api-key`` given to ``rksc_sgl.launch_router``,
which passes them to its worker and to sglang-router): each route family answers the key it
needs and refuses no key and the other key with 401, on the worker directly and through the
router; every admin endpoint SGLang has refuses the user key; a server bound to a non-loopback
host without an admin key warns at start-up, by flag."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from rksc_sgl import servers
from rksc_sgl.launch_router import cluster
from tests.conftest import TEST_POOL_TOKENS
from tests.integration.serving_doc import documented_admin_paths, sglang_admin_routes

pytestmark = pytest.mark.integration

USER, ADMIN = "user-key-36", "admin-key-36"
KEYS = {"no key": None, "user key": USER, "admin key": ADMIN}
HI = [{"role": "user", "content": "hi"}]
# One request per route family that generates: native, OpenAI chat, OpenAI completions.
GENERATION = {
    "native": ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}),
    "openai-chat": ("/v1/chat/completions", {"model": "default", "messages": HI, "max_tokens": 1}),
    "openai-completions": ("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": 1}),
}
# Admin endpoints whose handler is harmless to run here: the admin key must get through to it.
HARMLESS_ADMIN = [
    ("POST", "/flush_cache", None),
    ("GET", "/get_weights_by_name", {"name": "lm_head.weight", "truncate_size": 2}),
    ("POST", "/abort_request", {"rid": "no-such-request"}),
    ("POST", "/continue_generation", {}),
]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """(router URL, worker URL, cluster): one worker behind sglang-router, both keyed."""
    args = ["--max-total-tokens", str(TEST_POOL_TOKENS), "--log-level", "warning",
            "--api-key", USER, "--admin-api-key", ADMIN]
    with cluster(1, args, policy="round_robin", log_dir=tmp_path_factory.mktemp("keyed")) as (url, c):
        yield url, c.worker_urls[0], c


def call(url: str, method: str, route: str, body, key: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.request(method, url + route, json=body, headers=headers, timeout=120)


@pytest.mark.parametrize("where", ["worker", "router"])
@pytest.mark.parametrize("family", GENERATION)
def test_generation_takes_the_user_key_only(keyed, where, family):
    url = keyed[0] if where == "router" else keyed[1]
    route, body = GENERATION[family]
    statuses = {name: call(url, "POST", route, body, key).status_code for name, key in KEYS.items()}
    assert statuses == {"no key": 401, "user key": 200, "admin key": 401}


def test_every_admin_endpoint_of_sglang_refuses_no_key_and_the_user_key(keyed):
    routes = sglang_admin_routes()
    assert documented_admin_paths() == set(routes)
    failures = []
    for path, methods in routes.items():
        if "{" in path:  # /dumper/{method}: registered only with DUMPER_SERVER_PORT=reuse
            continue
        for key in (None, USER):
            status = call(keyed[1], methods[0], path, {}, key).status_code
            if status != 401:
                failures.append(f"{methods[0]} {path} with {key or 'no key'}: HTTP {status}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("method, path, body", HARMLESS_ADMIN, ids=[p for _, p, _ in HARMLESS_ADMIN])
def test_the_admin_key_opens_admin_endpoints_on_the_worker(keyed, method, path, body):
    res = call(keyed[1], method, path, body, ADMIN)
    assert res.status_code == 200, res.text[:300]


def test_through_the_router_the_control_plane_takes_the_admin_key_only(keyed):
    url = keyed[0]
    for route in ("/workers", "/flush_cache"):
        method = "GET" if route == "/workers" else "POST"
        assert [call(url, method, route, None, key).status_code for key in (None, USER)] == [401, 401], route
    assert call(url, "GET", "/workers", None, ADMIN).status_code == 200
    # The router's flush reaches the workers with its user key, which a keyed worker refuses.
    flushed = call(url, "POST", "/flush_cache", None, ADMIN)
    assert flushed.status_code == 206 and flushed.json()["workers_flushed"] == 0, flushed.text[:300]


@pytest.mark.parametrize("path", ["/update_weights_from_disk", "/release_memory_occupation", "/start_profile"])
def test_the_router_forwards_no_other_admin_endpoint(keyed, path):
    statuses = {name: call(keyed[0], "POST", path, {}, key).status_code for name, key in KEYS.items()}
    assert statuses == {"no key": 404, "user key": 404, "admin key": 404}  # not routed to the workers


def test_the_cluster_flushes_its_keyed_workers_with_the_admin_key(keyed):
    keyed[2].flush()  # raises RuntimeError with the worker's reason if it refused


def test_a_loopback_worker_does_not_warn(keyed):
    assert "--admin-api-key is not set" not in (keyed[2].log_dir / "worker0.log").read_text()


def test_a_server_bound_to_every_interface_without_an_admin_key_warns_by_flag(tmp_path):
    # The model path does not exist: the server warns, then fails to load it and exits.
    done = subprocess.run([sys.executable, "-m", "rksc_sgl.launch_server", "--host", "0.0.0.0", "--port",
                           str(servers.free_port()), "--model-path", str(tmp_path / "no-model")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "--host 0.0.0.0 is reachable from other machines and --admin-api-key is not set" in done.stderr
