"""Best-of-N with a verifier: N sampled candidates (one fork each), ``verify`` picks the winner.

The program in two steps: ``sample_candidates`` (each problem's candidates are ``programs.sc``'s
branches, seeded per problem and branch; with a stop rule, sampled until the rule decides the
vote), then ``verify_all`` (a decided vote skips verification; CGEE: skip when the winner is
confidently ahead, else the verifier with early exit; or every candidate at full depth). The
benchmark's measurement of it (every verification mode on the same candidates, timed, with CGEE
error against full depth) is ``benchmarks.bon_verify``.
"""

from __future__ import annotations

import concurrent.futures
import time

from programs.datasets import Problem, extract_answer
from programs.sampling import SamplingConfig
from programs.sc import run_branches
from rksc_sgl.adaptive import StopRule
from rksc_sgl.cgee import Candidate, CgeeThresholds, VerifyResult, verify


def candidate_tokens(dataset: str) -> int:
    """Tokens per candidate: multiple-choice needs a short rationale, GSM8K a worked solution."""
    return 128 if dataset == "gsm8k" else 64


def sample_candidates(problems: list[Problem], config: SamplingConfig, backend, *, first_index: int = 0,
                      exemplars: tuple[Problem, ...] = (), rule: StopRule | None = None) -> list[tuple[Candidate, ...]]:
    """Each problem's candidates: ``programs.sc``'s branches, with their contexts for the verifier
    (with a stop ``rule``: those sampled until it decided the vote)."""
    return [
        tuple(Candidate(context, extract_answer(p, text), lps) for context, text, lps, *_ in branches)
        for p, branches in zip(problems, run_branches(problems, config, backend, first_index=first_index,
                                                        exemplars=exemplars, rule=rule))
    ]


def vote_decided(rule: StopRule | None, candidates: tuple[Candidate, ...]) -> bool:
    """Whether ``rule`` decided the vote over these candidates (the rule is a pure function of
    their answers, so this is the decision the sampling stopped on)."""
    return rule is not None and rule.decided([c.answer for c in candidates])


def verify_all(backend, candidate_sets, thresholds: CgeeThresholds | None, lens: bool = False,
               threads: int = 8, rule: StopRule | None = None) -> tuple[list[VerifyResult], float]:
    """Verify every problem's candidates with CGEE ``thresholds`` (None: full depth), ``threads``
    problems at a time, skipping those whose vote ``rule`` decided; return the verdicts and the
    phase's wall time."""
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
        mode = "full" if thresholds is None else "cgee"
        verdicts = list(pool.map(
            lambda cands: verify(backend, cands, mode=mode, thresholds=thresholds, lens=lens,
                                 vote_decided=vote_decided(rule, cands)), candidate_sets))
    return verdicts, time.perf_counter() - start
