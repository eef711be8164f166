"""The benchmark's workloads, each one program from ``programs/`` behind one small interface.

A workload turns (problems, backend, mode) into per-problem answers plus the mechanism statistics
it can report; ``benchmarks.bench`` times it and does the bookkeeping.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any, Callable

from benchmarks.bench import agent_workloads as agents
from benchmarks.bench.modes import Mode
from programs.datasets import DATASETS, READING_DATASETS, Problem
from programs.grader import GRADER_MAX_DEVIATION
from programs.sampling import SamplingConfig
from rksc_sgl.adaptive import StopRule


@dataclasses.dataclass(frozen=True)
class BenchSettings(SamplingConfig):
    """What every workload of a run shares (from the command line): every branch's sampling,
    plus the held-out exemplars in front of every question (the shared prompt tail)."""

    max_new_tokens: int = 96
    shots: int = 3
    # Problems (programs) in flight at once; None: all of them. Bounding it keeps a run's working
    # set inside the KV pool, so a mode's reuse is not lost to its own concurrency.
    max_concurrency: int | None = None
    # CGEE modes: thresholds from this calibrate_cgee file (per dataset where it has them);
    # None: RkscConfig's (pooled) defaults.
    cgee_thresholds: str | None = None
    # The ``adaptive`` mode's stop rule (``rksc_sgl.adaptive.StopRule.parse`` syntax).
    stop_rule: str = "esc:3"
    # The ``*+trace`` modes' trace-confidence threshold (window and top-K: ``programs.sc``'s).
    trace_stop: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            StopRule.parse(self.stop_rule)
        except ValueError as e:
            raise ValueError(f"--stop-rule: {e}") from e
        if self.cgee_thresholds is not None:
            from rksc_sgl.cgee import CgeeThresholds

            try:  # checks every entry, so a bad per-dataset one fails here, not hours into a run
                CgeeThresholds.load(self.cgee_thresholds)
            except (OSError, KeyError, TypeError, json.JSONDecodeError) as e:
                raise ValueError(
                    f"--cgee-thresholds {self.cgee_thresholds!r}: not a calibrate_cgee file ({e!r})") from e
        if self.trace_stop is not None and not self.trace_stop > 0:
            raise ValueError(f"--trace-stop must be a threshold > 0, got {self.trace_stop}")
        if self.shots < 0:
            raise ValueError(f"--shots must be >= 0, got {self.shots}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")


@dataclasses.dataclass
class WorkloadRun:
    answers: list[str | None]  # per problem, the program's final answer
    correct: list[bool]
    # Per problem, per branch (candidate, leaf): its extracted answer and a digest of its text, so
    # modes can be compared branch by branch, not only by their majority answers.
    branch_answers: list[list[str | None]] = dataclasses.field(default_factory=list)
    branch_digests: list[list[str]] = dataclasses.field(default_factory=list)
    _: dataclasses.KW_ONLY  # the rest by name: a field inserted here once shifted positional callers
    branch_tokens: list[list[int]] = dataclasses.field(default_factory=list)  # completion tokens per branch
    # Per problem, each listed branch's index, where they are not 0..k-1 (a runtime group stop
    # keeps the branches that finished first, whichever they are); empty: 0..k-1.
    branch_indices: list[list[int]] = dataclasses.field(default_factory=list)
    # Per problem, per branch: where its trace confidence reached new lows (``programs.sc``), so
    # trace stops replay offline on this run; empty where the workload does not record them.
    branch_conf_minima: list[list[list]] = dataclasses.field(default_factory=list)
    # Per problem, per branch: its answer as the scheduler's group policy reads it (the program's
    # extractor's ordered patterns and normalisation, matched by ``read_answer`` under the
    # scheduler's timeout), which the replay of the group stop decides on; equal to
    # ``branch_answers`` unless a match timed out or the texts differ.
    branch_policy_answers: list[list[str | None]] = dataclasses.field(default_factory=list)
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)  # cgee_*, asks_*, ...
    # Seconds spent on reference measurements that the mode itself would not run (the full-depth
    # verifier that CGEE error is measured against); subtracted from the mode's wall time, and the
    # tokens those measurements sent (a frontend TokenCounters), subtracted from the mode's counters.
    reference_s: float = 0.0
    reference_tokens: Any = None
    pool: dict[str, int] | None = None  # the KV pool when the mode's work ended, if a reference step ran after it
    details: Any = None  # the program's own per-problem results, for comparisons across modes


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    run: Callable[[list[Problem], Any, Mode, BenchSettings, tuple[Problem, ...]], WorkloadRun]
    datasets: tuple[str, ...] = DATASETS  # the datasets it runs on; the first is --datasets' default ...
    default_datasets: tuple[str, ...] | None = None  # ... unless this is given (None: all of ``datasets``)
    default_shots: int | None = None  # --shots when not given (None: BenchSettings')
    # Branches keep their text, token ids and first-token top log-probabilities
    # (``ParaBranch``): quality against exact branch by branch (``benchmarks.calibration.blend_quality``),
    # and blend's recompute sweep (``--asks-recompute-sweep``) applies.
    branch_quality: bool = False
    # The workload's own columns of a row (``agent_workloads.agent_columns``), from the mode's run of
    # every repeat and exact's (None for exact itself, or without it).
    columns: Callable[[list[WorkloadRun], list[WorkloadRun] | None], dict[str, Any]] | None = None
    default_max_new_tokens: int | None = None  # --max-new-tokens when not given (None: BenchSettings')
    min_problems: int = 1  # --limit at least this (a steady state: a warm-up half and a measured half)
    branches_vote: bool = True  # its branches are votes (the stop rules' curve replays them); agents' are not
    # The blend gate its requests ask for (AsksOptions.max_deviation) where the mode leaves the
    # server's at its default; None: the server's (bon-grader: programs.grader.GRADER_MAX_DEVIATION).
    request_gate: float | None = None


def digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def stop_rule(mode: Mode, settings: BenchSettings) -> StopRule | None:
    """The stop rule the mode samples under: the run's for ``adaptive``, else none."""
    return StopRule.parse(settings.stop_rule) if mode.adaptive else None


