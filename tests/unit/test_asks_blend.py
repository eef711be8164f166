"""ASKS blend's pure parts (the selection and K re-rotation: ``test_asks_selection``): segments on a
simulated tree (and its trust boundary), the check layer, attention from rows at arbitrary
positions, the options and the hold. Requests go through the real ``RkscRadixCache.checkpoint`` over
fake pools, as in ``test_backend_tree``; group membership is what ``radix_ext.asks.decision`` registers.
"""

from __future__ import annotations

import math
from array import array

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from radix_ext.asks import segments as asks_segments
from radix_ext.asks.blend import BlendSettings
from radix_ext.asks.segments import Segment, find_segments
from radix_ext.asks.decision import AsksState
from radix_ext.asks.gate import Gate
from radix_ext.cpu.attention import blend_extend_attention, extend_attention
from radix_ext.eviction.backend import RkscRadixCache
from rksc_sgl.protocol import AsksOptions
from tests.unit.test_asks_selection import sglang_rope
from tests.unit.test_backend_tree import FakeAllocator, FakeReqToTokenPool, admit, finish

HEAD = [1, 2, 3]
OPEN_A, OPEN_B = [10, 11, 12], [20, 21]  # two openings of one group
SHARED = list(range(100, 140))  # the text both branches read after their opening
QUESTION = list(range(200, 210))
GROUP, OTHER = "program-a", "program-b"


def make(blended_donors: bool = True) -> RkscRadixCache:
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    params = CacheInitParams(disable=False, req_to_token_pool=FakeReqToTokenPool(),
                             token_to_kv_pool_allocator=FakeAllocator(), page_size=1, eviction_policy="lru")
    state = AsksState(Gate(tau=1.0, alpha=1.0, layers=(1,), num_layers=1), 16, 1 << 20, mode="blend",
                      blend=BlendSettings(0.15, "deviation", 4, blended_donors=blended_donors))
    return RkscRadixCache(params, asks=state)


def commit(cache, tokens: list[int], group: str | None = GROUP):
    """A prefill-only commit of ``group`` (None: a request of no group, another client's)."""
    req = admit(cache, tokens)
    if group is not None:
        asks_segments.register_commit(req, group)
    return finish(cache, req)


def member(cache, tokens: list[int], group: str = GROUP, output: list[int] = (7, 8)):
    """A generating member of ``group`` that computed its prompt exactly (a donor), and generated
    ``output`` (all but its last token get KV)."""
    req = admit(cache, tokens)
    setattr(req, asks_segments.MEMBER_ATTR, group)
    return finish(cache, req, output=list(output))


def segments_for(cache, tokens: list[int], start: int, group: str = GROUP, fresh_tail: int = 4):
    key = RadixKey(token_ids=array("q", tokens))
    return find_segments(cache.asks.index, key, start, len(tokens) - fresh_tail, group)


def slots_of(cache, tokens: list[int]) -> list[int]:
    """The KV slots of ``tokens``' cached path."""
    return cache.path_device_indices(cache.match_prefix(_params(tokens)).last_device_node).tolist()


def donor_tree(cache):
    """Branch A's whole prompt computed exactly by a member of the group (no commit needed)."""
    member(cache, HEAD + OPEN_A + SHARED + QUESTION)


