"""Self-consistency: N sampled reasoning branches from one shared prompt, majority vote.

The program is ordinary SGLang frontend code: ``s.fork(n)`` shares the prompt's KV through the
radix cache, every branch samples with ``return_logprob`` so its token log-probabilities are kept
(CGEE's confidence measure reads them), and the vote runs on the answers each dataset's extractor
finds in the branch texts.

Diverse-prompt self-consistency (``diverse=True``) starts each branch's answer with a different
opener (``OPENERS``, branch ``b`` takes ``OPENERS[b % len(OPENERS)]``): the branches share the
prompt and part ways at the opener, so exact prefix caching serves only the shared part.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from collections.abc import Callable

import sglang as sgl

from programs.datasets import Problem, extract_answer, extract_reading, format_question
from programs.sampling import SamplingConfig
from rksc_sgl.adaptive import adaptive_fork
from rksc_sgl.program_state import add_custom_params, branch_options
from rksc_sgl.adaptive import StopRule, leader
from rksc_sgl.cgee import token_logprobs
from rksc_sgl.protocol import AsksOptions
from rksc_sgl.stop_options import GROUP_POLICY_KEY, STOP_KEY, ConfStop
from rksc_sgl.stop_rules import token_confidence, window_minima

SYSTEM_PROMPT = "You are a careful assistant who solves problems step by step."
# The trace confidence recorded per branch when asked (``conf_top_k``): DeepConf's token
# confidence over the top-K log-probabilities, window means over CONF_WINDOW tokens.
CONF_TOP_K = 5
CONF_WINDOW = 8
# Openers of diverse-prompt self-consistency: the first words of each branch's answer.
OPENERS = (
    "Let me work through this step by step.",
    "First, I will write down what is given and what is asked.",
    "Let me think about which approach fits this problem, then apply it.",
    "I will solve this carefully and check the result at the end.",
)
INSTRUCTION = {
    "number": "Think step by step, then finish with 'The answer is N.' where N is a number.",
    "letter": "Think briefly, then finish with 'The answer is X.' where X is the letter of your choice.",
}


@dataclasses.dataclass(frozen=True)
class Branch:
    text: str
    answer: str | None
    token_logprobs: tuple[float, ...]  # one per generated token
    index: int = 0  # the branch's index (its seed's), which a runtime group stop may leave gaps in
    # Where its trace confidence (window ``CONF_WINDOW``, top ``CONF_TOP_K``) reached new lows:
    # ``rksc_sgl.stop_rules.window_minima``, so any trace-stop threshold replays offline.
    conf_minima: tuple[tuple[int, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class VoteResult:
    problem: Problem
    branches: tuple[Branch, ...]
    answer: str | None  # the majority answer (None if no branch produced one)
    votes: dict[str, int]

    @property
    def correct(self) -> bool:
        return self.answer is not None and self.answer == self.problem.answer


def user_prompt(problem: Problem, exemplars: tuple[Problem, ...] = ()) -> str:
    """The question and its answer instruction, after worked ``exemplars`` (few-shot) if any."""
    kind = "letter" if problem.choices else "number"
    shots = "".join(
        f"Question: {format_question(e)}\nAnswer: The answer is {e.answer}.\n\n" for e in exemplars
    )
    if shots:
        shots = "Solved examples:\n\n" + shots + "Now this one.\n"
    return f"{shots}Question: {format_question(problem)}\n\n{INSTRUCTION[kind]}"


def branch_seed(seed: int, problem_index: int, branch: int, step: int = 0) -> int:
    """A reproducible sampling seed per (run seed, problem, branch, program step), in [0, 2**63).

    Every benchmark mode passes the same four numbers, so with the runtime's seeded sampler
    (``radix_ext.sampling.sampler``) every mode draws the same candidates wherever its logits agree.
    """
    digest = hashlib.blake2b(f"{seed}/{problem_index}/{branch}/{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@sgl.function
def sc_program(s, prompt: str, num_branches: int, max_new_tokens: int, temperature: float, seeds: list[int],
               openers: list[str] | None = None, rule: StopRule | None = None,
               answer_of: Callable[[str], str | None] | None = None,
               answer_reading: tuple[tuple[str, ...], str] | None = None,
               conf_top_k: int = 0, trace_stop: float | None = None, asks_group: str | None = None):
    """Branch ``b`` samples with ``seeds[b]``; with a stop ``rule``, branches run in rounds until the
    rule is decided on ``answer_of(solution)`` of the branches so far, or, with ``answer_reading``
    (the ordered patterns and normalisation ``answer_of`` reads with: ``extract_reading``), all at
    once with the runtime stopping the rest once decided.
    ``conf_top_k``: also return each branch's trace-confidence minima (top ``conf_top_k``);
    ``trace_stop``: the runtime stops a branch whose window confidence falls below it;
    ``asks_group``: every branch's gen is in this ASKS group (a donor for the group's later requests,
    ``programs.grader``)."""
    s += sgl.system(SYSTEM_PROMPT)
    s += sgl.user(prompt)

    def branch(f, b: int):
        branch_options(f, sampling_seed=seeds[b])
        if asks_group is not None:
            add_custom_params(f, AsksOptions(group=asks_group).to_custom_params())
        if trace_stop is not None:
            add_custom_params(f, ConfStop(CONF_WINDOW, conf_top_k, trace_stop).to_custom_params())
        gen = sgl.gen("solution", max_tokens=max_new_tokens, temperature=temperature, return_logprob=True,
                      **({"top_logprobs_num": conf_top_k} if conf_top_k else {}))
        if openers:
            f += sgl.assistant_begin()
            f += openers[b] + "\n"
            f += gen
            f += sgl.assistant_end()
        else:
            f += sgl.assistant(gen)

    patterns, normalize = answer_reading or (None, None)
    forks = adaptive_fork(s, num_branches, rule, branch, lambda f: answer_of(f["solution"]) if answer_of else None,
                          answer_pattern=patterns, answer_normalize=normalize)
    # Per finished branch: its whole text (the verifier's context), the solution, its token
    # log-probabilities, its index, its trace-confidence minima (when asked).
    return [(f.text(), f["solution"], token_logprobs(f, "solution"), b,
             confidence_minima(f, "solution", conf_top_k) if conf_top_k else ())
            for f, b in zip(forks, forks.indices)]


def confidence_minima(state, var_name: str, top_k: int, window: int = CONF_WINDOW) -> tuple[tuple[int, float], ...]:
    """The trace-confidence minima of a gen (``top_logprobs_num >= top_k``), as the scheduler's
    trace stop computes them (``radix_ext.stop.stopper``), rounded to 4 decimals."""
    steps = state.get_meta_info(var_name).get("output_top_logprobs") or []
    confidences = [token_confidence([t[0] for t in step], top_k) for step in steps if step]
    return tuple((k, round(mean, 4)) for k, mean in window_minima(confidences, window))


def majority_vote(answers: list[str | None]) -> tuple[str | None, dict[str, int]]:
    """The most frequent non-empty answer (ties go to the answer seen first) and the votes."""
    return leader(answers), dict(collections.Counter(a for a in answers if a is not None))


def branch_openers(num_branches: int) -> list[str]:
    """Diverse-prompt self-consistency's opener of each branch, cycling through ``OPENERS``."""
    return [OPENERS[b % len(OPENERS)] for b in range(num_branches)]


