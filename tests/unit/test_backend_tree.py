"""RkscRadixCache's overrides of SGLang's RadixCache, and the SGLang behaviour they rely on.

Requests are driven through the real ``checkpoint`` as SGLang's scheduler drives them (match and
lock at admission, checkpoint after prefill, checkpoint and release at finish) over fake pools.
``TestSGLangContract`` pins what our overrides assume of SGLang 0.5.23: if one of those tests
fails after an upgrade, the override next to it needs a look.
"""

from __future__ import annotations

import pkgutil
import types
from array import array

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.evict_policy import LFUStrategy, LRUStrategy
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey, TreeNode
from sglang.srt.mem_cache.utils import get_eviction_strategy

from radix_ext import plugin, seams
from radix_ext.eviction import stats
from radix_ext.eviction.backend import RkscRadixCache, build_cache
from radix_ext.eviction.policy import RSBCMStrategy, node_depth, node_score
from rksc_sgl.program_state import branch_options
from rksc_sgl.protocol import BranchTag
from rksc_sgl.scores import report_score


class FakeAllocator:
    device = "cpu"

    def __init__(self) -> None:
        self.next_slot = 0
        self.freed: list[int] = []

    def alloc(self, n: int) -> torch.Tensor:
        slots = torch.arange(self.next_slot, self.next_slot + n, dtype=torch.int64)
        self.next_slot += n
        return slots

    def free_segment(self, indices, start_pos: int = 0) -> None:
        self.freed.extend(int(i) for i in indices)


class FakeReqToTokenPool:
    def __init__(self) -> None:
        self.req_to_token = torch.zeros((64, 256), dtype=torch.int64)
        self.rows_taken = 0

    def take_row(self) -> int:
        self.rows_taken += 1
        return self.rows_taken - 1

    def write(self, indices, values) -> None:
        self.req_to_token[indices] = values


def make_cache(policy: str = "rsbcm", *, disable: bool = False, config=None, rsbcm: bool = False, cls=RkscRadixCache):
    params = CacheInitParams(
        disable=disable, req_to_token_pool=FakeReqToTokenPool(), token_to_kv_pool_allocator=FakeAllocator(),
        page_size=1, eviction_policy=policy, eviction_policy_config=config,
    )
    return cls(params, rsbcm=rsbcm) if cls is RkscRadixCache else cls(params)


def make_req(prompt: list[int], depth: int | None = None, score: float | None = None):
    """A stand-in for SGLang's ``Req`` with the fields RadixCache.checkpoint reads."""
    tag = None if depth is None else BranchTag(depth=depth, score=score).to_custom_params()
    req = types.SimpleNamespace(
        rid=f"req-{id(prompt)}", origin_input_ids=array("q", prompt), output_ids=array("q"),
        extra_key=None, cache_salt=None, priority=None, lock=None, last_node=None, prefix_len=0,
        sampling_params=types.SimpleNamespace(custom_params=tag), finished_reason=None,
        kv=types.SimpleNamespace(req_pool_idx=0, cache_inserted_len=0, cache_protected_len=0, swa_evict_floor=0),
    )
    req.finished = lambda: req.finished_reason is not None
    return req


def admit(cache, prompt: list[int], depth=None, score=None):
    """Admission (Req.init_next_round_input + PrefillAdder): match all but the last token, lock,
    fill the request's row with the cached prefix and fresh slots for the rest."""
    req = make_req(prompt, depth, score)
    pool, allocator = cache.req_to_token_pool, cache.token_to_kv_pool_allocator
    req.kv.req_pool_idx = pool.take_row()
    match = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", prompt[:-1]))))
    req.prefix_len = req.kv.cache_protected_len = match.device_prefix_len
    req.last_node, req.lock = match.last_device_node, cache.lock(match.last_device_node)
    row = pool.req_to_token[req.kv.req_pool_idx]
    row[: req.prefix_len] = cache.path_device_indices(req.last_node)[: req.prefix_len]
    row[req.prefix_len : len(prompt)] = allocator.alloc(len(prompt) - req.prefix_len)
    req.full_untruncated_fill_ids = array("q", prompt)
    return req


