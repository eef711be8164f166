"""The bench's agent workloads: ``agents``, ``bon-grader`` and their steady state (issue 55).

* ``agents`` (``programs.agents``): a chain of four agents per problem (planner, solver, critic,
  answerer; on CoQA the reading team: finder, drafter, checker, answerer, each reading the
  passage first), each its own persona, each reading the question and the earlier agents'
  outputs verbatim (the relay); the answerer's answer is scored. All agents of a problem are one
  ASKS group; chains run ``--max-concurrency`` at a time. ``--max-new-tokens`` per agent (default 64).
* ``bon-grader`` (``programs.grader``): best-of-N whose candidates are ``programs.sc``'s branches
  (in the problem's group) and whose verifier is a strict grader with its own persona, one
  request per candidate in the same group; the picked candidate's answer is scored. Rounds of
  ``--max-concurrency`` problems (default 16), the grading phase timed apart (``verify_s``).
* ``agents-steady``, ``bon-grader-steady``: the same programs on a warm server. The first half
  of the run's problems runs first, untimed: its seconds and tokens are the row's reference pass
  (as CGEE's full-depth pass is), taken off the mode's wall time and counters, so the cache holds
  every agent's (the grader's) opening followed by other problems' text, as on a long-lived
  server. The second half is measured: ``--limit 2N`` reports N problems. A problem keeps its
  index (its seeds) in either half, so the measured problems sample as they do in ``agents``. A
  variant name rather than a flag: its rows go to their own results file, under their own name.

Every request of these workloads is streamed and timed to its first token (``programs.timed``),
so their rows carry TTFT beside wall time (``latency_columns``): median and 90th percentile
over every request of every repeat (agents: each agent's request; bon-grader: each grader
request, whose first token is its verdict), with ``exact``'s median over the row's. The quality
columns against ``exact`` (first-token KL, identical outputs, ROUGE-L: ``blend_quality``, over
every agent's output or every grader verdict) come from the bench's ASKS machinery
(``Workload.branch_quality``); ``agent_columns`` adds them per agent (the relay's later agents
read earlier agents' text, so a difference early moves everything after it), and
``grader_columns`` the grader's picks and how often they are exact's and P(Yes) against
exact's (a bon-grader row's branches are its candidates, so its branch agreement says whether
the candidates were exact's: else the picks compare other texts).

This module does not import ``benchmarks.bench.workloads`` (which registers these), so the
import graph has no circle: its runs return a ``Phase``, which the registry makes a
``WorkloadRun``.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable

DEFAULT_MAX_NEW_TOKENS = 64  # per agent, and per bon-grader candidate
DEFAULT_ROUND = 16  # bon-grader's problems per round without --max-concurrency (as bon-verify's)


@dataclasses.dataclass
class Phase:
    """What a run of these workloads returns: the measured problems' results (``.branches``,
    ``.answer``, ``.correct``), stats for the row, and the steady state's warm-up half apart."""

    results: list
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    reference_s: float = 0.0
    reference_tokens: Any = None


def split_steady(problems: list, steady: bool) -> tuple[list, list]:
    """(warm-up half, measured half) of the problems: all measured unless ``steady``."""
    if not steady:
        return [], list(problems)
    if len(problems) < 2:
        raise ValueError(f"a steady-state workload needs at least 2 problems (--limit), got {len(problems)}")
    half = len(problems) // 2
    return list(problems[:half]), list(problems[half:])


def _warm_then_measure(backend, problems: list, steady: bool, on_measure: Callable[[], None],
                       run: Callable[[list, int], Any]) -> tuple[Any, float, Any]:
    """``run(problems, first_index)`` on the warm-up half (untimed), then on the measured half;
    the measured result, and the warm-up's seconds and tokens."""
    warm, measured = split_steady(problems, steady)
    reference_s, reference_tokens = 0.0, None
    if warm:
        t0, before = time.perf_counter(), backend.counters_snapshot()
        run(warm, 0)
        reference_s, reference_tokens = time.perf_counter() - t0, backend.counters_snapshot() - before
    on_measure()
    return run(measured, len(warm)), reference_s, reference_tokens


def run_agents(problems, backend, mode, settings, exemplars, *, steady: bool = False,
               on_measure: Callable[[], None] = lambda: None) -> Phase:
    from programs.agents import new_run_key, solve_batch

    key = new_run_key()
    results, reference_s, reference_tokens = _warm_then_measure(
        backend, problems, steady, on_measure,
        lambda part, first: solve_batch(part, settings, backend, first_index=first,
                                        max_concurrency=settings.max_concurrency, progress_bar=True,
                                        recompute=mode.recompute, run_key=key))
    return Phase(results, {}, reference_s, reference_tokens)


def run_bon_grader(problems, backend, mode, settings, exemplars, *, steady: bool = False,
                   on_measure: Callable[[], None] = lambda: None) -> Phase:
    from programs.agents import new_run_key
    from programs.grader import GRADER_MAX_DEVIATION, solve_batch

    key = new_run_key()
    gate = mode.gate_asked(GRADER_MAX_DEVIATION)  # the program's own, unless the mode sets the server's
    graded, reference_s, reference_tokens = _warm_then_measure(
        backend, problems, steady, on_measure,
        lambda part, first: solve_batch(part, settings, backend, first_index=first, exemplars=exemplars,
                                        chunk=settings.max_concurrency or DEFAULT_ROUND, recompute=mode.recompute,
                                        max_deviation=gate, run_key=key))
    stats = {"verify_s": round(graded.grade_s, 3), "sample_s": round(graded.sample_s, 3),
             "verify_prefill_tokens": graded.grade_tokens.prefill_tokens,
             "verify_requests": graded.grade_tokens.requests}
    return Phase(graded.results, stats, reference_s, reference_tokens)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _ratio(num: float | None, den: float | None) -> float | None:
    return round(num / den, 3) if num and den else None


