"""The output measures of ASKS substitutions (``benchmarks.calibration.asks_quality``)."""

from __future__ import annotations

import math

import pytest

from benchmarks.calibration.asks_quality import logprob_delta, rouge_l, top_kl


def test_rouge_l_is_f1_of_the_longest_common_subsequence():
    assert rouge_l("a b c d", "a b c d") == 1.0
    assert rouge_l("a b c d", "e f g") == 0.0
    # LCS "a c d" = 3 of 4 and 3 of 5
    assert rouge_l("a b c d", "a x c y d") == pytest.approx(2 * (3 / 4) * (3 / 5) / (3 / 4 + 3 / 5))
    assert rouge_l("", "") == 1.0 and rouge_l("a", "") == 0.0


def test_top_kl_is_zero_for_equal_distributions_and_positive_otherwise():
    p = {1: math.log(0.7), 2: math.log(0.2), 3: math.log(0.1)}
    assert top_kl(p, dict(p)) == pytest.approx(0.0, abs=1e-12)
    q = {1: math.log(0.2), 2: math.log(0.7), 3: math.log(0.1)}
    expected = 0.7 * math.log(0.7 / 0.2) + 0.2 * math.log(0.2 / 0.7)
    assert top_kl(p, q) == pytest.approx(expected, abs=1e-9)
    # a token missing from the other top list gets that list's smallest log-probability
    assert top_kl(p, {1: math.log(0.7), 2: math.log(0.2)}) > 0
    assert top_kl({}, q) is None


def test_logprob_delta_stops_at_the_first_different_token():
    assert logprob_delta([1, 2, 3], [-1.0, -2.0, -3.0], [1, 2, 9], [-1.5, -2.5, -0.1]) == pytest.approx(0.5)
    assert logprob_delta([5], [-1.0], [6], [-1.0]) is None
    assert logprob_delta(list(range(20)), [-1.0] * 20, list(range(20)), [-2.0] * 20, positions=16) == 1.0
