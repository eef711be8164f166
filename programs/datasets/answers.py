"""Answer extraction and normalisation for numeric (GSM8K) and multiple-choice datasets."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

# A number as written in text: optional sign (not part of "3-4"), thousands groups or plain
# digits, optional decimals. "1,000.5", "-3", ".5", "42".
_NUMBER = r"(?:(?<![\w)\]])-)?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(_NUMBER)
_BOXED_RE = re.compile(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
_HASHES_RE = re.compile(r"####\s*\$?\s*(" + _NUMBER + ")")
_ANSWER_NUM_RE = re.compile(r"(?i:answer)(?:\s+(?i:is))?[\s:=*$\\(]*(" + _NUMBER + ")")

# Multiple choice. Letters are matched in capitals, except in a reply that is only a letter or
# an "Answer: b" ending its line: elsewhere a lower-case "a" is almost always the article.
_ANSWER_LETTER_RE = re.compile(
    r"(?i:answer)(?:\s+(?i:is))?[\s:=*$\\({\[]*(?:(?i:option|choice)\s*)?\(?([A-J])(?![\w'])"
)
_BOXED_LETTER_RE = re.compile(r"\\boxed\s*\{\s*(?:\\text(?:bf)?\s*\{\s*)?\(?([A-J])\)?\s*\}")
_OPTION_LETTER_RE = re.compile(r"(?i:option|choice)\s+\(?([A-J])\)?(?![\w'])")
_LONE_LETTER_RE = re.compile(r"^[\s*_`(\[]*([A-Ja-j])[\s*_`)\].:]*$")
# "Answer: b" / "answer is (c)." - lower case only when nothing but punctuation follows.
_ANSWER_LOWER_RE = re.compile(
    r"(?i:answer)(?:\s+(?i:is))?\s*[:=]?\s*\(?([a-j])\)?[.*]*[ \t]*$", re.M
)
_PAREN_LETTER_RE = re.compile(r"\(([A-J])\)")
# The strongest of the patterns ("the answer is X"), for a reader that takes one regex (the
# scheduler's group policy, ``rksc_group_policy.answer_pattern``): by answer kind.
ANSWER_PATTERNS = {"letter": _ANSWER_LETTER_RE.pattern, "number": _ANSWER_NUM_RE.pattern}
_STANDALONE_LETTER_RE = re.compile(r"(?<![\w'])([A-J])(?![\w'])")


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


def _last_number(text: str) -> str | None:
    matches = _NUMBER_RE.findall(text)
    return normalize_number(matches[-1]) if matches else None


def extract_number(text: str) -> str | None:
    """Extract the final numeric answer from free-form model output.

    Preference order: the last ``\\boxed{...}``, the last ``#### X``, the last
    ``answer is X`` / ``Answer: X``, and finally the last number anywhere in the text.
    The result is normalised with :func:`normalize_number`.
    """
    if not text:
        return None
    boxed = _BOXED_RE.findall(text)
    if boxed:
        content = boxed[-1].replace("{,}", ",").replace("\\$", "").replace("\\!", "")
        found = _NUMBER_RE.search(content)
        if found:
            return normalize_number(found.group(0))
    for pattern in (_HASHES_RE, _ANSWER_NUM_RE):
        matches = pattern.findall(text)
        if matches:
            return normalize_number(matches[-1])
    return _last_number(text)


def _last_valid(matches: list[str], letters: str) -> str | None:
    for letter in reversed(matches):
        if letter in letters:
            return letter
    return None


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
    for pattern in (_ANSWER_LETTER_RE, _BOXED_LETTER_RE):
        letter = _last_valid(pattern.findall(text), letters)
        if letter:
            return letter
    lone = _LONE_LETTER_RE.match(text)
    if lone and lone.group(1).upper() in letters:
        return lone.group(1).upper()
    for pattern in (_ANSWER_LOWER_RE, _OPTION_LETTER_RE, _PAREN_LETTER_RE):
        letter = _last_valid([found.upper() for found in pattern.findall(text)], letters)
        if letter:
            return letter
    for match in reversed(list(_STANDALONE_LETTER_RE.finditer(text))):
        letter = match.group(1)
        if letter not in letters:
            continue
        if letter == "A" and re.match(r"\s+[a-z]", text[match.end():]):
            continue  # "A planet rotates ..." - the article, not a choice
        return letter
    return None