class TestSegments:
    def test_text_after_another_opening_is_found_with_the_position_delta(self):
        cache = make()
        donor_tree(cache)
        request = HEAD + OPEN_B + SHARED + QUESTION
        start = len(HEAD + OPEN_B)
        [segment] = segments_for(cache, request, start)
        assert segment.start == start
        assert segment.length == len(request) - 4 - start  # up to the fresh tail
        assert segment.delta == len(OPEN_B) - len(OPEN_A)  # request position - donor position
        first = len(HEAD + OPEN_A)
        donor = slots_of(cache, HEAD + OPEN_A + SHARED + QUESTION)
        assert segment.donor_slots.tolist() == donor[first: first + segment.length]

    def test_a_run_is_found_mid_text_wherever_the_request_leaves_the_cache(self):
        cache = make()
        donor_tree(cache)
        for cut in (1, 5, 13, 30):
            request = HEAD + OPEN_B + SHARED[cut:] + QUESTION
            [segment] = segments_for(cache, request, len(HEAD + OPEN_B))
            assert segment.start == len(HEAD + OPEN_B) and segment.length == len(SHARED) - cut + len(QUESTION) - 4
            assert segment.delta == len(HEAD + OPEN_B) - (len(HEAD + OPEN_A) + cut)

    def test_a_label_another_group_computed_after_our_opening_does_not_hide_the_donor(self):
        # Steady state: a request of another group left our opening followed by a label and its own
        # text; the member's cached prefix then ends inside the label's node, which our group never
        # computed, and no anchor begins there.
        label = [50, 51, 52]
        cache = make()
        member(cache, HEAD + OPEN_B + label + [999] * 20, group=OTHER)
        member(cache, HEAD + OPEN_A + label + SHARED + QUESTION)
        request = HEAD + OPEN_B + label + SHARED + QUESTION
        start = len(cache.path_device_indices(cache.match_prefix(_params(request)).last_device_node))
        assert start == len(HEAD + OPEN_B + label)
        [segment] = segments_for(cache, request, start)
        assert segment.start == start and segment.length == len(SHARED) + len(QUESTION) - 4
        assert segment.delta == len(OPEN_B) - len(OPEN_A)

    def test_a_request_whose_own_earlier_text_is_cached_reuses_the_rest(self):
        # The same opening cached with the text's first tokens and then other text (an earlier problem).
        cache = make()
        donor_tree(cache)
        member(cache, HEAD + OPEN_B + SHARED[:5] + [999] * 12)
        request = HEAD + OPEN_B + SHARED + QUESTION
        start = len(cache.path_device_indices(cache.match_prefix(_params(request)).last_device_node))
        assert start == len(HEAD + OPEN_B) + 5
        [segment] = segments_for(cache, request, start)
        assert segment.start == start and segment.length == len(request) - 4 - start
        assert segment.delta == len(OPEN_B) - len(OPEN_A)

    def test_generated_text_is_a_donor_for_the_next_agent(self):
        cache = make()
        answer = list(range(500, 530))  # what agent A generated
        member(cache, HEAD + OPEN_A + QUESTION, output=answer + [2])
        request = HEAD + OPEN_B + QUESTION + [77] + answer + [88] * 5
        segments = segments_for(cache, request, len(HEAD + OPEN_B))
        assert [(s.start, s.length) for s in segments] == [(len(HEAD + OPEN_B), len(QUESTION)),
                                                            (len(HEAD + OPEN_B + QUESTION) + 1, len(answer))]
        assert segments[1].delta == 1 + len(OPEN_B) - len(OPEN_A)

    def test_a_run_split_across_two_donors_takes_each_part_from_its_own(self):
        cache = make()
        doc_a, doc_b = list(range(300, 330)), list(range(400, 430))
        member(cache, HEAD + OPEN_A + doc_a + [5] * 9)
        member(cache, HEAD + OPEN_A + [6] * 9 + doc_b + [5] * 9)
        request = HEAD + OPEN_B + doc_a + doc_b + QUESTION
        first, second = segments_for(cache, request, len(HEAD + OPEN_B))
        assert (first.start, first.length) == (len(HEAD + OPEN_B), len(doc_a))
        assert (second.start, second.length) == (len(HEAD + OPEN_B + doc_a), len(doc_b))
        assert second.delta == len(HEAD + OPEN_B + doc_a) - len(HEAD + OPEN_A + [6] * 9)

    def test_the_occurrence_after_the_same_preceding_text_wins(self):
        cache = make()
        doc = list(range(400, 430))
        near = HEAD + [6] * 9 + OPEN_B[-1:]  # the request's last token before the document
        member(cache, near + doc + [5] * 9)
        member(cache, HEAD + OPEN_A + doc + [5] * 9)  # newer, but after another token
        [segment] = segments_for(cache, HEAD + OPEN_B + doc + QUESTION, len(HEAD + OPEN_B))
        assert segment.context == 1 and segment.delta == len(HEAD + OPEN_B) - len(near)
        assert segment.length == len(doc)
        cache = make()
        member(cache, HEAD + OPEN_A + doc + [5] * 9)
        [segment] = segments_for(cache, HEAD + OPEN_B + doc + QUESTION, len(HEAD + OPEN_B))
        assert segment.context == 0 and segment.delta == len(OPEN_B) - len(OPEN_A)

    def test_another_groups_text_is_never_a_donor(self):
        cache = make()
        donor_tree(cache)
        assert segments_for(cache, HEAD + OPEN_B + SHARED + QUESTION, len(HEAD + OPEN_B), group=OTHER) == []

    def test_text_another_client_computed_is_never_a_donor(self):
        cache = make()
        commit(cache, HEAD + OPEN_A, GROUP)
        commit(cache, HEAD + OPEN_A + SHARED + QUESTION, None)  # a request of no group, same prefix
        assert segments_for(cache, HEAD + OPEN_B + SHARED + QUESTION, len(HEAD + OPEN_B)) == []

    def test_chunks_combine_in_any_order_with_gaps_computed(self):
        cache = make()
        doc_a, doc_b = list(range(300, 320)), list(range(400, 430))
        commit(cache, HEAD)
        commit(cache, HEAD + doc_a)
        commit(cache, HEAD + doc_b)
        request = HEAD + doc_b + [9, 9] + doc_a + QUESTION
        segments = segments_for(cache, request, len(HEAD) + len(doc_b))  # doc_b matched exactly
        [segment] = segments
        assert segment.start == len(HEAD + doc_b) + 2 and segment.length == len(doc_a)
        assert segment.delta == segment.start - len(HEAD)

    def test_the_search_stops_at_its_walk_budget(self, monkeypatch):
        cache = make()
        donor_tree(cache)
        request = HEAD + OPEN_B + SHARED + QUESTION
        monkeypatch.setattr(asks_segments, "MAX_WALKS_PER_REQUEST", 0)
        assert segments_for(cache, request, len(HEAD + OPEN_B)) == []

    def test_a_short_coincidence_is_no_segment(self):
        cache = make()
        donor_tree(cache)
        request = HEAD + OPEN_B + SHARED[: asks_segments.MIN_SEGMENT - 1] + [999] * 20
        assert segments_for(cache, request, len(HEAD + OPEN_B)) == []


