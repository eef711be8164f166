"""When to stop sampling: the pure rules both sides apply (no torch, no SGLang).

* Trace confidence (DeepConf online): a token's confidence is ``-mean`` of its step's top-k
  log-probabilities (a peaked step has one logprob near 0 and the others very negative, so a high
  value means confident); a trace stops once the mean over its last ``window`` tokens falls below
  a threshold. Only a full window is judged: the first ``window - 1`` tokens never stop a trace.
* Votes over branch answers, by branch index (``answers``: index -> extracted answer, ``None``
  when a finished branch gave none; ``None`` never counts for an answer):

  * ``esc`` (Early-Stopping Self-Consistency): branches form windows of ``window`` consecutive
    indices; the vote is decided by the first window (in index order) whose branches all finished
    with one and the same answer;
  * ``beta`` (Adaptive-Consistency): with ``v1`` votes for the leader and ``v2`` for the runner-up,
    the posterior probability that the leader's share beats the runner-up's, under a uniform prior
    on the two (the Beta approximation of the Dirichlet over answers), is ``P(X > 1/2)`` for
    ``X ~ Beta(v1 + 1, v2 + 1)``; the vote is decided once it reaches ``confidence``.

  Neither decides before ``min_samples`` branches finished. A decision names the winning answer.
* A branch's vote read from its text (``read_answer``): ordered patterns, the first that gives an
  answer winning with its last match, and a normalisation (``answer_normalizer``: ``"number"``,
  ``"letter:ABCD"``); the scheduler's group stop and the programs' extractors
  (``programs.datasets.answers``) read with the same patterns, so they read the same votes.
"""

from __future__ import annotations

import collections
import functools
import math
import time
from decimal import Decimal, InvalidOperation
from typing import Callable, Mapping, Sequence

import regex

RULES = ("esc", "beta")
MATCH_TIMEOUT_S = 0.05  # an answer pattern is a client's and runs in the scheduler loop: bounded
_MISSING = object()  # an index that has not finished


def token_confidence(top_logprobs: Sequence[float], top_k: int) -> float:
    """``-mean`` of the first ``top_k`` of one step's top log-probabilities (descending)."""
    values = list(top_logprobs)[:top_k]
    if not values:
        raise ValueError("token_confidence needs at least one log-probability")
    return -sum(values) / len(values)


