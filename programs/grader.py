"""Best-of-N judged by a grader with its own persona: N sampled candidates, a strict grader reads each.

The candidates are ``programs.sc``'s branches (``run_branches``, seeded per problem and branch),
every branch of a problem in the problem's ASKS group (``problem_group``). Then one grader
request per candidate: the system message ``GRADER_SYSTEM``, a user turn with the question and
the candidate's solution verbatim (``grader_message``) and ``GRADER_QUESTION``; one greedy
token, whose Yes/No probability is read as ``rksc_sgl.cgee.verify`` reads its verifier's
(``yes_probability`` over the single-token spellings, ``verdict_token_ids``). The grader picks
the candidate with the highest P(Yes), ties to the first (``pick``). Each grader request is in
the problem's group, so its reading of the question and of the candidate (text the group's
sampling requests computed: the question after the solver's opening, the solution as it was
generated) may reuse their KV under ASKS blend, the grader keeping its words.

Unlike ``verify``, whose prompt continues the candidate's own conversation (a prefix hit for
exact caching), the grader opens with its own persona, so exact caching shares only that
opening. Per round of ``chunk`` problems, the candidates are sampled, then graded, every grader
request of the round at once; the grading phase is timed apart (``GraderRun.grade_s``), and each
grader request is streamed and timed to its first token (``programs.timed``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time

from programs.agents import new_run_key
from programs.datasets import Problem, extract_answer, format_question
from programs.paraphrase_sc import TOP_LOGPROBS, ParaBranch, prompt_text, read_branch
from programs.sampling import SamplingConfig
from programs.sc import run_branches
from programs.timed import generate_timed, request_body
from rksc_sgl.cgee import verdict_token_ids, yes_probability
from rksc_sgl.counters import TokenCounters
from rksc_sgl.protocol import AsksOptions

GRADER_SYSTEM = ("You are a strict grader. You read a question and a proposed solution, check every step, "
                 "and say whether its final answer is correct.")
GRADER_QUESTION = "Is the proposed solution correct? Answer Yes or No."
# The blend gate each grader request asks for (AsksOptions.max_deviation), twice the server's
# default: a candidate's KV, computed in the solver's assistant turn, moves further in the grader's
# user turn than a shared text does after another opening, so the default gate sends back most of
# it; the grader reads one token. On bon-grader-steady (docs/benchmarks.md, "the grader's gate")
# 0.05 picked exact's candidate as often as float32 linears do or more, 0.1 less often.
GRADER_MAX_DEVIATION = 0.05


@dataclasses.dataclass(frozen=True)
class GraderResult:
    problem: Problem
    solutions: tuple[str, ...]  # the candidates' generated texts
    candidate_answers: tuple[str | None, ...]
    candidate_tokens: tuple[int, ...]  # completion tokens per candidate
    branches: tuple[ParaBranch, ...]  # the grader's output per candidate (its verdict token)
    p_yes: tuple[float, ...]  # per candidate
    pick: int  # the candidate the grader chose
    ttft_s: tuple[float, ...]  # per grader request
    latency_s: tuple[float, ...]

    @property
    def answer(self) -> str | None:
        return self.candidate_answers[self.pick]

    @property
    def correct(self) -> bool:
        return self.answer is not None and self.answer == self.problem.answer


@dataclasses.dataclass(frozen=True)
class GraderRun:
    results: list[GraderResult]
    sample_s: float  # the sampling phases' wall time, summed over rounds
    grade_s: float  # the grading phases'
    grade_tokens: TokenCounters  # the tokens the grading phases sent (``TokenCounters``, summed over rounds)


def grader_message(problem: Problem, solution: str) -> str:
    """The grader's user turn: the question, the candidate's solution verbatim, the question asked."""
    return f"Question: {format_question(problem)}\n\nProposed solution:\n{solution}\n\n{GRADER_QUESTION}"


def problem_group(run_key: str, index: int) -> str:
    return f"grader-{run_key}-{index}"


def pick(p_yes: tuple[float, ...] | list[float]) -> int:
    """The candidate with the highest P(Yes), ties to the first."""
    if not p_yes:
        raise ValueError("pick needs at least one candidate")
    return max(range(len(p_yes)), key=lambda i: (p_yes[i], -i))


def verdict(text: str) -> str | None:
    """The grader's word, ``"yes"`` or ``"no"``, or None when it said something else."""
    words = text.strip().lower().split()
    word = words[0].strip(".,!:;") if words else ""
    return word if word in ("yes", "no") else None


