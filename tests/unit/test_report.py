"""The README's results section is generated from a results file (``benchmarks.report``)."""

from __future__ import annotations

import json

import pytest

from benchmarks.report.sections import (ROOT, block, generated_blocks, main, pooled_cgee_error, replace_between_markers,
                                        section)
from benchmarks.report.tables import latest_rows

WALL = {"no-cache": 300.0, "exact": 200.0, "cgee-only": 160.0}
ACCURACY = {"no-cache": 0.20, "exact": 0.20, "cgee-only": 0.18}


def row(dataset: str, mode: str, run_id: str = "2", cgee_error: float | None = None) -> dict:
    return {
        "run_id": run_id, "workload": "bon-verify", "dataset": dataset, "mode": mode, "model": "m", "n_problems": 50,
        "commit": "abc1234", "date": "2026-11-29", "machine": "x86_64, 2 cores, CPU", "repeats": 1, "seed": 0,
        "settings": {"num_branches": 4}, "wall_s": WALL[mode],
        "speedup_vs_no_cache": round(WALL["no-cache"] / WALL[mode], 3),
        "speedup_vs_exact": round(WALL["exact"] / WALL[mode], 3),
        "accuracy": ACCURACY[mode], "accuracy_ci95": [0.1, 0.3], "answer_agreement_vs_exact": 0.9,
        "reuse_rate": 0.5, "cgee_skip_rate": 0.1 if cgee_error is not None else None,
        "cgee_mean_exit_layer": 30 if cgee_error is not None else None, "cgee_error": cgee_error,
        "cgee_error_ub95": 0.09 if cgee_error is not None else None, "evictions": 0,
    }


def rows(run_id: str = "2") -> list[dict]:
    return [row(d, m, run_id, 0.02 if m == "cgee-only" else None)
            for d in ("gsm8k", "gpqa") for m in ("no-cache", "exact", "cgee-only")]


def test_section_has_the_command_a_row_per_dataset_and_mode_and_the_headline():
    text = section(rows())
    assert "python -m benchmarks.bench --workload bon-verify --datasets gsm8k,gpqa --limit 50 " \
           "--modes no-cache,exact,cgee-only" in text
    assert text.count("| gsm8k |") == 3 and text.count("| gpqa |") == 3
    assert "| gsm8k | cgee-only | 160.0 | 1.88 | 1.25 | - |" in text  # one repeat: nothing to pair
    assert "-0.02" in text  # accuracy delta beside the speed-up
    assert "- `cgee-only`: 1.88x over no-cache (range 1.88-1.88); 1.25x over exact" in text
    assert "accuracy -2.0 points vs exact" in text
    assert "CGEE error 2/100 = 2.0%" in text
    assert "commit abc1234" in text


def test_repeats_are_paired_with_exacts_walls_in_the_same_repeat_of_the_same_run():
    table = rows() + rows(run_id="3")
    for r in table:
        r["repeats"] = 3
        r["wall_s_samples"] = {"exact": [200.0, 180.0, 220.0], "cgee-only": [250.0, 150.0, 200.0]}.get(r["mode"], [1.0])
    table[-2]["wall_s_samples"] = [100.0, 100.0, 100.0]  # run 3's gpqa exact: run 2's cgee-only must not pair with it
    text = section(table)
    assert text.count("| gsm8k | cgee-only | 160.0 | 1.88 | 1.25 | 0.80 / 1.20 / 1.10 |") == 2
    assert text.count("| gpqa | cgee-only | 160.0 | 1.88 | 1.25 | 0.80 / 1.20 / 1.10 |") == 1
    assert "| gpqa | cgee-only | 160.0 | 1.88 | 1.25 | 0.40 / 0.67 / 0.50 |" in text
    assert "| gsm8k | exact | 200.0 | 1.50 | 1.00 | - |" in text and "| gsm8k | no-cache | 300.0 | 1.00 | 0.67 | - |" in text