def finish(cache, req, output: list[int] = (), reason=None):
    """Prefill, decode ``output`` and release with checkpoint, as the scheduler does; ``reason``:
    the finish reason (default: a stop token's)."""
    from sglang.srt.managers.schedule_batch import FINISH_MATCHED_TOKEN

    prompt = list(req.origin_input_ids)
    allocator = cache.token_to_kv_pool_allocator
    row = cache.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
    if output:  # prefill done, not finished: checkpoint_kv_cache
        cache.checkpoint(req, up_to=len(prompt))
        req.prefix_len = len(prompt)
        req.output_ids = array("q", output)
        row[len(prompt) : len(prompt) + len(output) - 1] = allocator.alloc(len(output) - 1)
    owned = len(prompt) + max(len(output) - 1, 0)  # the last output token never gets KV
    req.full_untruncated_fill_ids = array("q", prompt + list(output))
    req.finished_reason = reason or FINISH_MATCHED_TOKEN(matched=0)
    cache.checkpoint(req, up_to=owned)  # release_kv_cache(checkpoint=True)
    allocator.free_segment(row[req.kv.cache_protected_len : owned])
    cache.unlock(req.lock)
    req.lock = None
    return req


def run_request(cache, prompt: list[int], output: list[int] = (), depth=None, score=None):
    """One request from admission to release, alone."""
    return finish(cache, admit(cache, prompt, depth, score), output)


def path_metadata(cache, tokens: list[int]) -> list[tuple]:
    """``(num_tokens, depth, score)`` runs along ``tokens``' path, root first (where SGLang splits
    nodes is its business: consecutive nodes with the same metadata are merged)."""
    node = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens)))).last_device_node
    runs: list[list] = []
    while node is not cache.root_node:
        meta = [node_depth(node), node_score(node)]
        if runs and runs[-1][1:] == meta:
            runs[-1][0] += len(node.key)
        else:
            runs.append([len(node.key), *meta])
        node = node.parent
    return [tuple(run) for run in reversed(runs)]


# A program's requests, as SGLang's frontend sends them: fork() first sends the shared text as a
# zero-token request, then each branch's gen sends it plus the assistant header; the last
# generated token never gets KV (generation stops before computing it).
PROMPT = list(range(1, 11))  # 10 tokens: system + question
HEADER = [50]  # "<|im_start|>assistant\n"
STEP1 = [21, 22, 23, 24]  # a first-level thought
STEP2 = [31, 32, 33]  # a second-level thought extending STEP1
STOP = [0]  # the last generated token


def level1(cache, thought=STEP1, score=None):
    """Commit the prompt, generate a level-1 thought, optionally report its score; its text."""
    run_request(cache, PROMPT)
    run_request(cache, PROMPT + HEADER, output=thought + STOP, depth=1)
    text = PROMPT + HEADER + thought
    if score is not None:
        run_request(cache, text, depth=1, score=score)
    return text


