"""The wire protocol between reasoning programs and the scheduler: one small module, no torch and
no SGLang, that both sides import (``rksc_sgl`` on the client, ``radix_ext`` in the scheduler),
so neither side imports the other.

A request carries our options in SGLang's free-form ``sampling_params.custom_params``, which
reaches the scheduler's ``Req`` unchanged over HTTP (``/generate``, and the OpenAI-compatible
routes' ``custom_params``) and in-process (``Engine.async_generate``). Every entry is parsed by
its class's ``from_custom_params``, which raises ``ValueError`` naming the field: the plugin runs
these checks where SGLang validates sampling parameters, so a malformed entry is an HTTP 400.

* ``"rksc"`` (``BRANCH_KEY``): ``BranchTag``, a branch's fork depth and score (RSBCM eviction);
* ``"rksc_early_exit"`` (``EXIT_KEY``): ``EarlyExitParams``, a verification request's logit-lens
  early exit (CGEE level 2);
* ``"rksc_asks"`` (``ASKS_KEY``): ``AsksOptions``, a request's ASKS substitution group
  (``{"group": "<id>"}``: without one a request is never rewritten) and its opt-out
  (``{"enabled": false}``).
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

Seeds of ``n > 1`` children: child ``i`` samples with ``child_seed(seed, i)`` (child 0 keeps the
request's own seed, so it draws what the same request with ``n = 1`` draws).

A stopped request (trace confidence, or its group's vote) finishes through SGLang's normal path
with finish reason ``{"type": "abort", "status_code": null, "message": "rksc: ..."}`` (HTTP 200,
OpenAI ``finish_reason: "abort"``, partial text), and, unless streamed, ``meta_info["rksc_stop"]``
(``STOP_KEY``): a list with one dict, ``{"reason": "confidence" | "group", "at_token": int,
...}`` (``radix_ext.stop.stopper``). A group member refused at creation because its group was
already decided gets the same finish reason with ``at_token`` 0.

What comes back: ``meta_info`` keys ``rksc_exit_layer``, ``rksc_entropies``, ``rksc_layers_run``,
``rksc_batch_rows``, ``rksc_lens_logprobs`` and ``rksc_layer_calls`` (flagged requests),
``SAMPLE_MARGIN_KEY`` (with ``report_sampling_margins``), ``ASKS_KEY`` (a list with one dict: the
request's ASKS decision, see ``radix_ext.asks.decision``); in the server's internal state,
``KV_POOL_KEY`` (the KV pool's accounting), ``STATS_KEY`` (cache counters) and ``CGEE_KEY`` (the
server's CGEE thresholds, its ``--cgee-*`` flags: what ``verify()`` uses when the program passes none).

Early exit, in detail. A verification request asks for a logit-lens forward in its sampling parameters::

    custom_params = {"rksc_early_exit": {"theta": 2.0, "epsilon": 0.25, "min_layer": 8}}

Options (``EarlyExitParams``):

* ``theta``, ``epsilon``, ``min_layer``: exit after the first layer ``l >= min_layer`` whose lens
  entropy ``H_l < theta`` (nats) and ``|H_l - H_{l-1}| < epsilon``; the layers after ``l`` do not run.
* ``full_depth: true``: run every layer, still report the lens entropy of each (the reference
  that CGEE error is measured against, and what calibration replays the rule on).
* ``full_depth: true, lens: false``: run SGLang's own forward untouched; only the no-insert
  guarantee below applies (the cost baseline for full-depth verification).
* ``lens_token_ids``: report, per lens layer, the log-probabilities of these tokens (a verifier's
  "Yes"/"No"), so calibration can read the verdict any exit layer would have given.

Layers are numbered 1..L: layer ``l`` is the output of the ``l``-th decoder layer, so an exit
at ``L`` is a full-depth pass. A flagged request must generate exactly one token (its verdict):
the layers it skipped wrote no KV, so no later token may attend to it, and its KV is never
inserted into the radix tree.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any

import regex

from rksc_sgl.stop_rules import LETTER_NORMALIZATION_PREFIX, RULES as STOP_RULES

BRANCH_KEY = "rksc"
EXIT_KEY = "rksc_early_exit"
KV_POOL_KEY = "rksc_kv_pool"
STATS_KEY = "rksc_cache"
CGEE_KEY = "rksc_cgee"  # {"tau_conf", "margin", "theta", "epsilon", "min_layer"}
SAMPLE_MARGIN_KEY = "rksc_sample_margin"
ASKS_KEY = "rksc_asks"  # request option (AsksOptions) and meta_info report (radix_ext.asks.decision)
GROUP_KEY = "rksc_group"
CONF_STOP_KEY = "rksc_conf_stop"
GROUP_POLICY_KEY = "rksc_group_policy"
STOP_KEY = "rksc_stop"  # meta_info report of a stopped request (radix_ext.stop.stopper)
EARLY_STOP_STATE_KEY = "rksc_early_stop"  # internal state: tracked requests, groups (radix_ext.stop.stopper)
STOP_MESSAGE_PREFIX = "rksc: "  # finish_reason.message of a stopped request


def _entry(custom_params: Any, key: str, fields: tuple[str, ...]) -> dict[str, Any] | None:
    """``custom_params[key]`` as a dict of known ``fields``; None when absent; ValueError naming
    the entry when it (or ``custom_params`` itself) is not an object or has unknown fields."""
    if custom_params is None:
        return None
    if not isinstance(custom_params, dict):
        raise ValueError(f"custom_params must be an object, got {custom_params!r}")
    if custom_params.get(key) is None:
        return None
    entry = custom_params[key]
    if not isinstance(entry, dict):
        raise ValueError(f"custom_params.{key} must be an object, got {entry!r}")
    unknown = sorted(set(entry) - set(fields))
    if unknown:
        raise ValueError(f"custom_params.{key} has unknown field(s) {unknown}; known: {list(fields)}")
    return dict(entry)


@dataclasses.dataclass(frozen=True)
class BranchTag:
    """What one request tells the cache about its branch."""

    depth: int  # fork level: 0 for the program's root, 1 for its first fork, ...
    score: float | None = None  # in [0, 1]; None on ordinary gens

    def __post_init__(self) -> None:
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 0:
            raise ValueError(f"custom_params.{BRANCH_KEY}.depth must be an int >= 0, got {self.depth!r}")
        if self.score is not None:
            if isinstance(self.score, bool) or not isinstance(self.score, (int, float)) \
                    or not math.isfinite(self.score) or not 0.0 <= self.score <= 1.0:
                raise ValueError(
                    f"custom_params.{BRANCH_KEY}.score must be a number in [0, 1], got {self.score!r}"
                )

    def to_custom_params(self, base: dict[str, Any] | None = None) -> dict[str, Any]:
        """``base`` (other custom_params, kept) plus this tag under ``"rksc"``."""
        entry = {"depth": self.depth}
        if self.score is not None:
            entry["score"] = float(self.score)
        return {**(base or {}), BRANCH_KEY: entry}

    @classmethod
    def from_custom_params(cls, custom_params: Any) -> "BranchTag | None":
        """The tag of a request, None if it has none; ValueError naming the field if malformed."""
        entry = _entry(custom_params, BRANCH_KEY, ("depth", "score"))
        if entry is None:
            return None
        if "depth" not in entry:
            raise ValueError(f"custom_params.{BRANCH_KEY} must be an object with a 'depth', got {entry!r}")
        return cls(depth=entry["depth"], score=entry.get("score"))


_FIELDS = ("theta", "epsilon", "min_layer", "full_depth", "lens", "lens_token_ids")


def _bad(field: str, expected: str, value: Any) -> ValueError:
    return ValueError(f"custom_params.{EXIT_KEY}.{field} must be {expected}, got {value!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class EarlyExitParams:
    theta: float | None = None  # nats; required unless full_depth
    epsilon: float | None = None  # nats; required unless full_depth
    min_layer: int = 2  # earliest layer allowed to exit (>= 2: the rule needs H_{l-1})
    full_depth: bool = False
    lens: bool = True  # full_depth only: compute lens entropies at every layer
    lens_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("full_depth", "lens"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(name, "true or false", getattr(self, name))
        if not self.full_depth:
            if not self.lens:
                raise _bad("lens", "true when the request may exit early", self.lens)
            for name in ("theta", "epsilon"):
                value = getattr(self, name)
                if not _is_number(value) or value < 0:
                    raise _bad(name, "a number >= 0 (nats)", value)
        if isinstance(self.min_layer, bool) or not isinstance(self.min_layer, int) or self.min_layer < 2:
            raise _bad("min_layer", "an int >= 2", self.min_layer)
        ids = self.lens_token_ids
        if not isinstance(ids, tuple) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise _bad("lens_token_ids", "a list of token ids", ids)

    @property
    def uses_lens(self) -> bool:
        return self.lens or not self.full_depth

    def first_lens_layer(self, num_layers: int) -> int:
        """The first layer whose lens this request needs (exit mode starts one before min_layer)."""
        if self.full_depth:
            return 1 if self.lens else num_layers + 1
        if self.min_layer >= num_layers:  # reaching layer L is no exit: nothing to probe
            return num_layers + 1
        return self.min_layer - 1

    def should_exit(self, layer: int, entropy: float, previous: float | None) -> bool:
        """The stopping rule at ``layer`` given its lens entropy and the previous layer's."""
        if self.full_depth or layer < self.min_layer or previous is None:
            return False
        return entropy < self.theta and abs(entropy - previous) < self.epsilon

    def to_custom_params(self, base: dict[str, Any] | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {"min_layer": self.min_layer}
        if self.full_depth:
            entry.update(full_depth=True, lens=self.lens)
        else:
            entry.update(theta=float(self.theta), epsilon=float(self.epsilon))
        if self.lens_token_ids:
            entry["lens_token_ids"] = list(self.lens_token_ids)
        return {**(base or {}), EXIT_KEY: entry}

    @classmethod
    def from_custom_params(cls, custom_params: Any) -> "EarlyExitParams | None":
        """The options of a request, None if it asks for none; ValueError naming the field."""
        values = _entry(custom_params, EXIT_KEY, _FIELDS)
        if values is None:
            return None
        if "lens_token_ids" in values:
            if not isinstance(values["lens_token_ids"], (list, tuple)):
                raise _bad("lens_token_ids", "a list of token ids", values["lens_token_ids"])
            values["lens_token_ids"] = tuple(values["lens_token_ids"])
        return cls(**values)


GROUP_MAX_CHARS = 128
ANSWER_PATTERN_MAX_CHARS = 512  # compiled and matched in the scheduler loop (cached: stop_rules)
ANSWER_PATTERNS_MAX = 8  # patterns per group policy, tried in order on every finished member


@dataclasses.dataclass(frozen=True)
class AsksOptions:
    """A request's ASKS options. ``group``: its substitution group, the only spans it may adopt
    a wording from or reuse KV from (and the only requests its own span commits may donate to); a
    request without one is never rewritten or blended, and its commits leave no signature
    (``docs/asks.md``). ``enabled=False`` keeps its prompt and KV exactly as computed.
    ``recompute``: under blend, this request's share of reused tokens recomputed (0 to 1; None:
    the server's ``--asks-recompute``)."""

    enabled: bool = True
    group: str | None = None
    recompute: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"custom_params.{ASKS_KEY}.enabled must be true or false, got {self.enabled!r}")
        if self.group is not None and (not isinstance(self.group, str)
                                       or not 0 < len(self.group) <= GROUP_MAX_CHARS):
            raise ValueError(f"custom_params.{ASKS_KEY}.group must be a string of 1 to {GROUP_MAX_CHARS} "
                             f"characters, got {self.group!r}")
        value = self.recompute
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 <= value <= 1):
            raise ValueError(f"custom_params.{ASKS_KEY}.recompute must be a number in [0, 1], got {value!r}")

    def to_custom_params(self, base: dict[str, Any] | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {"enabled": self.enabled}
        if self.group is not None:
            entry["group"] = self.group
        if self.recompute is not None:
            entry["recompute"] = float(self.recompute)
        return {**(base or {}), ASKS_KEY: entry}

    @classmethod
    def from_custom_params(cls, custom_params: Any) -> "AsksOptions":
        values = _entry(custom_params, ASKS_KEY, ("enabled", "group", "recompute"))
        return cls() if values is None else cls(**values)


def child_seed(seed: int, index: int) -> int:
    """The sampling seed of child ``index`` of an ``n > 1`` request seeded ``seed``: the seed itself
    for child 0, else a stable hash of both (blake2b), in SGLang's int64 seed range."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # 63 bits: a non-negative int64


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
        entry = _entry(custom_params, GROUP_KEY, ("id", "index"))
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
        if not _is_number(self.threshold) or self.threshold < 0:
            raise ValueError(f"custom_params.{CONF_STOP_KEY}.threshold must be a number >= 0, got {self.threshold!r}")

    def to_custom_params(self, base: dict[str, Any] | None = None) -> dict[str, Any]:
        return {**(base or {}), CONF_STOP_KEY: dataclasses.asdict(self)}

    @classmethod
    def from_custom_params(cls, custom_params: Any) -> "ConfStop | None":
        entry = _entry(custom_params, CONF_STOP_KEY, ("window", "top_k", "threshold"))
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
        if not _is_number(self.confidence) or not 0.5 < self.confidence < 1.0:
            raise ValueError(f"custom_params.{key}.confidence must be a number in (0.5, 1), got {self.confidence!r}")

    @property
    def patterns(self) -> tuple[str, ...]:
        """``answer_pattern`` as an ordered tuple (one pattern: a tuple of one)."""
        return (self.answer_pattern,) if isinstance(self.answer_pattern, str) else self.answer_pattern

    def to_custom_params(self, base: dict[str, Any] | None = None) -> dict[str, Any]:
        return {**(base or {}), GROUP_POLICY_KEY: dataclasses.asdict(self)}

    @classmethod
    def from_custom_params(cls, custom_params: Any) -> "GroupPolicy | None":
        entry = _entry(custom_params, GROUP_POLICY_KEY,
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