def test_prefill_shows_each_repeat_where_the_repeats_differ():
    table = rows()
    for r in table:
        r["repeats"] = 3
        r["prefill_tokens"], r["prefill_tokens_per_repeat"] = 300, [100, 100, 100]
    table[1]["prefill_tokens"], table[1]["prefill_tokens_per_repeat"] = 296, [100, 98, 98]  # gsm8k exact
    text = section(table)
    assert "| gsm8k | exact |" in text and "| 100 / 98 / 98 |" in text
    assert text.count("| 100 |") == len(table) - 1  # the same in each repeat: one figure


def test_pooled_error_sums_decisions_over_datasets():
    errors, n, ub = pooled_cgee_error([row("gsm8k", "cgee-only", cgee_error=0.02), row("gpqa", "cgee-only", cgee_error=0.0)])
    assert (errors, n) == (1, 100) and 0.01 < ub < 0.06
    assert pooled_cgee_error([row("gsm8k", "exact")]) is None


def test_readme_section_is_replaced_between_markers_only(tmp_path):
    results = tmp_path / "bon-verify.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in rows("1") + rows("2")) + "\n")
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:bon-verify:start -->\nold\n<!-- results:bon-verify:end -->\noutro\n")
    main([str(results), "--readme", str(readme)])
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("<!-- results:bon-verify:end -->\noutro\n")
    assert "old" not in text and "| gpqa | exact |" in text


def test_missing_markers_are_named():
    with pytest.raises(ValueError, match="results:sc:start"):
        replace_between_markers("no markers here", "sc", "body")


def test_asks_table_reports_prefill_against_exact_and_the_output_measures():
    base = rows()
    asks_row = {**row("gsm8k", "cgee-only"), "mode": "asks-only", "prefill_tokens": 250,
                "asks_substituted_branches": 7, "asks_reused_tokens": 2800, "asks_rouge_l_vs_own_wording": 0.41,
                "asks_rouge_l_two_seeds_one_prompt": 0.39, "asks_first_token_kl": 0.12,
                "asks_mean_abs_dlogprob_16": 0.3, "asks_false_accept_rate": 0.0, "asks_control_probed": 48,
                "asks_control_pairs": 64, "branch_answer_agreement_vs_exact": 0.5, "asks_overhead_s": 1.6,
                "asks_same_topic_false_accept_rate": 0.0125, "asks_same_topic_probed": 80,
                "asks_same_topic_pairs": 160}
    for r in base:
        r["prefill_tokens"] = 1000
    text = section(base + [asks_row])
    assert "| gsm8k | asks-only | 7 | 0.25 | 2800 |" in text
    # 1.6 s of a 160 s wall; the same-topic column beside the topic one
    assert "0.410 | 0.390 | 0.120 | 0.300 | 0.000 (48 of 64) | 0.013 (80 of 160) | 1.00 |" in text
    del asks_row["asks_same_topic_false_accept_rate"]  # a run from before the same-topic probe
    assert "| 0.000 (48 of 64) | - | 1.00 |" in section(base + [asks_row])
    assert "ASKS" not in section(base)


def test_adaptive_table_sets_the_runtime_saving_beside_the_replay_and_the_curve_has_its_table():
    from benchmarks.report.sections import adaptive_table, curve_table

    row = {"dataset": "arc-challenge", "mode": "adaptive", "stop_rule": "esc:3", "branches_sampled": 200,
           "branches_full": 320, "completion_tokens_vs_exact": 0.62, "token_saving": 0.38, "replay_token_saving": 0.36,
           "sample_saving": 0.375, "replay_sample_saving": 0.35, "speedup_vs_exact": 1.4,
           "answer_agreement_vs_exact": 0.95, "replay_vote_agreement": 0.95, "accuracy": 0.3,
           "accuracy_ci95": [0.15, 0.5], "vote_skip_rate": None}
    (*_, line) = adaptive_table([{"mode": "exact", "dataset": "arc-challenge"}, row])
    assert line.startswith("| arc-challenge | adaptive | `esc:3` | 200 / 320 | 0.620 | 38.0% | 36.0% | 37.5% (35.0%) | 1.40 |")
    assert adaptive_table([{"mode": "exact"}]) == []
    curve = {"workload": "sc", "n_problems": 20, "calibration_offset": 20, "num_branches": 16, "commit": "abc",
             "command": "python -m benchmarks.bench --calibration-offset 20",
             "datasets": {"arc-challenge": {"points": [{"rule": "esc:3", "branches_sampled": 250, "branches_full": 320,
                                                        "sample_saving": 0.22, "token_saving": 0.2,
                                                        "vote_agreement": 0.95}],
                                            "chosen_at_0.95": {"esc": "esc:3", "beta": None}}}}
    text = curve_table(curve)
    assert "| arc-challenge | `esc:3` | rounds | 250 / 320 | 22.0% | 20.0% | 0.95 |" in text
    assert "esc: `esc:3`, beta: none" in text and "--calibration-offset 20" in text


