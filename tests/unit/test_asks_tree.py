"""ASKS on a simulated tree: signature lifetime (split, evict, reset, cap) and decisions.

Requests go through the real ``RkscRadixCache.checkpoint`` over fake pools, as in
``test_backend_tree``; a span commit's signature is what ``radix_ext.asks.capture`` would leave
on the request after its prefill.
"""

from __future__ import annotations

import types
from array import array

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from radix_ext.asks import capture as asks_capture, decision as asks
from radix_ext.asks.decision import SIG_ATTR, AsksState, decide
from radix_ext.asks.gate import Gate
from radix_ext.eviction import stats
from radix_ext.eviction.backend import RkscRadixCache, asks_state
from rksc_sgl.config import RkscConfig
from tests.unit.test_backend_tree import FakeAllocator, FakeReqToTokenPool, admit, finish, run_request

LAYERS = (1, 2)
HEAD = [1, 2, 3]
SPAN_A = [10, 11, 12, 13]
SPAN_B = [20, 21, 22]  # means the same as A
SPAN_C = [30, 31, 32]  # does not
SPAN_A2 = [10, 14, 15]  # shares its first token with A, means the same
TAIL = list(range(40, 50))
GROUP, OTHER_GROUP = "program-a", "program-b"  # substitution groups (radix_ext.asks.decision's trust boundary)

torch.manual_seed(0)
MEANING = torch.randn(len(LAYERS), 8)
OTHER = torch.randn(len(LAYERS), 8)


def make(tau: float = 0.9, min_tail: int = 4, cap_bytes: int = 1 << 20) -> RkscRadixCache:
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    params = CacheInitParams(disable=False, req_to_token_pool=FakeReqToTokenPool(),
                             token_to_kv_pool_allocator=FakeAllocator(), page_size=1, eviction_policy="lru")
    gate = Gate(tau=tau, alpha=1.0, layers=LAYERS, num_layers=2)
    return RkscRadixCache(params, asks=AsksState(gate, min_tail, cap_bytes))


def commit_span(cache, prefix: list[int], span: list[int], meaning: torch.Tensor, group: str = GROUP):
    """A prefill-only span commit of ``group`` whose prefill left a signature of ``meaning`` (plus noise)."""
    req = admit(cache, prefix + span)
    pending = asks_capture._Pending(req, 0, req.prefix_len, len(prefix) + len(span) - req.prefix_len, LAYERS,
                                    group)
    pending.vectors = list(meaning + 0.01 * torch.randn_like(meaning))
    setattr(req, asks_capture.PENDING_ATTR, pending)
    return finish(cache, req)


def setup_tree(cache):
    run_request(cache, HEAD)
    commit_span(cache, HEAD, SPAN_A, MEANING)
    commit_span(cache, HEAD, SPAN_B, MEANING)
    commit_span(cache, HEAD, SPAN_C, OTHER)
    run_request(cache, HEAD + SPAN_A + TAIL)  # the donor's full prompt


def signed_nodes(cache):
    out, stack = [], list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        if getattr(node, SIG_ATTR, None) is not None:
            out.append(node)
        stack.extend(node.children.values())
    return out


def snapshot(cache):
    """Everything a read-only walk must leave alone."""
    out, stack = [], [cache.root_node]
    while stack:
        node = stack.pop()
        out.append((id(node), tuple(node.key.token_ids), node.last_access_time, node.lock_ref,
                    tuple(sorted(id(c) for c in node.children.values()))))
        stack.extend(node.children.values())
    return sorted(out), cache.evictable_size_, cache.protected_size_