class TestDepthTagging:
    def test_gen_tags_only_the_tokens_it_computed(self):
        cache = make_cache()
        level1(cache)
        assert path_metadata(cache, PROMPT + HEADER + STEP1) == [(10, None, None), (5, 1, None)]

    def test_request_without_tag_leaves_nodes_untagged(self):
        cache = make_cache()
        run_request(cache, PROMPT, output=STEP1 + STOP)
        assert path_metadata(cache, PROMPT + STEP1) == [(14, None, None)]

    def test_later_request_leaves_the_prefix_it_found_alone(self):
        cache = make_cache()
        run_request(cache, PROMPT)
        run_request(cache, PROMPT + STEP1, depth=2)
        run_request(cache, PROMPT + STEP1 + STEP2, depth=1)
        assert path_metadata(cache, PROMPT + STEP1 + STEP2) == [(10, None, None), (4, 2, None), (3, 1, None)]

    def test_tokens_two_concurrent_branches_computed_keep_the_shallower_depth(self):
        cache = make_cache()
        run_request(cache, PROMPT)
        deep = admit(cache, PROMPT + STEP1, depth=2)
        shallow = admit(cache, PROMPT + STEP1 + STEP2, depth=1)  # admitted before `deep` inserted
        finish(cache, deep)
        finish(cache, shallow)
        assert path_metadata(cache, PROMPT + STEP1 + STEP2) == [(10, None, None), (7, 1, None)]

    def test_gen_sent_with_a_score_scores_its_own_tokens_at_once(self):
        cache = make_cache()
        text = level1(cache)
        run_request(cache, text + [60], output=[1, 2, 3], depth=2, score=0.0)  # a verifier fork
        assert path_metadata(cache, text + [60, 1, 2]) == [(10, None, None), (5, 1, None), (3, 2, 0.0)]
        assert cache.score_reports == 1  # one request, though it checkpoints after prefill and at its end

    def test_disabled_cache_ignores_tags(self):
        cache = make_cache(disable=True)
        run_request(cache, PROMPT, output=STEP1 + STOP, depth=1, score=0.5)
        assert cache.total_size() == 0 and cache.score_reports == 0


class TestScoreReports:
    def test_report_scores_the_branch_path_inserted_earlier(self):
        cache = make_cache()
        text1 = level1(cache)
        run_request(cache, text1, output=STEP2 + STOP, depth=2)  # a level-2 thought extends it
        text2 = text1 + STEP2
        run_request(cache, text2, depth=2, score=0.8)  # report_score's zero-token request
        assert path_metadata(cache, text2) == [(10, None, None), (5, 1, None), (3, 2, 0.8)]
        run_request(cache, text1, depth=1, score=0.6)
        assert path_metadata(cache, text2) == [(10, None, None), (5, 1, 0.6), (3, 2, 0.8)]
        assert cache.score_reports == 2

    def test_report_reaching_new_text_scores_it_too(self):
        cache = make_cache()
        text = level1(cache)
        run_request(cache, text + [99], depth=1, score=0.4)  # the text re-tokenised with one more token
        assert path_metadata(cache, text + [99]) == [(10, None, None), (6, 1, 0.4)]

    def test_reported_scores_decide_eviction(self):
        cache = make_cache()
        good = level1(cache, STEP1, score=0.9)
        bad = level1(cache, STEP2, score=0.1)
        cache.evict(EvictParams(num_tokens=len(STEP2)))
        cached = [cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", t)))).device_prefix_len
                  for t in (good, bad)]
        assert cached == [len(good), len(PROMPT) + len(HEADER)]


class TestSplitAndReset:
    def test_split_keeps_depth_and_score_on_both_halves(self):
        cache = make_cache()
        text = level1(cache, score=0.7)
        nodes_before = len(path_to(cache, text))
        run_request(cache, PROMPT + HEADER + STEP1[:2] + [77])  # diverges inside the thought: a split
        assert len(path_to(cache, text)) == nodes_before + 1
        assert path_metadata(cache, text) == [(10, None, None), (5, 1, 0.7)]

    def test_reset_drops_metadata_and_report_count(self):
        cache = make_cache()
        level1(cache, score=0.5)
        cache.reset()
        assert cache.total_size() == 0 and cache.score_reports == 0
        run_request(cache, PROMPT)
        assert path_metadata(cache, PROMPT) == [(10, None, None)]


def path_to(cache, tokens: list[int]) -> list:
    node = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens)))).last_device_node
    path = []
    while node is not cache.root_node:
        path.append(node)
        node = node.parent
    return path