def run_branches(problems: list[Problem], config: SamplingConfig, backend, *, first_index: int = 0,
                 exemplars: tuple[Problem, ...] = (), diverse: bool = False, progress_bar: bool = False,
                 num_threads: int | None = None, rule: StopRule | None = None, in_runtime: bool = False,
                 conf_top_k: int = 0, trace_stop: float | None = None, asks_groups: list[str] | None = None):
    """``sc_program`` on every problem, ``num_threads`` at a time (default: all); per problem its
    finished branches' ``(context, solution, token log-probabilities, index)`` (``rule`` None: all
    ``config.num_branches``; ``in_runtime``: the rule is the runtime's group policy, not rounds),
    and with ``conf_top_k`` their trace-confidence minima (``trace_stop``: a trace stop on each);
    ``asks_groups``: problem ``i``'s branches in ASKS group ``asks_groups[i]``. Problem ``i``
    samples with the seeds of index ``first_index + i``."""
    arguments = [
        dict(prompt=user_prompt(p, exemplars), num_branches=config.num_branches, max_new_tokens=config.max_new_tokens,
             temperature=config.temperature,
             seeds=[branch_seed(config.seed, first_index + i, b) for b in range(config.num_branches)],
             openers=branch_openers(config.num_branches) if diverse else None,
             rule=rule, answer_of=lambda text, p=p: extract_answer(p, text),
             answer_reading=extract_reading(p) if in_runtime else None,
             conf_top_k=conf_top_k, trace_stop=trace_stop, asks_group=asks_groups[i] if asks_groups else None)
        for i, p in enumerate(problems)
    ]
    states = sc_program.run_batch(arguments, backend=backend, progress_bar=progress_bar, num_threads=num_threads or len(problems) or 1)
    return [state.ret_value for state in states]


