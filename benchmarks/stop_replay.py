"""Stop rules replayed offline on a full run's branches, and the trade-off curve they trace.

A full (``exact``) run samples every problem's N branches with per-branch seeds; a stop rule
would have sampled only the first ``replay(rule, answers)`` of them, so its savings and its vote
are known without running it: ``replay_rule``. ``curve`` replays a grid of thresholds
(``CURVE``: ESC windows 2..6, Beta c from 0.6 to 0.99) and ``choose`` picks, per rule family,
the threshold that saves the most tokens while its vote agrees with the full vote on at least
``target`` of the problems. Pure functions, no engine.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from rksc_sgl.adaptive import StopRule, leader, replay

CURVE = (*(f"esc:{w}" for w in range(2, 7)), *(f"beta:{c}" for c in (0.6, 0.7, 0.8, 0.9, 0.95, 0.99)))


def replay_rule(rule: StopRule, branch_answers: Sequence[Sequence[Hashable | None]],
                branch_tokens: Sequence[Sequence[int]]) -> dict:
    """What ``rule`` saves on a full run (per problem: its branches' answers and completion
    tokens, by branch index), and how often its vote equals the full vote."""
    used = [replay(rule, answers) for answers in branch_answers]
    branches = sum(len(a) for a in branch_answers)
    tokens = sum(sum(t) for t in branch_tokens)
    kept_tokens = sum(sum(t[:k]) for t, k in zip(branch_tokens, used))
    agree = sum(leader(a[:k]) == leader(a) for a, k in zip(branch_answers, used))
    n = len(branch_answers)
    return {"rule": rule.spec, "branches_sampled": sum(used), "branches_full": branches,
            "sample_saving": round(1 - sum(used) / branches, 4) if branches else None,
            "token_saving": round(1 - kept_tokens / tokens, 4) if tokens else None,
            "vote_agreement": round(agree / n, 4) if n else None}


def curve(branch_answers, branch_tokens, specs: Sequence[str] = CURVE) -> list[dict]:
    return [replay_rule(StopRule.parse(spec), branch_answers, branch_tokens) for spec in specs]


def choose(points: Sequence[dict], target: float) -> dict[str, str | None]:
    """Per family (``esc``, ``beta``), the spec with the largest token saving among the points
    whose vote agreement is at least ``target`` (None when no threshold reaches it)."""
    chosen = {}
    for family in ("esc", "beta"):
        ok = [p for p in points if p["rule"].startswith(family) and (p["vote_agreement"] or 0) >= target]
        chosen[family] = max(ok, key=lambda p: p["token_saving"])["rule"] if ok else None
    return chosen
