"""``benchmarks.fidelity``: the comparison of two teacher-forced readings, its flags, its table."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.perf.fidelity import compare, main


def test_identical_readings_agree_everywhere_and_change_nothing():
    reading = [([-1.0, -2.0, -0.5], [5, 6, 7]), ([-0.1, -3.0], [1, 2])]
    r = compare(reading, reading)
    assert r["texts"] == 2 and r["tokens"] == 5 and r["top_token_agreement"] == 1.0
    assert r["mean_abs_logprob_difference"] == 0.0 and r["nll_delta_per_token"] == 0.0
    assert r["perplexity"] == r["reference_perplexity"] == round(math.exp(6.6 / 5), 4)


def test_a_reading_that_loses_probability_raises_the_nll_and_counts_each_changed_top_token():
    reference = [([-1.0, -1.0], [5, 6]), ([-2.0, -2.0, -2.0], [1, 2, 3])]
    ours = [([-1.5, -1.0], [5, 9]), ([-2.0, -2.3, -2.0], [1, 2, 3])]
    r = compare(ours, reference)
    assert r["top_token_agreement"] == 0.8  # 4 of 5 positions
    assert r["mean_abs_logprob_difference"] == pytest.approx(0.8 / 5)
    assert r["nll_delta_per_token"] == pytest.approx((0.25 + 0.1) / 2)  # mean over texts of each text's mean
    lo, hi = r["nll_delta_ci95"]
    assert lo < r["nll_delta_per_token"] < hi
    assert r["perplexity"] > r["reference_perplexity"]


def test_readings_of_different_texts_are_refused():
    with pytest.raises(ValueError, match="different texts"):
        compare([([-1.0], [1])], [([-1.0, -2.0], [1, 2])])


@pytest.mark.parametrize("argv, named", [(["--cpu-linear-dtypes", "float32"], "--cpu-linear-dtypes"),
                                         (["--cpu-linear-dtypes", "int4"], "'int4'"),
                                         (["--texts", "1"], "--texts")])
def test_bad_flags_are_named_before_any_engine_starts(argv, named, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert named in capsys.readouterr().err


def test_the_section_gives_each_engine_against_float32_with_its_command(tmp_path):
    from benchmarks.report.tables import fidelity_section

    meta = {"commit": "abc1234", "date": "2026-12-06", "machine": "m", "texts": 2, "tokens": 5,
            "dataset": "gsm8k reference solutions", "command": "python -m benchmarks.fidelity --texts 2"}
    rows = [{"engine": "int8", "linear_dtype": "int8", "perplexity": 2.5, "reference_perplexity": 2.4,
             "top_token_agreement": 0.95, "mean_abs_logprob_difference": 0.05, "nll_delta_per_token": 0.04,
             "nll_delta_ci95": [0.03, 0.05], **meta},
            {"engine": "stock", "linear_dtype": "float32", "perplexity": 2.4, "reference_perplexity": 2.4,
             "top_token_agreement": 1.0, "mean_abs_logprob_difference": 0.0001, "nll_delta_per_token": 0.0,
             "nll_delta_ci95": [-0.0001, 0.0001], **meta}]
    path = tmp_path / "fidelity.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = fidelity_section(path)
    assert "python -m benchmarks.fidelity --texts 2" in text and "2 gsm8k reference solutions, 5 positions" in text
    assert "| `int8` | int8 | 2.500 | 2.400 | 95.0% | 0.0500 | +0.0400 [+0.0300, +0.0500] |" in text
    assert "| `stock` | float32 | 2.400 | 2.400 | 100.0% |" in text


def test_the_engines_are_the_speed_benchmarks_in_each_dtype_and_its_stock():
    from benchmarks.perf.fidelity import engines
    from benchmarks.perf.speed import engine_overrides

    named = engines(["bfloat16"])
    assert list(named) == ["float32", "bfloat16", "stock"]
    assert [named[d]["rksc"].cpu_linear_dtype for d in ("float32", "bfloat16")] == ["float32", "bfloat16"]
    assert named["stock"] == engine_overrides()["stock"] and named["stock"]["attention_backend"] == "torch_native"
