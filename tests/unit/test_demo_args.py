"""``make demo``'s command line: bad values exit with status 2 naming the flag, before any engine."""

from __future__ import annotations

import pytest

from programs.demo import parse_args


@pytest.mark.parametrize("argv, flag", [(["--limit", "0"], "--limit"), (["--num-branches", "0"], "--num-branches"),
                                        (["--temperature", "-1"], "--temperature")])
def test_a_bad_value_names_its_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_defaults_are_the_sampling_config_of_the_programs():
    args = parse_args([])
    assert args.config.num_branches == 4 and args.limit == 4
