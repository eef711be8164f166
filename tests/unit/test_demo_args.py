"""``make demo``'s command line: bad values exit with status 2 naming the flag, before any engine."""

from __future__ import annotations

import pytest

from programs.demo import parse_args


@pytest.mark.parametrize("argv, flag", [(["--sc-problems", "0"], "--sc-problems"),
                                        (["--tot-problems", "-1"], "--tot-problems"),
                                        (["--bon-problems", "-1"], "--bon-problems"),
                                        (["--branches", "1"], "--branches"),
                                        (["--max-total-tokens", "100"], "--max-total-tokens"),
                                        (["--vote-problems", "0"], "--vote-problems"),
                                        (["--vote-branches", "0"], "--vote-branches"),
                                        (["--stop-rule", "esc:1"], "--stop-rule"),
                                        (["--stop-rule", "none"], "--stop-rule")])
def test_a_bad_value_names_its_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def test_the_defaults_are_valid():
    args = parse_args([])
    assert min(args.sc_problems, args.bon_problems) >= 1 and args.tot_problems >= 0 and args.branches >= 2
    assert 1024 <= args.max_total_tokens


def test_the_report_prints_each_speed_up_beside_its_agreement(capsys):
    """``report`` on hand-made results: one line per mechanism, the ratio and the agreement on it."""
    from types import SimpleNamespace as NS

    from programs.demo import VOTE, Timed, report

    def sc(answers, asks=None):
        branches = [NS(answer=a, text=f"... {a}", asks=asks if i else None) for i, a in enumerate(answers)]
        return NS(answer=answers[0], correct=False, branches=branches)

    blended = {"mode": "blend", "outcome": "blended", "recompute": 0.15, "reused_tokens": 300,
               "recomputed_tokens": 53}
    def votes(answer, tokens, stopped):
        return NS(answers=(answer,) * 4, answer=answer, correct=answer == "B", completion_tokens=tokens, stopped=stopped)

    exact = {"paraphrase self-consistency": Timed([sc(["1", "2"])], 10.0, 800),
             "tree of thoughts": Timed([NS(answer="3", correct=True)], 8.0, 900),
             VOTE: Timed([votes("B", 100, 0), votes("C", 100, 0)], 9.0, 0)}
    ours = {"paraphrase self-consistency": Timed([sc(["1", "5"], blended)], 4.0, 300),
            "tree of thoughts": Timed([NS(answer="3", correct=True)], 6.4, 700),
            VOTE: Timed([votes("B", 60, 2), votes("D", 80, 1)], 6.0, 0)}
    bon = [{"mode": "full", "n_problems": 8, "verify_wall_s": 2.0, "accuracy": 0.25},
           {"mode": "cgee", "n_problems": 8, "verify_wall_s": 1.6, "accuracy": 0.25, "cgee_errors": 1,
            "cgee_skip_rate": 0.25, "cgee_mean_exit_layer": None}]
    report(exact, ours, bon, {"full": 900, "cgee": 640})
    out = capsys.readouterr().out
    assert "2.50x  votes agree 1/1, branch answers 1/2" in out
    assert "1.25x  answers agree 1/1; correct 1 vs 1" in out
    assert "1.25x  decisions differ from full depth 1/8; correct 2 vs 2" in out
    assert "1 of 2 branches kept their own wording" in out and "300 tokens' KV re-rotated and reused, 53 " \
        "recomputed, share 0.15" in out and "prefill 300 vs 800 tokens" in out
    assert "branch texts identical to exact 1/2" in out
    assert "1.50x  votes agree with the full vote 1/2; correct 1 vs 1" in out
    assert "stopped 3 of 8 children" in out and "completion tokens 140 vs 200" in out
    assert "skipped 2 of 8 verifications" in out
    assert "verification prefill 640 vs 900 tokens at full depth" in out
    for label in ("tree of thoughts",):  # the default run leaves tree of thoughts out: no RSBCM line
        del exact[label], ours[label]
    report(exact, ours, bon)
    out = capsys.readouterr().out
    assert "RSBCM" not in out and "2.50x  votes agree 1/1" in out and "verification prefill" not in out
