"""``radix_ext.ops.request_guards``: requests refused with a ValueError (HTTP 400) that names the
field and its limit, before they reach a scheduler they would kill, a queue they would hold or a
route that would drop them without a word."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from radix_ext.ops.request_guards import (
    _refuse_best_of,
    _refuse_unservable_request,
    check_logprob_fields,
    check_samples,
    check_stop_token_ids,
    unknown_field_error,
)

VOCAB = 100
MANAGER = SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB))


def request(input_ids=None, text="hi", input_embeds=None, **fields):
    defaults = {"top_logprobs_num": 0, "token_ids_logprob": None, "logprob_start_len": -1}
    return SimpleNamespace(input_ids=input_ids, text=text, input_embeds=input_embeds, **{**defaults, **fields})


def validate(input_ids, sent_ids: bool = True, input_embeds=None, **fields):
    """``input_ids`` as the hook sees them; ``sent_ids``: the client sent them (else the tokenizer did)."""
    obj = request(input_ids if sent_ids else None, input_embeds=input_embeds, **fields)
    return _refuse_unservable_request(MANAGER, obj, input_ids)


class TestPrompt:
    def test_empty_prompt_is_refused(self):
        with pytest.raises(ValueError, match="empty"):
            validate([])

    def test_embeddings_without_ids_pass(self):
        assert validate([], input_embeds=[[0.0]]) is None

    @pytest.mark.parametrize("bad", [VOCAB, -1, 10**9, "a", True])
    def test_token_outside_the_vocabulary_is_named(self, bad):
        with pytest.raises(ValueError, match=f"input_ids contains {bad!r}.*\\[0, {VOCAB}\\)"):
            validate([1, bad, 2])

    def test_valid_ids_pass(self):
        assert validate([0, 5, VOCAB - 1]) is None

    def test_ids_from_the_tokenizer_are_not_walked_again(self):
        assert validate([VOCAB + 7], sent_ids=False) is None  # a stand-in: only sent ids are checked


class TestLogprobFields:
    @pytest.mark.parametrize("top", [-1, VOCAB + 1, 100000])
    def test_top_logprobs_num_outside_the_vocabulary_is_refused_naming_the_limit(self, top):
        with pytest.raises(ValueError, match=f"top_logprobs_num must be in \\[0, {VOCAB}\\].*got {top}"):
            check_logprob_fields(request(top_logprobs_num=top), VOCAB)

    @pytest.mark.parametrize("top", [0, 1, VOCAB])
    def test_top_logprobs_num_up_to_the_vocabulary_passes(self, top):
        check_logprob_fields(request(top_logprobs_num=top), VOCAB)

    def test_more_token_ids_logprob_than_the_vocabulary_is_refused(self):
        with pytest.raises(ValueError, match=f"token_ids_logprob has {VOCAB + 1} ids.*\\({VOCAB}\\)"):
            check_logprob_fields(request(token_ids_logprob=[1] * (VOCAB + 1)), VOCAB)

    @pytest.mark.parametrize("start", [-2, -100])
    def test_logprob_start_len_below_minus_one_is_refused(self, start):
        with pytest.raises(ValueError, match=f"logprob_start_len must be -1.*got {start}"):
            check_logprob_fields(request(logprob_start_len=start), VOCAB)

    @pytest.mark.parametrize("start", [-1, 0, 5])
    def test_logprob_start_len_of_none_or_a_position_passes(self, start):
        check_logprob_fields(request(logprob_start_len=start), VOCAB)  # past the prompt: SGLang's check

    def test_the_hook_checks_logprob_fields_too(self):
        with pytest.raises(ValueError, match="top_logprobs_num"):
            validate([1, 2], top_logprobs_num=VOCAB + 1)


class TestSamples:
    @pytest.mark.parametrize("params", [{"n": 0}, {"n": -2}, [{"n": 1}, {"n": 0}], {"n": "3"}, {"n": True}])
    def test_fewer_than_one_sample_is_refused(self, params):
        with pytest.raises(ValueError, match="sampling_params.n must be an integer >= 1"):
            check_samples(params, 1, max_n=8, max_queued=None)

    @pytest.mark.parametrize("params", [None, {}, {"n": 1}, {"n": 8}, [{"n": 2}, {"n": 2}], {"n": None}])
    def test_one_to_max_n_samples_pass(self, params):
        check_samples(params, 2, max_n=8, max_queued=None)

    def test_more_than_max_n_samples_is_refused_naming_the_flag(self):
        with pytest.raises(ValueError, match="sampling_params.n must be <= 8 \\(the server's --max-n\\), got 100000"):
            check_samples({"n": 100000}, 1, max_n=8, max_queued=None)

    def test_children_beyond_the_queue_are_refused_naming_the_flag(self):
        with pytest.raises(ValueError, match="3 prompt\\(s\\) makes 24 requests.*--max-queued-requests 20"):
            check_samples({"n": 8}, 3, max_n=8, max_queued=20)

    def test_children_within_the_queue_pass(self):
        check_samples({"n": 8}, 2, max_n=8, max_queued=16)


class TestStopTokenIds:
    @pytest.mark.parametrize("bad", [VOCAB, -1, 100000])
    def test_stop_token_outside_the_vocabulary_is_refused(self, bad):
        with pytest.raises(ValueError, match=f"stop_token_ids contains {bad}.*\\[0, {VOCAB}\\)"):
            check_stop_token_ids({1, bad}, VOCAB)

    @pytest.mark.parametrize("ids", [None, set(), {0, VOCAB - 1}])
    def test_stop_tokens_of_the_vocabulary_pass(self, ids):
        check_stop_token_ids(ids, VOCAB)


KNOWN = frozenset({"text", "sampling_params", "rid"})
SAMPLING = frozenset({"custom_params", "max_new_tokens", "n"})


class TestUnknownFields:
    @pytest.mark.parametrize("key", sorted(SAMPLING))
    def test_a_sampling_field_at_the_top_level_is_refused_pointing_inside(self, key):
        reason = unknown_field_error({"text": "hi", key: {}}, KNOWN, SAMPLING)
        assert reason.startswith(f"{key} is not a top-level field") and "inside sampling_params" in reason

    def test_an_unknown_top_level_field_is_named(self):
        assert "'top_logprob_num'" in unknown_field_error({"text": "hi", "top_logprob_num": 3}, KNOWN, SAMPLING)

    def test_the_model_name_that_sglang_router_adds_passes(self):
        assert unknown_field_error({"text": "hi", "model": "/models/SmolLM2"}, KNOWN, SAMPLING) is None

    @pytest.mark.parametrize("body", [{"text": "hi", "sampling_params": {"custom_params": {}}, "rid": "a"}, [], "x"])
    def test_known_fields_and_non_objects_pass(self, body):
        assert unknown_field_error(body, KNOWN, SAMPLING) is None  # non-objects: SGLang's contract check


class TestBestOf:
    @pytest.mark.parametrize("best_of, n", [(5, 1), (2, 3), (100000, 1)])
    def test_best_of_other_than_n_is_refused(self, best_of, n):
        reason = _refuse_best_of(None, None, SimpleNamespace(best_of=best_of, n=n))
        assert f"best_of is not supported (SGLang ignores it), got best_of={best_of} with n={n}" in reason

    @pytest.mark.parametrize("best_of, n", [(None, 1), (None, 4), (3, 3)])
    def test_best_of_absent_or_equal_to_n_passes(self, best_of, n):
        assert _refuse_best_of(None, None, SimpleNamespace(best_of=best_of, n=n)) is None

    def test_an_earlier_reason_is_kept(self):
        assert _refuse_best_of("Prompt cannot be empty", None, SimpleNamespace(best_of=5, n=1)) == "Prompt cannot be empty"
