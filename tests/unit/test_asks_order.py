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
        adder = SimpleNamespace(can_run_list=[])
        assert _added(adder, reader)
        assert not _added(adder, fresh) and not _added(adder, plain)
        assert adder.can_run_list == [reader]
    adder = SimpleNamespace(can_run_list=[reader])
    assert _added(adder, fresh) and _added(adder, plain)  # waited out MAX_HOLDS batches: joins


def test_a_batch_without_a_light_member_takes_everyone(cache):
    reader, fresh, plain = Req("reader", READER), Req("fresh", FRESH), Req("plain", FRESH, group=None)
    _ordered([reader, fresh, plain])
    adder = SimpleNamespace(can_run_list=[])
    assert _added(adder, fresh) and _added(adder, plain) and _added(adder, reader)  # heavy first: no split
    assert getattr(fresh, order.HOLDS_ATTR, 0) == 0
