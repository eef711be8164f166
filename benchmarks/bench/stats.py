"""Statistics for benchmark rows: binomial intervals, ratios, agreement. Pure functions, no I/O."""

from __future__ import annotations

import math


def wilson_ci95(successes: int, n: int) -> list[float] | None:
    """95% Wilson score interval for a proportion, as [low, high]; None when n == 0."""
    if n == 0:
        return None
    z = 1.959963984540054
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def clopper_pearson_upper95(failures: int, n: int) -> float | None:
    """One-sided 95% upper bound on a failure rate (exact binomial); None when n == 0."""
    if n == 0:
        return None
    if failures >= n:
        return 1.0
    # Bisection on the binomial CDF: the largest p with P(X <= failures | n, p) >= 0.05.
    lo, hi = failures / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if _binom_cdf(failures, n, mid) > 0.05:
            lo = mid
        else:
            hi = mid
    return round(hi, 4)


def _binom_cdf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0 if k < n else 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    return sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q)
               for i in range(k + 1))


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator rounded to 3 places; None if either is missing or zero."""
    if not numerator or not denominator:
        return None
    return round(numerator / denominator, 3)


def agreement(answers: list[str | None], reference: list[str | None]) -> float | None:
    """Fraction of positions where two answer lists agree (None answers agree only with None)."""
    if not reference or len(answers) != len(reference):
        return None
    return round(sum(a == b for a, b in zip(answers, reference)) / len(reference), 4)


def branch_agreement(branches: list[list], reference: list[list], indices: list[list[int]] | None = None) -> float | None:
    """Fraction of (problem, branch) positions where two runs agree, over the branches the first
    run has (an early-stopped run's are the first of the reference's, or those at ``indices``,
    per problem the reference position of each); None if shapes differ."""
    if indices:
        if len(indices) != len(branches) or any(len(i) != len(b) for i, b in zip(indices, branches)):
            return None
        if any(i >= len(ys) for idx, ys in zip(indices, reference) for i in idx):
            return None
        reference = [[ys[i] for i in idx] for idx, ys in zip(indices, reference)]
    if not reference or len(branches) != len(reference) or any(len(a) > len(b) for a, b in zip(branches, reference)):
        return None
    pairs = [(a, b) for xs, ys in zip(branches, reference) for a, b in zip(xs, ys)]
    return round(sum(a == b for a, b in pairs) / len(pairs), 4) if pairs else None