def test_the_committed_docs_carry_the_tables_the_committed_results_give():
    """README.md's summary and docs/benchmarks.md's tables: regenerate with ``benchmarks.report --all``."""
    for path, blocks in generated_blocks().items():
        text = path.read_text()
        for name, body in blocks.items():
            assert block(text, name) == body, f"{path.name}, block {name}: run python -m benchmarks.report --all"


def test_the_readme_is_a_page_of_at_most_200_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_a_run_without_run_ids_is_its_trailing_rows_of_one_commit(tmp_path):
    path = tmp_path / "speed.jsonl"
    path.write_text("".join(json.dumps({"commit": c, "kind": k}) + "\n" for c, k in
                            (("a", "decode"), ("b", "decode"), ("b", "prefill"))))
    assert [r["kind"] for r in latest_rows(path)] == ["decode", "prefill"]


def test_all_takes_no_results_file(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["benchmarks/results/tot.jsonl", "--all"])
    assert exc.value.code == 2 and "--all" in capsys.readouterr().err


def test_the_summary_says_how_many_same_topic_controls_the_asks_gate_accepted():
    from benchmarks.report.tables import _did

    exact = {"dataset": "gsm8k", "mode": "exact", "prefill_tokens": 1000}
    asks = {"dataset": "gsm8k", "mode": "asks-only", "prefill_tokens": 800, "asks_substituted_branches": 12,
            "asks_same_topic_false_accepts": 1, "asks_same_topic_probed": 80}
    assert _did([exact, asks], [asks]) == ("12 branches adopted a sibling's span; prefill 0.80x; "
                                           "same-topic controls accepted 1/80")
    older = {k: v for k, v in asks.items() if not k.startswith("asks_same_topic")}
    assert _did([exact, older], [older]).endswith("prefill 0.80x")


def test_the_summary_says_whether_the_program_or_the_scheduler_applied_the_stop_rule():
    from benchmarks.report.tables import _did

    row = {"dataset": "gsm8k", "mode": "adaptive", "stop_rule": "beta:0.9", "branches_sampled": 600,
           "branches_full": 800, "completion_tokens_vs_exact": 0.7, "replay_token_saving": 0.25}
    assert _did([row], [row]).startswith("`beta:0.9` sampled 600 of 800 branches; completion tokens 0.70x")
    group = {**row, "mode": "group-stop", "stop_applied_by": "scheduler"}
    assert _did([group], [group]).startswith("`beta:0.9` let 600 of 800 branches finish (the scheduler stopped the rest)")


