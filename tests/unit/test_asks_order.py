"""ASKS blend's prefill order (``radix_ext.asks.order``) on a simulated tree: which waiting members
are light, the queue's order, and which requests a batch holding a light member leaves queued."""

from __future__ import annotations

import dataclasses
from array import array
from types import SimpleNamespace

import pytest
from sglang.srt.managers.schedule_policy import AddReqResult

from radix_ext.asks import blend, order, segments as asks_segments
from rksc_sgl.protocol import AsksOptions
from tests.unit.test_asks_blend import GROUP, HEAD, OPEN_A, OPEN_B, OTHER, QUESTION, SHARED, commit, make, member


class Req:  # a weak reference must reach it (``segments.members``)
    def __init__(self, rid: str, tokens: list[int], group: str | None = GROUP, recompute: float | None = None):
        self.rid, self.origin_input_ids, self.output_ids = rid, array("q", tokens), []
        self.full_untruncated_fill_ids, self.prefix_len = list(tokens), 0
        self.extra_key = self.cache_salt = None
        if group is not None:
            setattr(self, asks_segments.OPTIONS_ATTR, AsksOptions(group=group, recompute=recompute))
            asks_segments.members[rid] = self


READER = HEAD + OPEN_B + SHARED + QUESTION  # another opening, then the text the group has computed
FRESH = HEAD + OPEN_B + list(range(300, 340)) + QUESTION  # text nobody has computed


@pytest.fixture
def cache(monkeypatch):
    cache = make()
    monkeypatch.setattr(blend, "_live", [cache.asks])
    member(cache, HEAD + OPEN_A + SHARED + QUESTION)
    yield cache
    asks_segments.members.clear()


def test_a_member_is_light_when_its_own_groups_text_covers_half_its_prompt(cache):
    assert order.is_light(Req("reader", READER), cache.asks)
    assert not order.is_light(Req("fresh", FRESH), cache.asks)
    assert not order.is_light(Req("other group", READER, group=OTHER), cache.asks)  # not its group's text
    assert not order.is_light(Req("no group", READER, group=None), cache.asks)
    assert not order.is_light(Req("computes all", READER, recompute=1.0), cache.asks)
    half = HEAD + OPEN_B + SHARED[:20] + list(range(300, 360))  # 20 of 85 tokens covered
    assert not order.is_light(Req("a fifth", half), cache.asks)


def test_the_prediction_is_made_once_per_request(cache):
    req = Req("reader", READER)
    assert order.is_light(req, cache.asks)
    asks_segments.members.pop("reader")  # would now predict False
    assert order.is_light(req, cache.asks)


def _ordered(queue):
    order.light_first(lambda policy, waiting, *a, **k: None, object(), queue)
    return [req.rid for req in queue]


def test_light_members_go_first_and_sglangs_order_holds_within_each_part(cache):
    queue = [Req("fresh-1", FRESH), Req("reader-1", READER), Req("plain", FRESH, group=None),
             Req("reader-2", READER), Req("fresh-2", FRESH)]
    assert _ordered(queue) == ["reader-1", "reader-2", "fresh-1", "plain", "fresh-2"]


def test_the_order_is_sglangs_when_switched_off_or_when_no_member_waits(cache, monkeypatch):
    queue = [Req("fresh", FRESH), Req("reader", READER)]
    monkeypatch.setattr(cache.asks, "blend", dataclasses.replace(cache.asks.blend, blend_first=False))
    assert _ordered(queue) == ["fresh", "reader"]
    monkeypatch.setattr(cache.asks, "blend", dataclasses.replace(cache.asks.blend, blend_first=True))
    plain = [Req("a", FRESH, group=None), Req("b", READER, group=None)]
    asks_segments.members.clear()
    assert _ordered(plain) == ["a", "b"]
    assert not any(hasattr(req, order.LIGHT_ATTR) for req in plain)  # nothing was predicted


