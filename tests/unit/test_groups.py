"""``radix_ext.groups``: the children of an ``n > 1`` request get one group, their own index and
their own seed; the scheduler's group registry is bounded and expires; answers are extracted."""

from __future__ import annotations

import re

import pytest

from radix_ext import groups
from rksc_sgl.protocol import GROUP_KEY, GroupPolicy, GroupTag, child_seed


def params(**fields):
    from sglang.srt.sampling.sampling_params import SamplingParams

    return SamplingParams(**{"max_new_tokens": 8, "n": 3, **fields})


class TestChildren:
    def test_children_of_one_prompt_share_a_group_and_count_their_index(self):
        shared = params(sampling_seed=7, custom_params={"other": 1})
        children = [groups.stamp_child(shared) for _ in range(3)]
        tags = [GroupTag.from_custom_params(c.custom_params) for c in children]
        assert [t.index for t in tags] == [0, 1, 2]
        assert len({t.id for t in tags}) == 1
        assert all(c.custom_params["other"] == 1 for c in children)
        assert shared.custom_params == {"other": 1}  # the shared object itself is untouched
        assert [c.sampling_seed for c in children] == [7, child_seed(7, 1), child_seed(7, 2)]
        assert len(set(c.sampling_seed for c in children)) == 3

    def test_two_prompts_get_two_groups(self):
        first, second = params(), params()
        a = groups.stamp_child(first)
        b = groups.stamp_child(second)
        assert a.custom_params[GROUP_KEY]["id"] != b.custom_params[GROUP_KEY]["id"]
        for p in (first, second):
            groups.stamp_child(p), groups.stamp_child(p)  # finish both expansions

    def test_unseeded_children_stay_unseeded(self):
        shared = params()
        assert all(groups.stamp_child(shared).sampling_seed is None for _ in range(3))

    def test_warm_ups_single_requests_and_beams_are_not_children(self):
        assert not groups.is_parallel_child(params(max_new_tokens=0))  # the prefix warm-up
        assert not groups.is_parallel_child(params(n=1))
        assert not groups.is_parallel_child(params(n=2, beam_width=2))
        assert groups.is_parallel_child(params())

    def test_the_child_seed_is_stable_and_in_the_int64_range(self):
        assert child_seed(7, 0) == 7
        assert child_seed(7, 1) == child_seed(7, 1) != child_seed(8, 1)
        assert all(0 <= child_seed(s, i) < 2**63 for s in (-5, 0, 2**63 - 1) for i in range(1, 50))

    def test_a_client_group_tag_with_n_above_1_is_refused(self):
        with pytest.raises(ValueError, match="custom_params.rksc_group cannot be sent with n > 1"):
            groups._check_request(None, params(custom_params={GROUP_KEY: {"id": "g", "index": 0}}))
        groups._check_request(None, params(n=1, custom_params={GROUP_KEY: {"id": "g", "index": 0}}))


class FakeReq:
    def __init__(self, done: bool = False) -> None:
        self.done = done

    def finished(self) -> bool:
        return self.done


POLICY = GroupPolicy(answer_pattern=r"answer is (\d+)", rule="esc", window=2)


class TestRegistry:
    def test_a_group_of_known_size_is_freed_once_all_arrived_and_finished(self):
        registry = groups.GroupRegistry()
        reqs = [FakeReq(), FakeReq()]
        for i, req in enumerate(reqs):
            registry.join(GroupTag("g", i), POLICY, req, size=2)
        reqs[0].done = True
        registry.release("g")
        assert registry.get("g") is not None  # one still runs
        reqs[1].done = True
        registry.release("g")
        assert registry.get("g") is None

    def test_a_group_of_unknown_size_stays_for_later_members_until_it_expires(self, monkeypatch):
        registry = groups.GroupRegistry(ttl_s=10)
        req = FakeReq(done=True)
        registry.join(GroupTag("g", 0), POLICY, req)
        registry.release("g")
        assert registry.get("g") is not None
        now = groups.time.monotonic()
        monkeypatch.setattr(groups.time, "monotonic", lambda: now + 11)
        registry.expire()
        assert len(registry) == 0

    def test_the_registry_is_bounded_oldest_first(self):
        registry = groups.GroupRegistry(max_groups=3)
        keep = [FakeReq() for _ in range(5)]
        for i, req in enumerate(keep):
            registry.join(GroupTag(f"g{i}", 0), POLICY, req)
        assert len(registry) == 3 and registry.get("g0") is None and registry.get("g4") is not None

    def test_votes_decide_by_the_policy(self):
        registry = groups.GroupRegistry()
        group = registry.join(GroupTag("g", 0), POLICY, FakeReq())
        assert not group.vote(0, "7")
        assert group.vote(1, "7")
        assert group.decided == "7"
        assert not group.vote(2, "3")  # decided once


class TestExtract:
    def test_the_last_match_and_its_first_group(self):
        assert groups.extract(groups.compile_pattern(r"answer is (\d+)"), "answer is 3, no: the answer is 42.") == "42"

    def test_a_pattern_without_groups_gives_the_whole_match(self):
        assert groups.extract(groups.compile_pattern(r"\d+"), "1 then 22") == "22"

    def test_no_match_is_no_answer(self):
        assert groups.extract(groups.compile_pattern(r"answer is (\d+)"), "I do not know") is None


def test_a_backtracking_answer_pattern_cannot_hold_the_scheduler():
    """A client's pattern runs in the scheduler loop. ``(a|aa)+$`` backtracks exponentially in
    ``regex`` too (1.2 s on 30 a's here without a timeout, ~1.6x per extra character). Matching
    is cut at ``MATCH_TIMEOUT_S`` and the member casts no vote."""
    import time

    pattern = groups.compile_pattern(r"(a|aa)+$")
    start = time.perf_counter()
    assert groups.extract(pattern, "a" * 34 + "b") is None
    assert time.perf_counter() - start < 1.0
