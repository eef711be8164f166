"""RSBCM eviction on SGLang's real radix tree: our RkscRadixCache over a fake KV allocator.

No model: tokens are small ints, KV slots are ids handed out by the test. Metadata is set with
the same functions the backend's ``checkpoint`` calls (``tag_own_nodes``, ``score_path``); the
request path that calls them is covered in ``test_backend_tree.py``.
"""

from __future__ import annotations

import itertools
import random
import time
import types
from array import array

import pytest
import torch
from sglang.srt.mem_cache import radix_cache
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from radix_ext.eviction.backend import RkscRadixCache, score_path, tag_own_nodes
from radix_ext.eviction.policy import RSBCMStrategy, importance
from rksc_sgl.protocol import BranchTag


class FakeAllocator:
    """Stands for SGLang's token-to-KV allocator: records the slots the tree frees, in order."""

    device = "cpu"

    def __init__(self) -> None:
        self.freed: list[int] = []

    def free_segment(self, indices, start_pos: int = 0) -> None:
        self.freed.extend(int(i) for i in indices)


@pytest.fixture(autouse=True)
def logical_clock(monkeypatch):
    """Every ``time.monotonic()`` of the radix tree returns the next integer: LRU order is exact."""
    ticks = itertools.count(1)
    clock = types.SimpleNamespace(monotonic=lambda: float(next(ticks)), perf_counter=time.perf_counter)
    monkeypatch.setattr(radix_cache, "time", clock)


class Tree:
    """Factory for test trees: named branches inserted as finished requests would leave them."""

    def __init__(self, policy: str = "rsbcm", **policy_config) -> None:
        """RSBCM in the paper's unbounded order unless a test sets ``horizon_s`` (``TestAgeing``)."""
        if policy == "rsbcm":
            policy_config.setdefault("horizon_s", None)
        self.allocator = FakeAllocator()
        params = CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=self.allocator,
            page_size=1, eviction_policy=policy, eviction_policy_config=policy_config or None,
        )
        self.cache = RkscRadixCache(params)
        self.slot_owner: dict[int, str] = {}
        self.next_slot = 0

    def add(self, name: str, tokens: list[int], depth: int | None = None, score: float | None = None):
        """Insert ``tokens``; the part not yet cached is branch ``name`` (tagged ``depth``)."""
        key = RadixKey(array("q", tokens))
        cached = self.cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len
        slots = torch.arange(self.next_slot, self.next_slot + len(tokens), dtype=torch.int64)
        self.next_slot += len(tokens)
        for slot in slots[cached:].tolist():
            self.slot_owner[slot] = name
        node = self.cache.insert(InsertParams(key=key, value=slots)).last_device_node
        if depth is not None:
            tag_own_nodes(node, self.cache.root_node, cached, depth)
        if score is not None:
            self.score(node, depth, score)
        return node

    def score(self, node, depth: int, score: float) -> None:
        score_path(node, self.cache.root_node, BranchTag(depth=depth, score=score))

    def touch(self, tokens: list[int]) -> None:
        self.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))

    def evict_one_leaf(self) -> list[str]:
        """Evict one leaf (a 1-token request always takes a whole leaf); the branches it freed."""
        before = len(self.allocator.freed)
        self.cache.evict(EvictParams(num_tokens=1))
        return sorted({self.slot_owner[s] for s in self.allocator.freed[before:]})

    def eviction_order(self) -> list[str]:
        """Evict leaf by leaf until nothing evictable is left; branch names in order of eviction."""
        order = []
        while self.cache.evictable_size() > 0:
            freed = self.evict_one_leaf()
            assert freed, "an eviction pass freed nothing although tokens were evictable"
            order += [name for name in freed if name not in order]
        return order


# Token sequences: a shared prompt and branches hanging off it.
PROMPT = [1, 2, 3, 4]


def branch(i: int, length: int = 3) -> list[int]:
    return PROMPT + [100 + 10 * i + k for k in range(length)]


class TestImportanceOrder:
    def test_lowest_importance_is_evicted_first(self):
        tree = Tree()
        tree.add("prompt", PROMPT)
        tree.add("good", branch(1), depth=1, score=0.9)
        tree.add("bad", branch(2), depth=1, score=0.2)
        tree.add("fair", branch(3), depth=1, score=0.5)
        assert tree.eviction_order()[:3] == ["bad", "fair", "good"]

    def test_deeper_branch_with_the_same_score_is_evicted_first(self):
        tree = Tree()
        tree.add("shallow", branch(1), depth=1, score=0.6)
        tree.add("deep", branch(2), depth=3, score=0.6)
        assert tree.eviction_order()[:2] == ["deep", "shallow"]

    def test_importance_is_score_over_depth_plus_one(self):
        assert importance(0.6, 2) == pytest.approx(0.2)
        tree = Tree()
        tree.add("root-level", branch(1), depth=0, score=0.3)  # 0.30
        tree.add("third-level", branch(2), depth=2, score=0.8)  # 0.27
        assert tree.eviction_order()[:2] == ["third-level", "root-level"]

    def test_equal_importance_falls_back_to_lru(self):
        tree = Tree()
        tree.add("older", branch(1), depth=1, score=0.5)
        tree.add("newer", branch(2), depth=1, score=0.5)
        assert tree.eviction_order()[:2] == ["older", "newer"]


