"""``radix_ext.stop.abort_children``: an abort of an ``n > 1`` request, by its rid or by the client
going away, reaches every child (SGLang gives each a fresh rid)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from radix_ext.stop.abort_children import Families, _abort_with_children, _track_children


class FakeManager:
    """``rid_to_state`` and an ``abort_request`` that removes the rid, as SGLang's scheduler answer would."""

    def __init__(self, rids):
        self.rid_to_state = dict.fromkeys(rids, object())
        self.aborted: list[str] = []

    def abort_request(self, rid="", abort_all=False):
        self.aborted.append(rid)
        self.rid_to_state.pop(rid, None)


class TestFamilies:
    def test_children_are_found_by_the_client_rid_prefix(self):
        families = Families()
        families.add(["abc_0"], {"abc_0": 1, "u1": 2, "u2": 3})
        assert families.children_of("abc") == ["u1", "u2"]
        assert families.children_of("abc_0") == ["u1", "u2"]

    def test_an_empty_rid_matches_nothing(self):
        families = Families()
        families.add(["abc_0"], {"u1": 1})
        assert families.children_of("") == []

    def test_children_added_later_are_seen(self):
        families, children = Families(), {}
        families.add(["p"], children)
        children["late"] = 1  # SGLang fills the dict as it sends each child
        assert families.children_of("p") == ["late"]

    def test_removed_family_is_forgotten(self):
        families = Families()
        families.add(["p_0", "p_1"], {"u": 1})
        families.remove(["p_0", "p_1"])
        assert families.children_of("p") == []


def run_batch(manager, obj, request_states, outputs, close_after: int | None):
    """Drive ``_track_children`` over an original yielding ``outputs``; stop early after ``close_after``."""

    async def original(manager, obj, request, request_states):
        for out in outputs:
            yield out

    async def consume():
        gen = _track_children(original, manager, obj, None, request_states)
        seen = []
        async for out in gen:
            seen.append(out)
            if close_after is not None and len(seen) == close_after:
                await gen.aclose()  # what a disconnecting streaming client does
                break
        return seen

    return asyncio.run(consume())


class TestTracking:
    def test_a_batch_closed_early_aborts_its_running_children(self):
        manager = FakeManager(["u1", "u2"])
        obj = SimpleNamespace(rid=["p_0"], parallel_sample_num=2)
        run_batch(manager, obj, {"p_0": 0, "u1": 1, "u2": 2}, ["a", "b"], close_after=1)
        assert manager.aborted == ["u1", "u2"] and not manager.rid_to_state

    def test_a_finished_batch_aborts_nothing(self):
        manager = FakeManager([])
        obj = SimpleNamespace(rid=["p_0"], parallel_sample_num=2)
        assert run_batch(manager, obj, {"p_0": 0, "u1": 1}, ["a"], close_after=None) == ["a"]
        assert manager.aborted == []

    def test_an_abort_by_the_client_rid_reaches_the_children_while_running(self):
        manager = FakeManager(["u1", "u2", "other"])
        obj = SimpleNamespace(rid=["par_0"], parallel_sample_num=2)
        states = {"par_0": 0, "u1": 1, "u2": 2}

        async def original(manager, obj, request, request_states):
            _abort_with_children(FakeManager.abort_request, manager, "par")  # POST /abort_request mid-run
            yield "done"

        async def consume():
            return [out async for out in _track_children(original, manager, obj, None, states)]

        asyncio.run(consume())
        assert manager.aborted[:2] == ["u1", "u2"] and list(manager.rid_to_state) == ["other"]

    def test_single_requests_are_not_recorded(self):
        manager = FakeManager(["x"])
        obj = SimpleNamespace(rid=["x"], parallel_sample_num=1)
        run_batch(manager, obj, {"x": 0}, ["a", "b"], close_after=1)
        assert manager.aborted == []
