"""Stop rules replayed offline on a full run's branches, and the trade-off curve they trace.

A full (``exact``) run samples every problem's N branches with per-branch seeds; a stop rule
would have sampled only the first ``replay(rule, answers)`` of them, so its savings and its vote
are known without running it: ``replay_rule``. The runtime's group stop launches every branch at
once and keeps those that finish first: ``replay_group_stop`` replays it with each branch's
completion tokens as its finishing step (``rksc_sgl.adaptive.replay_concurrent``), deciding on
the answers as the scheduler reads them (the policy's patterns: the program's extractor's,
``benchmarks.bench.workloads.policy_answer``).

Trace-confidence stopping (DeepConf online) replays too, on top of either: each ``exact`` branch
records where its window confidence reached new lows (``programs.sc.Branch.conf_minima``), so a
threshold ``T`` stops it at a known token and it casts no vote (``replay_trace_stop``); ``T`` is
taken as a percentile of the traces' lowest window confidence (``TRACE_PERCENTILES``), as
DeepConf sets it from warm-up traces. ``curve`` replays a grid of thresholds
(``CURVE``: ESC windows 2..6, Beta c from 0.6 to 0.99) and ``choose`` picks, per rule family,
the threshold that saves the most tokens while its vote agrees with the full vote on at least
``target`` of the problems. Pure functions, no engine.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import statistics

from rksc_sgl.adaptive import StopRule, leader, replay, replay_concurrent
from rksc_sgl.stop_rules import first_stop

TRACE_PERCENTILES = (5, 10, 25, 50)  # of the traces' lowest window confidence: where T is put
CURVE = (*(f"esc:{w}" for w in range(2, 7)), *(f"beta:{c}" for c in (0.6, 0.7, 0.8, 0.9, 0.95, 0.99)))


def _outcome(branch_answers, branch_tokens, outcomes) -> dict:
    """What a replay saved and how often its vote equals the full vote. ``outcomes``: per
    problem, the completion tokens the rule spent and the indices of the branches that voted."""
    tokens = sum(sum(t) for t in branch_tokens)
    used = sum(u for u, _ in outcomes)
    agree = sum(leader([a[i] for i in voters]) == leader(a) for a, (_, voters) in zip(branch_answers, outcomes))
    n = len(branch_answers)
    return {"token_saving": round(1 - used / tokens, 4) if tokens else None,
            "vote_agreement": round(agree / n, 4) if n else None}


def _sampled(rule: StopRule, branch_answers, branch_tokens, outcomes) -> dict:
    branches = sum(len(a) for a in branch_answers)
    finished = sum(len(voters) for _, voters in outcomes)
    return {"rule": rule.spec, "branches_sampled": finished, "branches_full": branches,
            "sample_saving": round(1 - finished / branches, 4) if branches else None,
            **_outcome(branch_answers, branch_tokens, outcomes)}


def replay_rule(rule: StopRule, branch_answers: Sequence[Sequence[Hashable | None]],
                branch_tokens: Sequence[Sequence[int]]) -> dict:
    """What ``rule`` saves on a full run (per problem: its branches' answers and completion
    tokens, by branch index), and how often its vote equals the full vote."""
    used = [replay(rule, answers) for answers in branch_answers]
    outcomes = [(sum(t[:k]), range(k)) for t, k in zip(branch_tokens, used)]
    return _sampled(rule, branch_answers, branch_tokens, outcomes)


def replay_group_stop(rule: StopRule, branch_answers: Sequence[Sequence[Hashable | None]],
                      branch_tokens: Sequence[Sequence[int]],
                      branch_read: Sequence[Sequence[Hashable | None]] | None = None) -> dict:
    """``replay_rule`` for the runtime's group stop: every branch launched at once, the vote read
    after each step over the branches that finished, the others stopped one token after it is
    decided. The rule decides on ``branch_read`` (the answers as the scheduler reads them, with
    the policy's patterns) where given; the vote compared with the full vote is ``branch_answers``'."""
    read = branch_answers if branch_read is None else branch_read
    outcomes = [replay_concurrent(rule, r, t) for r, t in zip(read, branch_tokens)]
    return _sampled(rule, branch_answers, branch_tokens, outcomes)


def curve(branch_answers, branch_tokens, specs: Sequence[str] = CURVE, branch_read=None) -> list[dict]:
    """Every rule of ``specs`` replayed in rounds (``applied_by`` "rounds") and, with
    ``branch_read`` (the answers as the scheduler reads them), by the scheduler's group stop."""
    points = [{**replay_rule(StopRule.parse(spec), branch_answers, branch_tokens), "applied_by": "rounds"}
              for spec in specs]
    if branch_read is not None:
        points += [{**replay_group_stop(StopRule.parse(spec), branch_answers, branch_tokens, branch_read),
                    "applied_by": "scheduler"} for spec in specs]
    return points


def choose(points: Sequence[dict], target: float) -> dict[str, str | None]:
    """Per family (``esc``, ``beta``) and per way of applying it (rounds: ``esc``; the scheduler:
    ``esc (scheduler)``), the spec with the largest token saving among the points whose vote
    agreement is at least ``target`` (None when no threshold reaches it)."""
    chosen = {}
    for applied_by in sorted({p.get("applied_by", "rounds") for p in points}):
        for family in ("esc", "beta"):
            ok = [p for p in points if p.get("applied_by", "rounds") == applied_by and p["rule"].startswith(family)
                  and (p["vote_agreement"] or 0) >= target]
            key = family if applied_by == "rounds" else f"{family} (scheduler)"
            chosen[key] = max(ok, key=lambda p: p["token_saving"])["rule"] if ok else None
    return chosen


def lowest_confidences(branch_minima: Sequence[Sequence[Sequence[Sequence[float]]]]) -> list[float]:
    """Every trace's lowest window confidence (the last of its minima; traces shorter than the
    window have none and are left out)."""
    return [minima[-1][1] for problem in branch_minima for minima in problem if minima]


def percentile_threshold(lowest: Sequence[float], pct: float) -> float | None:
    """The threshold below which ``pct``% of the traces' lowest window confidences fall."""
    if len(lowest) < 2:
        return None
    return statistics.quantiles(lowest, n=100, method="inclusive")[max(1, min(99, round(pct))) - 1]


def replay_trace_stop(rule: StopRule, branch_answers, branch_tokens, branch_minima, threshold: float,
                      concurrent: bool, branch_read=None) -> dict:
    """``rule`` with a trace stop at ``threshold`` on every branch, in rounds (``concurrent``
    False, as ``adaptive_fork``) or all at once with the scheduler's group stop. A stopped trace
    ends one token after its window fell below ``threshold`` and casts no vote. The scheduler's
    rule decides on ``branch_read`` where given (as ``replay_group_stop``)."""
    outcomes, stopped = [], 0
    read_all = branch_answers if branch_read is None or not concurrent else branch_read
    for answers, tokens, minima, read in zip(branch_answers, branch_tokens, branch_minima, read_all):
        stops = [first_stop(m, threshold) for m in minima]
        votes = [s is None or s >= t for s, t in zip(stops, tokens)]
        cost = [t if v else s + 1 for s, t, v in zip(stops, tokens, votes)]
        if concurrent:
            outcomes.append(replay_concurrent(rule, read, cost, votes))
        else:
            launched: list[int] = []
            for branches in rule.rounds(len(answers)):
                launched += branches
                voters = [b for b in launched if votes[b]]
                if rule.decision({b: answers[b] for b in voters}) is not None:
                    break
            outcomes.append((sum(cost[b] for b in launched), [b for b in launched if votes[b]]))
        stopped += votes.count(False)
    return {"rule": rule.spec, "threshold": round(threshold, 4), "applied_by": "scheduler" if concurrent else "rounds",
            "branches_voting": sum(len(voters) for _, voters in outcomes),
            "branches_full": sum(len(a) for a in branch_answers), "traces_stopped": stopped,
            **_outcome(branch_answers, branch_tokens, outcomes)}


def trace_curve(branch_answers, branch_tokens, branch_minima, rule_spec: str,
                percentiles: Sequence[float] = TRACE_PERCENTILES, branch_read=None) -> list[dict]:
    """A trace stop at each percentile's threshold, alone and under ``rule_spec`` applied in rounds
    and by the scheduler, replayed on a full run."""
    lowest = lowest_confidences(branch_minima)
    points = []
    for pct in percentiles:
        threshold = percentile_threshold(lowest, pct)
        if threshold is None:
            continue
        for spec, concurrent in (("none", False), (rule_spec, False), (rule_spec, True)):
            if spec == "none" and concurrent:
                continue
            point = replay_trace_stop(StopRule.parse(spec), branch_answers, branch_tokens, branch_minima,
                                      threshold, concurrent, branch_read)
            points.append({"percentile": pct, **point})
    return points