def _run_sc(problems, backend, mode, settings, exemplars, diverse: bool = False) -> WorkloadRun:
    from programs.sc import CONF_TOP_K, solve_batch

    # Every mode asks for the top-K log-probabilities (the same work in each), so that exact's
    # branches carry their trace confidence for the offline replay of trace stops.
    results = solve_batch(problems, settings, backend, progress_bar=False, exemplars=exemplars, diverse=diverse,
                          num_threads=settings.max_concurrency, rule=stop_rule(mode, settings),
                          in_runtime=mode.group_stop, conf_top_k=CONF_TOP_K,
                          trace_stop=settings.trace_stop if mode.trace_stop else None)
    return WorkloadRun([r.answer for r in results], [r.correct for r in results],
                       [[b.answer for b in r.branches] for r in results],
                       [[digest(b.text) for b in r.branches] for r in results],
                       branch_tokens=[[len(b.token_logprobs) for b in r.branches] for r in results],
                       branch_indices=[[b.index for b in r.branches] for r in results] if mode.group_stop else [],
                       branch_conf_minima=[[[list(m) for m in b.conf_minima] for b in r.branches] for r in results],
                       branch_policy_answers=[[policy_answer(r.problem, b.text) for b in r.branches] for r in results])


def policy_answer(problem, text: str) -> str | None:
    """A branch's answer as the scheduler's group policy reads it: the patterns and normalisation
    ``programs.sc`` sends (``extract_reading``), matched by ``read_answer`` with its timeout."""
    from programs.datasets import extract_reading
    from rksc_sgl.stop_rules import read_answer

    patterns, normalize = extract_reading(problem)
    return read_answer(patterns, text, normalize)


def _run_diverse_sc(problems, backend, mode, settings, exemplars) -> WorkloadRun:
    return _run_sc(problems, backend, mode, settings, exemplars, diverse=True)


def _run_tot(problems, backend, mode, settings, exemplars) -> WorkloadRun:
    from programs.tot import TotConfig, solve_batch

    results = solve_batch(problems, TotConfig(seed=settings.seed), backend, num_threads=settings.max_concurrency)
    return WorkloadRun([r.answer for r in results], [r.correct for r in results],
                       [list(r.leaf_answers) for r in results], [[digest(t) for t in r.leaf_texts] for r in results])


