"""Relay through blended requests (``radix_ext.asks.private``), on a simulated tree.

A finished blended request's approximate tail stays as a private node of its group: found by
the group's content search, never by prefix matching, evicted and counted like any leaf.
Requests go through the real ``RkscRadixCache.checkpoint`` over fake pools (``test_backend_tree``).
"""

from __future__ import annotations

from array import array

from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey

from radix_ext.asks import private, segments as asks_segments
from radix_ext.asks.blend import EXACT_LEN_ATTR
from tests.unit.test_asks_blend import GROUP, HEAD, OPEN_A, OPEN_B, OTHER, QUESTION, SHARED, make, member, segments_for
from tests.unit.test_backend_tree import admit, finish

OUTPUT = list(range(300, 320))  # what the blended request generated (all but its last token get KV)
EXACT = len(HEAD + OPEN_B) + 4  # its opening and the first 4 tokens it computed in full


def blended(cache, tokens=HEAD + OPEN_B + SHARED + QUESTION, output=OUTPUT, group=GROUP, reason=None, extra_key=None):
    """A member of ``group`` that blended (its KV exact only before ``EXACT``) and generated ``output``."""
    req = admit(cache, tokens)
    req.extra_key = extra_key
    setattr(req, asks_segments.MEMBER_ATTR, group)
    setattr(req, EXACT_LEN_ATTR, EXACT)
    return finish(cache, req, output=list(output), reason=reason)


def tail_slots(cache, req) -> list[int]:
    return cache.req_to_token_pool.req_to_token[req.kv.req_pool_idx, EXACT: len(req.full_untruncated_fill_ids) - 1].tolist()


def matched(cache, tokens, extra_key=None) -> int:
    return cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens), extra_key))).device_prefix_len


class TestKept:
    def test_the_tail_stays_in_the_cache_unfreed_and_is_counted_evictable(self):
        cache = make()
        req = blended(cache)
        assert not set(cache.token_to_kv_pool_allocator.freed) & set(tail_slots(cache, req))
        total = len(req.full_untruncated_fill_ids) - 1
        assert req.kv.cache_protected_len == total  # the release frees none of it
        assert cache.evictable_size() == total
        assert cache.asks.blend_counters.kept_tokens == total - EXACT
        assert cache.asks.blend_counters.kept_requests == 1

    def test_prefix_matching_never_reaches_it_with_any_extra_key(self):
        cache = make()
        req = blended(cache)
        tokens = list(req.full_untruncated_fill_ids)
        assert matched(cache, tokens) == EXACT
        node = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens[:EXACT])))).last_device_node
        [child] = node.children.values()
        assert child.key.extra_key.startswith(private.PRIVATE_PREFIX)
        assert matched(cache, tokens[EXACT:], child.key.extra_key[:-1]) == 0  # a guess at the namespace
        assert matched(cache, tokens, "rksc-asks-private:") == 0

    def test_its_group_finds_its_output_and_approximate_prompt_others_do_not(self):
        cache = make()
        req = blended(cache)
        reader = HEAD + OPEN_A + OUTPUT[:-1] + QUESTION  # the next agent reads what it generated
        [segment] = segments_for(cache, reader, len(HEAD + OPEN_A))
        assert segment.start == len(HEAD + OPEN_A)
        assert segment.donor_slots.tolist() == tail_slots(cache, req)[-(len(OUTPUT) - 1):][: segment.length]
        assert segment.delta == len(HEAD + OPEN_A) - (len(HEAD + OPEN_B + SHARED + QUESTION))
        assert segments_for(cache, reader, len(HEAD + OPEN_A), group=OTHER) == []
        prompt_reader = HEAD + OPEN_A + SHARED + QUESTION  # its approximate prompt tokens serve too
        assert segments_for(cache, prompt_reader, len(HEAD + OPEN_A))

    def test_a_member_of_another_extra_key_does_not_reuse_it(self):
        cache = make()
        blended(cache, extra_key="lora-a")
        tokens = HEAD + OPEN_A + OUTPUT[:-1] + QUESTION
        key = RadixKey(token_ids=array("q", tokens), extra_key=None)
        assert asks_segments.find_segments(cache.asks.index, key, 5, len(tokens) - 4, GROUP) == []
        key = RadixKey(token_ids=array("q", tokens), extra_key="lora-a")
        assert asks_segments.find_segments(cache.asks.index, key, 5, len(tokens) - 4, GROUP)

    def test_an_exact_place_wins_a_tie_with_a_private_one(self):
        cache = make()
        blended(cache)  # SHARED[4:] approximately
        donor = HEAD + OPEN_B[:1] + [99] + SHARED + QUESTION
        member(cache, donor)  # and exactly
        start = len(HEAD) + 2
        [segment] = segments_for(cache, HEAD + [98, 97] + SHARED[4:] + QUESTION, start)  # as long, no context
        exact_slots = cache.path_device_indices(cache.match_prefix(MatchPrefixParams(
            key=RadixKey(array("q", donor)))).last_device_node).tolist()
        assert segment.donor_slots.tolist() == exact_slots[start + 4: start + 4 + segment.length]


    def test_private_copies_never_push_the_exact_place_out_of_a_windows_places(self):
        cache = make()
        donor = HEAD + OPEN_B[:1] + [99] + SHARED + QUESTION
        member(cache, donor)  # SHARED exactly, first
        for i in range(asks_segments.MAX_OCCURRENCES + 2):  # then more blended copies than a window keeps
            blended(cache, tokens=HEAD + [90 + i] + OPEN_B + SHARED + QUESTION)
        places = cache.asks.index.groups[GROUP].places[asks_segments.digest_of(SHARED[8:16])]
        assert len(places) == asks_segments.MAX_OCCURRENCES
        assert sum(not hasattr(w.node, asks_segments.BASE_KEY_ATTR) for w in places) == 1


