"""The benchmark's command line: modes and workloads are checked before any engine starts."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.bench.run import parse_args
from benchmarks.bench.modes import LANDED, MODES, resolve_modes


def test_unlanded_mechanism_is_refused_naming_it(capsys, monkeypatch):
    import benchmarks.bench.modes

    monkeypatch.setattr(benchmarks.bench.modes, "LANDED", frozenset({"cgee", "rsbcm"}))
    with pytest.raises(SystemExit):
        parse_args(["--modes", "exact,asks-only"])
    assert "ASKS" in capsys.readouterr().err


def test_every_mode_takes_the_runs_linears_but_exact_float32(capsys):
    args = parse_args(["--modes", "exact,rksc,exact-float32", "--cpu-linear-dtype", "bfloat16"])
    configs = {m.name: m.engine_config(args.cpu_linear_dtype) for m in args.mode_objs}
    assert configs["exact"].cpu_linear_dtype == configs["rksc"].cpu_linear_dtype == "bfloat16"
    assert configs["exact-float32"].cpu_linear_dtype == "float32" and configs["rksc"].rsbcm
    assert parse_args([]).cpu_linear_dtype == MODES["exact"].rksc_config().cpu_linear_dtype  # the engine's default
    with pytest.raises(SystemExit):
        parse_args(["--cpu-linear-dtype", "int4"])
    assert "int4" in capsys.readouterr().err


def test_unknown_workload_and_dataset_are_named(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--workload", "nope"])
    assert "'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--datasets", "gsm8k,imagenet"])
    assert "'imagenet'" in capsys.readouterr().err


def test_baselines_are_stock_and_rksc_holds_only_landed_mechanisms():
    no_cache, exact, rksc = resolve_modes("no-cache,exact,rksc")
    assert no_cache.engine_overrides() == {"disable_radix_cache": True}
    assert exact.engine_overrides() == {} and not exact.rksc_config().uses_backend
    assert rksc.mechanisms == {"asks", "cgee", "rsbcm"} == LANDED
    assert rksc.rksc_config().rsbcm and rksc.rksc_config().asks
    (asks_only,) = resolve_modes("asks-only")
    assert asks_only.rksc_config().asks and not asks_only.rksc_config().rsbcm


def test_every_workload_of_the_issue_is_accepted():
    for name in ("sc", "diverse-sc", "tot", "bon-verify", "paraphrase-sc"):
        assert parse_args(["--workload", name]).workload_obj.name == name


def test_diverse_branches_get_distinct_openers_cycling_when_there_are_more_branches():
    from programs.sc import OPENERS, branch_openers

    assert branch_openers(len(OPENERS)) == list(OPENERS) and len(set(OPENERS)) == len(OPENERS)
    assert branch_openers(len(OPENERS) + 1)[-1] == OPENERS[0]


def test_sampling_flags_are_checked_by_the_programs_own_config(capsys):
    from programs.sampling import SamplingConfig

    args = parse_args(["--num-branches", "3", "--max-new-tokens", "16", "--shots", "0"])
    assert isinstance(args.settings, SamplingConfig)
    assert (args.settings.num_branches, args.settings.max_new_tokens, args.settings.shots) == (3, 16, 0)
    assert args.settings.max_concurrency is None  # default: every problem in flight
    assert parse_args(["--max-concurrency", "2"]).settings.max_concurrency == 2
    for flag, value in (("--num-branches", "0"), ("--max-new-tokens", "0"), ("--shots", "-1"), ("--temperature", "-1"),
                        ("--max-concurrency", "0")):
        with pytest.raises(SystemExit):
            parse_args([flag, value])
        assert flag in capsys.readouterr().err


def test_pool_fraction_sizes_each_datasets_pool_from_an_uncapped_run(tmp_path, capsys):
    import json

    run = tmp_path / "bon-verify.jsonl"
    rows = [{"run_id": "1", "workload": "bon-verify", "dataset": d, "mode": m, "n_problems": 5, "tree_tokens_after": t}
            for d, t in (("gsm8k", 40000), ("gpqa", 80000)) for m in ("exact", "rsbcm-only")]
    run.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    base = ["--workload", "bon-verify", "--limit", "5", "--working-set-from", str(run)]
    args = parse_args([*base, "--datasets", "gsm8k,gpqa", "--pool-fraction", "0.25"])
    assert args.pool_tokens == {"gsm8k": 10000, "gpqa": 20000}
    assert parse_args(["--workload", "bon-verify"]).pool_tokens is None
    for argv, message in (([*base, "--datasets", "gsm8k,mmlu-stem", "--pool-fraction", "0.25"], "mmlu-stem"),
                          ([*base[:-2], "--datasets", "gsm8k", "--pool-fraction", "0.25"], "--working-set-from"),
                          ([*base, "--datasets", "gsm8k", "--pool-fraction", "1.5"], "--pool-fraction"),
                          ([*base, "--limit", "6", "--datasets", "gsm8k", "--pool-fraction", "0.25"], "6 problems")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err


def test_cgee_thresholds_file_is_checked_at_start_naming_the_flag(capsys, tmp_path):
    with pytest.raises(SystemExit):
        parse_args(["--workload", "bon-verify", "--cgee-thresholds", str(tmp_path / "missing.json")])
    assert "--cgee-thresholds" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"thresholds": {"tau_conf": 0.5, "margin": 7, "theta": 0.1, "epsilon": 0.02, "min_layer": 30}}')
    with pytest.raises(SystemExit):
        parse_args(["--workload", "bon-verify", "--cgee-thresholds", str(bad)])
    assert "--cgee-margin" in capsys.readouterr().err
    from pathlib import Path

    committed = str(Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cgee_thresholds.json")
    assert parse_args(["--workload", "bon-verify", "--cgee-thresholds", committed]).settings.cgee_thresholds == committed


def test_a_bad_per_dataset_entry_fails_at_start_too(capsys, tmp_path):
    import json

    good = {"tau_conf": 0.2, "margin": 0.8, "theta": 0.1, "epsilon": 0.02, "min_layer": 30}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"thresholds": good, "per_dataset": {"gpqa": {"thresholds": {**good, "margin": 7}}}}))
    with pytest.raises(SystemExit):
        parse_args(["--workload", "bon-verify", "--cgee-thresholds", str(path)])
    assert "--cgee-margin" in capsys.readouterr().err


def test_rksc_lru_is_our_cache_class_under_stock_lru_with_no_mechanism():
    from rksc_sgl.config import BACKEND_NAME

    (lru,) = resolve_modes("rksc-lru")
    assert lru.mechanisms == frozenset() and not lru.cgee
    config = lru.rksc_config()
    assert not config.rsbcm and not config.asks  # stock LRU: no RSBCM strategy, no ASKS
    assert lru.engine_overrides() == {"radix_cache_backend": BACKEND_NAME}
    (exact,) = resolve_modes("exact")
    assert "radix_cache_backend" not in exact.engine_overrides()  # exact keeps SGLang's default class


def test_exact_again_is_exact_under_another_name():
    exact, again = resolve_modes("exact,exact-again")
    assert dataclasses.replace(again, name="exact") == exact  # the A/A control: every field but the name


def test_repeat_r_starts_at_mode_r_mod_m():
    from benchmarks.bench.run import mode_order

    modes = ["a", "b", "c"]
    assert [mode_order(modes, r) for r in range(4)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"],
                                                          ["a", "b", "c"]]


def test_run_all_rotates_engines_and_keeps_each_repeat_per_mode(monkeypatch):
    import benchmarks.bench.run as bench
    from rksc_sgl.counters import TokenCounters

    ran = []

    def one_repeat(mode, args, data):  # stands in for an engine: records the order it was started in
        ran.append(mode.name)
        wall = float(len(ran))
        return {"gsm8k": {"wall": wall, "run": wall, "counters": TokenCounters(1, 10, 4, 2), "reference": None,
                          "evicted": 3, "pool": {}, "max_total_tokens": None}}

    monkeypatch.setattr(bench, "run_mode", one_repeat)
    args = parse_args(["--modes", "exact,rksc-lru,rsbcm-only", "--repeats", "3", "--datasets", "gsm8k"])
    results, orders = bench.run_all(args, {"gsm8k": None})
    assert orders == [["exact", "rksc-lru", "rsbcm-only"], ["rksc-lru", "rsbcm-only", "exact"],
                      ["rsbcm-only", "exact", "rksc-lru"]]
    assert ran == [name for order in orders for name in order]
    assert results["exact"]["gsm8k"]["walls"] == [1.0, 6.0, 8.0]  # its slot in each repeat, in repeat order
    assert results["rsbcm-only"]["gsm8k"]["evicted"] == 9 and len(results["exact"]["gsm8k"]["counters"]) == 3


def test_token_counters_subtract_a_phase_field_by_field():
    from rksc_sgl.counters import TokenCounters

    total, reference = TokenCounters(10, 1000, 600, 50), TokenCounters(4, 300, 250, 4)
    own = total - reference
    assert own == TokenCounters(6, 700, 350, 46) and own.prefill_tokens == 350
    assert own + reference == total


def test_stop_rule_is_checked_at_start_naming_the_flag_and_adaptive_needs_a_voting_workload(capsys):
    assert parse_args(["--modes", "exact,adaptive", "--stop-rule", "beta:0.9"]).settings.stop_rule == "beta:0.9"
    (adaptive,) = resolve_modes("adaptive")
    assert adaptive.adaptive and not adaptive.mechanisms and adaptive.engine_overrides() == {}
    for argv, message in ((["--stop-rule", "esc:1"], "--stop-rule"), (["--stop-rule", "beta:2"], "--stop-rule"),
                          (["--modes", "adaptive", "--workload", "tot"], "adaptive runs only"),
                          (["--modes", "group-stop", "--workload", "bon-verify"], "group-stop runs only"),
                          (["--modes", "group-stop+trace"], "need --trace-stop"),
                          (["--modes", "group-stop+trace", "--trace-stop", "-1"], "--trace-stop"),
                          (["--calibration-offset", "-1"], "--calibration-offset")):
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert message in capsys.readouterr().err
    assert parse_args(["--modes", "adaptive", "--workload", "bon-verify"]).mode_objs == [adaptive]


def test_calibration_offset_evaluates_the_problems_after_a_reported_runs():
    from benchmarks.bench.run import split_problems

    exemplars, reported = split_problems("arc-challenge", 3, 4)
    same_exemplars, held_apart = split_problems("arc-challenge", 3, 4, offset=4)
    assert exemplars == same_exemplars
    assert not {p.id for p in reported} & {p.id for p in held_apart}
    assert len(held_apart) == 4
