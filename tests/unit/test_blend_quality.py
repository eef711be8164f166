"""Quality and work against exact, branch by branch (``benchmarks.calibration.blend_quality``), and the
modes and flags of the ASKS blend benchmark."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from benchmarks.calibration.blend_quality import blend_work, branch_quality, percentile


def branch(text="a b c", ids=(1, 2, 3), top=None, asks=None):
    top = {7: math.log(0.6), 8: math.log(0.4)} if top is None else top
    return SimpleNamespace(text=text, token_ids=ids, first_top_logprobs=top, asks=asks)


def run(*problems):
    return [SimpleNamespace(branches=tuple(bs)) for bs in problems]


class TestBranchQuality:
    def test_identical_branches_read_zero_kl_identical_outputs_full_rouge(self):
        exact = run([branch(), branch()])
        q = branch_quality(run([branch(), branch()]), exact)
        assert q["quality_branches"] == 2 and q["first_token_kl_median"] == 0.0
        assert q["output_identical_vs_exact"] == 1.0 and q["rouge_l_vs_exact"] == 1.0

    def test_each_branch_is_compared_with_exacts_branch_of_the_same_index(self):
        exact = run([branch("a b", (1, 2)), branch("c d", (3, 4))])
        mine = run([branch("c d", (3, 4)), branch("c d", (3, 4))])
        q = branch_quality(mine, exact)
        assert q["output_identical_vs_exact"] == 0.5 and q["rouge_l_vs_exact"] == 0.5

    def test_kl_is_read_on_exacts_top_tokens(self):
        other = {7: math.log(0.4), 8: math.log(0.6)}
        q = branch_quality(run([branch(top=other)]), run([branch()]))
        assert q["first_token_kl_median"] == pytest.approx(0.6 * math.log(1.5) + 0.4 * math.log(0.4 / 0.6), abs=1e-5)

    def test_no_branches_no_measures(self):
        q = branch_quality([], [])
        assert q["quality_branches"] == 0 and q["first_token_kl_median"] is None


def test_percentile_interpolates_between_ranks():
    assert percentile([0.0, 10.0], 0.9) == pytest.approx(9.0) and percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0


class TestBlendWork:
    def test_reused_and_recomputed_tokens_and_outcomes_are_summed_over_the_branches(self):
        results = run([branch(asks={"mode": "blend", "outcome": "blended", "reused_tokens": 85, "recomputed_tokens": 15}),
                       branch(asks={"adopted": True, "outcome": "adopted", "reused_tokens": 50})])
        work = blend_work(results)
        assert work["asks_reused_tokens"] == 135 and work["asks_recomputed_tokens"] == 15
        assert work["asks_outcomes"] == {"blended": 1, "adopted": 1}

    def test_without_reports_there_is_nothing_to_sum(self):
        assert blend_work(run([branch()]))["asks_reused_tokens"] is None

    def test_the_frontends_prefill_count_leaves_out_blends_reused_tokens(self):
        from rksc_sgl.counters import TokenCounters

        counters = TokenCounters()
        counters.add({"prompt_tokens": 1000, "cached_tokens": 100,
                      "rksc_asks": [{"mode": "blend", "outcome": "blended", "reused_tokens": 600}]})
        assert counters.prefill_tokens == 300


class TestModesAndFlags:
    def test_asks_only_is_the_servers_default_blend_and_asks_adopt_adopts(self):
        from benchmarks.bench.modes import MODES

        assert MODES["asks-only"].effective_asks_mode == "blend" and MODES["asks-only"].recompute is None
        assert MODES["asks-adopt"].rksc_config().asks_mode == "adopt" and MODES["asks-adopt"].rksc_config().asks
        assert MODES["exact"].effective_asks_mode is None and MODES["exact-reseed"].seed_offset > 0

    def test_a_workloads_own_gate_applies_unless_the_mode_sets_the_servers(self):
        from benchmarks.bench.modes import MODES, check_sweep_modes

        assert MODES["asks-only"].gate_asked(0.05) == 0.05 and MODES["asks-only"].gate_asked(None) is None
        assert check_sweep_modes("2:0.1")[0].gate_asked(0.05) is None  # the curve measures the server's

    def test_the_sweep_makes_one_blend_mode_per_share(self):
        from benchmarks.bench.modes import MODES, sweep_modes

        modes = sweep_modes("0, 0.15,1.0")
        assert [m.name for m in modes] == ["asks-blend@0", "asks-blend@0.15", "asks-blend@1"]
        assert [m.recompute for m in modes] == [0.0, 0.15, 1.0] and all(m.effective_asks_mode == "blend" for m in modes)
        # the sweep shows what the share alone buys: the gate is off in its modes, on in asks-only
        assert all(m.rksc_config().asks_max_deviation == math.inf for m in modes)
        assert math.isfinite(MODES["asks-only"].rksc_config().asks_max_deviation)

    @pytest.mark.parametrize("spec", ["0,1.5", "x", "", "0.1,0.1"])
    def test_a_bad_sweep_is_refused_naming_the_flag(self, spec):
        from benchmarks.bench.modes import sweep_modes

        with pytest.raises(ValueError, match="--asks-recompute-sweep"):
            sweep_modes(spec)

    def test_the_check_sweep_makes_one_blend_mode_per_depth_and_gate(self):
        from benchmarks.bench.modes import check_sweep_modes

        modes = check_sweep_modes("2:0.025, 4:0.07,3:inf")
        assert [m.name for m in modes] == ["asks-check@2:0.025", "asks-check@4:0.07", "asks-check@3:inf"]
        configs = [m.rksc_config() for m in modes]
        assert [c.asks_check_layers for c in configs] == [2, 4, 3]
        assert [c.asks_max_deviation for c in configs] == [0.025, 0.07, math.inf]
        assert all(m.effective_asks_mode == "blend" and m.recompute is None for m in modes)  # the server's share

    @pytest.mark.parametrize("spec", ["1:0.025", "2", "2:0", "x:0.1", "", "2:0.1,2:0.1", "2.5:0.1"])
    def test_a_bad_check_sweep_is_refused_naming_the_flag(self, spec):
        from benchmarks.bench.modes import check_sweep_modes

        with pytest.raises(ValueError, match="--asks-check-sweep"):
            check_sweep_modes(spec)

    def test_the_four_modes_and_the_sweep_run_in_one_bench_run(self):
        from benchmarks.bench.run import parse_args

        args = parse_args(["--workload", "multi-doc", "--modes", "exact,no-cache,asks-only,asks-adopt,exact-reseed",
                           "--asks-recompute-sweep", "0,1"])
        assert [m.name for m in args.mode_objs][-2:] == ["asks-blend@0", "asks-blend@1"]
        assert args.dataset_names == ["coqa-short"] and args.shots == 0

    def test_reading_workloads_refuse_voting_datasets_and_the_sweep_needs_an_asks_workload(self, capsys):
        from benchmarks.bench.run import parse_args

        with pytest.raises(SystemExit):
            parse_args(["--workload", "role-sc", "--datasets", "gsm8k"])
        assert "'gsm8k'" in capsys.readouterr().err
        with pytest.raises(SystemExit):
            parse_args(["--workload", "sc", "--asks-recompute-sweep", "0"])
        assert "--asks-recompute-sweep" in capsys.readouterr().err
        with pytest.raises(SystemExit):
            parse_args(["--workload", "sc", "--asks-check-sweep", "2:0.025"])
        assert "--asks-check-sweep" in capsys.readouterr().err
        args = parse_args(["--workload", "role-sc", "--modes", "exact", "--asks-check-sweep", "2:0.025,4:0.07"])
        assert [m.name for m in args.mode_objs] == ["exact", "asks-check@2:0.025", "asks-check@4:0.07"]
        assert parse_args(["--workload", "paraphrase-sc"]).shots == 3