class TestNotKept:
    def test_off_aborted_or_without_group_the_tail_is_freed(self):
        for cache, kwargs in ((make(blended_donors=False), {}),
                              (make(), {"reason": FINISH_ABORT("client went away")}),
                              (make(), {"group": None})):
            req = blended(cache, **kwargs)
            assert set(tail_slots(cache, req)) <= set(cache.token_to_kv_pool_allocator.freed)
            assert cache.asks.blend_counters.kept_tokens == 0
            assert cache.evictable_size() == EXACT

    def test_a_tail_shorter_than_a_window_is_freed(self):
        cache = make()
        req = blended(cache, tokens=HEAD + OPEN_B + SHARED[:5], output=[7, 8])
        assert cache.asks.blend_counters.kept_tokens == 0
        assert set(tail_slots(cache, req)) <= set(cache.token_to_kv_pool_allocator.freed)


class TestEviction:
    def test_eviction_frees_its_slots_and_drops_its_windows_no_leak(self):
        cache = make()
        req = blended(cache)
        assert cache.asks.index.windows > 0
        cache.evict(EvictParams(num_tokens=10 ** 6))
        allocator = cache.token_to_kv_pool_allocator
        assert sorted(allocator.freed) == list(range(allocator.next_slot))  # every slot back, once
        assert cache.evictable_size() == 0 and cache.asks.index.windows == 0
        assert segments_for(cache, HEAD + OPEN_A + OUTPUT[:-1] + QUESTION, len(HEAD + OPEN_A)) == []
        assert req.kv.cache_protected_len == len(req.full_untruncated_fill_ids) - 1

    def test_the_private_leaf_goes_first_its_exact_parent_stays_until_empty(self):
        cache = make()
        blended(cache)
        cache.evict(EvictParams(num_tokens=1))
        assert matched(cache, HEAD + OPEN_B + SHARED) == EXACT  # the exact part is still cached
        assert cache.asks.blend_counters.kept_tokens > 0 and cache.evictable_size() == EXACT
