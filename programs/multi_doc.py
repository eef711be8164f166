"""Multi-document questions: four passages in a per-branch order, then a question about one.

A problem is a CoQA story's first question (``programs.datasets.coqa``, ``coqa-short`` by
default) and ``NUM_DOCS`` documents: its own story and ``NUM_DOCS - 1`` others drawn for it
deterministically (``documents_for``). Every branch reads all of them, each branch in its own
order (``branch_orders``: distinct permutations ranked by a hash of the problem id, the same in
every mode and every seed), then the question. The program declares the documents reusable
chunks (``rksc_sgl.share_chunks``) under the run's substitution group before its branches run:
exact prefix caching shares a branch's first document at most, ASKS blend reuses each document's
KV wherever it sits in a branch's prompt, re-rotated to its position, a share recomputed.

Each branch samples with its own seed (``programs.sc.branch_seed``); answers are short phrases
scored and voted on as in ``programs.role_sc`` (``programs.reading``).
"""

from __future__ import annotations

import hashlib
import itertools
import uuid

import sglang as sgl

from programs.datasets.coqa import ReadingProblem
from programs.paraphrase_sc import TOP_LOGPROBS, run_concurrently
from programs.role_sc import ReadingResult, result_of
from programs.sampling import SamplingConfig
from programs.sc import branch_seed
from rksc_sgl.primitives import share_chunks
from rksc_sgl.program_state import add_custom_params, branch_options
from rksc_sgl.protocol import AsksOptions

NUM_DOCS = 4
SYSTEM = "You are a careful reader who answers questions about documents."
INSTRUCTION = "Answer the question in a few words, using the documents above."


def _rank(key: str) -> bytes:
    return hashlib.blake2b(key.encode(), digest_size=8).digest()


def documents_for(problem: ReadingProblem, pool: tuple[ReadingProblem, ...] | list[ReadingProblem],
                  num_docs: int = NUM_DOCS) -> tuple[str, ...]:
    """The problem's passage and ``num_docs - 1`` other passages of ``pool`` (by a hash of both
    ids), the problem's first: the canonical order ``branch_orders`` permutes."""
    others = sorted((p for p in pool if p.passage != problem.passage), key=lambda p: _rank(f"{problem.id}/{p.id}"))
    if len(others) < num_docs - 1:
        raise ValueError(f"multi-doc: {num_docs} documents need a pool of at least {num_docs} passages")
    return (problem.passage, *(p.passage for p in others[:num_docs - 1]))


def branch_orders(key: str, num_docs: int, num_branches: int) -> list[tuple[int, ...]]:
    """Each branch's order of the documents: the permutations of ``range(num_docs)`` ranked by a
    hash of ``key`` (the problem id), distinct while there are enough, then cycling."""
    ranked = sorted(itertools.permutations(range(num_docs)), key=lambda perm: _rank(f"{key}/{perm}"))
    return [ranked[b % len(ranked)] for b in range(num_branches)]


def chunk(document: str) -> str:
    """A document as it sits in a prompt, wherever it sits: the same text at every position."""
    return f"Document:\n{document}\n\n"


def question_prompt(question: str) -> str:
    return f"Question: {question}\n{INSTRUCTION}"


@sgl.function
def multi_doc_program(s, documents: list[str], orders: list[tuple[int, ...]], question: str, gen_tokens: int,
                      gen_temperature: float, seeds: list[int], group: str | None = None,
                      recompute: float | None = None):
    chunks = [chunk(d) for d in documents]
    s += sgl.system(SYSTEM)
    s += sgl.user_begin()
    group = share_chunks(s, chunks, group=group)
    forks = s.fork(len(orders))
    for fork, order, seed in zip(forks, orders, seeds):
        branch_options(fork, sampling_seed=seed)
        add_custom_params(fork, AsksOptions(group=group, recompute=recompute).to_custom_params())
        fork += "".join(chunks[i] for i in order) + question_prompt(question)
        fork += sgl.user_end() + sgl.assistant_begin()
        fork += sgl.gen("answer", max_tokens=gen_tokens, temperature=gen_temperature,
                        return_logprob=True, top_logprobs_num=TOP_LOGPROBS)
    return [(fork["answer"], fork.get_meta_info("answer")) for fork in forks]


def solve(problem: ReadingProblem, index: int, pool, config: SamplingConfig, backend, group: str | None = None,
          recompute: float | None = None) -> ReadingResult:
    """One problem, its distractors from ``pool``; ``group``: the ASKS substitution group
    (default: this program's own); ``recompute``: the blend share its branches ask for."""
    state = multi_doc_program.run(
        documents=list(documents_for(problem, pool)), orders=branch_orders(problem.id, NUM_DOCS, config.num_branches),
        question=problem.question, gen_tokens=config.max_new_tokens, gen_temperature=config.temperature,
        seeds=[branch_seed(config.seed, index, b) for b in range(config.num_branches)],
        group=group, recompute=recompute, backend=backend)
    return result_of(problem, state.ret_value)


def solve_batch(problems: list[ReadingProblem], pool, config: SamplingConfig, backend, first_index: int = 0,
                max_concurrency: int | None = None, progress_bar: bool = False,
                recompute: float | None = None) -> list[ReadingResult]:
    """``solve`` on every problem, ``max_concurrency`` at a time (default: all), the run's problems
    one substitution group; problem ``i`` samples with the seeds of index ``first_index + i``."""
    group = uuid.uuid4().hex
    return run_concurrently([(solve, (p, first_index + i, pool, config, backend),
                              {"group": group, "recompute": recompute}) for i, p in enumerate(problems)],
                            max_concurrency, progress_bar)