def test_the_cgee_calibration_section_says_what_was_chosen_per_dataset_and_why_no_layer_exit(tmp_path):
    import json

    from benchmarks.report.tables import cgee_calibration_section

    def entry(tau, skip, errors):
        return {"thresholds": {"tau_conf": tau, "margin": 0.5, "theta": 0.1, "epsilon": 0.02, "min_layer": 4},
                "calibration": {"n_problems": 100, "errors": errors, "skip_rate": skip, "error_ub95": 0.047,
                                "decision_agreement_if_all_exit_at_layer": {"2": 0.4, "3": 0.6, "4": 1.0}}}

    data = {**entry(0.4, 0.1125, 3), "per_dataset": {"gsm8k": entry(0.3, 0.01, 0)}, "target_error": 0.05,
            "calibration_split": "last 100 problems of each dataset", "command": "python -m benchmarks.calibrate_cgee",
            "candidates": {"num_candidates": 4, "shots": 3, "max_new_tokens": 96, "temperature": 0.7}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    out = cgee_calibration_section(path)
    assert "| pooled (`RkscConfig` defaults) | 100 | 0.4 | 0.5 | 4 | 11.2% | 3/100 | 4.7% |" in out
    assert "| `gsm8k` | 100 | 0.3 |" in out and "3 shots, 96 new tokens" in out
    assert "at most 60% of problems (layer 3)" in out


def test_a_curve_run_a_dataset_at_a_time_keeps_the_earlier_datasets_with_their_own_command(tmp_path):
    import json

    from benchmarks.bench.rows import earlier_curves
    from benchmarks.report.sections import curve_table

    point = {"rule": "esc:3", "branches_sampled": 1, "branches_full": 2, "sample_saving": 0.5, "token_saving": 0.5,
             "vote_agreement": 1.0}
    entry = {"points": [point], "chosen_at_0.95": {"esc": "esc:3", "beta": None}}
    path = tmp_path / "sc_stop_curve.json"
    path.write_text(json.dumps({"workload": "sc", "n_problems": 50, "num_branches": 16, "commit": "old",
                                "command": "bench --datasets arc-challenge", "datasets": {"arc-challenge": entry}}))
    merged = earlier_curves(path)
    assert merged["arc-challenge"]["commit"] == "old" and merged["arc-challenge"]["points"] == [point]
    merged["gsm8k"] = {**entry, "commit": "new", "command": "bench --datasets gsm8k", "n_problems": 50}
    text = curve_table({"workload": "sc", "n_problems": 50, "num_branches": 16, "commit": "new",
                        "command": "bench --datasets gsm8k", "datasets": merged})
    assert "arc-challenge: Replayed" in text and "commit old" in text and "bench --datasets arc-challenge" in text
    assert "gsm8k: Replayed" in text and "commit new" in text and text.count("| dataset | rule |") == 1
    assert earlier_curves(tmp_path / "absent.json") == {}


def test_a_curve_with_trace_points_gets_the_trace_stop_table():
    from benchmarks.report.sections import curve_table

    point = {"rule": "esc:3", "branches_sampled": 1, "branches_full": 2, "sample_saving": 0.5, "token_saving": 0.5,
             "vote_agreement": 1.0}
    trace = {"percentile": 25, "rule": "beta:0.9", "threshold": 1.2345, "applied_by": "scheduler",
             "branches_voting": 12, "branches_full": 16, "traces_stopped": 3, "token_saving": 0.3, "vote_agreement": 0.9}
    entry = {"points": [point], "chosen_at_0.95": {"esc": "esc:3", "beta": None}}
    curve = {"workload": "sc", "n_problems": 1, "num_branches": 16, "commit": "c", "command": "bench",
             "datasets": {"gpqa": entry}}
    assert "Trace stops" not in curve_table(curve)
    curve["datasets"]["gpqa"] = {**entry, "trace_points": [trace]}
    assert "| gpqa | 1.234 (p25) | `beta:0.9` | scheduler | 3 | 12 / 16 | 30.0% | 0.90 |" in curve_table(curve)


def test_the_scheduler_profile_section_shows_each_datasets_latest_run_with_every_modes_cache_class(tmp_path):
    from benchmarks.report.tables import scheduler_profile_section

    def run(commit, dataset, forward):
        modes = [{"mode": mode, "bench_wall_s": 30.0, "seconds_by_category": {"model forward": forward, "radix cache": 0.06}}
                 for mode in ("exact", "rksc-lru", "rsbcm-only", "no-cache", "a-mode-bench-dropped")]
        return {"commit": commit, "date": "2026-12-03", "machine": "m", "command": f"profile {dataset}",
                "workload": "bon-verify", "dataset": dataset, "limit": 20, "modes": modes}

    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (run("old", "gpqa", 1.0), run("abc", "mmlu-stem", 2.0),
                                                     run("new", "gpqa", 3.0))) + "\n")
    out = scheduler_profile_section(path)
    # one table per (workload, dataset), in the order first profiled, from its latest run
    assert "commit old" not in out and out.index("gpqa, 20 problems: commit new") < out.index("mmlu-stem, 20 problems")
    assert "| exact (SGLang's `UnifiedRadixCache`, LRU) | 30.0 | 3.00 | 0.00 | 0.06 | 0.00 | 0.00 | - |" in out
    assert "| rksc-lru (our `RkscRadixCache`, LRU) |" in out and "| rsbcm-only (our `RkscRadixCache`, RSBCM) |" in out
    assert "| no-cache (no radix cache) |" in out and "| a-mode-bench-dropped | 30.0 |" in out
    # a run with other bench flags (a capped pool, read from its command) is a table of its own
    capped = {**run("cap", "gpqa", 4.0), "command": "profile gpqa --bench-args '--pool-fraction 0.25'"}
    path.write_text(path.read_text() + json.dumps(capped) + "\n")
    out = scheduler_profile_section(path)
    assert "gpqa, 20 problems: commit new" in out
    assert "gpqa, 20 problems, bench flags `--pool-fraction 0.25`: commit cap" in out
    # a run that split the forward by batch kind shows the split
    split = run("split", "coqa", 5.0)
    split["modes"][0]["forward_seconds_by_kind"] = {"decode": 2.0, "prefill": 2.5, "ASKS blend": 0.5}
    path.write_text(path.read_text() + json.dumps(split) + "\n")
    assert "| 30.0 | 5.00 | 0.00 | 0.06 | 0.00 | 0.00 | 2.00 / 0.50 / 2.50 |" in scheduler_profile_section(path)