class TestDecisions:
    def test_equivalent_span_adopts_the_donor_wording(self):
        cache = make()
        setup_tree(cache)
        decision, ids = decide(cache, HEAD + SPAN_B + TAIL, cache.asks.gate, cache.asks.min_tail, group=GROUP)
        assert decision.adopted and decision.sigma > 0.9
        assert ids == HEAD + SPAN_A + TAIL
        assert (decision.span_start, decision.own_length, decision.donor_length) == (3, 3, 4)

    def test_non_equivalent_span_is_rejected_by_the_gate(self):
        cache = make()
        setup_tree(cache)
        decision, ids = decide(cache, HEAD + SPAN_C + TAIL, cache.asks.gate, cache.asks.min_tail, group=GROUP)
        assert decision.outcome == "gate" and ids is None and decision.candidates == 1

    def test_tau_one_never_adopts_even_identical_meaning(self):
        cache = make(tau=1.0)
        setup_tree(cache)
        decision, ids = decide(cache, HEAD + SPAN_B + TAIL, cache.asks.gate, cache.asks.min_tail, group=GROUP)
        assert not decision.adopted and ids is None

    def test_donor_must_continue_with_our_tail_for_min_tail_tokens(self):
        cache = make(min_tail=4)
        setup_tree(cache)
        other_tail = TAIL[:3] + [99] * 7  # shares 3 < 4 tokens
        decision, ids = decide(cache, HEAD + SPAN_B + other_tail, cache.asks.gate, 4, group=GROUP)
        assert decision.outcome == "no-donor" and ids is None
        decision, _ = decide(cache, HEAD + SPAN_B + other_tail, cache.asks.gate, 3, group=GROUP)
        assert decision.adopted

    def test_request_without_a_signed_span_or_tail_has_nothing_to_decide(self):
        cache = make()
        setup_tree(cache)
        assert decide(cache, HEAD + [77, 78] + TAIL, cache.asks.gate, 4, group=GROUP)[0].outcome == "no-span"
        assert decide(cache, HEAD + SPAN_B + TAIL[:2], cache.asks.gate, 4, group=GROUP)[0].outcome == "no-span"

    def test_span_sharing_leading_tokens_with_the_donor_replaces_only_where_it_diverged(self):
        cache = make()
        setup_tree(cache)
        commit_span(cache, HEAD, SPAN_A2, MEANING)  # its commit found HEAD + [10] cached
        decision, ids = decide(cache, HEAD + SPAN_A2 + TAIL, cache.asks.gate, cache.asks.min_tail, group=GROUP)
        assert decision.adopted and decision.span_start == 4
        assert ids == HEAD + SPAN_A + TAIL

    def test_donor_spans_far_longer_than_the_own_span_are_not_searched(self):
        cache = make()
        run_request(cache, HEAD)
        long_span = list(range(100, 100 + asks.MIN_REACH + 1))  # 65 tokens > max(64, 4 x 3)
        commit_span(cache, HEAD, long_span, MEANING)
        commit_span(cache, HEAD, SPAN_B, MEANING)
        run_request(cache, HEAD + long_span + TAIL)
        assert decide(cache, HEAD + SPAN_B + TAIL, cache.asks.gate, cache.asks.min_tail, group=GROUP)[0].outcome == "no-donor"
        commit_span(cache, HEAD, SPAN_A, MEANING)
        run_request(cache, HEAD + SPAN_A + TAIL)
        assert decide(cache, HEAD + SPAN_B + TAIL, cache.asks.gate, cache.asks.min_tail, group=GROUP)[0].adopted

    def test_decision_is_read_only(self):
        cache = make()
        setup_tree(cache)
        before = snapshot(cache)
        for prompt in (HEAD + SPAN_B + TAIL, HEAD + SPAN_C + TAIL, HEAD + SPAN_A[:2] + TAIL):
            decide(cache, prompt, cache.asks.gate, cache.asks.min_tail, group=GROUP)
        assert snapshot(cache) == before

    def test_adopted_request_matches_the_donor_path_and_a_later_evicted_donor_costs_only_reuse(self):
        cache = make()
        setup_tree(cache)
        _, ids = decide(cache, HEAD + SPAN_B + TAIL, cache.asks.gate, cache.asks.min_tail, group=GROUP)
        req = admit(cache, ids)
        assert req.prefix_len == len(ids) - 1  # donor span and tail served from the cache
        finish(cache, req, [7, 8])
        # decided, then the donor evicted before admission: the request computes it itself
        _, ids = decide(cache, HEAD + SPAN_B + TAIL, cache.asks.gate, cache.asks.min_tail, group=GROUP)
        cache.evict(EvictParams(num_tokens=10_000))
        req = admit(cache, ids)
        assert req.prefix_len < len(HEAD) + len(SPAN_A)
        finish(cache, req)
        assert cache.asks.counters.signature_bytes == stats.live_signature_bytes(cache)


