"""``radix_ext.request_guards``: requests refused with a ValueError (HTTP 400) that names the
field, before SGLang turns them into a TypeError (HTTP 500) or a dead scheduler."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sglang.srt.sampling.sampling_params import SamplingParams

from radix_ext.request_guards import _refuse_unservable_prompt, check_sampling_params

VOCAB = 100


def validate(input_ids, sampling_params=None, input_embeds=None):
    manager = SimpleNamespace(sampling_params_class=SamplingParams, model_config=SimpleNamespace(vocab_size=VOCAB))
    obj = SimpleNamespace(sampling_params=sampling_params, input_embeds=input_embeds)
    return _refuse_unservable_prompt(manager, obj, input_ids)


class TestSamplingParams:
    @pytest.mark.parametrize("params, field", [
        ({"unknown_knob": 1}, "unknown_knob"),
        ({"max_new_tokens": "ten"}, "max_new_tokens"),
        ({"temperature": "warm"}, "temperature"),
        ({"stop": 123}, "stop"),
        ({"stop_token_ids": ["a"]}, "stop_token_ids"),
        ({"custom_params": "x"}, "custom_params"),
        ({"n": 1.5}, "n"),
        ({"temperature_typo": None}, "temperature_typo"),
    ])
    def test_unknown_or_mistyped_field_is_named(self, params, field):
        with pytest.raises(ValueError, match=f"sampling_params.{field}"):
            check_sampling_params(params, SamplingParams)

    def test_not_an_object_is_refused(self):
        with pytest.raises(ValueError, match="JSON object"):
            check_sampling_params("hot", SamplingParams)

    def test_valid_params_and_nulls_pass(self):
        check_sampling_params(None, SamplingParams)
        check_sampling_params({"max_new_tokens": 8, "temperature": 0, "top_p": 0.9, "top_k": 20, "stop": ["\n"],
                               "stop_token_ids": [2], "sampling_seed": 7, "custom_params": {"rksc": {"depth": 1}},
                               "logit_bias": {"5": -1.0}, "min_p": None},
                              SamplingParams)
        # CGEE's early-exit options nest a list inside custom_params: passed through, as SGLang does
        check_sampling_params({"max_new_tokens": 1, "custom_params": {"rksc_early_exit": {
                                  "full_depth": True, "lens": True, "lens_token_ids": [3, 4]}}},
                              SamplingParams)

    def test_values_out_of_range_are_left_to_sglang(self):
        check_sampling_params({"max_new_tokens": -5, "top_p": 7.0}, SamplingParams)  # its verify() names them


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
        assert validate([0, 5, VOCAB - 1], {"max_new_tokens": 2}) is None


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
    manager = SimpleNamespace(sampling_params_class=SamplingParams, model_config=SimpleNamespace(vocab_size=VOCAB))
    with pytest.raises(ValueError, match="top_logprobs_num"):
        _refuse_unservable_prompt(manager, SimpleNamespace(sampling_params=None, input_embeds=None,
                                                           top_logprobs_num=-1), [1, 2])
