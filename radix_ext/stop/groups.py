"""Request groups: the tokenizer stamps the children of an ``n > 1`` request; the scheduler keeps
each group's vote (``radix_ext.stop.stopper`` acts on it).

**Children of ``n > 1``.** SGLang expands such a request in ``TokenizerManager.
_handle_batch_request``: per prompt one warm-up request (``max_new_tokens = 0``), then ``n``
children, each a shallow copy of the prompt's tokenized request sharing one ``SamplingParams``
object, each given a fresh uuid rid: nothing links them or tells them apart, and all carry the
request's one seed (so our seeded sampler drew ``n`` identical samples). A BEFORE hook on
``TokenizerManager._send_one_request`` (called once per child, in order) recognises the children
by that shared object and gives each its own copy of it with ``custom_params["rksc_group"] =
{"id": <one uuid per prompt>, "index": i}`` and, when seeded, ``sampling_seed =
child_seed(seed, i)`` (``rksc_sgl.protocol``). A client's own ``rksc_group`` on an ``n > 1``
request is refused (the server names those groups).

**The scheduler's registry** (``GroupRegistry``): per group id, the policy the members carry,
the answers of the members that finished by themselves (by index), the live members, and, once
the vote is decided, the decision. It is bounded (``MAX_GROUPS``, oldest dropped first) and an
entry expires ``TTL_S`` after its last activity, so abandoned groups cannot accumulate.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import time
import uuid
import weakref
from typing import Any


from rksc_sgl import stop_rules
from rksc_sgl.protocol import child_seed
from rksc_sgl.stop_options import GROUP_KEY, GroupPolicy, GroupTag

SEND_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._send_one_request"
SAMPLING_VERIFY = "sglang.srt.sampling.sampling_params.SamplingParams.verify"
MAX_OPEN_EXPANSIONS = 1024  # n > 1 prompts whose children are being sent (normally a handful)
MAX_GROUPS = 4096
TTL_S = 600.0


# ---- tokenizer side: stamping the children of n > 1 ----------------------------------------

@dataclasses.dataclass
class _Expansion:
    params: Any  # the SamplingParams every child of one prompt shares (held, so its id stays unique)
    group_id: str
    sent: int = 0


_open: "collections.OrderedDict[int, _Expansion]" = collections.OrderedDict()


def is_parallel_child(params) -> bool:
    """Whether a tokenized request is a child of an ``n > 1`` expansion (not its warm-up, not a
    beam request, whose ``n`` counts returned beams)."""
    return (getattr(params, "n", 1) or 1) > 1 and (params.beam_width or 1) <= 1 and params.max_new_tokens != 0


def stamp_child(params) -> Any:
    """The child's own copy of the shared ``params``, tagged with its group and index, reseeded."""
    expansion = _open.get(id(params))
    if expansion is None or expansion.params is not params:
        expansion = _open[id(params)] = _Expansion(params, uuid.uuid4().hex)
        while len(_open) > MAX_OPEN_EXPANSIONS:  # an expansion that failed half-way
            _open.popitem(last=False)
    index = expansion.sent
    expansion.sent += 1
    if expansion.sent >= params.n:
        del _open[id(params)]
    child = copy.copy(params)
    child.custom_params = GroupTag(expansion.group_id, index).to_custom_params(params.custom_params)
    if params.sampling_seed is not None:
        child.sampling_seed = child_seed(params.sampling_seed, index)
    return child


def _stamp(manager, tokenized_obj, *args, **kwargs):
    params = getattr(tokenized_obj, "sampling_params", None)
    if params is not None and is_parallel_child(params):
        tokenized_obj.sampling_params = stamp_child(params)
    return None


def _check_request(result, sampling_params, *args, **kwargs):
    """``SamplingParams.verify`` check: the tag is well formed, and absent when ``n > 1``."""
    tag = GroupTag.from_custom_params(sampling_params.custom_params)  # ValueError -> HTTP 400
    if tag is not None and (sampling_params.n or 1) > 1:
        raise ValueError(f"custom_params.{GROUP_KEY} cannot be sent with n > 1: the server tags the "
                         f"children of an n > 1 request itself (one group per prompt)")
    return None