class TestScoreUpdates:
    def test_score_reported_after_insert_changes_the_order(self):
        tree = Tree()
        first = tree.add("first", branch(1), depth=1)
        second = tree.add("second", branch(2), depth=1)
        tree.score(first, depth=1, score=0.9)
        tree.score(second, depth=1, score=0.1)
        assert tree.eviction_order()[:2] == ["second", "first"]

    def test_latest_report_wins(self):
        tree = Tree()
        a = tree.add("a", branch(1), depth=1, score=0.9)
        tree.add("b", branch(2), depth=1, score=0.5)
        tree.score(a, depth=1, score=0.1)
        assert tree.eviction_order()[:2] == ["a", "b"]


class TestUnscoredNodes:
    def test_unscored_nodes_evict_in_lru_order(self):
        tree = Tree()
        for i, name in enumerate(["a", "b", "c"], start=1):
            tree.add(name, branch(i), depth=1)
        tree.touch(branch(1))  # a becomes the most recently used
        assert tree.eviction_order()[:3] == ["b", "c", "a"]

    def test_unscored_nodes_rank_as_a_coin_flip_at_the_root_by_default(self):
        tree = Tree()
        tree.add("good-shallow", branch(1), depth=0, score=0.9)  # 0.90
        tree.add("unscored", branch(2), depth=1)  # 0.50
        tree.add("good-deep", branch(3), depth=1, score=0.9)  # 0.45
        assert tree.eviction_order()[:3] == ["good-deep", "unscored", "good-shallow"]

    def test_scratch_scored_zero_goes_first(self):
        tree = Tree()
        tree.add("pending", branch(1), depth=1)
        tree.add("verifier", branch(2), depth=2, score=0.0)
        tree.add("kept", branch(3), depth=1, score=0.8)
        assert tree.eviction_order()[:3] == ["verifier", "kept", "pending"]

    def test_unscored_first_when_configured(self):
        tree = Tree(unscored_importance=0.0)
        tree.add("scored-low", branch(1), depth=3, score=0.05)
        tree.add("unscored", branch(2), depth=1)
        assert tree.eviction_order()[:2] == ["unscored", "scored-low"]

    def test_unscored_importance_places_them_among_the_scores(self):
        tree = Tree(unscored_importance=0.3)
        tree.add("high", branch(1), depth=1, score=0.8)  # 0.40
        tree.add("unscored", branch(2), depth=1)  # 0.30
        tree.add("low", branch(3), depth=1, score=0.2)  # 0.10
        assert tree.eviction_order()[:3] == ["low", "unscored", "high"]

    def test_without_scores_rsbcm_evicts_exactly_like_lru(self):
        def workload(tree: Tree) -> list[str]:
            for i in range(1, 6):
                tree.add(f"b{i}", branch(i), depth=i % 3)
            tree.touch(branch(2))
            tree.touch(branch(4)[:5])
            return tree.eviction_order()

        assert workload(Tree("rsbcm")) == workload(Tree("lru"))
        assert workload(Tree("rsbcm", horizon_s=None)) == workload(Tree("lru"))

    def test_bad_unscored_importance_names_the_flag(self):
        with pytest.raises(ValueError, match="--radix-eviction-policy-config"):
            RSBCMStrategy(unscored_importance="high")


