"""Quality and work of a mode against ``exact``, branch by branch (ASKS blend, issue 35).

Every mode of the ASKS workloads (``paraphrase-sc``, ``role-sc``, ``multi-doc``) keeps, per
branch, its text, its sampled token ids and its first token's top-20 log-probabilities
(``programs.paraphrase_sc.ParaBranch``). Against ``exact``'s branch with the same problem and
seed (full computation of the same prompt):

* ``first_token_kl_*``: KL(exact || mode) of the first generated token, on exact's top-20
  renormalised (``asks_quality.top_kl``), median, mean and 90th percentile over the branches;
* ``output_identical_vs_exact``: the share of branches whose sampled tokens are identical;
* ``rouge_l_vs_exact``: mean ROUGE-L F1 (LCS of whitespace tokens, ``asks_quality.rouge_l``).

The run-level columns (vote agreement, accuracy and its interval, wall time) are
``benchmarks.bench``'s. ``exact-reseed`` gives the floor of each: two seeds, one prompt.

Work: a blended branch reports in ``meta_info["rksc_asks"][0]`` (``radix_ext.asks.blend``) the
tokens whose KV it took from a donor and did not recompute (``reused_tokens``) and those a donor
covered that it recomputed anyway (``recomputed_tokens``); ``blend_work`` sums them per run.
Blend's reuse is not in SGLang's ``cached_tokens``; the frontend's ``TokenCounters`` subtracts it
(``blended_tokens``), so a row's ``prefill_tokens`` is what was really computed: ``prompt -
cached - reused`` (under ``deviation`` selection the reused tokens still run the first
``--asks-check-layers`` (2) of 30 layers, which this does not count). Adoption's reuse is in
``cached_tokens`` already.
"""

from __future__ import annotations

import collections
import statistics
from typing import Any

from benchmarks.calibration.asks_quality import rouge_l, top_kl


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 5)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    at = q * (len(xs) - 1)
    low = int(at)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (at - low)


def branch_pairs(results, exact_results):
    """(mode branch, exact branch) for every branch both runs have, by problem and branch index."""
    for mine, ref in zip(results, exact_results):
        yield from zip(mine.branches, ref.branches)


def branch_quality(results, exact_results) -> dict[str, Any]:
    """The per-branch measures against exact (module docstring) over every branch of the run."""
    kls, identical, rouge = [], [], []
    for branch, ref in branch_pairs(results, exact_results):
        kl = top_kl(ref.first_top_logprobs, branch.first_top_logprobs)
        if kl is not None:
            kls.append(max(kl, 0.0))  # renormalised on a shared support: >= 0 up to rounding
        identical.append(tuple(branch.token_ids) == tuple(ref.token_ids))
        rouge.append(rouge_l(branch.text, ref.text))
    return {"quality_branches": len(identical),
            "first_token_kl_median": _round(statistics.median(kls)) if kls else None,
            "first_token_kl_mean": _round(statistics.fmean(kls)) if kls else None,
            "first_token_kl_p90": _round(percentile(kls, 0.9)),
            "output_identical_vs_exact": round(sum(identical) / len(identical), 4) if identical else None,
            "rouge_l_vs_exact": round(statistics.fmean(rouge), 4) if rouge else None}


def blend_work(results) -> dict[str, Any]:
    """What the branches' ASKS reports say: tokens reused (served from a donor, not recomputed) and
    recomputed, of those covered the ones past the gate (``--asks-max-deviation``), and how many
    branches had each outcome; None where no branch reported (ASKS off)."""
    reports = [b.asks for r in results for b in r.branches if b.asks]
    if not reports:
        return {"asks_reused_tokens": None, "asks_recomputed_tokens": None, "asks_deviating_tokens": None,
                "asks_outcomes": None}
    return {"asks_reused_tokens": sum(int(x.get("reused_tokens") or 0) for x in reports),
            "asks_recomputed_tokens": sum(int(x.get("recomputed_tokens") or 0) for x in reports),
            "asks_deviating_tokens": sum(int(x.get("deviating_tokens") or 0) for x in reports),
            "asks_outcomes": dict(collections.Counter(str(x.get("outcome", "adopted" if x.get("adopted") else "none"))
                                                      for x in reports))}