def grade(problem: Problem, solution: str, backend, group: str, recompute: float | None = None,
          max_deviation: float | None = GRADER_MAX_DEVIATION):
    """One grader request: its output (``ParaBranch``), P(Yes), time to first token and latency."""
    yes_ids, no_ids = verdict_token_ids(backend)
    options = AsksOptions(group=group, recompute=recompute, max_deviation=max_deviation)
    body = request_body(prompt_of(backend, problem, solution), max_new_tokens=1, temperature=0.0,
                        top_logprobs_num=TOP_LOGPROBS, custom_params=options.to_custom_params(),
                        token_ids_logprob=[*yes_ids, *no_ids])
    out = generate_timed(backend, body, routing_key=group)
    logprobs = {i: lp for lp, i, *_ in out.meta_info["output_token_ids_logprobs"][0]}
    return (read_branch(out.text, out.meta_info, verdict(out.text)), yes_probability(logprobs, yes_ids, no_ids),
            out.ttft_s, out.latency_s)


def prompt_of(backend, problem: Problem, solution: str) -> str:
    """The grader request's text under the backend's chat template."""
    return prompt_text(backend.chat_template, GRADER_SYSTEM, grader_message(problem, solution))


def solve_batch(problems: list[Problem], config: SamplingConfig, backend, *, first_index: int = 0,
                exemplars: tuple[Problem, ...] = (), chunk: int = 16, recompute: float | None = None,
                max_deviation: float | None = GRADER_MAX_DEVIATION, run_key: str | None = None) -> GraderRun:
    """Every problem, ``chunk`` at a time: sample its candidates, then grade each (module
    docstring). Problem ``i`` is index ``first_index + i``: its seeds and its group under
    ``run_key`` (default fresh); ``recompute``, ``max_deviation``: the blend share and gate the
    grader requests ask for (None: the server's)."""
    run_key = run_key or new_run_key()
    results, sample_s, grade_s, grade_tokens = [], 0.0, 0.0, None
    for start in range(0, len(problems), chunk):
        part = problems[start:start + chunk]
        groups = [problem_group(run_key, first_index + start + i) for i in range(len(part))]
        t0 = time.perf_counter()
        branches = run_branches(part, config, backend, first_index=first_index + start, exemplars=exemplars,
                                asks_groups=groups)
        t1, before = time.perf_counter(), backend.counters_snapshot()
        jobs = [(p, g, solution) for p, g, out in zip(part, groups, branches) for _, solution, *_ in out]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
            graded = list(pool.map(lambda job: grade(job[0], job[2], backend, job[1], recompute, max_deviation),
                                   jobs))
        t2, tokens = time.perf_counter(), backend.counters_snapshot() - before
        sample_s, grade_s = sample_s + t1 - t0, grade_s + t2 - t1
        grade_tokens = tokens if grade_tokens is None else grade_tokens + tokens
        at = 0
        for problem, out in zip(part, branches):
            mine, at = graded[at:at + len(out)], at + len(out)
            p_yes = tuple(g[1] for g in mine)
            results.append(GraderResult(
                problem, tuple(solution for _, solution, *_ in out),
                tuple(extract_answer(problem, solution) for _, solution, *_ in out),
                tuple(len(lps) for _, _, lps, *_ in out), tuple(g[0] for g in mine), p_yes, pick(p_yes),
                tuple(g[2] for g in mine), tuple(g[3] for g in mine)))
    return GraderRun(results, sample_s, grade_s, grade_tokens if grade_tokens is not None else TokenCounters())