# ---- scheduler side: the registry ----------------------------------------------------------

def compile_patterns(policy: GroupPolicy | None) -> tuple[Any, ...] | None:
    """A policy's answer patterns, compiled (``stop_rules.compile_pattern``, cached), in order."""
    return None if policy is None else tuple(stop_rules.compile_pattern(p) for p in policy.patterns)


@dataclasses.dataclass
class Group:
    policy: GroupPolicy | None
    patterns: tuple[Any, ...] | None  # the policy's answer patterns, compiled once, in order (``compile_patterns``)
    answers: dict[int, str | None] = dataclasses.field(default_factory=dict)  # index -> answer
    members: "weakref.WeakValueDictionary[int, Any]" = dataclasses.field(default_factory=weakref.WeakValueDictionary)
    size: int | None = None  # members in all, when known (the n of an n > 1 request)
    arrived: int = 0
    decided: str | None = None  # the decided answer, once the vote is decided
    touched: float = dataclasses.field(default_factory=time.monotonic)

    def record(self, index: int, answer: str | None) -> None:
        """A finished member's answer (its vote is read with the others of its step: ``decide``)."""
        self.answers[index] = answer

    def decide(self) -> bool:
        """Read the vote over the answers recorded so far; True if this decided it. The scheduler
        reads it once per step, after every member that finished in that step was recorded, so
        the decision does not depend on the order in which one step's finishers are seen (the
        rules are not monotone: {A, A, A} may be decided where {A, A, A, D} is not)."""
        if self.decided is not None or self.policy is None:
            return False
        self.decided = stop_rules.decide(self.policy.rule, self.answers, window=self.policy.window,
                                         confidence=self.policy.confidence, min_samples=self.policy.min_samples)
        return self.decided is not None

    def running(self) -> list[Any]:
        return [req for req in self.members.values() if not req.finished()]


class GroupRegistry:
    """The live groups of one scheduler, by id, bounded and expiring."""

    def __init__(self, max_groups: int = MAX_GROUPS, ttl_s: float = TTL_S) -> None:
        self.max_groups, self.ttl_s = max_groups, ttl_s
        self._groups: "collections.OrderedDict[str, Group]" = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._groups)

    def get(self, group_id: str) -> Group | None:
        return self._groups.get(group_id)

    def join(self, tag: GroupTag, policy: GroupPolicy | None, req: Any, size: int | None = None) -> Group:
        """The member's group (created on its first member), with ``req`` registered in it;
        ``size``: how many members the group has in all, if known."""
        self.expire()
        group = self._groups.get(tag.id)
        if group is None:
            group = self._groups[tag.id] = Group(policy, compile_patterns(policy))
            while len(self._groups) > self.max_groups:
                self._groups.popitem(last=False)
        elif group.policy is None and policy is not None:  # the first member may have had none
            group.policy, group.patterns = policy, compile_patterns(policy)
        group.members[tag.index] = req
        group.size, group.arrived = size, group.arrived + 1
        self.touch(tag.id)
        return group

    def touch(self, group_id: str) -> None:
        group = self._groups.get(group_id)
        if group is not None:
            group.touched = time.monotonic()
            self._groups.move_to_end(group_id)

    def release(self, group_id: str) -> None:
        """Forget a group once every member arrived and none runs. A group of unknown size (a
        program's forks) stays until it expires: later members must still see its vote."""
        group = self._groups.get(group_id)
        if group is not None and group.size is not None and group.arrived >= group.size and not group.running():
            del self._groups[group_id]

    def expire(self) -> None:
        deadline = time.monotonic() - self.ttl_s
        while self._groups:
            oldest_id, oldest = next(iter(self._groups.items()))
            if oldest.touched >= deadline:
                break
            del self._groups[oldest_id]


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(SAMPLING_VERIFY, _check_request, HookType.AFTER)
    HookRegistry.register(SEND_TARGET, _stamp, HookType.BEFORE)
