"""``rksc_sgl.launch_server`` argument handling: ours are split off and validated, SGLang's pass."""

from __future__ import annotations

import pytest

from rksc_sgl.config import RkscConfig
from rksc_sgl.launch_server import split_args


def test_our_flags_are_parsed_with_their_types_and_the_rest_passes_through():
    config, rest = split_args(["--rsbcm", "--cgee-min-layer", "12", "--cgee-theta", "0.5", "--port", "30001"])
    assert config == RkscConfig(rsbcm=True, cgee_min_layer=12, cgee_theta=0.5)
    assert rest == ["--port", "30001"]


def test_bad_value_exits_with_status_2_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        split_args(["--cgee-tau-conf", "1.5"])
    assert exc.value.code == 2
    assert "--cgee-tau-conf" in capsys.readouterr().err


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
