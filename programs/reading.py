"""Short answers about a passage, scored so a 135M model's replies can be read (reading workloads).

The model is asked to answer in a few words; SmolLM2-135M mostly answers with a sentence that
restates the question ("cotton was a little white kitten"). So:

* ``short_answer``: a branch's answer is its first non-empty line, without an ``Answer:`` prefix,
  cut at the first sentence end, normalised as SQuAD and CoQA do (``normalize``: lower case,
  punctuation and the articles a/an/the removed, whitespace collapsed); None when nothing is left.
* ``is_correct``: against every annotator's gold answer, a hit on any of them: a yes/no gold by
  the answer's first word; any other gold by token F1 >= ``F1_CORRECT`` (CoQA's own metric, made
  binary so that accuracy has a binomial interval), or by the gold's words appearing, in order
  and contiguous, in an answer of at most ``MAX_ANSWER_WORDS`` words (the sentence answers
  above; a long answer that merely mentions the gold among other things is not a hit).
* ``vote``: the majority over the branches' normalised answers; a tie (with eight free-form
  answers, often all of them distinct) goes to the tied answer the other branches support most
  (summed token F1 with every branch's answer), then to the branch seen first.

Pure functions, no SGLang: the benchmark and the tests import them cheaply.
"""

from __future__ import annotations

import collections
import re
import string

F1_CORRECT = 0.5
MAX_ANSWER_WORDS = 12
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PREFIX = re.compile(r"^\s*(?:the\s+)?(?:final\s+)?(?:short\s+)?answer\s*(?:is)?\s*[:\-]?\s*", re.I)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split())


def short_answer(text: str) -> str | None:
    """A branch's answer: its first non-empty line, prefix and everything after the first
    sentence dropped, normalised; None if empty."""
    line = next((x for x in text.splitlines() if x.strip()), "")
    line = _SENTENCE_END.split(_PREFIX.sub("", line.strip(), count=1), maxsplit=1)[0]
    return normalize(line) or None


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1 of two normalised strings (bag of words)."""
    p, g = prediction.split(), gold.split()
    if not p or not g:
        return float(p == g)
    common = sum((collections.Counter(p) & collections.Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def contains_words(answer: str, gold: str) -> bool:
    """True when ``gold``'s words occur in ``answer`` in order and contiguous (both normalised)."""
    a, g = answer.split(), gold.split()
    return bool(g) and any(a[i:i + len(g)] == g for i in range(len(a) - len(g) + 1))


def is_correct(answer: str | None, golds: tuple[str, ...] | list[str]) -> bool:
    """True when the normalised ``answer`` matches one of ``golds`` (as written; module docstring)."""
    if not answer:
        return False
    short = len(answer.split()) <= MAX_ANSWER_WORDS
    for gold in (normalize(g) for g in golds):
        if gold in ("yes", "no", "unknown"):
            if answer.split()[0] == gold:
                return True
        elif token_f1(answer, gold) >= F1_CORRECT or (short and contains_words(answer, gold)):
            return True
    return False


def vote(answers: list[str | None]) -> tuple[str | None, dict[str, int]]:
    """The majority answer (ties: the most supported, then the first seen; module docstring)
    and the vote counts."""
    counts = collections.Counter(a for a in answers if a)
    if not counts:
        return None, {}
    best = max(counts.values())
    tied = [a for a in dict.fromkeys(a for a in answers if a) if counts[a] == best]
    support = {a: sum(token_f1(a, b) for b in answers if b) for a in tied}
    return max(tied, key=lambda a: support[a]), dict(counts)