class TestContentIndex:
    def test_a_path_is_indexed_once_however_often_it_is_checkpointed(self):
        cache = make()
        donor_tree(cache)
        windows = cache.asks.index.windows
        assert windows == len(HEAD + OPEN_A + SHARED + QUESTION) + 1 - asks_segments.WINDOW + 1  # + output
        donor_tree(cache)
        commit(cache, HEAD + OPEN_A + SHARED)  # a prefix of what is indexed
        assert cache.asks.index.windows == windows

    def test_eviction_drops_a_nodes_windows_and_the_group_goes_with_its_last(self):
        cache = make()
        donor_tree(cache)
        assert cache.asks.index.has(GROUP)
        cache.evict(EvictParams(num_tokens=10_000))
        assert not cache.asks.index.has(GROUP) and cache.asks.index.windows == 0
        donor_tree(cache)
        cache.reset()
        assert cache.asks.index.groups == {} and cache.asks.index.windows == 0

    def test_a_group_keeps_its_newest_windows_within_its_bound(self, monkeypatch):
        monkeypatch.setattr(asks_segments, "MAX_WINDOWS_PER_GROUP", 20)
        cache = make()
        member(cache, HEAD + list(range(300, 340)))
        member(cache, HEAD + list(range(400, 440)))
        assert cache.asks.index.groups[GROUP].live == 20
        assert segments_for(cache, HEAD + OPEN_B + list(range(300, 340)) + QUESTION, len(HEAD + OPEN_B)) == []
        [segment] = segments_for(cache, HEAD + OPEN_B + list(range(400, 440)) + QUESTION, len(HEAD + OPEN_B))
        assert segment.start > len(HEAD + OPEN_B)  # the first windows of the newest text went too

    def test_past_the_total_bound_the_least_recently_indexed_group_goes_first(self, monkeypatch):
        monkeypatch.setattr(asks_segments, "MAX_WINDOWS", 40)
        cache = make()
        member(cache, HEAD + list(range(300, 340)), group=OTHER)
        member(cache, HEAD + list(range(400, 440)))
        groups = cache.asks.index.groups
        assert cache.asks.index.windows == 40 and groups[GROUP].live == 37 and groups[OTHER].live == 3
        assert list(groups) == [OTHER, GROUP]  # the least recently indexed first

    def test_a_blended_request_enters_the_tree_only_up_to_its_first_reused_token(self):
        from radix_ext.asks.blend import EXACT_LEN_ATTR

        cache = make(blended_donors=False)
        tokens = HEAD + OPEN_B + SHARED + QUESTION
        req = admit(cache, tokens)
        setattr(req, asks_segments.MEMBER_ATTR, GROUP)
        setattr(req, EXACT_LEN_ATTR, 9)  # its opening and the first 4 tokens it computed in full
        finish(cache, req, output=[7, 8])
        assert len(slots_of(cache, tokens)) == 9
        freed = cache.token_to_kv_pool_allocator.freed
        assert sorted(freed) == list(range(9, len(tokens) + 1))  # the approximate rest, and its output
        assert cache.asks.index.windows == 9 - asks_segments.WINDOW + 1  # only exact text is the group's

    def test_a_blended_request_whose_exact_part_is_cached_inserts_nothing(self):
        from radix_ext.asks.blend import EXACT_LEN_ATTR

        cache = make()
        commit(cache, HEAD + OPEN_B, None)
        req = admit(cache, HEAD + OPEN_B + SHARED)
        setattr(req, EXACT_LEN_ATTR, len(HEAD + OPEN_B))
        finish(cache, req, output=[7, 8])
        assert len(slots_of(cache, HEAD + OPEN_B + SHARED)) == len(HEAD + OPEN_B)

    def test_split_nodes_stay_visible_and_their_windows_move_with_their_tokens(self):
        cache = make()
        donor_tree(cache)
        commit(cache, HEAD + OPEN_A + SHARED[:5] + [555], GROUP)  # splits the donor's node
        commit(cache, HEAD + OPEN_A + SHARED[:20] + [556], OTHER)  # and again, by another group
        [segment] = segments_for(cache, HEAD + OPEN_B + SHARED + QUESTION, len(HEAD + OPEN_B))
        assert segment.length == len(SHARED) + len(QUESTION) - 4
        first = len(HEAD + OPEN_A)
        assert segment.donor_slots.tolist() == slots_of(cache, HEAD + OPEN_A + SHARED + QUESTION)[
            first: first + segment.length]
        for window in [w for ws in cache.asks.index.groups[GROUP].places.values() for w in ws]:
            start = getattr(window.node, asks_segments.START_ATTR)
            assert start <= window.pos < start + len(window.node.key)