def latency_columns(runs: list, exact_runs: list | None) -> dict[str, Any]:
    """TTFT and latency over every request of every repeat (``details``: results with ``ttft_s``
    and ``latency_s`` per request), and exact's median TTFT over the row's."""
    from benchmarks.calibration.blend_quality import percentile

    def pooled(field: str, of: list) -> list[float]:
        return [t for run in of for r in run.details for t in getattr(r, field)]

    ttft, latency = pooled("ttft_s", runs), pooled("latency_s", runs)
    out = {"ttft_requests": len(ttft),
           "ttft_median_s": _round(statistics.median(ttft)) if ttft else None,
           "ttft_p90_s": _round(percentile(ttft, 0.9)),
           "latency_median_s": _round(statistics.median(latency)) if latency else None,
           "latency_p90_s": _round(percentile(latency, 0.9))}
    if exact_runs:
        exact_ttft = pooled("ttft_s", exact_runs)
        out["ttft_median_vs_exact"] = _ratio(statistics.median(exact_ttft) if exact_ttft else None,
                                             out["ttft_median_s"])
    return out


def agent_columns(runs: list, exact_runs: list | None) -> dict[str, Any]:
    """``latency_columns``, each agent's median TTFT, and against exact (last repeats) each agent's
    share of identical outputs and its mean ROUGE-L; keyed by the names of the problems' team
    (``programs.agents.team_of``: a row is one dataset, so one team)."""
    from benchmarks.calibration.asks_quality import rouge_l
    from programs.agents import team_of

    out = latency_columns(runs, exact_runs)
    chains = [r for run in runs for r in run.details]
    if not chains:
        return out
    names = [a.name for a in team_of(chains[0].problem)]
    out["ttft_median_s_by_agent"] = {name: _round(statistics.median([r.ttft_s[a] for r in chains]))
                                     for a, name in enumerate(names)}
    if exact_runs:
        pairs = list(zip(runs[-1].details, exact_runs[-1].details))
        if pairs:
            out["agent_output_identical_vs_exact"] = {
                name: round(statistics.fmean(m.branches[a].token_ids == e.branches[a].token_ids for m, e in pairs), 4)
                for a, name in enumerate(names)}
            out["agent_rouge_l_vs_exact"] = {
                name: round(statistics.fmean(rouge_l(m.branches[a].text, e.branches[a].text) for m, e in pairs), 4)
                for a, name in enumerate(names)}
    return out


def grader_columns(runs: list, exact_runs: list | None) -> dict[str, Any]:
    """``latency_columns`` of the grader requests, the sampling and verification phases' times
    (medians over repeats), the grader's picks and P(Yes) (last repeat), and against exact (last
    repeats): the share of problems where it picks exact's candidate and mean |P(Yes) - exact's|
    per candidate."""
    out = latency_columns(runs, exact_runs)
    verify = [run.stats["verify_s"] for run in runs if run.stats.get("verify_s") is not None]
    out["verify_s"] = round(statistics.median(verify), 3) if verify else None
    out["verify_s_samples"] = verify
    sample = [run.stats["sample_s"] for run in runs if run.stats.get("sample_s") is not None]
    out["sample_s"] = round(statistics.median(sample), 3) if sample else None
    out["grader_picks"] = [r.pick for r in runs[-1].details]
    out["grader_p_yes"] = [[round(p, 4) for p in r.p_yes] for r in runs[-1].details]
    if exact_runs:
        exact_verify = [run.stats["verify_s"] for run in exact_runs if run.stats.get("verify_s") is not None]
        out["verify_time_vs_exact"] = _ratio(statistics.median(exact_verify) if exact_verify else None, out["verify_s"])
        pairs = list(zip(runs[-1].details, exact_runs[-1].details))
        if pairs:
            out["grader_same_pick_vs_exact"] = round(statistics.fmean(m.pick == e.pick for m, e in pairs), 4)
            diffs = [abs(p - q) for m, e in pairs for p, q in zip(m.p_yes, e.p_yes)]
            out["grader_p_yes_abs_diff_vs_exact"] = round(statistics.fmean(diffs), 4) if diffs else None
    return out


def print_latency(rows: list[dict]) -> None:
    """The agent workloads' table: TTFT beside wall time, quality against exact, the grader's picks."""
    mine = [r for r in rows if "ttft_median_s" in r]
    if not mine:
        return
    head = (f"{'dataset':9} {'mode':15} {'wall s':>7} {'x exact':>7} {'TTFT med':>8} {'TTFT p90':>8} {'x exact':>7} "
            f"{'ident':>6} {'ROUGE-L':>7} {'KL med':>7} {'acc':>5} {'verify s':>8} {'same pick':>9}")
    print("\n" + head + "\n" + "-" * len(head))
    fmt = lambda v, f: "-" if v is None else format(v, f)
    for r in mine:
        print(f"{r['dataset']:9} {r['mode']:15} {r['wall_s']:>7.1f} {fmt(r['speedup_vs_exact'], '>7.2f')} "
              f"{fmt(r['ttft_median_s'], '>8.3f')} {fmt(r['ttft_p90_s'], '>8.3f')} "
              f"{fmt(r.get('ttft_median_vs_exact'), '>7.2f')} {fmt(r.get('output_identical_vs_exact'), '>6.2f')} "
              f"{fmt(r.get('rouge_l_vs_exact'), '>7.3f')} {fmt(r.get('first_token_kl_median'), '>7.4f')} "
              f"{fmt(r['accuracy'], '>5.2f')} {fmt(r.get('verify_s'), '>8.1f')} "
              f"{fmt(r.get('grader_same_pick_vs_exact'), '>9.2f')}")