class TestConstruction:
    def test_rsbcm_policy_installs_the_rsbcm_strategy(self):
        cache = make_cache("rsbcm", config={"unscored_importance": 0.2})
        assert isinstance(cache.eviction_strategy, RSBCMStrategy)
        assert cache.eviction_strategy.unscored_importance == 0.2
        assert cache.eviction_policy == "rsbcm"

    def test_rsbcm_switch_with_default_policy_installs_it_too(self):
        cache = make_cache("lru", rsbcm=True, config={"unscored_importance": 0.1})
        assert isinstance(cache.eviction_strategy, RSBCMStrategy) and cache.eviction_policy == "rsbcm"
        assert cache.eviction_strategy.unscored_importance == 0.1

    def test_rsbcm_switch_with_another_policy_is_rejected_naming_both_flags(self):
        with pytest.raises(ValueError, match="--rsbcm.*--radix-eviction-policy lfu"):
            make_cache("lfu", rsbcm=True)

    @pytest.mark.parametrize("policy, strategy", [("lru", LRUStrategy), ("lfu", LFUStrategy)])
    def test_stock_policies_keep_sglangs_strategy(self, policy, strategy):
        assert type(make_cache(policy).eviction_strategy) is strategy

    def test_factory_rejects_hybrid_models(self):
        ctx = types.SimpleNamespace(is_hybrid_swa=True, is_hybrid_ssm=False, enable_hierarchical_cache=False)
        with pytest.raises(ValueError, match="--radix-cache-backend rksc"):
            build_cache(ctx)


class TestWireFormat:
    @pytest.mark.parametrize("entry, field", [
        ({"depth": -1}, "depth"), ({"depth": True}, "depth"), ({"depth": 1, "score": 1.5}, "score"),
        ({"depth": 1, "score": "high"}, "score"), ({"score": 0.5}, "depth"), ({"depth": 1, "extra": 2}, "extra"),
    ])
    def test_malformed_tag_is_rejected_naming_the_field(self, entry, field):
        with pytest.raises(ValueError, match=field):
            BranchTag.from_custom_params({"rksc": entry})

    def test_tag_round_trips_and_keeps_other_custom_params(self):
        params = BranchTag(depth=2, score=0.25).to_custom_params({"thinking_budget": 8})
        assert params == {"thinking_budget": 8, "rksc": {"depth": 2, "score": 0.25}}
        assert BranchTag.from_custom_params(params) == BranchTag(depth=2, score=0.25)
        assert BranchTag.from_custom_params({"thinking_budget": 8}) is None

    def test_branch_options_adds_depth_beside_the_seed(self):
        state = types.SimpleNamespace()
        branch_options(state, sampling_seed=7)
        branch_options(state, depth=3)
        assert state._rksc_options == {"sampling_seed": 7, "custom_params": {"rksc": {"depth": 3}}}

    def test_branch_options_score_marks_every_gen_of_the_branch(self):
        state = types.SimpleNamespace()
        branch_options(state, depth=2, score=0.0)
        branch_options(state, sampling_seed=1)
        assert state._rksc_options["custom_params"] == {"rksc": {"depth": 2, "score": 0.0}}
        with pytest.raises(ValueError, match="depth"):
            branch_options(types.SimpleNamespace(), score=0.5)

    def test_report_score_needs_a_depth(self):
        state = types.SimpleNamespace(backend=None, text=lambda: "")
        with pytest.raises(ValueError, match="branch_options"):
            report_score(state, 0.5)

    def test_plugin_check_rejects_a_bad_tag_where_sglang_validates_sampling(self):
        params = types.SimpleNamespace(custom_params={"rksc": {"depth": "deep"}})
        with pytest.raises(ValueError, match="depth"):
            plugin._check_branch_tag(None, params, 32000)


