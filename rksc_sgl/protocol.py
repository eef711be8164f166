"""The wire protocol between reasoning programs and the scheduler: this module and the early
stop's options (``rksc_sgl.stop_options``), no torch and no SGLang, which both sides import
(``rksc_sgl`` on the client, ``radix_ext`` in the scheduler), so neither side imports the other.

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
  (``{"enabled": false}``). On the OpenAI routes the group may come instead in sglang-router's
  routing-key header (``ROUTING_KEY_HEADER``) as ``asks_routing_key(group)``, which pins the
  group to one worker behind the router and reaches the worker where ``custom_params`` may not
  (sglang-router 0.3.2 drops it from chat requests); a group in ``custom_params`` wins.

The early stop's entries (``rksc_group``, ``rksc_conf_stop``, ``rksc_group_policy``) and its
``rksc_stop`` report are in ``rksc_sgl.stop_options``, parsed by the same helpers.

Seeds of ``n > 1`` children: child ``i`` samples with ``child_seed(seed, i)`` (child 0 keeps the
request's own seed, so it draws what the same request with ``n = 1`` draws).

What comes back: ``meta_info`` keys ``rksc_exit_layer``, ``rksc_entropies``, ``rksc_layers_run``,
``rksc_batch_rows``, ``rksc_lens_logprobs`` and ``rksc_layer_calls`` (flagged requests),
``SAMPLE_MARGIN_KEY`` (with ``report_sampling_margins``), ``ASKS_KEY`` (a list with one dict: the
request's ASKS decision, see ``radix_ext.asks.decision``); in the server's internal state,
``KV_POOL_KEY`` (the KV pool's accounting), ``STATS_KEY`` (cache counters), ``DECODE_KEY`` (decode
steps by path, on the CPU) and ``CGEE_KEY`` (the server's CGEE thresholds, its ``--cgee-*`` flags:
what ``verify()`` uses when the program passes none).

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

BRANCH_KEY = "rksc"
EXIT_KEY = "rksc_early_exit"
KV_POOL_KEY = "rksc_kv_pool"
STATS_KEY = "rksc_cache"
CGEE_KEY = "rksc_cgee"  # {"tau_conf", "margin", "theta", "epsilon", "min_layer"}
SAMPLE_MARGIN_KEY = "rksc_sample_margin"
DECODE_KEY = "rksc_decode"  # internal state: decode steps by path (radix_ext.cpu.decode.stats)
ASKS_KEY = "rksc_asks"  # request option (AsksOptions) and meta_info report (radix_ext.asks.decision)
ROUTING_KEY_HEADER = "X-SMG-Routing-Key"  # sglang-router's sticky key (its manual policy pins each to one worker)
ASKS_ROUTING_PREFIX = "rksc-asks:"  # a routing key that names an ASKS group (asks_routing_key)


def custom_params_entry(custom_params: Any, key: str, fields: tuple[str, ...]) -> dict[str, Any] | None:
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


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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
        entry = custom_params_entry(custom_params, BRANCH_KEY, ("depth", "score"))
        if entry is None:
            return None
        if "depth" not in entry:
            raise ValueError(f"custom_params.{BRANCH_KEY} must be an object with a 'depth', got {entry!r}")
        return cls(depth=entry["depth"], score=entry.get("score"))


_FIELDS = ("theta", "epsilon", "min_layer", "full_depth", "lens", "lens_token_ids")


def _bad(field: str, expected: str, value: Any) -> ValueError:
    return ValueError(f"custom_params.{EXIT_KEY}.{field} must be {expected}, got {value!r}")


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
                if not is_number(value) or value < 0:
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
        values = custom_params_entry(custom_params, EXIT_KEY, _FIELDS)
        if values is None:
            return None
        if "lens_token_ids" in values:
            if not isinstance(values["lens_token_ids"], (list, tuple)):
                raise _bad("lens_token_ids", "a list of token ids", values["lens_token_ids"])
            values["lens_token_ids"] = tuple(values["lens_token_ids"])
        return cls(**values)


GROUP_MAX_CHARS = 128  # an ASKS substitution group's id


@dataclasses.dataclass(frozen=True)
class AsksOptions:
    """A request's ASKS options. ``group``: its substitution group, the only spans it may adopt
    a wording from or reuse KV from (and the only requests its own span commits may donate to); a
    request without one is never rewritten or blended, and its commits leave no signature
    (``docs/asks.md``). ``enabled=False`` keeps its prompt and KV exactly as computed.
    ``recompute``: under blend, this request's share of reused tokens recomputed (0 to 1; None:
    the server's ``--asks-recompute``). ``max_deviation``: under blend, this request's gate (a
    number > 0; None: the server's ``--asks-max-deviation``)."""

    enabled: bool = True
    group: str | None = None
    recompute: float | None = None
    max_deviation: float | None = None

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
        value = self.max_deviation
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or math.isnan(value) or value <= 0):
            raise ValueError(f"custom_params.{ASKS_KEY}.max_deviation must be a number > 0, got {value!r}")

    def to_custom_params(self, base: dict[str, Any] | None = None) -> dict[str, Any]:
        entry: dict[str, Any] = {"enabled": self.enabled}
        if self.group is not None:
            entry["group"] = self.group
        if self.recompute is not None:
            entry["recompute"] = float(self.recompute)
        if self.max_deviation is not None:
            entry["max_deviation"] = float(self.max_deviation)
        return {**(base or {}), ASKS_KEY: entry}

    @classmethod
    def from_custom_params(cls, custom_params: Any) -> "AsksOptions":
        values = custom_params_entry(custom_params, ASKS_KEY, ("enabled", "group", "recompute", "max_deviation"))
        return cls() if values is None else cls(**values)


def asks_routing_key(group: str) -> str:
    """The routing key (``ROUTING_KEY_HEADER``) of ASKS group ``group``'s requests on the OpenAI
    routes: behind sglang-router it keeps the group on one worker, and names the group there."""
    AsksOptions(group=group)  # ValueError naming the field
    return ASKS_ROUTING_PREFIX + group


def group_of_routing_key(key: Any) -> str | None:
    """The ASKS group a routing key names (``asks_routing_key``), None if it names none;
    ValueError if the group after the prefix is not a valid one."""
    if not isinstance(key, str) or not key.startswith(ASKS_ROUTING_PREFIX):
        return None
    group = key[len(ASKS_ROUTING_PREFIX):]
    try:
        return AsksOptions(group=group).group
    except ValueError:
        raise ValueError(f"{ROUTING_KEY_HEADER}: {ASKS_ROUTING_PREFIX!r} must be followed by an ASKS group of 1 to "
                         f"{GROUP_MAX_CHARS} characters, got {group!r}") from None


def child_seed(seed: int, index: int) -> int:
    """The sampling seed of child ``index`` of an ``n > 1`` request seeded ``seed``: the seed itself
    for child 0, else a stable hash of both (blake2b), in SGLang's int64 seed range."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # 63 bits: a non-negative int64
