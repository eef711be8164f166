"""Paraphrase self-consistency: each branch opens with its own wording of the system message.

Branch ``b`` of a problem has the system message ``EVAL.paraphrases[b % 8]``
(``programs.paraphrases``), then the user turn: ``shots`` solved exemplars drawn for this
problem (deterministically, from a pool held apart from the evaluated problems) and the
question. Exact prefix caching shares only the chat header between branches; every branch
recomputes the exemplars and the question under its own wording. ASKS (``--asks``) lets a
branch whose wording means the same as branch 0's adopt branch 0's wording and reuse its KV.

The program (``paraphrase_program``) is a fork program: ``rksc_sgl.paraphrase_fork`` forks the
open system turn into one branch per wording, commits the spans and branch 0's full prompt
under one ASKS substitution group, and each branch then samples with its own seed
(``programs.sc.branch_seed``); the answers are voted on. Every mode runs the same requests.
``solve_batch`` gives all the problems of one run one group (one client: their spans may stand
in for one another), and nothing outside the run can join it.

What ASKS did to each branch comes back in its ``meta_info["rksc_asks"]``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import uuid
from typing import Any

import sglang as sgl

from programs.datasets import Problem, extract_answer
from programs.paraphrases import EVAL
from programs.sampling import SamplingConfig
from programs.sc import branch_seed, majority_vote, user_prompt
from rksc_sgl.primitives import paraphrase_fork
from rksc_sgl.program_state import add_custom_params, branch_options, program_key
from rksc_sgl.protocol import ASKS_KEY, AsksOptions

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
def paraphrase_program(s, systems: list[str], prompt: str, gen_tokens: int, gen_temperature: float,
                       seeds: list[int], group: str | None = None, recompute: float | None = None):
    s += sgl.system_begin()
    group = group or program_key(s.stream_executor)
    forks = paraphrase_fork(s, systems, sgl.system_end() + sgl.user(prompt) + sgl.assistant_begin(), group=group)
    for fork, seed in zip(forks, seeds):
        branch_options(fork, sampling_seed=seed)
        ask_recompute(fork, group, recompute)
        fork += sgl.gen("solution", max_tokens=gen_tokens, temperature=gen_temperature,
                        return_logprob=True, top_logprobs_num=TOP_LOGPROBS)
    return [(fork["solution"], fork.get_meta_info("solution")) for fork in forks]


def ask_recompute(state, group: str, recompute: float | None) -> None:
    """Every later gen of ``state`` asks ASKS blend to recompute this share of its reused tokens
    (``AsksOptions.recompute``; the benchmark's recompute sweep); None: the server's default."""
    if recompute is not None:
        add_custom_params(state, AsksOptions(group=group, recompute=recompute).to_custom_params())


def read_branch(text: str, meta: dict[str, Any], answer: str | None) -> ParaBranch:
    """A branch's gen (text and ``meta_info``, asked with ``top_logprobs_num``) as a ParaBranch."""
    first_top = (meta.get("output_top_logprobs") or [[]])[0] or []
    report = meta.get(ASKS_KEY)
    return ParaBranch(text, answer, tuple(e[0] for e in meta["output_token_logprobs"]),
                      tuple(e[1] for e in meta["output_token_logprobs"]), {e[1]: e[0] for e in first_top},
                      report[0] if report else None)


def prompt_text(chat_template, system: str, prompt: str) -> str:
    """The text a branch of ``paraphrase_program`` with system message ``system`` sends for its gen."""
    text = ""
    for role, content in (("system", system), ("user", prompt)):
        prefix, suffix = chat_template.get_prefix_and_suffix(role, [])
        text += prefix + content + suffix
    return text + chat_template.get_prefix_and_suffix("assistant", [])[0]


def solve(problem: Problem, index: int, exemplars: tuple[Problem, ...], config: SamplingConfig, backend,
          paraphrases: tuple[str, ...] = EVAL.paraphrases, group: str | None = None,
          recompute: float | None = None) -> ParaResult:
    """One problem; ``group``: the ASKS substitution group (default: this program's own);
    ``recompute``: the blend share its branches ask for (None: the server's)."""
    state = paraphrase_program.run(
        systems=[paraphrases[b % len(paraphrases)] for b in range(config.num_branches)],
        prompt=user_prompt(problem, exemplars), gen_tokens=config.max_new_tokens,
        gen_temperature=config.temperature, seeds=[branch_seed(config.seed, index, b) for b in range(config.num_branches)],
        group=group, recompute=recompute, backend=backend)
    branches = [read_branch(text, meta, extract_answer(problem, text)) for text, meta in state.ret_value]
    answer, votes = majority_vote([b.answer for b in branches])
    return ParaResult(problem, tuple(branches), answer, votes)


def solve_batch(problems: list[Problem], pool: tuple[Problem, ...], shots: int, config: SamplingConfig,
                backend, first_index: int = 0, max_concurrency: int | None = None,
                progress_bar: bool = False, recompute: float | None = None) -> list[ParaResult]:
    """``solve`` on every problem, ``max_concurrency`` problems at a time (default: all); problem
    ``i`` samples with the seeds of index ``first_index + i`` and its exemplars come from ``pool``."""
    group = uuid.uuid4().hex  # the run's substitution group
    return run_concurrently(
        [(solve, (p, first_index + i, exemplars_for(p, pool, shots), config, backend),
          {"group": group, "recompute": recompute}) for i, p in enumerate(problems)],
        max_concurrency, progress_bar)


def run_concurrently(calls: list[tuple], max_concurrency: int | None, progress_bar: bool) -> list:
    """``fn(*args, **kwargs)`` for every ``(fn, args, kwargs)``, ``max_concurrency`` at a time
    (default: all), under a progress bar; the results in order."""
    from tqdm import tqdm

    with concurrent.futures.ThreadPoolExecutor(max_workers=max_concurrency or max(1, len(calls))) as pool_exec:
        futures = [pool_exec.submit(fn, *args, **kwargs) for fn, args, kwargs in calls]
        with tqdm(total=len(futures), desc="problems", unit="problem", leave=False, disable=not progress_bar) as bar:
            for _ in concurrent.futures.as_completed(futures):
                bar.update()
        return [f.result() for f in futures]
