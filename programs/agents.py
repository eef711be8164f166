"""Agents in a chain, each reading the others' words: a team per kind of problem (``team_of``).

* ``AGENTS`` (GSM8K and the multiple-choice datasets): a planner, a solver, a critic and an
  answerer. Agent ``i``'s user message is the question, then what agents ``0..i-1`` wrote,
  verbatim, each under its label (``Plan:``, ``Solution:``, ``Review:``), then its own task
  (``user_message``); the answerer's task asks for the dataset's answer line
  (``programs.sc.INSTRUCTION``).
* ``READING_AGENTS`` (CoQA, ``programs.datasets.READING_DATASETS``): a finder that quotes the
  passage's evidence, a drafter that answers from it, a checker that holds the draft against the
  passage and an answerer. Agent ``i``'s user message opens with the passage and the question,
  then the earlier outputs under their labels (``Evidence:``, ``Draft:``, ``Check:``) and its
  task; the answerer's asks for a short answer (``programs.role_sc.INSTRUCTION``).

Each agent is its own persona (system message); the answerer's answer is read and scored by the
dataset's extractor (``programs.datasets``). So agent ``i + 1`` reads text that agent ``i``
generated: the relay. Exact prefix caching shares only each agent's opening (its system message,
the same for every problem), since every agent's prompt leaves the others' at its persona; ASKS
blend may reuse, for the question (a reading team's long passage, right after each persona) and
each earlier agent's output, the KV that an earlier request of the problem computed after
another opening (the question after another persona, an output as that agent generated it), K
re-rotated and the deviating tokens recomputed, every agent keeping its words.

All agents of one problem are one ASKS group (``problem_group``: fresh per run and problem), so
nothing outside the problem can donate to it or be served by it. Agent ``a`` of problem ``i``
samples at the run's temperature with seed ``programs.sc.branch_seed(seed, i, a)`` (greedy at
temperature 0), at most ``max_new_tokens``. Every request is plain, sent through the program's
backend by ``programs.timed`` (streamed, timed to its first token): a frontend gen returns whole,
and the frontend's own streaming cannot be timed from outside its executor thread.
Problems run ``max_concurrency`` at a time, each chain in order.
"""

from __future__ import annotations

import dataclasses
import uuid

from programs.datasets import READING_DATASETS, Problem, extract_answer, format_question, is_correct
from programs.paraphrase_sc import TOP_LOGPROBS, prompt_text, read_branch, run_concurrently
from programs.role_sc import INSTRUCTION as READING_INSTRUCTION
from programs.sampling import SamplingConfig
from programs.sc import INSTRUCTION, branch_seed
from programs.timed import generate_timed, request_body
from rksc_sgl.protocol import AsksOptions

SEPARATOR = "\n\n"  # after the question and after each earlier output
FINAL_PERSONA = "You are the final answerer of a team. You read the team's work and state the final answer."


@dataclasses.dataclass(frozen=True)
class Agent:
    name: str
    system: str  # its persona
    label: str  # how later agents' messages introduce what it wrote
    task: str  # the instruction closing its user message ("" for the answerer: the dataset's)


AGENTS: tuple[Agent, ...] = (
    Agent("planner", "You are a planner. You read a math or science problem and write a short numbered plan "
                     "for solving it. You do not carry out the plan.",
          "Plan", "Write a short plan for solving this problem. Do not compute the answer."),
    Agent("solver", "You are a solver. You follow a plan step by step and carry out every calculation carefully.",
          "Solution", "Follow the plan and solve the problem step by step."),
    Agent("critic", "You are a critic. You check a solution for mistakes in its reasoning and its arithmetic.",
          "Review", "Check the solution step by step. Point out any mistake, or say that it is correct."),
    Agent("answer", FINAL_PERSONA, "Answer", ""),
)
READING_AGENTS: tuple[Agent, ...] = (
    Agent("finder", "You are an evidence finder. You read a passage and a question about it, and you quote the "
                    "sentences of the passage that answer the question.",
          "Evidence", "Quote the one or two sentences of the passage that answer the question. Do not answer it."),
    Agent("drafter", "You are a reader who answers questions about a passage from the evidence quoted for you.",
          "Draft", "Answer the question from the evidence."),
    Agent("checker", "You are a checker. You compare an answer with the passage and say whether the passage "
                     "supports it.",
          "Check", "Check the draft against the passage. Say whether it is right, or give the right answer."),
    Agent("answer", FINAL_PERSONA, "Answer", ""),
)


