"""``radix_ext.asks.batching``: how prefill batches are built around blend members, on the real
tree and content index with SGLang's ``AddReqResult`` (the adder and the queue are the scheduler's
shapes, simulated)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sglang.srt.managers.schedule_policy import AddReqResult

from radix_ext.asks import batching, blend, segments as asks_segments
from rksc_sgl.protocol import AsksOptions
from tests.unit.test_asks_blend import GROUP, HEAD, OPEN_A, OTHER, SHARED, commit, make


class Req:  # a weak reference must reach it (``segments.members``)
    def __init__(self, rid: str, group: str | None = GROUP, recompute: float | None = None, extend: int = 290):
        self.rid, self.prefix_len = rid, 10
        self.full_untruncated_fill_ids = list(range(10 + extend))
        if group is not None:
            setattr(self, asks_segments.OPTIONS_ATTR, AsksOptions(group=group, recompute=recompute))


@pytest.fixture
def cache(monkeypatch):
    cache = make()
    monkeypatch.setattr(blend, "_live", [cache.asks])
    return cache


@pytest.fixture
def members():
    """Registers requests as members (grouped generating requests) while a test runs."""
    registered = []

    def register(*reqs):
        for req in reqs:
            if hasattr(req, asks_segments.OPTIONS_ATTR):
                asks_segments.members[req.rid] = req
                registered.append(req.rid)
        return reqs

    yield register
    for rid in registered:
        asks_segments.members.pop(rid, None)


def added(hook, adder, req) -> bool:
    """Whether ``hook`` lets ``req`` through to SGLang's ``add_one_req`` (here: always NO_TOKEN)."""
    return hook(lambda *a: AddReqResult.NO_TOKEN, adder, req) is not AddReqResult.CONTINUE


class TestHoldForWholePrefill:
    """A member that may blend and that a batch would chunk waits for a batch it fits in whole."""

    def test_a_member_whose_group_has_a_donor_to_find_waits_at_most_its_bound(self, cache, members):
        commit(cache, HEAD + OPEN_A + SHARED)
        adder = SimpleNamespace(rem_chunk_tokens=100, can_run_list=[object()])
        (req,) = members(Req("r"))
        held = [not added(batching.hold_for_whole_prefill, adder, req) for _ in range(batching.MAX_HOLDS + 1)]
        assert held == [True] * batching.MAX_HOLDS + [False]

    def test_a_member_of_a_group_without_indexed_text_is_never_delayed(self, cache, members):
        commit(cache, HEAD + OPEN_A + SHARED, group=OTHER)
        adder = SimpleNamespace(rem_chunk_tokens=100, can_run_list=[object()])
        assert added(batching.hold_for_whole_prefill, adder, *members(Req("r")))

    def test_nothing_is_held_when_it_fits_or_computes_everything_or_the_batch_is_empty(self, cache, members):
        commit(cache, HEAD + OPEN_A + SHARED)
        adder = SimpleNamespace(rem_chunk_tokens=100, can_run_list=[object()])
        assert added(batching.hold_for_whole_prefill, adder, *members(Req("whole", recompute=1.0)))
        adder.rem_chunk_tokens = 400
        assert added(batching.hold_for_whole_prefill, adder, *members(Req("fits")))
        adder.rem_chunk_tokens, adder.can_run_list = 100, []
        assert added(batching.hold_for_whole_prefill, adder, *members(Req("alone")))


class TestHoldOutOfBlendBatch:
    """A long request that may not blend waits out a batch holding a member that may, once."""

    def test_a_long_full_prefill_waits_out_one_batch_of_members(self, cache, members):
        commit(cache, HEAD + OPEN_A + SHARED)
        reader, finder = members(Req("reader"), Req("finder", group="fresh-problem"))
        adder = SimpleNamespace(rem_chunk_tokens=None, can_run_list=[reader])
        assert [added(batching.hold_out_of_blend_batch, adder, finder) for _ in range(3)] == [False, True, True]

    def test_a_request_of_no_group_is_never_held_for_another_clients_members(self, cache, members):
        commit(cache, HEAD + OPEN_A + SHARED)
        (reader,) = members(Req("reader"))
        adder = SimpleNamespace(rem_chunk_tokens=None, can_run_list=[reader])
        stranger = Req("stranger", group=None)
        assert [added(batching.hold_out_of_blend_batch, adder, stranger) for _ in range(2)] == [True, True]

    def test_short_requests_members_and_batches_without_members_pass(self, cache, members):
        commit(cache, HEAD + OPEN_A + SHARED)
        reader, other_reader, whole = members(Req("reader"), Req("other-reader"), Req("whole", recompute=1.0))
        short = Req("short", group=None, extend=batching.SIDE_ROWS)
        with_member = SimpleNamespace(rem_chunk_tokens=None, can_run_list=[reader])
        assert added(batching.hold_out_of_blend_batch, with_member, short)
        assert added(batching.hold_out_of_blend_batch, with_member, other_reader)  # it may blend too
        without = SimpleNamespace(rem_chunk_tokens=None, can_run_list=[whole])  # whole computes every token
        assert added(batching.hold_out_of_blend_batch, without, Req("long", group="fresh"))
        assert added(batching.hold_out_of_blend_batch, SimpleNamespace(rem_chunk_tokens=None, can_run_list=[]),
                     Req("first", group="fresh"))


class TestMembersFirst:
    """After SGLang's order: the requests whose hold is spent, the members that may blend, the rest."""

    @staticmethod
    def order(queue, priority_scheduling: bool = False) -> list[str]:
        policy = SimpleNamespace(enable_priority_scheduling=priority_scheduling)
        batching.members_first(lambda p, q, *a, **k: None, policy, queue, None, processed_tokens=0)
        return [req.rid for req in queue]

    def test_members_that_may_blend_go_first_in_sglangs_order(self, cache, members):
        commit(cache, HEAD + OPEN_A + SHARED)
        queue = list(members(Req("finder", group="fresh"), Req("r1"), Req("stranger", group=None), Req("r2")))
        assert self.order(queue) == ["r1", "r2", "finder", "stranger"]

    def test_a_request_whose_hold_is_spent_goes_before_them(self, cache, members):
        commit(cache, HEAD + OPEN_A + SHARED)
        queue = list(members(Req("r1"), Req("finder", group="fresh"), Req("stranger", group=None)))
        setattr(queue[2], batching.HOLDS_ATTR, batching.SIDE_HOLDS)
        assert self.order(queue) == ["stranger", "r1", "finder"]

    def test_nothing_moves_without_a_member_that_may_blend_or_under_priority_scheduling(self, cache, members):
        commit(cache, HEAD + OPEN_A + SHARED, group=OTHER)  # no text of GROUP indexed
        queue = list(members(Req("finder", group="fresh"), Req("r1")))
        assert self.order(queue) == ["finder", "r1"]
        commit(cache, HEAD + OPEN_A + SHARED)
        assert self.order(queue, priority_scheduling=True) == ["finder", "r1"]
        assert self.order(queue) == ["r1", "finder"]