def solve_batch(problems: list[Problem], config: SamplingConfig, backend, progress_bar: bool = True,
                exemplars: tuple[Problem, ...] = (), diverse: bool = False,
                num_threads: int | None = None, rule: StopRule | None = None,
                in_runtime: bool = False, conf_top_k: int = 0, trace_stop: float | None = None) -> list[VoteResult]:
    """Run self-consistency on every problem (``num_threads`` at a time, default all, through the
    given frontend backend); ``diverse``: each branch starts its answer with its own opener;
    ``rule``: stop sampling a problem's branches once its vote is decided, in rounds, or
    (``in_runtime``) by the runtime's group stop with every branch launched at once; ``conf_top_k``:
    record each branch's trace-confidence minima."""
    results = []
    for problem, branches_out in zip(problems, run_branches(problems, config, backend, exemplars=exemplars,
                                                             diverse=diverse, progress_bar=progress_bar,
                                                             num_threads=num_threads, rule=rule, in_runtime=in_runtime,
                                                             conf_top_k=conf_top_k, trace_stop=trace_stop)):
        branches = tuple(Branch(text, extract_answer(problem, text), lps, b, minima)
                         for _, text, lps, b, minima in branches_out)
        answer, votes = majority_vote([b.answer for b in branches])
        results.append(VoteResult(problem, branches, answer, votes))
    return results


@dataclasses.dataclass(frozen=True)
class GroupVote:
    """Self-consistency as one ``n``-sample request: the children's answers (by child index, as the
    client's extractor reads them), their completion tokens, and how many the runtime stopped."""

    problem: Problem
    answers: tuple[str | None, ...]
    answer: str | None
    completion_tokens: int
    stopped: int

    @property
    def correct(self) -> bool:
        return self.answer is not None and self.answer == self.problem.answer


def solve_as_one_request(problems: list[Problem], config: SamplingConfig, backend, *,
                         exemplars: tuple[Problem, ...] = (), rule: StopRule | None = None) -> list[GroupVote]:
    """Every problem as one request with ``n = config.num_branches``, all problems at once, through
    an in-process ``RkscEngineEndpoint``. The children sample with seeds derived from the problem's
    seed and their index (``rksc_sgl.protocol.child_seed``). With a ``rule`` the request carries a
    group policy (``rksc_group_policy``): once the vote over the finished children is decided, the
    scheduler stops the others, so the decision costs no program round trip and no launch rounds.
    This is what an OpenAI client gets with ``n`` and the policy in ``extra_body``."""
    import asyncio

    tokenizer = backend.engine.tokenizer_manager.tokenizer
    requests = []
    for i, problem in enumerate(problems):
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user_prompt(problem, exemplars)}]
        params = {"n": config.num_branches, "max_new_tokens": config.max_new_tokens,
                  "temperature": config.temperature, "sampling_seed": branch_seed(config.seed, i, 0)}
        if rule is not None and rule.name != "none":
            patterns, normalize = extract_reading(problem)
            policy = {"answer_pattern": list(patterns), "answer_normalize": normalize, "rule": rule.name,
                      "min_samples": rule.min_samples}
            policy |= {"window": rule.window} if rule.name == "esc" else {"confidence": rule.confidence}
            params["custom_params"] = {GROUP_POLICY_KEY: policy}
        requests.append((tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), params))

    async def send_all():
        return await asyncio.gather(*(backend.engine.async_generate(prompt=p, sampling_params=s) for p, s in requests))

    results = []
    for problem, outs in zip(problems, backend.run(send_all())):
        answers = tuple(extract_answer(problem, out["text"]) for out in outs)
        stopped = sum(STOP_KEY in out["meta_info"] for out in outs)
        results.append(GroupVote(problem, answers, leader(answers), sum(o["meta_info"]["completion_tokens"] for o in outs),
                                 stopped))
    return results