def _run_bon(problems, backend, mode, settings, exemplars) -> WorkloadRun:
    """Best-of-N; CGEE modes verify with skip + early exit, the others at full depth.

    CGEE modes also run the full-depth verifier on the same candidates, untimed (``reference_s``),
    because CGEE error is defined against its decisions.
    """
    from benchmarks.bench.bon_verify import solve_batch, summarize
    from rksc_sgl.cgee import CgeeThresholds

    thresholds = (CgeeThresholds.load(settings.cgee_thresholds, problems[0].dataset) if settings.cgee_thresholds
                  else CgeeThresholds.of_server(backend))
    verify_modes = {"full": None, "cgee": thresholds} if mode.cgee else {"full": None}
    results, verify_s, verify_tokens = solve_batch(problems, settings, backend, modes=verify_modes,
                                                   exemplars=exemplars, chunk=settings.max_concurrency or 16,
                                                   rule=stop_rule(mode, settings))
    used = list(verify_modes)[-1]
    # The verification phase's own tokens (the mode's verifier: CGEE's, or full depth's).
    stats = {"verify_prefill_tokens": verify_tokens[used].prefill_tokens,
             "verify_requests": verify_tokens[used].requests,
             "vote_skip_rate": round(sum(r.verdicts[used].skip_reason == "vote" for r in results) / len(results), 4)
             if mode.adaptive and results else None}
    if mode.cgee:
        row = next(r for r in summarize(results, verify_s, "") if r["mode"] == "cgee")
        stats |= {k: row[k] for k in ("cgee_skip_rate", "cgee_mean_exit_layer", "cgee_error", "cgee_errors",
                                     "cgee_error_ub95")}
        # Verification phase alone, CGEE against full depth on the same candidates, same engine.
        stats["cgee_verify_time_ratio"] = row["verify_time_ratio_vs_full"]
        stats["cgee_thresholds"] = dataclasses.asdict(thresholds)
    return WorkloadRun([r.verdicts[used].answer for r in results], [r.correct(used) for r in results],
                       [[c.answer for c in r.candidates] for r in results],
                       [[digest(c.context) for c in r.candidates] for r in results], stats=stats,
                       branch_tokens=[[len(c.token_logprobs) for c in r.candidates] for r in results],
                       reference_s=verify_s["full"] if mode.cgee else 0.0,
                       reference_tokens=verify_tokens["full"] if mode.cgee else None)


EXEMPLAR_POOL = 200  # paraphrase-sc draws each problem's exemplars from the dataset's last 200


def _run_paraphrase_sc(problems, backend, mode, settings, exemplars) -> WorkloadRun:
    """Paraphrase SC (``programs.paraphrase_sc``); exemplars drawn per problem from a pool at the
    end of the dataset, apart from the evaluated problems. ``asks-adopt`` modes also run the
    adoption gate's control probe (untimed, ``reference_s``) for its false-accept rate in the
    runtime."""
    import time

    from benchmarks.calibration.asks_quality import control_probe
    from programs.datasets import load
    from programs.paraphrase_sc import solve_batch

    everything = load(problems[0].dataset) if problems else []
    pool = tuple(everything[-EXEMPLAR_POOL:])
    if {p.id for p in pool} & {p.id for p in problems}:
        raise ValueError("paraphrase-sc: the exemplar pool overlaps the evaluated problems; lower --limit")
    asks_on = "asks" in mode.mechanisms
    before = _asks_seconds(backend) if asks_on else 0.0
    results = solve_batch(problems, pool, settings.shots, settings, backend, max_concurrency=settings.max_concurrency,
                          progress_bar=True, recompute=mode.recompute)
    stats = _asks_stats(results, backend, before) if asks_on else {}
    reference_s, reference_tokens, pool = 0.0, None, None
    if mode.effective_asks_mode == "adopt":
        # The probe's spans are the workload's own paraphrases, already cached under the run's group
        # (a cached span is never signed again, docs/asks.md): it runs on an empty tree, after the
        # run's pool is read, and neither its time nor its tokens count as the mode's.
        pool, t0, tokens = backend.kv_pool(), time.perf_counter(), backend.counters_snapshot()
        backend.flush_cache()
        stats.update(control_probe(backend))
        reference_s, reference_tokens = time.perf_counter() - t0, backend.counters_snapshot() - tokens
    return _branch_run(results, stats, reference_s=reference_s, reference_tokens=reference_tokens, pool=pool)


def _asks_stats(results, backend, seconds_before: float) -> dict[str, Any]:
    """ASKS's work in a run: adoptions, reused and recomputed tokens (``blend_quality.blend_work``),
    and its scheduler time (decisions, signature capture) during the run."""
    from benchmarks.calibration.blend_quality import blend_work

    reports = [b.asks for r in results for b in r.branches if b.asks]
    return {"asks_substitutions": sum(bool(x.get("adopted")) for x in reports) if reports else None,
            **blend_work(results), "asks_overhead_s": round(_asks_seconds(backend) - seconds_before, 3)}


def _branch_run(results, stats, **extra) -> WorkloadRun:
    """A WorkloadRun of results whose branches are ``ParaBranch``es (the ASKS workloads)."""
    return WorkloadRun([r.answer for r in results], [r.correct for r in results],
                       [[b.answer for b in r.branches] for r in results],
                       [[digest(b.text) for b in r.branches] for r in results],
                       branch_tokens=[[len(b.token_logprobs or ()) for b in r.branches] for r in results],
                       stats=stats, details=results, **extra)


def _run_role_sc(problems, backend, mode, settings, exemplars) -> WorkloadRun:
    """Role SC over a shared passage (``programs.role_sc``): 8 roles, one CoQA story, a question."""
    from programs.role_sc import solve_batch

    asks_on = "asks" in mode.mechanisms
    before = _asks_seconds(backend) if asks_on else 0.0
    results = solve_batch(problems, settings, backend, max_concurrency=settings.max_concurrency, progress_bar=True,
                          recompute=mode.recompute)
    return _branch_run(results, _asks_stats(results, backend, before) if asks_on else {})