class WindowConfidence:
    """The mean token confidence over the last ``window`` tokens, kept incrementally."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.values: collections.deque[float] = collections.deque()
        self.total = 0.0
        self.tokens = 0  # tokens pushed in all

    def push(self, confidence: float) -> float | None:
        """Add one token's confidence; the window's mean once it is full, else None."""
        self.values.append(confidence)
        self.total += confidence
        self.tokens += 1
        if len(self.values) > self.window:
            self.total -= self.values.popleft()
        if len(self.values) < self.window:
            return None
        # Recompute now and then: the running sum drifts by rounding over long traces.
        if self.tokens % 1024 == 0:
            self.total = math.fsum(self.values)
        return self.total / self.window


def should_stop_trace(mean_confidence: float | None, threshold: float) -> bool:
    return mean_confidence is not None and mean_confidence < threshold


def window_minima(confidences: Sequence[float], window: int) -> list[tuple[int, float]]:
    """Where a trace's window mean reaches a new low: ``(k, mean)`` for each ``k`` (tokens decoded,
    ``k >= window``) whose mean over tokens ``k - window .. k - 1`` is below every earlier one. A
    trace-confidence stop at threshold ``T`` fires at the first ``k`` whose mean is below ``T``,
    which is always one of these, so they replay any threshold (``first_stop``)."""
    minima: list[tuple[int, float]] = []
    tracker = WindowConfidence(window)
    for k, confidence in enumerate(confidences, start=1):
        mean = tracker.push(confidence)
        if mean is not None and (not minima or mean < minima[-1][1]):
            minima.append((k, mean))
    return minima


def first_stop(minima: Sequence[Sequence[float]], threshold: float) -> int | None:
    """Tokens decoded when a trace-confidence stop at ``threshold`` fires (``window_minima``'s
    ``k``), or None if it never does."""
    return next((int(k) for k, mean in minima if mean < threshold), None)


def esc_decision(answers: Mapping[int, str | None], window: int, min_samples: int = 1) -> str | None:
    """The answer of the first complete, unanimous window of branch indices, or None."""
    if len(answers) < min_samples:
        return None
    for start in range(0, max(answers, default=-1) + 1, window):
        members = [answers.get(i, _MISSING) for i in range(start, start + window)]
        if all(a is not _MISSING for a in members) and members[0] is not None and len(set(members)) == 1:
            return members[0]
    return None


def leader_stays_probability(leader_votes: int, runner_up_votes: int) -> float:
    """``P(X > 1/2)`` for ``X ~ Beta(leader_votes + 1, runner_up_votes + 1)``, exactly: for integer
    parameters, ``I_{1/2}(a, b)`` is a binomial tail, ``sum_{j>=a} C(a+b-1, j) / 2^(a+b-1)``."""
    n = leader_votes + runner_up_votes + 1
    below = sum(math.comb(n, j) for j in range(leader_votes + 1, n + 1))
    return 1.0 - below / 2**n


def beta_decision(answers: Mapping[int, str | None], confidence: float, min_samples: int = 1) -> str | None:
    """The leading answer once it stays the leader with posterior probability >= ``confidence``."""
    if len(answers) < min_samples:
        return None
    counts = collections.Counter(a for _, a in sorted(answers.items()) if a is not None)
    if not counts:
        return None
    ranked = counts.most_common(2)  # ties: the first seen by index leads
    leader, v1 = ranked[0]
    v2 = ranked[1][1] if len(ranked) > 1 else 0
    return leader if leader_stays_probability(v1, v2) >= confidence else None


def decide(rule: str, answers: Mapping[int, str | None], *, window: int = 3, confidence: float = 0.95,
           min_samples: int = 1) -> str | None:
    """The decided answer under ``rule`` (``"esc"`` or ``"beta"``), or None while undecided."""
    if rule == "esc":
        return esc_decision(answers, window, min_samples)
    if rule == "beta":
        return beta_decision(answers, confidence, min_samples)
    raise ValueError(f"unknown stop rule {rule!r}; known: {list(RULES)}")


@functools.lru_cache(maxsize=256)
def compile_pattern(source: str):
    """An answer pattern (one of a group policy's ``answer_pattern``), compiled with the ``regex``
    module (``re``-compatible syntax), whose matching takes a timeout: ``re`` has none, and a
    backtracking pattern such as ``(a+)+$`` on a 27-character text held a Python ``re`` search
    for 7.6 s here."""
    return regex.compile(source)


# ---- reading a vote: ordered patterns, then a normalisation -------------------------------

# A number as written in text: optional sign (not part of "3-4"), thousands groups or plain
# digits, optional decimals. "1,000.5", "-3", ".5", "42".
NUMBER = r"(?:(?<![\w)\]])-)?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_NUMBER_RE = regex.compile(NUMBER)
LETTER_NORMALIZATION_PREFIX = "letter:"


def normalize_number(text: str) -> str | None:
    """Canonicalise a numeric answer string, or return None if it is not a number.

    Drops currency signs, thousands separators, a trailing percent sign or period and useless
    decimals: ``"1,000" -> "1000"``, ``"3.0" -> "3"``, ``"$5" -> "5"``, ``"-0.50" -> "-0.5"``.
    """
    cleaned = text.strip().replace(",", "").replace("$", "").replace(" ", "")
    cleaned = cleaned.rstrip(".%")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def first_number(text: str) -> str | None:
    """The first number in a matched answer, canonical (``normalize_number``); LaTeX's ``{,}``
    thousands separator, ``\\$`` and ``\\!`` are read through (``\\boxed{1{,}000}`` -> 1000)."""
    found = _NUMBER_RE.search(text.replace("{,}", ",").replace("\\$", "").replace("\\!", ""))
    return normalize_number(found.group(0)) if found else None


@functools.lru_cache(maxsize=64)
def answer_normalizer(spec: str | None) -> Callable[[str], str | None]:
    """How a matched answer becomes a vote (a group policy's ``answer_normalize``): None, as
    matched; ``"number"``, its first number, canonical (``first_number``); ``"letter:ABCD"``,
    upper-cased and None unless one of the listed letters. ValueError for any other spec."""
    if spec is None:
        return lambda answer: answer
    if spec == "number":
        return first_number
    if isinstance(spec, str) and spec.startswith(LETTER_NORMALIZATION_PREFIX):
        letters = frozenset(spec[len(LETTER_NORMALIZATION_PREFIX):])
        return lambda answer: answer.upper() if answer.upper() in letters else None
    raise ValueError(f"unknown answer normalisation {spec!r}; known: None, 'number', 'letter:<letters>'")


def read_answer(patterns, text: str, normalize: str | None = None, *,
                timeout: float | None = MATCH_TIMEOUT_S) -> str | None:
    """A member's vote as the scheduler reads it. ``patterns``: one pattern or an ordered
    sequence (compiled, or sources). Each pattern's matches give answers (group 1 if it has
    groups, else the whole match; stripped; then ``answer_normalizer(normalize)``, which may
    reject one as None); the first pattern, in order, with an answer gives the vote: the last of
    its answers that is not None. None when no pattern gives one, or when matching takes longer
    than ``timeout`` in all (the member casts no vote; None: no limit, as the programs'
    extractors read their own outputs)."""
    if isinstance(patterns, str) or hasattr(patterns, "finditer"):
        patterns = (patterns,)
    norm = answer_normalizer(normalize)
    deadline = None if timeout is None else time.monotonic() + timeout
    for pattern in patterns:
        if isinstance(pattern, str):
            pattern = compile_pattern(pattern)
        last = None
        try:
            for match in pattern.finditer(text, timeout=None if deadline is None else max(deadline - time.monotonic(), 0.0)):
                answer = match.group(1) if pattern.groups else match.group(0)
                answer = None if answer is None else norm(answer.strip())
                last = answer if answer is not None else last
        except TimeoutError:
            return None
        if last is not None:
            return last
    return None