def _added(adder, req) -> bool:
    def add(adder, req, *args, **kwargs):  # SGLang's add_one_req, as far as the hold can tell
        adder.can_run_list.append(req)
        return AddReqResult.NO_TOKEN

    return order.hold_behind_light(add, adder, req) is not AddReqResult.CONTINUE


def test_a_batch_holding_a_light_member_leaves_the_others_queued_at_most_max_holds_times(cache):
    reader, fresh, plain = Req("reader", READER), Req("fresh", FRESH), Req("plain", FRESH, group=None)
    _ordered([reader, fresh, plain])
    for _ in range(order.MAX_HOLDS):
        adder = SimpleNamespace(can_run_list=[], rem_chunk_tokens=None)
        assert _added(adder, reader)
        assert not _added(adder, fresh) and not _added(adder, plain)
        assert adder.can_run_list == [reader]
    adder = SimpleNamespace(can_run_list=[reader], rem_chunk_tokens=None)
    assert _added(adder, fresh) and _added(adder, plain)  # waited out MAX_HOLDS batches: joins


def test_a_batch_without_a_light_member_takes_everyone(cache):
    reader, fresh, plain = Req("reader", READER), Req("fresh", FRESH), Req("plain", FRESH, group=None)
    _ordered([reader, fresh, plain])
    adder = SimpleNamespace(can_run_list=[], rem_chunk_tokens=None)
    assert _added(adder, fresh) and _added(adder, plain) and _added(adder, reader)  # heavy first: no split
    assert getattr(fresh, order.HOLDS_ATTR, 0) == 0


# ---- heavy members in chunks, parked for light ones -------------------------------------------

class Adder(SimpleNamespace):
    def __init__(self, budget: int | None = 4096):
        super().__init__(can_run_list=[], rem_chunk_tokens=budget, new_chunked_req=None, chunked_req_limit=None)


def _admit(adder, req, has_chunked_req: bool = False):
    """``hold_behind_light`` over SGLang's admission as far as the budget goes: a request longer
    than what is left of the chunk budget is cut there and becomes the batch's chunked request."""
    def add(adder, req, *args, **kwargs):
        extend = len(req.full_untruncated_fill_ids) - req.prefix_len
        req.taken = extend if adder.rem_chunk_tokens is None else min(extend, adder.rem_chunk_tokens)
        if req.taken < extend:
            adder.new_chunked_req = req
        if adder.rem_chunk_tokens is not None:
            adder.rem_chunk_tokens -= req.taken
        adder.can_run_list.append(req)
        return AddReqResult.CONTINUE

    return order.hold_behind_light(add, adder, req, has_chunked_req=has_chunked_req, truncation_align_size=None)


HEAVY = list(range(500, 900))  # 400 tokens of its own group's first text


@pytest.fixture
def light_seen(cache, monkeypatch):
    monkeypatch.setitem(order._round, "last_light", order.time.monotonic())
    monkeypatch.setitem(order._round, "light_waiting", False)
    return cache


def test_while_light_members_come_a_heavy_member_prefills_one_chunk_that_ends_its_batch(light_seen):
    adder = Adder()
    heavy = Req("heavy", HEAVY, group="fresh")
    assert not order.is_light(heavy, light_seen.asks)  # its group has no text: nothing to reuse
    assert _admit(adder, heavy) is AddReqResult.CONTINUE and heavy.taken == order.HEAVY_CHUNK
    assert adder.new_chunked_req is heavy and adder.rem_chunk_tokens == 0
    assert getattr(heavy, order.CHUNKED_ATTR) and light_seen.asks.blend_counters.chunked_requests == 1
    plain, small = Req("plain", HEAVY, group=None), Req("small", HEAVY[:100], group="fresh")
    partly = Req("partly", HEAD + OPEN_B + SHARED[:20] + HEAVY)  # covers a little: keeps its reuse whole
    for req in (plain, small, partly):
        order.is_light(req, light_seen.asks)
        adder = Adder()
        _admit(adder, req)
        assert req.taken == len(req.full_untruncated_fill_ids) and adder.new_chunked_req is None