def _run_multi_doc(problems, backend, mode, settings, exemplars) -> WorkloadRun:
    """Multi-document questions (``programs.multi_doc``): 4 shared documents per problem, each
    branch its own order; the other documents drawn from the whole dataset."""
    from programs.datasets import load
    from programs.multi_doc import solve_batch

    asks_on = "asks" in mode.mechanisms
    before = _asks_seconds(backend) if asks_on else 0.0
    pool = tuple(load(problems[0].dataset)) if problems else ()
    results = solve_batch(problems, pool, settings, backend, max_concurrency=settings.max_concurrency,
                          progress_bar=True, recompute=mode.recompute)
    return _branch_run(results, _asks_stats(results, backend, before) if asks_on else {})


def _run_phase(run_phase, build, problems, backend, mode, settings, exemplars) -> WorkloadRun:
    """A run of ``agent_workloads`` (its ``Phase``) as a WorkloadRun built by ``build``; ASKS's
    stats over the measured problems alone (a steady state's warm-up half is its reference pass)."""
    asks_on = "asks" in mode.mechanisms
    before = [0.0]

    def on_measure() -> None:
        if asks_on:
            before[0] = _asks_seconds(backend)

    phase = run_phase(problems, backend, mode, settings, exemplars, on_measure=on_measure)
    stats = {**(_asks_stats(phase.results, backend, before[0]) if asks_on else {}), **phase.stats}
    return build(phase.results, stats, reference_s=phase.reference_s, reference_tokens=phase.reference_tokens)


def _grader_run(results, stats, **extra) -> WorkloadRun:
    """bon-grader's WorkloadRun: its branches are the candidates (answers, texts, tokens), its
    details the grader's results (``programs.grader.GraderResult``: verdicts, picks)."""
    return WorkloadRun([r.answer for r in results], [r.correct for r in results],
                       [list(r.candidate_answers) for r in results],
                       [[digest(t) for t in r.solutions] for r in results],
                       branch_tokens=[list(r.candidate_tokens) for r in results], stats=stats, details=results,
                       **extra)


def _agent_workload(name: str, run_phase, build, columns, *, steady: bool, shots: int | None,
                    votes: bool, datasets: tuple[str, ...] = DATASETS, request_gate: float | None = None) -> Workload:
    """An ``agent_workloads`` workload on ``datasets`` (GSM8K by default), or its steady state."""
    return Workload(name, functools.partial(_run_phase, functools.partial(run_phase, steady=steady), build),
                    datasets, ("gsm8k",), default_shots=shots, branch_quality=True, columns=columns,
                    default_max_new_tokens=agents.DEFAULT_MAX_NEW_TOKENS, min_problems=2 if steady else 1,
                    branches_vote=votes, request_gate=request_gate)


def _asks_seconds(backend) -> float:
    """The scheduler's seconds in ASKS so far (decisions, signature capture; 0 where not reported)."""
    stats = (backend.get_server_info()["internal_states"][0].get("rksc_cache") or {}).get("asks") or {}
    return stats.get("decision_seconds", 0.0) + stats.get("capture_seconds", 0.0)


WORKLOADS: dict[str, Workload] = {
    "sc": Workload("sc", _run_sc),
    "diverse-sc": Workload("diverse-sc", _run_diverse_sc),
    "tot": Workload("tot", _run_tot),
    "bon-verify": Workload("bon-verify", _run_bon),
    "paraphrase-sc": Workload("paraphrase-sc", _run_paraphrase_sc, branch_quality=True),
    "role-sc": Workload("role-sc", _run_role_sc, READING_DATASETS, ("coqa",), default_shots=0, branch_quality=True),
    "multi-doc": Workload("multi-doc", _run_multi_doc, READING_DATASETS, ("coqa-short",), default_shots=0,
                          branch_quality=True),
    # The reading sets too: a CoQA problem gets the reading team (``programs.agents.team_of``).
    **{name: _agent_workload(name, agents.run_agents, _branch_run, agents.agent_columns, steady=steady, shots=0,
                             votes=False, datasets=DATASETS + READING_DATASETS)
       for name, steady in (("agents", False), ("agents-steady", True))},
    **{name: _agent_workload(name, agents.run_bon_grader, _grader_run, agents.grader_columns, steady=steady,
                             shots=None, votes=True, request_gate=GRADER_MAX_DEVIATION)
       for name, steady in (("bon-grader", False), ("bon-grader-steady", True))},
}


def resolve_workload(name: str) -> Workload:
    if name in WORKLOADS:
        return WORKLOADS[name]
    raise ValueError(f"--workload: unknown workload {name!r}; valid: {', '.join(WORKLOADS)}")