def test_every_benchmark_mode_names_its_cache_class():
    from benchmarks.bench.modes import MODES

    classes = {name: mode.cache_class for name, mode in MODES.items()}
    assert classes["exact"] == classes["cgee-only"] == classes["adaptive"] == "SGLang's `UnifiedRadixCache`, LRU"
    assert classes["rksc-lru"] == classes["asks-only"] == "our `RkscRadixCache`, LRU"
    assert classes["rksc"] == classes["rsbcm-only"] == "our `RkscRadixCache`, RSBCM"


def test_blend_table_reads_each_mode_against_exact_beside_the_two_seed_floor():
    from benchmarks.report.tables import blend_table

    base = {"dataset": "coqa", "prefill_tokens_computed": 100, "accuracy": 0.4, "accuracy_ci95": [0.3, 0.5]}
    rows = [{**base, "mode": "exact", "answer_agreement_vs_exact": 1.0},
            {**base, "mode": "exact-reseed", "answer_agreement_vs_exact": 0.7, "first_token_kl_median": 0.0},
            {**base, "mode": "asks-blend@0.15", "asks_mode": "blend", "asks_recompute_asked": 0.15,
             "speedup_vs_exact": 2.2, "prefill_computed_vs_exact": 0.3, "asks_reused_tokens": 900,
             "asks_recomputed_tokens": 135, "first_token_kl_median": 0.0123, "first_token_kl_p90": 0.05,
             "output_identical_vs_exact": 0.25, "rouge_l_vs_exact": 0.61, "answer_agreement_vs_exact": 0.8,
             "asks_outcomes": {"blended": 7, "no-anchor": 1}},
            {**base, "mode": "asks-only", "asks_mode": "blend", "asks_max_deviation": 0.07,
             "asks_deviating_tokens": 61, "speedup_vs_exact": 1.5}]
    text = "\n".join(blend_table(rows))
    assert "| coqa | exact |" not in text
    assert ("| coqa | asks-blend@0.15 | blend | 0.15 | - | 2.20 | 0.30 | 900 / 135 | 0.0123 (0.0500) | 0.25 | 0.610 "
            "| 0.80 (0.70) | 0.40 (0.30-0.50) | blended 7, no-anchor 1 |") in text
    assert "| coqa | asks-only | blend | - | 0.07 (61) | 1.50 |" in text  # the gate, and the tokens past it
    assert blend_table([{**base, "mode": "exact"}]) == [] and blend_table([{"mode": "x", "dataset": "d"}]) == []


