"""The early stop's wire options (see ``rksc_sgl.protocol``, whose helpers parse them): what a
request carries in ``sampling_params.custom_params`` for the scheduler to stop it, or its group,
early, and what comes back when it did. No torch and no SGLang: both sides import it.

* ``"rksc_group"`` (``GROUP_KEY``): ``GroupTag`` ``{"id": str, "index": int}``, the group a request
  belongs to (the forks of one program, or the children of one ``n > 1`` request, which the server
  stamps itself: ``radix_ext.stop.groups``) and its index in it;
* ``"rksc_conf_stop"`` (``CONF_STOP_KEY``): ``ConfStop`` ``{"window", "top_k", "threshold"}``, a
  trace-confidence stop (DeepConf online): a token's confidence is ``-mean`` of its step's top-k
  log-probabilities, and the request stops once the mean over its last ``window`` tokens is below
  ``threshold``; it needs ``return_logprob`` and ``top_logprobs_num >= top_k``;
* ``"rksc_group_policy"`` (``GROUP_POLICY_KEY``): ``GroupPolicy`` ``{"answer_pattern", "rule",
  "window" (esc), "confidence" (beta), "min_samples", "answer_normalize"}``, carried by group
  members: once the vote over finished members' answers is decided (``rksc_sgl.stop_rules``), the
  scheduler stops the rest. A member's answer is read as the program's extractor reads it:
  ``answer_pattern`` is one regex or an ordered list of up to 8 (the first that matches wins, with
  its last match), ``answer_normalize`` ``"number"`` (``"1,000"`` -> ``"1000"``) or
  ``"letter:ABCD"`` (upper-cased, only those letters) or absent.

A stopped request (trace confidence, or its group's vote) finishes through SGLang's normal path
with finish reason ``{"type": "abort", "status_code": null, "message": "rksc: ..."}`` (HTTP 200,
OpenAI ``finish_reason: "abort"``, partial text), and, unless streamed, ``meta_info["rksc_stop"]``
(``STOP_KEY``): a list with one dict, ``{"reason": "confidence" | "group", "at_token": int,
...}`` (``radix_ext.stop.stopper``). A group member refused at creation because its group was
already decided gets the same finish reason with ``at_token`` 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import regex

from rksc_sgl.protocol import custom_params_entry, is_number
from rksc_sgl.stop_rules import LETTER_NORMALIZATION_PREFIX, RULES as STOP_RULES

GROUP_KEY = "rksc_group"
CONF_STOP_KEY = "rksc_conf_stop"
GROUP_POLICY_KEY = "rksc_group_policy"
STOP_KEY = "rksc_stop"  # meta_info report of a stopped request (radix_ext.stop.stopper)
EARLY_STOP_STATE_KEY = "rksc_early_stop"  # internal state: tracked requests, groups (radix_ext.stop.stopper)
STOP_MESSAGE_PREFIX = "rksc: "  # finish_reason.message of a stopped request
ANSWER_PATTERN_MAX_CHARS = 512  # compiled and matched in the scheduler loop (cached: stop_rules)
ANSWER_PATTERNS_MAX = 8  # patterns per group policy, tried in order on every finished member


def _int_at_least(key: str, field: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"custom_params.{key}.{field} must be an int >= {low}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class GroupTag:
    """The group of a request and its index in it."""

    id: str
    index: int

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not 0 < len(self.id) <= 256:
            raise ValueError(f"custom_params.{GROUP_KEY}.id must be a string of 1-256 characters, got {self.id!r}")
        _int_at_least(GROUP_KEY, "index", self.index, 0)

    def to_custom_params(self, base: dict[str, Any] | None = None) -> dict[str, Any]:
        return {**(base or {}), GROUP_KEY: {"id": self.id, "index": self.index}}

    @classmethod
    def from_custom_params(cls, custom_params: Any) -> "GroupTag | None":
        entry = custom_params_entry(custom_params, GROUP_KEY, ("id", "index"))
        if entry is None:
            return None
        missing = [f for f in ("id", "index") if f not in entry]
        if missing:
            raise ValueError(f"custom_params.{GROUP_KEY} needs {missing}, got {entry!r}")
        return cls(**entry)


@dataclasses.dataclass(frozen=True)
class ConfStop:
    """A trace-confidence stop: stop once the mean token confidence over the last ``window``
    tokens is below ``threshold`` (token confidence: ``-mean`` of the step's top-``top_k``
    log-probabilities, so higher is more confident)."""

    window: int
    top_k: int
    threshold: float

    def __post_init__(self) -> None:
        _int_at_least(CONF_STOP_KEY, "window", self.window, 1)
        _int_at_least(CONF_STOP_KEY, "top_k", self.top_k, 1)
        if not is_number(self.threshold) or self.threshold < 0:
            raise ValueError(f"custom_params.{CONF_STOP_KEY}.threshold must be a number >= 0, got {self.threshold!r}")

    def to_custom_params(self, base: dict[str, Any] | None = None) -> dict[str, Any]:
        return {**(base or {}), CONF_STOP_KEY: dataclasses.asdict(self)}

    @classmethod
    def from_custom_params(cls, custom_params: Any) -> "ConfStop | None":
        entry = custom_params_entry(custom_params, CONF_STOP_KEY, ("window", "top_k", "threshold"))
        if entry is None:
            return None
        missing = [f for f in ("window", "top_k", "threshold") if f not in entry]
        if missing:
            raise ValueError(f"custom_params.{CONF_STOP_KEY} needs {missing}, got {entry!r}")
        return cls(**entry)


def _check_pattern(field: str, pattern: Any) -> None:
    """One answer pattern of a group policy: a non-empty regex of at most ANSWER_PATTERN_MAX_CHARS."""
    key = GROUP_POLICY_KEY
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"custom_params.{key}.{field} must be a non-empty regex, got {pattern!r}")
    if len(pattern) > ANSWER_PATTERN_MAX_CHARS:
        raise ValueError(f"custom_params.{key}.{field} must be at most {ANSWER_PATTERN_MAX_CHARS} "
                         f"characters, got {len(pattern)}")
    try:  # the engine the scheduler matches with (rksc_sgl.stop_rules.compile_pattern)
        regex.compile(pattern)
    except regex.error as e:
        raise ValueError(f"custom_params.{key}.{field} is not a valid regex: {e}") from None


def _is_normalization(spec: Any) -> bool:
    """``"number"`` or ``"letter:"`` and 1-26 distinct capitals (``stop_rules.answer_normalizer``)."""
    if spec == "number":
        return True
    if not isinstance(spec, str) or not spec.startswith(LETTER_NORMALIZATION_PREFIX):
        return False
    letters = spec[len(LETTER_NORMALIZATION_PREFIX):]
    return bool(letters) and len(set(letters)) == len(letters) and all("A" <= c <= "Z" for c in letters)


@dataclasses.dataclass(frozen=True)
class GroupPolicy:
    """When a group's vote is decided: ``esc`` once a window of ``window`` members (by index) agree,
    ``beta`` once the leader stays the leader with posterior probability >= ``confidence``; never
    before ``min_samples`` members voted. A member's answer is read from its text with
    ``answer_pattern``, one regex or an ordered list of at most ``ANSWER_PATTERNS_MAX`` (a
    program's extractor's: ``programs.datasets.answers.answer_reading``), and
    ``answer_normalize`` (None, ``"number"`` or ``"letter:ABCD"``): the first pattern that gives
    an answer wins, with the last of its matches (group 1 if it has one) that normalises
    (``rksc_sgl.stop_rules.read_answer``)."""

    answer_pattern: str | tuple[str, ...]
    rule: str
    window: int = 3
    confidence: float = 0.95
    min_samples: int = 1
    answer_normalize: str | None = None

    def __post_init__(self) -> None:
        key = GROUP_POLICY_KEY
        if isinstance(self.answer_pattern, (list, tuple)):
            if not 1 <= len(self.answer_pattern) <= ANSWER_PATTERNS_MAX:
                raise ValueError(f"custom_params.{key}.answer_pattern must list 1 to {ANSWER_PATTERNS_MAX} "
                                 f"patterns, got {len(self.answer_pattern)}")
            object.__setattr__(self, "answer_pattern", tuple(self.answer_pattern))
            for i, pattern in enumerate(self.answer_pattern):
                _check_pattern(f"answer_pattern[{i}]", pattern)
        else:
            _check_pattern("answer_pattern", self.answer_pattern)
        if self.answer_normalize is not None and not _is_normalization(self.answer_normalize):
            raise ValueError(f"custom_params.{key}.answer_normalize must be null, \"number\" or \"letter:\" and "
                             f"distinct capital letters, got {self.answer_normalize!r}")
        if self.rule not in STOP_RULES:
            raise ValueError(f"custom_params.{key}.rule must be one of {list(STOP_RULES)}, got {self.rule!r}")
        _int_at_least(key, "window", self.window, 1)
        _int_at_least(key, "min_samples", self.min_samples, 1)
        if not is_number(self.confidence) or not 0.5 < self.confidence < 1.0:
            raise ValueError(f"custom_params.{key}.confidence must be a number in (0.5, 1), got {self.confidence!r}")

    @property
    def patterns(self) -> tuple[str, ...]:
        """``answer_pattern`` as an ordered tuple (one pattern: a tuple of one)."""
        return (self.answer_pattern,) if isinstance(self.answer_pattern, str) else self.answer_pattern

    def to_custom_params(self, base: dict[str, Any] | None = None) -> dict[str, Any]:
        return {**(base or {}), GROUP_POLICY_KEY: dataclasses.asdict(self)}

    @classmethod
    def from_custom_params(cls, custom_params: Any) -> "GroupPolicy | None":
        entry = custom_params_entry(custom_params, GROUP_POLICY_KEY,
                       ("answer_pattern", "rule", "window", "confidence", "min_samples", "answer_normalize"))
        if entry is None:
            return None
        missing = [f for f in ("answer_pattern", "rule") if f not in entry]
        if missing:
            raise ValueError(f"custom_params.{GROUP_POLICY_KEY} needs {missing}, got {entry!r}")
        return cls(**entry)


def stopped_by_runtime(meta_info: dict[str, Any] | None) -> bool:
    """Whether a response's ``meta_info`` says the runtime stopped the request early (a trace or
    group stop): its ``STOP_KEY`` report, or, where that is absent (a stream's last chunk), its
    finish reason's message."""
    if not meta_info:
        return False
    if meta_info.get(STOP_KEY):
        return True
    reason = meta_info.get("finish_reason")
    return isinstance(reason, dict) and str(reason.get("message") or "").startswith(STOP_MESSAGE_PREFIX)
