"""``radix_ext.stop.groups``: the children of an ``n > 1`` request get one group, their own index and
their own seed; the scheduler's group registry is bounded and expires; answers are extracted."""

from __future__ import annotations

import re

import pytest

from radix_ext.stop import groups
from rksc_sgl.protocol import child_seed
from rksc_sgl.stop_options import GROUP_KEY, GroupPolicy, GroupTag
from rksc_sgl.stop_rules import compile_pattern, read_answer


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
        group.record(0, "7")
        assert not group.decide()
        group.record(1, "7")
        assert group.decide()
        assert group.decided == "7"
        group.record(2, "3")
        assert not group.decide()  # decided once


class TestOneStepsFinishers:
    """Members that finish in the same scheduler step are all recorded before the vote is read:
    beta:0.9 decides {A, A, A} but not {A, A, A, D}, so reading after each member would decide
    or not by the order in which the scheduler happens to hold them."""

    @staticmethod
    def finish_in_one_step(order, monkeypatch, reason=None):
        from radix_ext.stop import stopper as early_stop

        class Tokenizer:
            def decode(self, ids, skip_special_tokens=True):
                return f"The answer is {ids[0]}."

        class Req:
            def __init__(self, index, answer):
                self.index, self.output_ids, self.finished_len = index, [answer], None
                self.tokenizer, self.finished_reason, self.to_finish, self.customized_info = Tokenizer(), None, None, None

            def finished(self):
                return self.finished_reason is not None

        registry = groups.GroupRegistry()
        monkeypatch.setattr(early_stop, "registry", registry)
        monkeypatch.setattr(early_stop, "_tracked", early_stop.weakref.WeakValueDictionary())
        policy = GroupPolicy(r"answer is (\w)", "beta", confidence=0.9, min_samples=2)
        answers = {0: "A", 1: "A", 2: "A", 3: "D"}
        reqs = {i: Req(i, a) for i, a in answers.items()} | {4: Req(4, "A")}  # member 4 still runs
        for i in [*order, 4]:
            tag = GroupTag("g", i)
            registry.join(tag, policy, reqs[i])
            setattr(reqs[i], early_stop.REQ_ATTR, early_stop.StopState(None, None, tag))
            early_stop._tracked[id(reqs[i])] = reqs[i]
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH

        for i in order:
            reqs[i].finished_reason = reason or FINISH_LENGTH(1)
        scheduler = type("Scheduler", (), {"waiting_queue": []})()
        early_stop._after_batch(None, scheduler)
        return registry.get("g"), reqs[4]

    @pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 0, 1, 2], [0, 3, 1, 2]])
    def test_the_vote_does_not_depend_on_the_order_of_one_steps_finishers(self, order, monkeypatch):
        group, running = self.finish_in_one_step(order, monkeypatch)
        assert group.answers == {0: "A", 1: "A", 2: "A", 3: "D"}
        assert group.decided is None and running.to_finish is None

    def test_a_decided_step_stops_the_members_still_running(self, monkeypatch):
        group, running = self.finish_in_one_step([0, 1, 2], monkeypatch)
        assert group.decided == "A" and running.to_finish is not None

    def test_a_step_without_a_new_vote_does_not_read_the_vote(self, monkeypatch):
        """Members that were aborted cast no vote, so their step leaves the vote unread."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        reads = []
        monkeypatch.setattr(groups.Group, "decide", lambda group: reads.append(group) or False)
        group, running = self.finish_in_one_step([0, 1], monkeypatch, reason=FINISH_ABORT("client left"))
        assert reads == [] and group.answers == {} and running.to_finish is None
        self.finish_in_one_step([0, 1], monkeypatch)
        assert len(reads) == 1  # one read for the step, however many members voted in it


class TestExtract:
    def test_the_last_match_and_its_first_group(self):
        assert read_answer(compile_pattern(r"answer is (\d+)"), "answer is 3, no: the answer is 42.") == "42"

    def test_a_pattern_without_groups_gives_the_whole_match(self):
        assert read_answer(compile_pattern(r"\d+"), "1 then 22") == "22"

    def test_no_match_is_no_answer(self):
        assert read_answer(compile_pattern(r"answer is (\d+)"), "I do not know") is None


def test_a_backtracking_answer_pattern_cannot_hold_the_scheduler():
    """A client's pattern runs in the scheduler loop. ``(a|aa)+$`` backtracks exponentially in
    ``regex`` too (1.2 s on 30 a's here without a timeout, ~1.6x per extra character). Matching
    is cut at ``MATCH_TIMEOUT_S`` and the member casts no vote."""
    import time

    pattern = compile_pattern(r"(a|aa)+$")
    start = time.perf_counter()
    assert read_answer(pattern, "a" * 34 + "b") is None
    assert time.perf_counter() - start < 1.0