def _params(tokens):
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    return MatchPrefixParams(key=RadixKey(array("q", tokens)))


class TestCheckLayer:
    def test_its_kv_at_the_slots_given_is_what_sglangs_attention_prepares(self):
        """``write_check_kv`` (the last check layer, run only as far as its K and V) writes, at the
        slots it is given, what ``LlamaAttention.forward_prepare_native`` (SGLang's own, on a
        stand-in layer) computes from the layer's input norm: a change there, e.g. a norm on q and
        k, fails. Which rows ``blend_forward`` gives it (the covered ones) is pinned by the
        integration tests (recompute 1.0 gives exact's tokens; blend's KL stays near exact)."""
        from types import SimpleNamespace

        from sglang.srt.models.llama import LlamaAttention

        from radix_ext.asks.kv_writes import write_check_kv

        torch.manual_seed(2)
        heads, kv_heads, dim, width, tokens = 3, 1, 64, 48, 7
        weight = torch.randn((heads + 2 * kv_heads) * dim, width)
        radix = SimpleNamespace(layer_id=5, tp_k_head_num=kv_heads, tp_v_head_num=kv_heads, qk_head_dim=dim,
                                v_head_dim=dim)
        attn = SimpleNamespace(qkv_proj=lambda x: (x @ weight.T, None), q_size=heads * dim, kv_size=kv_heads * dim,
                               rotary_emb=sglang_rope(), attn=radix)
        layer = SimpleNamespace(self_attn=attn, input_layernorm=lambda x: x / x.norm(dim=-1, keepdim=True))
        state, positions = torch.randn(tokens, width), torch.arange(40, 40 + tokens)
        written = []
        pool = SimpleNamespace(set_kv_buffer=lambda *call: written.append(call))
        slots = torch.arange(100, 100 + tokens)
        write_check_kv(layer, positions, state, slots, pool)
        _, want_k, want_v = LlamaAttention.forward_prepare_native(attn, positions, layer.input_layernorm(state))
        (target, loc, k, v), = written
        assert target is radix and torch.equal(loc.loc, slots)
        assert torch.equal(k, want_k.view(tokens, kv_heads, dim)) and torch.equal(v, want_v.view(tokens, kv_heads, dim))


