"""``make demo``'s command line: bad values exit with status 2 naming the flag, before any engine."""

from __future__ import annotations

import pytest

from programs.demo import parse_args


@pytest.mark.parametrize("argv, flag", [(["--sc-problems", "0"], "--sc-problems"),
                                        (["--tot-problems", "0"], "--tot-problems"),
                                        (["--bon-problems", "-1"], "--bon-problems"),
                                        (["--branches", "1"], "--branches"),
                                        (["--max-total-tokens", "100"], "--max-total-tokens")])
def test_a_bad_value_names_its_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_defaults_give_every_workload_problems_and_a_pool_below_the_trees():
    args = parse_args([])
    assert min(args.sc_problems, args.tot_problems, args.bon_problems) >= 1 and args.branches >= 2
    assert 1024 <= args.max_total_tokens