@dataclasses.dataclass(frozen=True)
class AgentsResult:
    """One problem's chain: each agent's output (``ParaBranch``: text, tokens, first-token top
    log-probabilities, ASKS report) with its time to first token and its latency, and the
    answerer's answer."""

    problem: Problem
    branches: tuple  # ParaBranch per agent, in its team's order
    ttft_s: tuple[float, ...]  # per agent
    latency_s: tuple[float, ...]  # per agent
    answer: str | None

    @property
    def correct(self) -> bool:
        """The answerer's output scored as its dataset scores (a reading problem's: against every
        annotator's answer)."""
        return is_correct(self.problem, self.branches[-1].text)


def is_reading(problem: Problem) -> bool:
    return problem.dataset in READING_DATASETS


def team_of(problem: Problem) -> tuple[Agent, ...]:
    """The chain that works on ``problem``: ``READING_AGENTS`` for a question about a passage,
    else ``AGENTS``."""
    return READING_AGENTS if is_reading(problem) else AGENTS


def final_task(problem: Problem) -> str:
    """The answerer's task: the dataset's answer line (a number, or a choice's letter), or a
    reading problem's short answer."""
    if is_reading(problem):
        return "Using the work above, give the final answer. " + READING_INSTRUCTION
    return "Using the work above, give the final answer. " + INSTRUCTION["letter" if problem.choices else "number"]


def task_of(agent_index: int, problem: Problem) -> str:
    agent = team_of(problem)[agent_index]
    return agent.task or final_task(problem)


def opening(problem: Problem) -> str:
    """What every agent's user message starts with: the question, or the passage then the question."""
    if is_reading(problem):
        return f"Passage:\n{problem.passage}{SEPARATOR}Question: {problem.question}{SEPARATOR}"
    return f"Question: {format_question(problem)}{SEPARATOR}"


def user_message(problem: Problem, agent_index: int, outputs: list[str] | tuple[str, ...]) -> str:
    """Agent ``agent_index`` (of ``team_of(problem)``)'s user message: the question (after its
    passage), every earlier agent's output verbatim under its label, then its task. ``outputs``:
    the earlier agents' texts, in order."""
    team = team_of(problem)
    if not 0 <= agent_index < len(team):
        raise ValueError(f"agent_index must be in [0, {len(team)}), got {agent_index}")
    if len(outputs) != agent_index:
        raise ValueError(f"agent {team[agent_index].name} reads {agent_index} earlier outputs, got {len(outputs)}")
    parts = [opening(problem)]
    parts += [f"{agent.label}:\n{text}{SEPARATOR}" for agent, text in zip(team, outputs)]
    return "".join(parts) + task_of(agent_index, problem)


def problem_group(run_key: str, index: int) -> str:
    """The ASKS group of problem ``index`` of the run keyed ``run_key`` (its routing key too)."""
    return f"agents-{run_key}-{index}"


def new_run_key() -> str:
    return uuid.uuid4().hex[:16]


def solve(problem: Problem, index: int, config: SamplingConfig, backend, group: str,
          recompute: float | None = None) -> AgentsResult:
    """One problem's chain (module docstring); ``recompute``: the blend share its requests ask for
    (None: the server's)."""
    params = AsksOptions(group=group, recompute=recompute).to_custom_params()
    branches, ttft, latency = [], [], []
    for a, agent in enumerate(team_of(problem)):
        text = prompt_text(backend.chat_template, agent.system, user_message(problem, a, [b.text for b in branches]))
        out = generate_timed(backend, request_body(text, max_new_tokens=config.max_new_tokens,
                                                   temperature=config.temperature, top_logprobs_num=TOP_LOGPROBS,
                                                   seed=branch_seed(config.seed, index, a), custom_params=params),
                             routing_key=group)
        branches.append(read_branch(out.text, out.meta_info, extract_answer(problem, out.text)))
        ttft.append(out.ttft_s)
        latency.append(out.latency_s)
    return AgentsResult(problem, tuple(branches), tuple(ttft), tuple(latency), branches[-1].answer)


def solve_batch(problems: list[Problem], config: SamplingConfig, backend, first_index: int = 0,
                max_concurrency: int | None = None, progress_bar: bool = False, recompute: float | None = None,
                run_key: str | None = None) -> list[AgentsResult]:
    """``solve`` on every problem, ``max_concurrency`` chains at a time (default: all); problem
    ``i`` is index ``first_index + i`` (its seeds, its group under ``run_key``, default fresh)."""
    run_key = run_key or new_run_key()
    return run_concurrently([(solve, (p, first_index + i, config, backend, problem_group(run_key, first_index + i)),
                              {"recompute": recompute}) for i, p in enumerate(problems)],
                            max_concurrency, progress_bar)