class TestAttentionFromArbitraryRows:
    def test_contiguous_tail_rows_equal_the_extend_attention(self):
        torch.manual_seed(0)
        q, k, v = torch.randn(4, 5, 16), torch.randn(2, 12, 16), torch.randn(2, 12, 16)
        positions = torch.arange(7, 12)
        torch.testing.assert_close(blend_extend_attention(q, k, v, positions), extend_attention(q, k, v))

    def test_a_row_between_reused_ones_sees_only_keys_up_to_its_position(self):
        torch.manual_seed(1)
        q, k, v = torch.randn(2, 1, 8), torch.randn(2, 10, 8), torch.randn(2, 10, 8)
        out = blend_extend_attention(q, k, v, torch.tensor([4]))
        torch.testing.assert_close(out, extend_attention(q, k[:, :5], v[:, :5]))


class TestOptions:
    @pytest.mark.parametrize("bad", [-0.1, 1.5, "half", True])
    def test_a_bad_recompute_share_is_refused_naming_the_field(self, bad):
        with pytest.raises(ValueError, match="rksc_asks.recompute"):
            AsksOptions.from_custom_params({"rksc_asks": {"group": "g", "recompute": bad}})

    def test_bad_blend_flags_fail_naming_the_flag(self):
        from rksc_sgl.config import RkscConfig

        for kwargs, flag in (({"asks_mode": "merge"}, "--asks-mode"), ({"asks_select": "random"}, "--asks-select"),
                             ({"asks_recompute": 2}, "--asks-recompute"), ({"asks_fresh_tail": 0}, "--asks-fresh-tail"),
                             ({"asks_max_deviation": 0}, "--asks-max-deviation"),
                             ({"asks_max_deviation": -1.0}, "--asks-max-deviation"),
                             ({"asks_max_deviation": math.nan}, "--asks-max-deviation"),
                             ({"asks_max_deviation": "low"}, "--asks-max-deviation"),
                             ({"asks_check_layers": 1}, "--asks-check-layers"),
                             ({"asks_check_layers": 2.5}, "--asks-check-layers")):
            with pytest.raises(ValueError, match=flag):
                RkscConfig(**kwargs)
        assert RkscConfig(asks_max_deviation=math.inf).asks_max_deviation == math.inf  # the gate off