class TestTrustBoundary:
    """A request adopts only from spans its own substitution group committed."""

    def test_another_groups_span_is_never_a_donor_even_where_the_gate_passes(self):
        cache = make()
        run_request(cache, HEAD)
        commit_span(cache, HEAD, SPAN_A, MEANING, group=OTHER_GROUP)
        run_request(cache, HEAD + SPAN_A + TAIL)  # the other group's full prompt
        commit_span(cache, HEAD, SPAN_B, MEANING)
        decision, ids = decide(cache, HEAD + SPAN_B + TAIL, cache.asks.gate, cache.asks.min_tail, group=GROUP)
        assert decision.outcome == "no-donor" and ids is None
        # and the reverse: the other group's request does not see our span as its own
        decision, ids = decide(cache, HEAD + SPAN_B + TAIL, cache.asks.gate, cache.asks.min_tail,
                               group=OTHER_GROUP)
        assert decision.outcome == "no-span" and ids is None

    def test_same_group_still_substitutes_beside_another_group(self):
        cache = make()
        setup_tree(cache)
        commit_span(cache, HEAD, [60, 61, 62], MEANING, group=OTHER_GROUP)
        run_request(cache, HEAD + [60, 61, 62] + TAIL)  # would be a second candidate in one group
        decision, ids = decide(cache, HEAD + SPAN_B + TAIL, cache.asks.gate, cache.asks.min_tail, group=GROUP)
        assert decision.adopted and ids == HEAD + SPAN_A + TAIL and decision.candidates == 1

    def test_request_without_a_group_is_never_rewritten_nor_signed(self):
        cache = make()
        setup_tree(cache)
        req, recv, scheduler = created(cache, HEAD + SPAN_B + TAIL)
        req.sampling_params.custom_params = None
        asks._on_create(req, scheduler, recv)
        assert getattr(req, asks.DECISION_ATTR).outcome == "skipped:no-group"
        assert list(req.origin_input_ids) == HEAD + SPAN_B + TAIL
        commit, recv, scheduler = created(cache, HEAD + [70, 71, 72])
        commit.rid, commit.sampling_params.custom_params, commit.sampling_params.max_new_tokens = "c", None, 0
        asks._on_create(commit, scheduler, recv)
        assert "c" not in asks_capture._capturing  # a commit without a group leaves no signature

    def test_span_commit_of_a_group_is_captured_for_that_group(self):
        cache = make()
        commit, recv, scheduler = created(cache, HEAD + [70, 71, 72])
        commit.rid, commit.sampling_params.max_new_tokens = "c", 0
        asks._on_create(commit, scheduler, recv)
        assert asks_capture._capturing.pop("c") is commit
        assert getattr(commit, asks_capture.GROUP_ATTR) == GROUP


