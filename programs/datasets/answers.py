"""Answer extraction and normalisation for numeric (GSM8K) and multiple-choice datasets.

Each extractor is an ordered list of patterns and a normalisation, read by
``rksc_sgl.stop_rules.read_answer``: the first pattern that gives an answer wins, with the last
of its answers. The lists are plain strings (``ANSWER_PATTERNS``) so that the scheduler's group
stop reads a branch's vote with exactly these (``rksc_group_policy.answer_pattern`` and
``answer_normalize``: ``answer_reading``), and the two cannot drift apart.
"""

from __future__ import annotations

from rksc_sgl.stop_rules import LETTER_NORMALIZATION_PREFIX, NUMBER, normalize_number, read_answer

__all__ = ["ANSWER_PATTERNS", "answer_reading", "extract_letter", "extract_number", "normalize_number"]

_BOXED = r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}"
_BOXED_ANY = r"\\boxed\s*\{(?:[^{}]|\{[^{}]*\})*\}"
NUMBER_PATTERNS: tuple[str, ...] = (
    # The last \boxed{...} only (none after it), read for its first number.
    _BOXED + r"(?!(?s:.*?)" + _BOXED_ANY + ")",
    r"####\s*\$?\s*(" + NUMBER + ")",
    r"(?i:answer)(?:\s+(?i:is))?[\s:=*$\\(]*(" + NUMBER + ")",
    NUMBER,  # the last number anywhere
)

# Multiple choice. Letters are matched in capitals, except in a reply that is only a letter or
# an "Answer: b" ending its line: elsewhere a lower-case "a" is almost always the article.
LETTER_PATTERNS: tuple[str, ...] = (
    # "answer is (B)" / "Answer: B" / "the correct answer is option C"
    r"(?i:answer)(?:\s+(?i:is))?[\s:=*$\\({\[]*(?:(?i:option|choice)\s*)?\(?([A-J])(?![\w'])",
    r"\\boxed\s*\{\s*(?:\\text(?:bf)?\s*\{\s*)?\(?([A-J])\)?\s*\}",
    r"^[\s*_`(\[]*([A-Ja-j])[\s*_`)\].:]*$",  # a reply that is just a letter: "B", "(B)", "**b.**"
    # "Answer: b" / "answer is (c)." - lower case only when nothing but punctuation follows.
    r"(?m)(?i:answer)(?:\s+(?i:is))?\s*[:=]?\s*\(?([a-j])\)?[.*]*[ \t]*$",
    r"(?i:option|choice)\s+\(?([A-J])\)?(?![\w'])",
    r"\(([A-J])\)",
    # The last standalone capital, but not an article-like "A word" ("A planet rotates ...").
    r"(?<![\w'])([A-J])(?![\w'])(?!(?<=A)\s+[a-z])",
)
# The extractors' ordered patterns, by answer kind (``answer_reading`` adds the normalisation).
ANSWER_PATTERNS: dict[str, tuple[str, ...]] = {"number": NUMBER_PATTERNS, "letter": LETTER_PATTERNS}


def answer_reading(kind: str, letters: str = "ABCD") -> tuple[tuple[str, ...], str]:
    """The ordered patterns and the normalisation the extractor of ``kind`` ("number" or
    "letter", with the letters in range) reads an answer with: what a group policy sends as
    ``answer_pattern`` and ``answer_normalize``."""
    if kind == "number":
        return NUMBER_PATTERNS, "number"
    if kind == "letter":
        return LETTER_PATTERNS, LETTER_NORMALIZATION_PREFIX + letters
    raise ValueError(f"unknown answer kind {kind!r}; known: {list(ANSWER_PATTERNS)}")


def extract_number(text: str) -> str | None:
    """Extract the final numeric answer from free-form model output.

    Preference order: the last ``\\boxed{...}`` (its first number), the last ``#### X``, the last
    ``answer is X`` / ``Answer: X``, and finally the last number anywhere in the text.
    The result is normalised with :func:`normalize_number`.
    """
    if not text:
        return None
    return read_answer(NUMBER_PATTERNS, text, "number", timeout=None)


def extract_letter(text: str, letters: str = "ABCD") -> str | None:
    """Extract a multiple-choice letter (one of ``letters``) from free-form model output.

    Preference order: ``answer is (B)`` / ``Answer: B`` / ``the correct answer is option C``
    (last occurrence), ``\\boxed{B}``, a reply that is just a letter (``"B"``, ``"(B)"``,
    ``"**b.**"``), a lower-case ``Answer: b`` ending its line, ``option B`` / ``choice B``, the
    last parenthesised ``(B)``, and finally the last standalone capital letter in range
    (skipping an article-like ``"A word"``). Letters outside ``letters`` are ignored.
    """
    if not text:
        return None
    return read_answer(LETTER_PATTERNS, text, LETTER_NORMALIZATION_PREFIX + letters, timeout=None)