def test_without_light_members_lately_or_chunked_prefill_a_heavy_member_prefills_whole(light_seen, monkeypatch):
    monkeypatch.setitem(order._round, "last_light", order.time.monotonic() - order.LIGHT_WINDOW_S - 1)
    heavy = Req("heavy", HEAVY, group="fresh")
    order.is_light(heavy, light_seen.asks)
    _admit(Adder(), heavy)
    assert heavy.taken == len(HEAVY)
    monkeypatch.setitem(order._round, "last_light", order.time.monotonic())
    heavy = Req("heavy-2", HEAVY, group="fresh")
    order.is_light(heavy, light_seen.asks)
    _admit(Adder(budget=None), heavy)
    assert heavy.taken == len(HEAVY)


def test_while_a_chunk_runs_nothing_else_is_chunked_and_a_second_heavy_member_waits(light_seen):
    adder = Adder(budget=200)
    heavy, plain_long = Req("heavy", HEAVY, group="fresh"), Req("plain-long", HEAVY, group=None)
    plain = Req("plain", HEAVY[:50], group=None)
    order.is_light(heavy, light_seen.asks)
    assert _admit(adder, heavy, has_chunked_req=True) is AddReqResult.CONTINUE and adder.can_run_list == []
    assert _admit(adder, plain_long, has_chunked_req=True) is AddReqResult.CONTINUE and adder.can_run_list == []
    _admit(adder, plain, has_chunked_req=True)
    assert adder.can_run_list == [plain] and adder.new_chunked_req is None


def _continue(adder, req):
    return order.park_for_light(lambda adder, req: adder.can_run_list.append(req), adder, req)


def test_a_chunk_sits_out_rounds_in_which_a_light_member_waits_at_most_max_holds_in_a_row(light_seen, monkeypatch):
    heavy = Req("heavy", HEAVY, group="fresh")
    setattr(heavy, order.CHUNKED_ATTR, True)
    monkeypatch.setitem(order._round, "light_waiting", True)
    for _ in range(order.MAX_HOLDS):
        adder = Adder()
        assert _continue(adder, heavy) is heavy and adder.can_run_list == []
        assert getattr(heavy, order.PARKED_ATTR)
    adder = Adder()
    _continue(adder, heavy)
    assert adder.can_run_list == [heavy] and adder.chunked_req_limit == order.HEAVY_CHUNK
    assert not getattr(heavy, order.PARKED_ATTR)
    assert _continue(Adder(), heavy) is heavy  # it moved: it may sit out again
    monkeypatch.setitem(order._round, "light_waiting", False)
    adder = Adder()
    _continue(adder, heavy)
    assert adder.can_run_list == [heavy]
    plain = Req("plain", HEAVY, group=None)  # SGLang's own chunked request: never parked nor capped
    monkeypatch.setitem(order._round, "light_waiting", True)
    adder = Adder()
    _continue(adder, plain)
    assert adder.can_run_list == [plain] and adder.chunked_req_limit is None


def test_a_parked_chunk_gets_back_the_middle_chunk_the_scheduler_counted_for_it(light_seen):
    heavy, reader = Req("heavy", HEAVY, group="fresh"), Req("reader", READER)
    heavy.inflight_middle_chunks = 1  # counted by the scheduler as it built the batch
    setattr(heavy, order.PARKED_ATTR, True)
    built = order.uncount_parked_chunk(lambda cls, reqs, **kwargs: reqs, object, [reader], chunked_req=heavy)
    assert built == [reader] and heavy.inflight_middle_chunks == 0
    heavy.inflight_middle_chunks = 1
    order.uncount_parked_chunk(lambda cls, reqs, **kwargs: reqs, object, [reader], chunked_req=heavy)
    assert heavy.inflight_middle_chunks == 1  # once per parked round
    setattr(heavy, order.PARKED_ATTR, True)
    order.uncount_parked_chunk(lambda cls, reqs, **kwargs: reqs, object, [heavy, reader], chunked_req=heavy)
    assert heavy.inflight_middle_chunks == 1  # in the batch: its result counts it back