class TestSignatureLifetime:
    def test_signature_sits_on_the_node_ending_at_the_span_end(self):
        cache = make()
        setup_tree(cache)
        ends = sorted(getattr(n, SIG_ATTR).end for n in signed_nodes(cache))
        assert ends == [6, 6, 7]  # B and C end at 6, A at 7
        assert cache.asks.counters.signatures == 3
        assert cache.asks.counters.signature_bytes == stats.live_signature_bytes(cache) > 0

    def test_split_leaves_the_signature_on_the_lower_half_only(self):
        cache = make()
        setup_tree(cache)
        run_request(cache, HEAD + SPAN_A[:2] + [99])  # splits A's node after two of its tokens
        a_nodes = [n for n in signed_nodes(cache) if getattr(n, SIG_ATTR).end == 7]
        assert len(a_nodes) == 1 and list(a_nodes[0].key.token_ids) == SPAN_A[2:]
        assert getattr(a_nodes[0].parent, SIG_ATTR, None) is None
        assert cache.asks.counters.signature_bytes == stats.live_signature_bytes(cache)

    def test_eviction_and_reset_release_signature_bytes(self):
        cache = make()
        setup_tree(cache)
        cache.evict(EvictParams(num_tokens=10_000))
        assert cache.asks.counters.signatures == 0 and cache.asks.counters.signature_bytes == 0
        setup_tree(cache)
        cache.reset()
        assert cache.asks.counters.signatures == 0 and stats.live_signature_bytes(cache) == 0

    def test_cap_stops_capture_and_counts_it(self):
        one = 2 * 8 * 2  # two layers x 8 dims x fp16
        cache = make(cap_bytes=2 * one)
        setup_tree(cache)
        assert cache.asks.counters.signatures == 2 and cache.asks.counters.signatures_over_cap == 1

    def test_recommitting_a_signed_span_keeps_the_first_signature(self):
        cache = make()
        setup_tree(cache)
        first = {id(n): getattr(n, SIG_ATTR) for n in signed_nodes(cache)}
        commit_span(cache, HEAD, SPAN_B, OTHER)
        assert {id(n): getattr(n, SIG_ATTR) for n in signed_nodes(cache)} == first


class TestScheduler:
    def test_tensor_parallel_asks_is_refused_naming_the_flags(self):
        ctx = types.SimpleNamespace(tp_size=2)
        with pytest.raises(ValueError, match="--asks needs --tp-size 1"):
            asks_state(ctx, RkscConfig(asks=True))

    @pytest.mark.parametrize("attr,value,why", [
        ("custom_params", {"rksc_asks": {"enabled": False}}, "opted-out"),
        ("logprob_start_len", 0, "input-logprobs"),
        ("input_embeds", [[0.0]], "embeddings"),
    ])
    def test_skipped_requests_keep_their_prompt(self, attr, value, why):
        cache = make()
        setup_tree(cache)
        req, recv, scheduler = created(cache, HEAD + SPAN_B + TAIL, return_logprob=attr == "logprob_start_len")
        target = {"custom_params": req.sampling_params, "logprob_start_len": recv}.get(attr, req)
        setattr(target, attr, value)
        asks._on_create(req, scheduler, recv)
        decision = getattr(req, asks.DECISION_ATTR)
        assert decision.outcome == f"skipped:{why}" and list(req.origin_input_ids) == HEAD + SPAN_B + TAIL

    def test_created_request_adopts_and_keeps_unpadded_ids_in_step(self):
        cache = make()
        setup_tree(cache)
        req, recv, scheduler = created(cache, HEAD + SPAN_B + TAIL, return_logprob=True)
        asks._on_create(req, scheduler, recv)
        assert list(req.origin_input_ids) == HEAD + SPAN_A + TAIL
        assert req.origin_input_ids_unpadded is req.origin_input_ids
        assert cache.asks.counters.adopted == 1 and cache.asks.counters.requests == 1


class FakeReq(types.SimpleNamespace):
    """A ``Req`` stand-in (the fields the decision reads); weakly referable, as the capture registry needs."""


def created(cache, prompt: list[int], return_logprob: bool = False):
    """A just-created ``Req`` stand-in, its ``recv_req`` and scheduler."""
    req = FakeReq(
        rid="r", origin_input_ids=array("q", prompt), extra_key=None, cache_salt=None,
        sampling_params=types.SimpleNamespace(custom_params={"rksc_asks": {"group": GROUP}}, max_new_tokens=4),
        input_embeds=None, positional_embed_overrides=None, token_type_ids=None, session=None,
        multi_item_delimiter_indices=None)
    req.origin_input_ids_unpadded = req.origin_input_ids
    recv = types.SimpleNamespace(return_logprob=return_logprob, logprob_start_len=-1, mm_inputs=None,
                                 session_params=None)
    scheduler = types.SimpleNamespace(tree_cache=cache, model_config=types.SimpleNamespace(context_len=8192))
    return req, recv, scheduler