class TestAgeing:
    """Importance buys ``horizon_s`` seconds of residency at most (one clock tick = one second here)."""

    def test_an_idle_scored_node_loses_to_fresher_unscored_traffic(self):
        tree = Tree(horizon_s=10)
        tree.add("scored", branch(1), depth=0, score=1.0)  # key ~ t + 10
        tree.add("plain-soon", branch(2), depth=1)  # touched 1 tick later: key ~ t + 1 + 5
        for _ in range(8):
            tree.touch([9])  # the clock moves on (a miss touches nothing)
        tree.add("plain-later", branch(3), depth=1)  # ~11 ticks later: key ~ t + 11 + 5 > t + 10
        assert tree.eviction_order()[:3] == ["plain-soon", "scored", "plain-later"]

    def test_inside_the_horizon_importance_still_decides(self):
        tree = Tree(horizon_s=1000)
        tree.add("good", branch(1), depth=1, score=0.9)
        tree.add("bad", branch(2), depth=1, score=0.1)
        assert tree.eviction_order()[:2] == ["bad", "good"]

    def test_without_a_horizon_a_scored_node_outlives_any_unscored_one(self):
        tree = Tree(horizon_s=None)
        tree.add("scored", branch(1), depth=0, score=1.0)
        for _ in range(10_000):
            tree.touch([9])
        tree.add("plain", branch(2), depth=1)
        assert tree.eviction_order()[:2] == ["plain", "scored"]

    @pytest.mark.parametrize("horizon_s, starved", [(5, False), (None, True)])
    def test_a_client_scoring_everything_one_cannot_starve_plain_traffic(self, horizon_s, starved):
        """Client A streams fresh prefixes scored 1.0 at depth 0; client B asks for its own prompt
        every 10 requests. The pool holds 60 tokens. With a horizon B keeps hitting its cached
        prompt; without one (the unbounded order) A's scores push B out every time."""
        tree, capacity = Tree(horizon_s=horizon_s), 60
        b_prompt = [7, 7, 7, 7, 7]
        hits = visits = 0
        for step in range(400):
            if step % 10 == 0:
                cached = tree.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", b_prompt)))).device_prefix_len
                hits += cached == len(b_prompt)
                visits += 1
                tree.add("B", b_prompt)
            else:
                node = tree.add("A", [8, step, step + 1, step + 2, step + 3], depth=0, score=1.0)
                assert node is not None
            excess = tree.cache.total_size() - capacity
            if excess > 0:
                tree.cache.evict(EvictParams(num_tokens=excess))
        if starved:
            assert hits <= 1  # only while the pool was still filling up
        else:
            assert hits >= visits - 2  # the first visit misses; B's prompt stays resident after

    def test_default_horizon_is_a_minute(self):
        assert RSBCMStrategy().horizon_s == 60.0

    @pytest.mark.parametrize("bad", [0, -5, float("inf"), float("nan"), "600", True])
    def test_bad_horizon_names_the_flag_and_key(self, bad):
        with pytest.raises(ValueError, match="--radix-eviction-policy-config.*horizon_s"):
            RSBCMStrategy(horizon_s=bad)


class TestLocks:
    def test_locked_node_is_never_evicted(self):
        tree = Tree()
        tree.add("prompt", PROMPT)
        worst = tree.add("worst", branch(1), depth=3, score=0.0)
        tree.add("other", branch(2), depth=1, score=0.9)
        lock = tree.cache.lock(worst)
        order = tree.eviction_order()
        assert "worst" not in order and "prompt" not in order  # the lock holds the whole path
        assert tree.cache.protected_size() == len(branch(1))
        tree.cache.unlock(lock)
        assert tree.eviction_order() == ["worst", "prompt"]

    def test_evicting_more_than_is_evictable_leaves_locked_paths_alone(self):
        tree = Tree()
        kept = tree.add("kept", branch(1), depth=1, score=0.0)
        tree.add("free", branch(2), depth=1, score=1.0)
        tree.cache.lock(kept)
        tree.cache.evict(EvictParams(num_tokens=10_000))
        assert sorted(tree.slot_owner[s] for s in tree.allocator.freed) == ["free"] * 3


class TestTreeShape:
    def test_parent_becomes_evictable_when_its_last_child_goes(self):
        tree = Tree(unscored_importance=0.0)
        tree.add("prompt", PROMPT)  # unscored, so lowest: it would go first if it were a leaf
        tree.add("child-a", branch(1), depth=1, score=0.9)
        tree.add("child-b", branch(2), depth=1, score=0.8)
        assert tree.evict_one_leaf() == ["child-b"]
        assert tree.evict_one_leaf() == ["child-a"]
        assert tree.evict_one_leaf() == ["prompt"]

    def test_tree_stays_a_valid_radix_tree_under_random_work(self):
        rng = random.Random(0)
        tree = Tree()
        locks = []
        for step in range(300):
            tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 10))]
            depth = rng.randrange(4)
            score = rng.choice([None, rng.random()])
            node = tree.add(f"s{step}", tokens, depth=depth, score=score)
            if rng.random() < 0.1:
                locks.append(tree.cache.lock(node))
            if locks and rng.random() < 0.1:
                tree.cache.unlock(locks.pop(rng.randrange(len(locks))))
            if rng.random() < 0.3:
                tree.cache.evict(EvictParams(num_tokens=rng.randrange(1, 8)))
            assert_valid_radix_tree(tree.cache)
        in_tree = {int(s) for s in tree.cache.all_values_flatten()} if tree.cache.total_size() else set()
        assert in_tree.isdisjoint(tree.allocator.freed)  # nothing freed is still referenced


def assert_valid_radix_tree(cache: RkscRadixCache) -> None:
    """Structure and SGLang's size/leaf bookkeeping agree with a fresh walk of the tree."""
    evictable = protected = 0
    leaves = set()
    stack = [cache.root_node]
    while stack:
        node = stack.pop()
        for child_key, child in node.children.items():
            assert child.parent is node
            assert len(child.key) > 0 and child.value is not None
            assert len(child.value) == len(child.key)
            assert child_key == child.key.child_key(cache.page_size)
            assert child.lock_ref <= node.lock_ref or node is cache.root_node  # locks cover the path
            stack.append(child)
        if node is cache.root_node:
            continue
        if node.lock_ref > 0:
            protected += len(node.key)
        else:
            evictable += len(node.key)
            if not node.children:
                leaves.add(node)
    assert (cache.evictable_size(), cache.protected_size()) == (evictable, protected)
    assert cache.evictable_leaves == leaves
