"""Tree of thoughts: propose -> evaluate -> expand for a few levels, majority vote at the leaves.

Per problem (defaults: 3 proposals per node, 2 levels, the 2 best children of a node explored,
3 leaves):

* **propose**: a node forks ``branching`` thoughts (fork level = depth ``l``), one line each.
  Each sibling opens with a different phrase, so the branches differ even under greedy decoding
  (the default, so the eviction comparison runs the same tree under every policy; with a
  temperature, every thought is seeded from (run seed, problem, thought, step));
* **evaluate**: the model judges each thought itself: a fork of the thought asks "Is the
  reasoning so far correct? Answer Yes or No." and the thought's score is P(Yes), read from the
  log-probability of its one-token greedy reply (``yes_probability``). The scores are reported to
  the runtime with ``report_score``: RSBCM eviction acts on them. The verifier forks and the
  final answers are marked ``score=0`` when sent: scratch the search never extends;
* **expand**: ``search="dfs"`` (default) goes down the best child first and backtracks to the
  next of the ``beam`` best children until ``leaves`` answers are in: the second-best first-level
  thought is expanded only after the best one's whole subtree, the long-distance reuse of a
  shallow, well-scored branch that RSBCM is meant to keep. ``search="bfs"`` expands level by
  level, keeping the ``beam`` best thoughts of each level;
* **vote**: each leaf finishes with "The answer is ..."; the majority answer wins (ties: the
  answer found first, i.e. along better-scored thoughts).

Every request of a branch carries its fork level (``branch_options(state, depth=...)``): the
radix cache learns which tokens belong to which level of the tree.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math

import sglang as sgl

from programs.datasets import Problem, extract_answer, format_question
from programs.sc import SYSTEM_PROMPT, branch_seed, majority_vote
from rksc_sgl.program_state import branch_options
from rksc_sgl.scores import report_score

INSTRUCTION = "Solve the problem step by step, one short step per line."
EVAL_QUESTION = "Is the reasoning so far correct? Answer Yes or No."
ANSWER_CUE = "The answer is"
# Sibling i at level l opens with OPENERS[l > 1][i % len]: distinct prefixes, distinct branches.
OPENERS = (
    ("First, ", "Let's see, ", "We know that ", "To start, "),
    ("Next, ", "Then ", "So ", "Now "),
)


@dataclasses.dataclass(frozen=True)
class TotConfig:
    branching: int = 3  # thoughts proposed per frontier node
    beam: int = 2  # children explored per node (dfs) / thoughts kept per level (bfs)
    levels: int = 2  # levels of thoughts before the answer
    leaves: int = 3  # answers that vote
    step_tokens: int = 40  # max new tokens per thought
    answer_tokens: int = 12
    temperature: float = 0.0
    seed: int = 0
    search: str = "dfs"  # "dfs": best child first, backtracking; "bfs": level by level, global beam

    def __post_init__(self) -> None:
        for name in ("branching", "beam", "levels", "leaves", "step_tokens", "answer_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.branching > len(OPENERS[0]):
            raise ValueError(f"--branching must be <= {len(OPENERS[0])}, got {self.branching}")
        if self.temperature < 0:
            raise ValueError(f"--temperature must be >= 0, got {self.temperature}")
        if self.search not in ("dfs", "bfs"):
            raise ValueError(f"--search must be dfs or bfs, got {self.search!r}")


@dataclasses.dataclass(frozen=True)
class TotResult:
    problem: Problem
    answer: str | None  # the majority answer of the leaves
    votes: dict[str, int]
    leaf_answers: tuple[str | None, ...]  # best leaf first
    level_scores: tuple[tuple[float, ...], ...]  # every evaluated thought's score, per level
    leaf_texts: tuple[str, ...] = ()  # the leaves' whole texts, in the order of leaf_answers

    @property
    def correct(self) -> bool:
        return self.answer is not None and self.answer == self.problem.answer


def yes_probability(verdict: str, meta_info: dict) -> float:
    """P(Yes) from the one-token greedy verdict: its own probability if it says Yes, the
    complement if it says No (the rest of the mass counted as Yes), 0.5 for anything else."""
    word = verdict.strip().lower()
    if word not in ("yes", "no"):
        return 0.5
    p_chosen = math.exp(meta_info["output_token_logprobs"][0][0])
    return p_chosen if word == "yes" else 1.0 - p_chosen


def propose(frontier: list, level: int, cfg: TotConfig, problem_index: int, step: int) -> list:
    """Fork ``cfg.branching`` thoughts from every frontier node; ``step`` (the program's count of
    thoughts so far) keys their sampling seeds apart from earlier expansions."""
    children = []
    for parent in frontier:
        for i, child in enumerate(parent.fork(cfg.branching).states):
            branch_options(child, depth=level,
                           sampling_seed=branch_seed(cfg.seed, problem_index, len(children), step))
            child += f"Step {level}: {OPENERS[level > 1][i]}"
            child += sgl.gen("thought", max_tokens=cfg.step_tokens, stop="\n", temperature=cfg.temperature)
            child += "\n"
            children.append(child)
    return children


def evaluate(children: list, level: int) -> list[float]:
    """Each child's self-evaluated score, also reported to the runtime's cache."""
    judges = []
    for child in children:
        judge = child.fork(1)[0]
        branch_options(judge, depth=level + 1, score=0.0)  # scratch: RSBCM may drop it first
        judge += sgl.assistant_end()
        judge += sgl.user(EVAL_QUESTION)
        judge += sgl.assistant(sgl.gen("verdict", max_tokens=1, temperature=0, return_logprob=True))
        judges.append(judge)
    scores = [yes_probability(judge["verdict"], judge.get_meta_info("verdict")) for judge in judges]
    with concurrent.futures.ThreadPoolExecutor(len(children)) as pool:  # one scheduler round, not one each
        list(pool.map(report_score, children, scores))
    end(judges)
    return scores


def ranked(states: list, scores: list[float]) -> list:
    order = sorted(range(len(states)), key=lambda i: -scores[i])  # stable: ties keep proposal order
    return [states[i] for i in order]


def end(states: list) -> None:
    """Stop the states' executor threads now rather than at garbage collection."""
    for state in states:
        state.stream_executor.end()