def test_a_blend_workloads_headline_is_its_median_of_three_run_where_there_is_one(tmp_path):
    from benchmarks.report.tables import _blend

    (tmp_path / "blend").mkdir()
    (tmp_path / "blend" / "role-sc.jsonl").write_text("{}\n")
    assert _blend(tmp_path, "role-sc") == tmp_path / "blend" / "role-sc.jsonl"
    (tmp_path / "blend-repeats").mkdir()
    (tmp_path / "blend-repeats" / "role-sc.jsonl").write_text("{}\n")
    assert _blend(tmp_path, "role-sc") == tmp_path / "blend-repeats" / "role-sc.jsonl"
    assert _blend(tmp_path, "multi-doc") == tmp_path / "blend" / "multi-doc.jsonl"


def test_the_decode_profile_keeps_every_earlier_run_as_its_before(tmp_path):
    from benchmarks.report.tables import decode_profile_section

    def row(commit, step, python, tok_s):
        return json.dumps({"commit": commit, "date": "2026-12-05", "machine": "m", "new_tokens": 32, "command": "c",
                           "linear_dtype": "float32", "streams": 1, "tok_s": tok_s, "step_ms": step,
                           "parts": {"linears": {"ops": step - python, "python": python / 2},
                                     "norms": {"ops": 0.0, "python": python / 2}}})

    path = tmp_path / "decode_profile.jsonl"
    path.write_text(row("old", 72.5, 29.0, 17.0) + "\n")
    assert "oldest first" not in decode_profile_section(path)  # one run: no history
    path.write_text(row("old", 72.5, 29.0, 17.0) + "\n" + row("new", 43.8, 11.0, 24.4) + "\n")
    text = decode_profile_section(path)
    assert text.startswith("Commit new")
    assert "| old (2026-12-05) | 72.5 / 29.0 / 17.0 |" in text and "| new (2026-12-05) | 43.8 / 11.0 / 24.4 |" in text


def test_llama_cpp_rows_put_the_default_linears_first_with_their_agreement_and_the_others_by_their_flag():
    from benchmarks.report.tables import _llama_cpp_rows

    def decode(dtype, tok_s):
        return {"kind": "decode", "streams": 1, "baseline": "llama.cpp", "linear_dtype": dtype, "tok_s": tok_s,
                "baseline_tok_s": 100.0, "commit": "abc", "machine": "m"}

    agreement = {"kind": "agreement", "streams": 50, "linear_dtype": "int8", "baseline": "float32 linears",
                 "prompts": 50, "identical": 16, "new_tokens": 128}
    rows = _llama_cpp_rows([decode("float32", 20.0), decode("int8", 62.0), agreement])
    assert [r[1] for r in rows] == ["CPU path, int8 linears", "CPU path, `--cpu-linear-dtype float32`"]
    assert [r[3] for r in rows] == ["0.62x", "0.20x"]
    assert rows[0][4] == "greedy text equal to float32's for 16 of 50 prompts (128 tokens)" and rows[1][4] == "-"
    assert rows[0][-1] == "m, int8 linears"
    # A run on a machine without int8 has float32 as its default; rows without the field ran float32.
    old = {k: v for k, v in decode("float32", 20.0).items() if k != "linear_dtype"}
    assert [r[1] for r in _llama_cpp_rows([old])] == ["CPU path, float32 linears"]


def test_llama_cpp_rows_add_the_teacher_forced_reading_of_their_linears_where_there_is_one():
    from benchmarks.report.tables import _llama_cpp_rows

    decode = {"kind": "decode", "streams": 1, "baseline": "llama.cpp", "linear_dtype": "int8", "tok_s": 62.0,
              "baseline_tok_s": 100.0, "commit": "abc", "machine": "m"}
    read = {"engine": "int8", "top_token_agreement": 0.953, "perplexity": 2.512, "reference_perplexity": 2.498}
    row, = _llama_cpp_rows([decode], [read, {**read, "engine": "bfloat16", "perplexity": 9.0}])
    assert row[4] == "teacher-forced, top token float32's at 95.3% of positions, perplexity 2.512 vs 2.498"
