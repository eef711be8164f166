"""``radix_ext.ops.batch_guards``: a malformed batch shape and a fan-out (prompts x n) beyond
``--max-fanout`` are refused with a reason naming the field, on the raw ``/generate`` body, on
SGLang's normalized request and on OpenAI requests alike."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from radix_ext.ops.batch_guards import (
    _refuse_bad_body,
    _refuse_bad_request,
    _refuse_openai_fanout,
    batch_shape_error,
    openai_error,
    prompts,
    request_error,
)

ONE = {"max_new_tokens": 2}
MAX_N = 1000  # --max-n, high enough that n alone is left to the fan-out here


class TestPrompts:
    @pytest.mark.parametrize("fields, found", [
        ({"text": "hi"}, ("text", None)),
        ({"text": ["a", "b"]}, ("text", 2)),
        ({"text": []}, ("text", 0)),
        ({"input_ids": [1, 2]}, ("input_ids", None)),
        ({"input_ids": [[1], [2], [3]]}, ("input_ids", 3)),
        ({"input_embeds": [[0.1, 0.2]]}, ("input_embeds", None)),
        ({"input_embeds": [[[0.1]], [[0.2]]]}, ("input_embeds", 2)),
        ({"text": "hi", "input_ids": [[1], [2]]}, ("text", None)),  # text wins, as in SGLang
    ])
    def test_the_prompt_field_and_its_batch_size(self, fields, found):
        assert prompts(fields) == found

    @pytest.mark.parametrize("fields", [{}, {"input_ids": []}, {"text": 5}, {"sampling_params": [ONE]}])
    def test_requests_sglang_refuses_itself_are_left_to_it(self, fields):
        assert prompts(fields) is None
        assert batch_shape_error(fields) is None


class TestBatchShape:
    def test_a_parameter_list_shorter_than_the_batch_is_named_with_both_lengths(self):
        error = batch_shape_error({"text": ["a", "b"], "sampling_params": [ONE]})
        assert error == ("sampling_params has 1 entries for the 2 prompts in text: send one entry per prompt, "
                         "or one value for all")

    def test_a_parameter_list_longer_than_the_batch_is_refused(self):
        assert "sampling_params has 3 entries for the 2 prompts" in batch_shape_error(
            {"text": ["a", "b"], "sampling_params": [ONE] * 3})

    @pytest.mark.parametrize("field, value", [
        ("return_logprob", [True]), ("logprob_start_len", [0, 0, 0]), ("top_logprobs_num", [1]),
        ("rid", ["x"]), ("lora_path", ["x"]), ("custom_logit_processor", ["x"]), ("bootstrap_room", [1]),
        ("video_data", ["v"]), ("token_ids_logprob", [[1]]),
    ])
    def test_every_per_prompt_list_must_match_the_batch(self, field, value):
        error = batch_shape_error({"input_ids": [[1], [2]], field: value})
        assert error is not None and error.startswith(f"{field} has {len(value)} ") and "input_ids" in error

    def test_lists_of_the_batch_length_and_shared_values_pass(self):
        assert batch_shape_error({"text": ["a", "b"], "sampling_params": [ONE, ONE], "rid": ["x", "y"],
                                  "return_logprob": True, "token_ids_logprob": [1, 2, 3]}) is None

    @pytest.mark.parametrize("field, value", [
        ("sampling_params", [ONE]), ("logprob_start_len", [0]), ("rid", ["x"]), ("return_logprob", [True]),
        ("token_ids_logprob", [[1], [2]]),
    ])
    def test_a_list_beside_a_single_prompt_is_refused(self, field, value):
        error = batch_shape_error({"text": "hi", field: value})
        assert error is not None and error.startswith(f"{field} is a list") and "single prompt" in error

    def test_a_single_prompt_keeps_its_own_lists(self):
        assert batch_shape_error({"text": "hi", "token_ids_logprob": [1, 2], "video_data": ["a", "b"]}) is None

    @pytest.mark.parametrize("params", [ONE, [ONE], None])
    def test_an_empty_batch_is_refused(self, params):
        assert batch_shape_error({"text": [], "sampling_params": params}) == (
            "text is an empty list: a batch needs at least one prompt")


class TestFanout:
    def test_a_batch_beyond_the_limit_names_the_field_the_count_and_the_flag(self):
        fields = {"text": ["hi"] * 5000, "sampling_params": {"max_new_tokens": 1}}
        error = request_error(fields, max_fanout=256, max_n=MAX_N)
        assert error == ("this request fans out to 5000 generations (5000 prompt(s) in text x sampling_params.n = 1), "
                         "more than the server's limit of 256 per request (--max-fanout): "
                         "split it into smaller requests")

    @pytest.mark.parametrize("batch, n, refused", [(4, 64, False), (5, 64, True), (1, 256, False), (1, 257, True),
                                                   (256, 1, False), (257, 1, True)])
    def test_prompts_times_n_is_bounded(self, batch, n, refused):
        fields = {"input_ids": [[1, 2]] * batch if batch > 1 else [1, 2], "sampling_params": {"n": n}}
        error = request_error(fields, max_fanout=256, max_n=MAX_N)
        assert (error is not None) == refused
        if refused:
            assert f"{batch * n} generations" in error and "--max-fanout" in error

    def test_n_is_read_from_the_first_entry_of_a_parameter_list(self):
        assert "6 generations" in request_error({"text": ["a", "b"], "sampling_params": [{"n": 3}, {"n": 3}]}, 5, MAX_N)

    @pytest.mark.parametrize("n", [0, -1, "x", 2.5, True])
    def test_a_bad_n_is_left_to_the_n_check(self, n):
        assert request_error({"text": ["a"] * 10, "sampling_params": {"n": n}}, max_fanout=2, max_n=MAX_N) is None

    def test_n_beyond_max_n_is_left_to_the_n_check_which_names_max_n(self):
        fields = {"text": "hi", "sampling_params": {"n": 100000}}
        assert request_error(fields, max_fanout=256, max_n=64) is None
        assert openai_error(SimpleNamespace(prompt="hi", n=100000), max_fanout=256, max_n=64) is None
        assert "65 generations" in request_error({"text": "hi", "sampling_params": {"n": 65}}, 64, 65)

    def test_the_shape_is_judged_before_the_fanout(self):
        error = request_error({"text": ["a"] * 10, "sampling_params": [ONE]}, max_fanout=2, max_n=MAX_N)
        assert error.startswith("sampling_params")


class TestOpenAI:
    @pytest.mark.parametrize("prompt, n, generations", [
        (["a"] * 300, 1, 300), ([[1, 2]] * 3, 100, 300), ("one", 300, 300), ([1, 2, 3], 300, 300),
    ])
    def test_prompt_times_n_names_prompt_and_n(self, prompt, n, generations):
        error = openai_error(SimpleNamespace(prompt=prompt, n=n), max_fanout=256, max_n=MAX_N)
        assert f"fans out to {generations} generations" in error and "in prompt x n =" in error

    def test_chat_is_one_conversation(self):
        assert openai_error(SimpleNamespace(messages=[], n=256), max_fanout=256, max_n=MAX_N) is None
        error = openai_error(SimpleNamespace(messages=[], n=257), max_fanout=256, max_n=MAX_N)
        assert "257 generations (1 prompt(s) in messages x n = 257)" in error

    def test_an_earlier_reason_is_kept(self):
        request = SimpleNamespace(prompt=["a"] * 300, n=1)
        kept = _refuse_openai_fanout("best_of is not supported", None, request, max_fanout=2, max_n=MAX_N)
        assert kept == "best_of is not supported"
        assert "--max-fanout" in _refuse_openai_fanout(None, None, request, max_fanout=2, max_n=MAX_N)


class TestHooks:
    def test_the_body_hook_keeps_the_contract_error_and_checks_otherwise(self):
        body = {"text": ["a", "b"], "sampling_params": [ONE]}
        assert _refuse_bad_body("invalid type", body, max_fanout=8, max_n=MAX_N) == "invalid type"
        assert _refuse_bad_body(None, body, max_fanout=8, max_n=MAX_N).startswith("sampling_params has 1 entries")
        assert _refuse_bad_body(None, [], max_fanout=8, max_n=MAX_N) is None

    def test_the_request_hook_raises_a_value_error_sglang_turns_into_a_400(self):
        obj = SimpleNamespace(text=["a", "b", "c"], input_ids=None, sampling_params={"n": 2})
        with pytest.raises(ValueError, match=r"6 generations .*\(--max-fanout\)"):
            _refuse_bad_request(obj, max_fanout=5, max_n=MAX_N)
        assert _refuse_bad_request(obj, max_fanout=6, max_n=MAX_N) is None
