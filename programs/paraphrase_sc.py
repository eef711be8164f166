"""Paraphrase self-consistency: each branch opens with its own wording of the system message.

Branch ``b`` of a problem has the system message ``EVAL.paraphrases[b % 8]``
(``programs.paraphrases``), then the user turn: ``shots`` solved exemplars drawn for this
problem (deterministically, from a pool held apart from the evaluated problems) and the
question. Exact prefix caching shares only the chat header between branches; every branch
recomputes the exemplars and the question under its own wording. ASKS (``--asks``) lets a
branch whose wording means the same as branch 0's adopt branch 0's wording and reuse its KV.

The program, per problem, in this order (every mode runs the same requests):

1. commits the shared head (the system header) and each branch's span (head + its paraphrase),
   as prefill-only requests, so every span has a signature before any prompt containing it;
2. commits branch 0's full prompt;
3. runs the branches (``branch_program``, one ``@sgl.function`` per branch, all concurrently),
   each sampling with its own seed (``programs.sc.branch_seed``), then votes.

What ASKS did to each branch comes back in its ``meta_info["rksc_asks"]``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
from typing import Any

import sglang as sgl

from programs.datasets import Problem, extract_answer
from programs.paraphrases import EVAL
from programs.sampling import SamplingConfig
from programs.sc import branch_seed, majority_vote, user_prompt
from rksc_sgl.frontend import branch_options
from rksc_sgl.protocol import ASKS_KEY

TOP_LOGPROBS = 20  # of each branch's first token: the first-token KL between modes


@dataclasses.dataclass(frozen=True)
class ParaBranch:
    text: str
    answer: str | None
    token_logprobs: tuple[float, ...]
    token_ids: tuple[int, ...]
    first_top_logprobs: dict[int, float]  # token id -> logprob, the first token's top TOP_LOGPROBS
    asks: dict[str, Any] | None  # the runtime's ASKS report (None when ASKS is off)


@dataclasses.dataclass(frozen=True)
class ParaResult:
    problem: Problem
    branches: tuple[ParaBranch, ...]
    answer: str | None
    votes: dict[str, int]

    @property
    def correct(self) -> bool:
        return self.answer is not None and self.answer == self.problem.answer


def exemplars_for(problem: Problem, pool: tuple[Problem, ...], shots: int) -> tuple[Problem, ...]:
    """``shots`` exemplars for ``problem``, drawn deterministically from ``pool`` by its id."""
    if shots > len(pool):
        raise ValueError(f"--shots {shots}: the exemplar pool has only {len(pool)} problems")
    ranked = sorted(pool, key=lambda e: hashlib.blake2b(f"{problem.id}/{e.id}".encode(), digest_size=8).digest())
    return tuple(ranked[:shots])


@sgl.function
def branch_program(s, system: str, prompt: str, gen_tokens: int, gen_temperature: float, seed: int):
    s += sgl.system(system)
    s += sgl.user(prompt)
    branch_options(s, sampling_seed=seed)
    s += sgl.assistant(sgl.gen("solution", max_tokens=gen_tokens, temperature=gen_temperature,
                               return_logprob=True, top_logprobs_num=TOP_LOGPROBS))
    meta = s.get_meta_info("solution")
    return s["solution"], meta


def prompt_text(chat_template, system: str, prompt: str) -> str:
    """The text ``branch_program`` sends for its gen (committed ahead for branch 0)."""
    text = ""
    for role, content in (("system", system), ("user", prompt)):
        prefix, suffix = chat_template.get_prefix_and_suffix(role, [])
        text += prefix + content + suffix
    return text + chat_template.get_prefix_and_suffix("assistant", [])[0]


def solve(problem: Problem, index: int, exemplars: tuple[Problem, ...], config: SamplingConfig, backend,
          paraphrases: tuple[str, ...] = EVAL.paraphrases) -> ParaResult:
    systems = [paraphrases[b % len(paraphrases)] for b in range(config.num_branches)]
    prompt = user_prompt(problem, exemplars)
    head = backend.chat_template.get_prefix_and_suffix("system", [])[0]
    backend.prefill(head)
    for system in dict.fromkeys(systems):
        backend.prefill(head + system)
    backend.prefill(prompt_text(backend.chat_template, systems[0], prompt))
    arguments = [dict(system=system, prompt=prompt, gen_tokens=config.max_new_tokens,
                      gen_temperature=config.temperature, seed=branch_seed(config.seed, index, b))
                 for b, system in enumerate(systems)]
    states = branch_program.run_batch(arguments, backend=backend, num_threads=len(arguments))
    branches = []
    for state in states:
        text, meta = state.ret_value
        first_top = (meta.get("output_top_logprobs") or [[]])[0] or []
        report = meta.get(ASKS_KEY)
        branches.append(ParaBranch(
            text, extract_answer(problem, text),
            tuple(e[0] for e in meta["output_token_logprobs"]), tuple(e[1] for e in meta["output_token_logprobs"]),
            {e[1]: e[0] for e in first_top}, report[0] if report else None))
    answer, votes = majority_vote([b.answer for b in branches])
    return ParaResult(problem, tuple(branches), answer, votes)


def solve_batch(problems: list[Problem], pool: tuple[Problem, ...], shots: int, config: SamplingConfig,
                backend, first_index: int = 0, max_concurrency: int | None = None,
                progress_bar: bool = False) -> list[ParaResult]:
    """``solve`` on every problem, ``max_concurrency`` problems at a time (default: all); problem
    ``i`` samples with the seeds of index ``first_index + i`` and its exemplars come from ``pool``."""
    from tqdm import tqdm

    with concurrent.futures.ThreadPoolExecutor(max_workers=max_concurrency or max(1, len(problems))) as pool_exec:
        futures = [pool_exec.submit(solve, p, first_index + i, exemplars_for(p, pool, shots), config, backend)
                   for i, p in enumerate(problems)]
        with tqdm(total=len(futures), desc="problems", unit="problem", leave=False, disable=not progress_bar) as bar:
            for _ in concurrent.futures.as_completed(futures):
                bar.update()
        return [f.result() for f in futures]
