"""``rksc_sgl.launch_server`` argument handling: ours are split off and validated, SGLang's pass."""

from __future__ import annotations

import pytest

from rksc_sgl.config import RkscConfig
from rksc_sgl.launch_server import exposure_warning, is_loopback, split_args


def test_our_flags_are_parsed_with_their_types_and_the_rest_passes_through():
    config, rest = split_args(["--rsbcm", "--cgee-min-layer", "12", "--cgee-theta", "0.5", "--port", "30001"])
    assert config == RkscConfig(rsbcm=True, cgee_min_layer=12, cgee_theta=0.5)
    assert rest == ["--port", "30001"]


@pytest.mark.parametrize("argv,flag", [(["--cgee-tau-conf", "1.5"], "--cgee-tau-conf"), (["--max-n", "0"], "--max-n"),
                                       (["--max-fanout", "0"], "--max-fanout"),
                                       (["--cpu-linear-dtype", "int4"], "--cpu-linear-dtype")])
def test_bad_value_exits_with_status_2_naming_the_flag(capsys, argv, flag):
    with pytest.raises(SystemExit) as exc:
        split_args(argv)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_config_round_trips_through_the_environment(monkeypatch):
    monkeypatch.setenv("RKSC_SGL_CONFIG", "")  # restored after the test: engines read this variable
    config = RkscConfig(rsbcm=True, cgee_epsilon=0.1)
    config.export_to_env()
    assert RkscConfig.from_env() == config
    monkeypatch.setenv("RKSC_SGL_CONFIG", '{"no_such_option": 1}')
    with pytest.raises(ValueError, match="no_such_option"):
        RkscConfig.from_env()


def test_boolean_options_default_on_can_be_switched_off():
    config, rest = split_args(["--no-seeded-sampling", "--report-sampling-margins"])
    assert config == RkscConfig(seeded_sampling=False, report_sampling_margins=True)
    assert rest == []
    assert split_args([])[0].seeded_sampling is True


@pytest.mark.parametrize("argv,flags", [
    (["--rsbcm", "--radix-eviction-policy", "lfu"], ["--rsbcm", "--radix-eviction-policy lfu"]),
    (["--asks", "--disable-radix-cache"], ["--asks", "--disable-radix-cache"]),
    (["--rsbcm", "--radix-cache-backend=other"], ["--rsbcm", "--radix-cache-backend rksc"]),
    (["--asks", "--tp-size", "2"], ["--asks", "--tp-size 1"]),
    (["--asks", "--tp", "2"], ["--asks", "--tp-size 1"]),
    (["--max-n", "32", "--max-queued-requests", "16"], ["--max-n 32", "--max-queued-requests 16"]),
])
def test_flag_conflicts_exit_with_status_2_before_sglang_starts(capsys, argv, flags):
    with pytest.raises(SystemExit) as exc:
        split_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert all(flag in err for flag in flags), err


def test_compatible_flags_pass():
    config, rest = split_args(["--rsbcm", "--radix-eviction-policy", "rsbcm", "--asks", "--tp-size", "1"])
    assert config.rsbcm and config.asks and rest[-2:] == ["--tp-size", "1"]


def test_in_process_engine_refuses_the_same_conflicts_before_starting():
    from rksc_sgl.engine import launch_engine

    with pytest.raises(ValueError, match="--asks needs --tp-size 1"):
        launch_engine(rksc=RkscConfig(asks=True), tp_size=2)


def test_max_fanout_is_our_flag_with_its_default():
    assert RkscConfig().max_fanout == 256
    assert split_args(["--max-fanout", "1000"])[0].max_fanout == 1000


class TestExposureWarning:
    @pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
    def test_a_loopback_host_needs_no_admin_key(self, host):
        assert is_loopback(host) and exposure_warning(host, None, None) is None

    @pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "my-host.example"])
    def test_a_reachable_host_without_an_admin_key_is_warned_about_by_flag(self, host):
        warning = exposure_warning(host, None, None)
        assert warning.startswith(f"--host {host} is reachable") and "--admin-api-key is not set" in warning
        assert "/update_weights_from_disk" in warning and "answer any client." in warning

    def test_a_user_key_alone_still_leaves_admin_routes_to_every_user(self):
        assert "answer any client that holds --api-key" in exposure_warning("0.0.0.0", "user", None)

    def test_an_admin_key_silences_it(self):
        assert exposure_warning("0.0.0.0", None, "admin") is None
