"""``python -m rksc_sgl.launch_router``'s command line: bad values fail before any worker starts,
naming the flag; every flag it does not know goes to the workers."""

from __future__ import annotations

import pytest

from rksc_sgl import launch_router


@pytest.fixture()
def fake_router_python(tmp_path, monkeypatch):
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setenv(launch_router.ROUTER_ENV, str(python))
    return str(python)


def test_unknown_flags_go_to_the_workers(fake_router_python):
    args, worker_args = launch_router.parse_args(["--workers", "3", "--rsbcm", "--max-total-tokens", "4096"])
    assert (args.workers, args.policy, args.router_python) == (3, "pinned", fake_router_python)
    assert worker_args == ["--rsbcm", "--max-total-tokens", "4096"]


@pytest.mark.parametrize("argv, flag", [(["--workers", "0"], "--workers"), (["--policy", "sticky"], "--policy"),
                                        (["--router-python", "/nonexistent/python"], "--router-python")])
def test_bad_values_exit_2_naming_the_flag(argv, flag, fake_router_python, capsys):
    with pytest.raises(SystemExit) as exc:
        launch_router.parse_args(argv)
    assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_a_worker_flag_conflict_fails_before_any_worker_starts(fake_router_python, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(launch_router, "Cluster", lambda *a, **k: started.append(a))
    with pytest.raises(SystemExit) as exc:
        launch_router.main(["--rsbcm", "--radix-eviction-policy", "lfu"])
    assert exc.value.code == 2 and "--radix-eviction-policy" in capsys.readouterr().err
    assert not started


def test_pinned_is_the_routers_sticky_key_policy():
    assert launch_router.POLICIES["pinned"] == ["--policy", "manual", "--assignment-mode", "min_group"]


def test_without_a_router_install_the_error_says_how_to_get_one(monkeypatch, tmp_path):
    monkeypatch.delenv(launch_router.ROUTER_ENV, raising=False)
    monkeypatch.setattr(launch_router, "FRONT_VENV_PYTHON", tmp_path / "missing")
    monkeypatch.setattr(launch_router.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="make front"):
        launch_router.router_python()


def test_routing_waits_for_every_worker_to_be_listed_healthy():
    from rksc_sgl.launch_router import all_registered

    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    # the shape of sglang-router 0.3.2's GET /workers (fields we do not read left out)
    one = {"workers": [{"url": urls[0], "is_healthy": True}], "total": 1}
    both = {"workers": [{"url": urls[0], "is_healthy": True}, {"url": urls[1], "is_healthy": True}], "total": 2}
    sick = {"workers": [{"url": urls[0], "is_healthy": True}, {"url": urls[1], "is_healthy": False}], "total": 2}
    assert not all_registered(one, urls) and not all_registered(sick, urls) and not all_registered({}, urls)
    assert all_registered(both, urls)


class TestKeys:
    def test_the_workers_keys_are_read_from_their_flags(self):
        keys = launch_router.ClusterKeys.of(["--rsbcm", "--api-key", "u", "--admin-api-key=a"])
        assert keys == launch_router.ClusterKeys("u", "a")
        assert launch_router.ClusterKeys.of(["--rsbcm"]) == launch_router.ClusterKeys()

    def test_the_router_gets_the_user_key_and_the_admin_key_for_its_control_plane(self):
        assert launch_router.ClusterKeys("u", "a").router_args() == [
            "--api-key", "u", "--control-plane-api-keys", "rksc-admin:rksc-sgl admin:admin:a"]
        assert launch_router.ClusterKeys().router_args() == []

    @pytest.mark.parametrize("keys, user, admin", [
        (("u", "a"), "Bearer u", "Bearer a"), (("u", None), "Bearer u", "Bearer u"), ((None, "a"), None, "Bearer a"),
    ])
    def test_each_call_carries_the_key_it_needs(self, keys, user, admin):
        keys = launch_router.ClusterKeys(*keys)
        assert keys.headers().get("Authorization") == user
        assert keys.headers(admin=True).get("Authorization") == admin

    def test_a_reachable_router_without_an_admin_key_is_warned_about(self):
        warning = launch_router.router_exposure_warning("0.0.0.0", launch_router.ClusterKeys("u"))
        assert "--admin-api-key is not set" in warning and "/workers" in warning
        assert launch_router.router_exposure_warning("127.0.0.1", launch_router.ClusterKeys()) is None
        assert launch_router.router_exposure_warning("0.0.0.0", launch_router.ClusterKeys(None, "a")) is None
