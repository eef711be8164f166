"""Benchmark statistics: intervals and ratios on known values."""

from __future__ import annotations

import pytest

from benchmarks.bench.stats import agreement, clopper_pearson_upper95, ratio, wilson_ci95


class TestWilson:
    def test_interval_contains_the_estimate_and_stays_in_unit_range(self):
        low, high = wilson_ci95(7, 10)
        assert 0.0 <= low < 0.7 < high <= 1.0

    def test_known_value(self):  # 50/100: 0.4038 .. 0.5962
        assert wilson_ci95(50, 100) == pytest.approx([0.4038, 0.5962], abs=1e-4)

    def test_empty_sample_has_no_interval(self):
        assert wilson_ci95(0, 0) is None


class TestClopperPearson:
    def test_zero_failures_gives_rule_of_three(self):  # 1 - 0.05 ** (1/n) ~ 3/n
        assert clopper_pearson_upper95(0, 100) == pytest.approx(1 - 0.05 ** (1 / 100), abs=1e-4)

    def test_paper_figure(self):  # 6 / 1,616 decisions differ: upper bound ~0.73%
        ub = clopper_pearson_upper95(6, 1616)
        assert ub == pytest.approx(0.00733, abs=5e-5)  # exact one-sided Clopper-Pearson

    def test_bound_grows_with_failures(self):
        assert clopper_pearson_upper95(1, 50) < clopper_pearson_upper95(5, 50) < 1.0


class TestRatiosAndAgreement:
    def test_ratio_of_missing_or_zero_is_none(self):
        assert ratio(None, 2.0) is None and ratio(2.0, 0.0) is None
        assert ratio(3.0, 2.0) == 1.5

    def test_agreement_counts_equal_answers(self):
        assert agreement(["1", "2", None], ["1", "3", None]) == pytest.approx(2 / 3, abs=1e-4)
        assert agreement(["1"], []) is None


class TestBranchAgreement:
    def test_counts_every_problem_and_branch_position(self):
        from benchmarks.bench.stats import branch_agreement

        assert branch_agreement([["1", "2"], ["3", None]], [["1", "9"], ["3", None]]) == 0.75

    def test_a_group_stopped_run_is_compared_at_its_branches_indices(self):
        from benchmarks.bench.stats import branch_agreement

        reference = [["1", "2", "3", "4"]]
        assert branch_agreement([["2", "4"]], reference, [[1, 3]]) == 1.0
        assert branch_agreement([["2", "9"]], reference, [[1, 3]]) == 0.5
        assert branch_agreement([["2"]], reference, [[7]]) is None

    def test_runs_of_different_shapes_are_not_compared(self):
        from benchmarks.bench.stats import branch_agreement

        assert branch_agreement([["1", "2"]], [["1"]]) is None
        assert branch_agreement([["1"]], []) is None


def test_repeats_token_counters_are_summed_field_by_field():
    import dataclasses

    from benchmarks.bench.rows import sum_counters

    @dataclasses.dataclass
    class Counters:
        prompt_tokens: int
        cached_tokens: int

    assert sum_counters([Counters(10, 4), Counters(7, 7)]) == Counters(17, 11)


def test_adaptive_rows_set_the_runtime_saving_beside_the_replay_of_the_same_rule_on_exacts_branches():
    import argparse

    from benchmarks.bench.rows import adaptive_columns
    from benchmarks.bench.modes import MODES
    from benchmarks.bench.workloads import WorkloadRun
    from rksc_sgl.counters import TokenCounters

    full = WorkloadRun(["A", "B"], [True, False], [["A"] * 3 + ["B"] * 3, ["A", "B", "C", "B", "B", "B"]],
                       branch_tokens=[[10] * 6, [20] * 6])
    early = WorkloadRun(["A", "B"], [True, False], [["A"] * 3, ["A", "B", "C", "B", "B", "B"]])
    exact = {"run": full, "counters": [TokenCounters(completion_tokens=180)]}
    args = argparse.Namespace(num_branches=6, stop_rule="esc:3")
    row = adaptive_columns(MODES["adaptive"], args, early, TokenCounters(completion_tokens=150), {"exact": exact})
    assert (row["branches_sampled"], row["branches_full"], row["stop_rule"]) == (9, 12, "esc:3")
    assert row["sample_saving"] == row["replay_sample_saving"] == 0.25
    assert row["token_saving"] == row["replay_token_saving"] == round(1 - 150 / 180, 4)
    assert row["completion_tokens_vs_exact"] == round(150 / 180, 3) and row["replay_vote_agreement"] == 1.0
    exact_row = adaptive_columns(MODES["exact"], args, full, TokenCounters(completion_tokens=180), {"exact": exact})
    assert exact_row == {"stop_rule": None, "branches_sampled": 12, "branches_full": 12}