class Search:
    """One problem's tree: expansions, scores per level, and the answers of the leaves."""

    def __init__(self, cfg: TotConfig, problem_index: int):
        self.cfg, self.problem_index = cfg, problem_index
        self.level_scores: list[list[float]] = [[] for _ in range(cfg.levels)]
        self.answers: list[str] = []
        self.states: list = []

    def expand(self, frontier: list, level: int) -> list:
        """Propose children of every frontier node, evaluate them; the children, best first."""
        children = propose(frontier, level, self.cfg, self.problem_index, step=len(self.states))
        scores = evaluate(children, level)
        self.level_scores[level - 1] += scores
        self.states += children
        return ranked(children, scores)

    def answer(self, leaf) -> None:
        finish = leaf.fork(1)[0]
        branch_options(finish, depth=self.cfg.levels + 1, score=0.0)  # read once, then scratch
        finish += ANSWER_CUE + sgl.gen("answer", max_tokens=self.cfg.answer_tokens, stop="\n", temperature=0)
        self.answers.append(ANSWER_CUE + finish["answer"])
        self.states.append(finish)

    def bfs(self, root) -> None:
        """Level by level: keep the ``beam`` best children of the whole level."""
        frontier = [root]
        for level in range(1, self.cfg.levels + 1):
            keep = self.cfg.leaves if level == self.cfg.levels else self.cfg.beam
            frontier = self.expand(frontier, level)[:keep]
        for leaf in frontier:
            self.answer(leaf)

    def dfs(self, node, level: int = 1) -> None:
        """Best child first, down to the last level; backtrack to the next of the ``beam`` best
        children until ``leaves`` answers are in."""
        for child in self.expand([node], level)[: self.cfg.beam]:
            if len(self.answers) >= self.cfg.leaves:
                return
            if level == self.cfg.levels:
                self.answer(child)
            else:
                self.dfs(child, level + 1)


@sgl.function
def tot_program(s, prompt: str, cfg: TotConfig, problem_index: int):
    s += sgl.system(SYSTEM_PROMPT)
    s += sgl.user(prompt)
    s += sgl.assistant_begin()
    search = Search(cfg, problem_index)
    if cfg.search == "bfs":
        search.bfs(s)
    else:
        search.dfs(s)
    end(search.states)
    return search.answers, tuple(tuple(scores) for scores in search.level_scores)


def user_prompt(problem: Problem) -> str:
    return f"{format_question(problem)}\n\n{INSTRUCTION}"


def solve_batch(problems: list[Problem], cfg: TotConfig, backend, num_threads: int | None = None,
                progress_bar: bool = False) -> list[TotResult]:
    """Run the tree of thoughts on every problem, ``num_threads`` problems at a time (default: all)."""
    arguments = [dict(prompt=user_prompt(p), cfg=cfg, problem_index=i) for i, p in enumerate(problems)]
    states = tot_program.run_batch(arguments, backend=backend, progress_bar=progress_bar,
                                   num_threads=num_threads or max(len(problems), 1))
    results = []
    for problem, state in zip(problems, states):
        if state.ret_value is None:
            raise RuntimeError(f"tree of thoughts failed on {problem.id}: {state.error()}")
        texts, level_scores = state.ret_value
        leaf_answers = tuple(extract_answer(problem, text) for text in texts)
        answer, votes = majority_vote(list(leaf_answers))
        results.append(TotResult(problem, answer, votes, leaf_answers, level_scores, tuple(texts)))
    return results
