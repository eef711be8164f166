"""The fault run's pure parts: its flag checks, reading the router's worker list, and waiting."""

import pytest

from benchmarks.serving import faults


@pytest.mark.parametrize("argv, flag", [(["--programs", "0"], "--programs"), (["--forks", "0"], "--forks"),
                                        (["--kill-after", "-1"], "--kill-after must"),
                                        (["--program-retries", "-1"], "--program-retries"),
                                        (["--timeout-s", "0"], "--timeout-s")])
def test_a_bad_value_names_its_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        faults.parse_args(argv)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_worker_health_reads_the_routers_list(monkeypatch):
    listed = {"workers": [{"url": "http://a:1", "is_healthy": True}, {"url": "http://b:2", "is_healthy": False}]}

    class Answer:
        def json(self):
            return listed

    monkeypatch.setattr(faults.requests, "get", lambda url, timeout: Answer())
    assert faults.worker_health("http://router", "http://a:1") is True
    assert faults.worker_health("http://router", "http://b:2") is False
    assert faults.worker_health("http://router", "http://c:3") is None  # not listed


def test_wait_for_gives_the_seconds_or_none():
    calls = iter([False, False, True])
    assert faults.wait_for(lambda: next(calls), timeout_s=5, interval_s=0.01) is not None
    assert faults.wait_for(lambda: False, timeout_s=0.05, interval_s=0.01) is None


def test_the_failover_flags_are_sglang_router_flags_with_values():
    names = faults.FAILOVER[0::2]
    assert all(n.startswith("--") for n in names) and not any(v.startswith("--") for v in faults.FAILOVER[1::2])