class TestSGLangContract:
    """What the overrides and hooks assume of SGLang; a failure here means: revisit the override."""

    def test_sglang_does_not_know_rsbcm_so_the_parent_is_built_with_lru(self):
        with pytest.raises(ValueError, match="Unknown eviction policy"):
            get_eviction_strategy("rsbcm")

    def test_evict_asks_the_instance_strategy_about_unlocked_leaves_only(self):
        cache = make_cache("lru", cls=RadixCache)
        run_request(cache, PROMPT)
        run_request(cache, PROMPT + HEADER, output=STEP1 + STOP)
        locked = run_request(cache, PROMPT + HEADER, output=STEP2 + STOP)
        lock = cache.lock(locked.last_node)
        asked = []
        cache.eviction_strategy = types.SimpleNamespace(get_priority=lambda node: asked.append(node) or 0.0)
        cache.evict(EvictParams(num_tokens=100))
        assert [len(n.key) for n in asked] == [4]  # STEP1's leaf; not the locked leaf, not the prompt
        cache.unlock(lock)

    def test_split_node_returns_the_new_upper_node_and_the_child_keeps_the_suffix(self):
        cache = make_cache("lru", cls=RadixCache)
        run_request(cache, PROMPT)
        child = cache.root_node.children[PROMPT[0]]
        upper = cache._split_node(child.key, child, 4)
        assert upper.parent is cache.root_node and child.parent is upper
        assert (list(upper.key.token_ids), list(child.key.token_ids)) == (PROMPT[:4], PROMPT[4:])

    def test_checkpoint_leaves_last_node_at_the_end_of_the_inserted_path(self):
        cache = make_cache("lru", cls=RadixCache)
        req = run_request(cache, PROMPT, output=STEP1 + STOP)
        assert len(cache.path_device_indices(req.last_node)) == len(PROMPT) + len(STEP1)

    def test_init_calls_reset_so_our_counter_exists_before_the_parent_init(self):
        seen = []

        class Probe(RkscRadixCache):
            def reset(self):
                seen.append(hasattr(self, "score_reports"))
                super().reset()

        Probe(CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=FakeAllocator(),
                              page_size=1))
        assert seen == [True]

    def test_tree_nodes_accept_extra_attributes(self):
        node = TreeNode()
        node.rksc_depth = 1
        assert not hasattr(TreeNode, "__slots__")

    def test_custom_params_carry_a_nested_rksc_entry(self):
        import msgspec
        from sglang.srt.sampling.sampling_params import SamplingParams

        params = SamplingParams(max_new_tokens=0, custom_params=BranchTag(depth=1, score=0.5).to_custom_params())
        params.verify(vocab_size=100)
        decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams)  # the IPC codec
        assert decoded.custom_params == {"rksc": {"depth": 1, "score": 0.5}}

    def test_hook_targets_and_registry_calls_exist(self):
        for target in (stats.STATE_TARGET, seams.SAMPLING_VERIFY_TARGET):
            assert callable(pkgutil.resolve_name(target)), target
        from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES, add_radix_eviction_policy_choices

        assert add_radix_eviction_policy_choices.__self__ is RADIX_EVICTION_POLICY_CHOICES

    def test_registration_is_idempotent(self, monkeypatch):
        from sglang.srt.arg_groups.choices import RADIX_EVICTION_POLICY_CHOICES
        from sglang.srt.mem_cache import registry

        monkeypatch.setattr(registry, "_RADIX_CACHE_REGISTRY", {})
        before = list(RADIX_EVICTION_POLICY_CHOICES)
        # Start without the name: an engine started earlier in this process has added it already.
        RADIX_EVICTION_POLICY_CHOICES[:] = [c for c in before if c != "rsbcm"]
        try:
            plugin.register_backend()
            plugin.register_backend()
            assert registry.get_radix_cache_factory("rksc") is build_cache
            assert RADIX_EVICTION_POLICY_CHOICES.count("rsbcm") == 1
        finally:
            RADIX_EVICTION_POLICY_CHOICES[:] = before
