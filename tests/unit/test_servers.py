"""``rksc_sgl.servers.settle`` (behind ``http_server`` and the router's workers): a server whose chosen
port another process took first (uvicorn then exits with status 3, after SGLang's warmup has posted to
the other process's port) is stopped at once and started again on a fresh port."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rksc_sgl import servers

TAKEN = "[2026-12-05 13:42:10] ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 1): address already in use\n"


def test_a_taken_port_is_named_by_the_log(tmp_path):
    log = tmp_path / "server.log"
    assert not servers.port_taken(log) and not servers.port_taken(None)
    log.write_text("INFO: started\n")
    assert not servers.port_taken(log)
    log.write_text("INFO: a request asked why the address already in use error\n")  # the words, not the error
    assert not servers.port_taken(log)
    log.write_text(TAKEN)
    assert servers.port_taken(log)
    log.write_text("INFO: started\n" + TAKEN.rstrip("\n"))  # the log's last line, no newline yet
    assert servers.port_taken(log)


def fake_spawn(outcomes: list[str], calls: list[str]):
    """A spawn whose n-th server logs ``outcomes[n]`` ("taken" or "ok") and idles."""
    def spawn(module, args, log, env=None, python=None):
        outcome = outcomes[len(calls)]
        calls.append(outcome)
        log.write_text(TAKEN if outcome == "taken" else "ready\n")
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        return proc, f"http://127.0.0.1:{len(calls)}"
    return spawn


def fake_health(url, proc, timeout_s, route="/health_generate", log=None):
    if servers.port_taken(log):
        raise servers.PortTaken(url)


def test_a_taken_port_is_retried_on_a_fresh_one(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(servers, "spawn", fake_spawn(["taken", "ok"], calls))
    monkeypatch.setattr(servers, "wait_healthy", fake_health)
    with servers.http_server("some.module", [], tmp_path) as url:
        assert url == "http://127.0.0.1:2"
    assert calls == ["taken", "ok"]


def test_it_gives_up_after_the_last_attempt_with_the_log(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(servers, "spawn", fake_spawn(["taken"] * servers.START_ATTEMPTS, calls))
    monkeypatch.setattr(servers, "wait_healthy", fake_health)
    with pytest.raises(RuntimeError, match="3 ports taken") as error:
        with servers.http_server("some.module", [], tmp_path):
            pass
    assert "Errno 98" in str(error.value) and len(calls) == servers.START_ATTEMPTS


def test_the_wait_stops_as_soon_as_the_log_shows_the_port_taken(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(TAKEN)
    with pytest.raises(servers.PortTaken):
        servers.wait_healthy("http://127.0.0.1:9", None, timeout_s=30, log=log)


def test_a_router_worker_whose_port_was_taken_starts_again(tmp_path, monkeypatch):
    from rksc_sgl import launch_router

    calls: list[str] = []
    monkeypatch.setattr(servers, "spawn", fake_spawn(["ok", "taken", "ok"], calls))
    monkeypatch.setattr(servers, "wait_healthy", fake_health)
    cluster = launch_router.Cluster(2, [], tmp_path, python=sys.executable)
    try:
        assert cluster.worker_urls == ["http://127.0.0.1:1", "http://127.0.0.1:3"]
        assert calls == ["ok", "taken", "ok"]
    finally:
        cluster.stop()
