"""``radix_ext.request_guards``: requests refused with a ValueError (HTTP 400) that names the
field, before they reach a scheduler they would kill or a route that would never answer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from radix_ext.request_guards import _refuse_unservable_prompt

VOCAB = 100


MANAGER = SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB))


def validate(input_ids, sent_ids: bool = True, input_embeds=None, top_logprobs_num=0):
    """``input_ids`` as the hook sees them; ``sent_ids``: the client sent them (else the tokenizer did)."""
    obj = SimpleNamespace(input_ids=input_ids if sent_ids else None, input_embeds=input_embeds,
                          top_logprobs_num=top_logprobs_num)
    return _refuse_unservable_prompt(MANAGER, obj, input_ids)


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


class TestSamples:
    @pytest.mark.parametrize("params", [{"n": 0}, {"n": -2}, [{"n": 1}, {"n": 0}], {"n": "3"}])
    def test_fewer_than_one_sample_is_refused(self, params):
        from radix_ext.request_guards import _refuse_no_samples

        with pytest.raises(ValueError, match="sampling_params.n must be an integer >= 1"):
            _refuse_no_samples(SimpleNamespace(sampling_params=params))

    @pytest.mark.parametrize("params", [None, {}, {"n": 1}, {"n": 4}, [{"n": 2}, {"n": 2}], {"n": None}])
    def test_one_or_more_samples_pass(self, params):
        from radix_ext.request_guards import _refuse_no_samples

        assert _refuse_no_samples(SimpleNamespace(sampling_params=params)) is None


def test_negative_top_logprobs_num_is_refused():
    with pytest.raises(ValueError, match="top_logprobs_num must be >= 0"):
        validate([1, 2], top_logprobs_num=-1)
