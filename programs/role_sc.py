"""Role self-consistency over a shared passage: every branch its own role, one long passage.

Branch ``b`` of a problem opens with the system message ``ROLES[b % 8]`` (eight personas that
all keep the task: answer a question about a text), then the user turn: the passage (a CoQA
story, ``programs.datasets.coqa``), the question and ``INSTRUCTION``. Exact prefix caching
shares only the chat header between branches, so every branch prefills the whole passage under
its own role; ASKS blend (``--asks``) reuses the passage's KV computed after branch 0's role,
re-rotated and partly recomputed, every branch keeping its own words; ASKS adopt may rewrite a
branch's role to branch 0's.

The program is ``programs.paraphrase_sc.paraphrase_program`` with roles for wordings: it forks
the open system turn into one branch per role and commits the roles' spans and branch 0's full
prompt under the run's substitution group; each branch samples with its own seed
(``programs.sc.branch_seed``) and keeps its first token's top log-probabilities (the first-token
KL between modes). Answers are short phrases, scored and voted on by ``programs.reading``.
"""

from __future__ import annotations

import dataclasses
import uuid


from programs.datasets.coqa import ReadingProblem
from programs.paraphrase_sc import ParaBranch, paraphrase_program, read_branch, run_concurrently
from programs.reading import is_correct, short_answer, vote
from programs.sampling import SamplingConfig
from programs.sc import branch_seed

ROLES = (
    "You are a careful reader who answers questions about a text.",
    "You are a school teacher helping a student understand a story.",
    "You are a librarian who knows every detail of the books you lend.",
    "You are a reading-comprehension tutor. Answer from the passage only.",
    "You are a journalist who checks facts against the source text.",
    "You are an exam grader who knows the passage by heart.",
    "You are a friendly assistant who has just read the passage below.",
    "You are an editor who reads texts closely and answers precisely.",
)
INSTRUCTION = "Answer the question in a few words, using the passage."


@dataclasses.dataclass(frozen=True)
class ReadingResult:
    """One problem of a reading workload: its branches, the voted answer and whether it is right
    (``programs.reading.is_correct`` against every annotator's answer)."""

    problem: ReadingProblem
    branches: tuple[ParaBranch, ...]
    answer: str | None
    votes: dict[str, int]
    correct: bool


def user_prompt(passage: str, question: str) -> str:
    return f"Passage:\n{passage}\n\nQuestion: {question}\n{INSTRUCTION}"


def branch_roles(num_branches: int) -> list[str]:
    """Branch ``b``'s role, cycling through ``ROLES``."""
    return [ROLES[b % len(ROLES)] for b in range(num_branches)]


def result_of(problem: ReadingProblem, outputs) -> ReadingResult:
    """A reading problem's branches (``(text, meta_info)`` per branch) scored and voted on."""
    branches = tuple(read_branch(text, meta, short_answer(text)) for text, meta in outputs)
    answer, votes = vote([b.answer for b in branches])
    return ReadingResult(problem, branches, answer, votes, is_correct(answer, problem.answers))


def solve(problem: ReadingProblem, index: int, config: SamplingConfig, backend, group: str | None = None,
          recompute: float | None = None) -> ReadingResult:
    """One problem; ``group``: the ASKS substitution group (default: this program's own);
    ``recompute``: the blend share its branches ask for (None: the server's)."""
    state = paraphrase_program.run(  # a role is an opening like a paraphrase: the same program
        systems=branch_roles(config.num_branches), prompt=user_prompt(problem.passage, problem.question),
        gen_tokens=config.max_new_tokens, gen_temperature=config.temperature,
        seeds=[branch_seed(config.seed, index, b) for b in range(config.num_branches)],
        group=group, recompute=recompute, backend=backend)
    return result_of(problem, state.ret_value)


def solve_batch(problems: list[ReadingProblem], config: SamplingConfig, backend, first_index: int = 0,
                max_concurrency: int | None = None, progress_bar: bool = False,
                recompute: float | None = None) -> list[ReadingResult]:
    """``solve`` on every problem, ``max_concurrency`` at a time (default: all), the run's problems
    one substitution group; problem ``i`` samples with the seeds of index ``first_index + i``."""
    group = uuid.uuid4().hex
    return run_concurrently([(solve, (p, first_index + i, config, backend), {"group": group, "recompute": recompute})
                             for i, p in enumerate(problems)], max_concurrency, progress_bar)
