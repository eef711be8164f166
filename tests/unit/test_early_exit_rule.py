"""CGEE level 2: the entropy stopping rule, the request options, and the SGLang code it copies."""

from __future__ import annotations

import hashlib
import inspect
import math

import pytest
import torch

from benchmarks.calibration.calibrate_cgee import exit_layers
from radix_ext.cgee.rule import first_exit_layer, lens_entropy
from rksc_sgl.protocol import EXIT_KEY as PARAMS_KEY
from rksc_sgl.protocol import EarlyExitParams

RULE = EarlyExitParams(theta=1.0, epsilon=0.2, min_layer=4)


class TestLensEntropy:
    def test_uniform_logits_have_log_vocab_nats(self):
        assert lens_entropy(torch.zeros(2, 1000)).tolist() == pytest.approx([math.log(1000)] * 2, rel=1e-5)

    def test_a_peaked_distribution_has_almost_none(self):
        logits = torch.full((1, 50), -100.0)
        logits[0, 3] = 100.0
        assert lens_entropy(logits).item() == pytest.approx(0.0, abs=1e-6)

    def test_two_equal_tokens_have_log_two(self):
        logits = torch.tensor([[5.0, 5.0, -1e9]])
        assert lens_entropy(logits).item() == pytest.approx(math.log(2), rel=1e-5)


class TestStoppingRule:
    def test_exits_when_entropy_is_low_and_stable(self):
        assert RULE.should_exit(layer=6, entropy=0.5, previous=0.6)

    def test_low_entropy_that_just_dropped_does_not_exit(self):
        assert not RULE.should_exit(layer=6, entropy=0.5, previous=2.0)

    def test_stable_but_high_entropy_does_not_exit(self):
        assert not RULE.should_exit(layer=6, entropy=1.5, previous=1.5)

    def test_never_exits_before_min_layer_or_without_a_previous_layer(self):
        assert not RULE.should_exit(layer=3, entropy=0.1, previous=0.1)
        assert not RULE.should_exit(layer=6, entropy=0.1, previous=None)

    def test_full_depth_never_exits(self):
        assert not EarlyExitParams(full_depth=True).should_exit(layer=10, entropy=0.0, previous=0.0)

    def test_first_exit_layer_is_the_first_layer_meeting_the_rule(self):
        #            l=1  2    3    4    5    6    7
        entropies = [0.1, 0.1, 3.0, 0.9, 0.8, 0.7, 0.7]
        assert first_exit_layer(entropies, RULE) == 5  # l=2 is before min_layer, l=4 jumped by 2.1

    def test_first_exit_layer_is_the_last_layer_when_nothing_qualifies(self):
        assert first_exit_layer([3.0] * 30, RULE) == 30

    def test_lens_starts_one_layer_before_min_layer(self):
        assert RULE.first_lens_layer(num_layers=30) == 3
        assert EarlyExitParams(full_depth=True).first_lens_layer(30) == 1
        assert EarlyExitParams(full_depth=True, lens=False).first_lens_layer(30) == 31
        assert EarlyExitParams(theta=1.0, epsilon=0.2, min_layer=30).first_lens_layer(30) == 31

    def test_calibration_replays_the_same_rule_vectorised(self):
        torch.manual_seed(0)
        entropies = torch.rand(64, 30, dtype=torch.float64) * 2
        for theta, epsilon, min_layer in [(1.0, 0.2, 4), (0.5, 1.0, 2), (2.0, 0.05, 20), (0.0, 1.0, 2)]:
            rule = EarlyExitParams(theta=theta, epsilon=epsilon, min_layer=min_layer)
            expected = [first_exit_layer(row.tolist(), rule) for row in entropies]
            assert exit_layers(entropies, theta, epsilon, min_layer).tolist() == expected


class TestRequestOptions:
    def test_round_trips_through_custom_params(self):
        params = EarlyExitParams(theta=1.5, epsilon=0.1, min_layer=8, lens_token_ids=(3, 4))
        custom = params.to_custom_params({"other": 1})
        assert custom["other"] == 1
        assert EarlyExitParams.from_custom_params(custom) == params

    def test_absent_entry_means_no_early_exit(self):
        assert EarlyExitParams.from_custom_params(None) is None
        assert EarlyExitParams.from_custom_params({"rksc": {"depth": 1}}) is None

    @pytest.mark.parametrize("entry, field", [
        ({"epsilon": 0.1}, "theta"),
        ({"theta": -1, "epsilon": 0.1}, "theta"),
        ({"theta": 1, "epsilon": "x"}, "epsilon"),
        ({"theta": 1, "epsilon": 0.1, "min_layer": 1}, "min_layer"),
        ({"theta": 1, "epsilon": 0.1, "lens": False}, "lens"),
        ({"full_depth": "yes"}, "full_depth"),
        ({"full_depth": True, "lens_token_ids": [1, -2]}, "lens_token_ids"),
    ])
    def test_bad_options_name_the_field(self, entry, field):
        with pytest.raises(ValueError, match=f"{PARAMS_KEY}.{field}"):
            EarlyExitParams.from_custom_params({PARAMS_KEY: entry})

    def test_unknown_fields_are_refused(self):
        with pytest.raises(ValueError, match="unknown field"):
            EarlyExitParams.from_custom_params({PARAMS_KEY: {"full_depth": True, "layers": 3}})


# SHA-256 prefixes of the SGLang 0.5.23 functions whose body radix_ext.cgee.forward._lens_forward
# copies (the layer loop, final norm and logits processor call).
PINNED = {
    "LlamaModel.forward": "d02b894a8afcbf3f",
    "LlamaForCausalLM.forward": "8f45f98f8561cc31",
}


class TestPinnedSglangCode:
    def test_the_copied_llama_forward_is_unchanged(self):
        from sglang.srt.models.llama import LlamaForCausalLM, LlamaModel

        for name, fn in (("LlamaModel.forward", LlamaModel.forward), ("LlamaForCausalLM.forward", LlamaForCausalLM.forward)):
            source = inspect.getsource(inspect.unwrap(fn))
            digest = hashlib.sha256(source.encode()).hexdigest()[:16]
            assert digest == PINNED[name], f"SGLang changed {name}: re-check radix_ext.cgee.forward._lens_forward"

    def test_kv_release_still_honours_skip_radix_cache_insert(self):
        from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache

        assert "skip_radix_cache_insert" in inspect.getsource(release_kv_cache)
        assert "skip_radix_cache_insert" in inspect.getsource(checkpoint_kv_cache)


def synthetic_records(num_problems: int = 80, num_layers: int = 30) -> list[dict]:
    """Half the problems are unanimous and confident; in all, the lens turns faithful (and its
    entropy low and flat) from layer 12 on, so an exit from layer 13 on never changes a decision (the grid has min_layer 12, not 13)."""
    gen = torch.Generator().manual_seed(0)
    records = []
    for p in range(num_problems):
        unanimous = p < num_problems // 2
        final = torch.rand(3, generator=gen).tolist()
        lens = torch.rand(3, num_layers, generator=gen)
        lens[:, 11:] = torch.tensor(final).unsqueeze(1)
        entropies = torch.full((3, num_layers), 3.0)
        entropies[:, 11:] = 0.5
        records.append({
            "answers": ["a", "a", "a"] if unanimous else ["a", "b", "c"],
            "confidences": [0.9] * 3 if unanimous else [0.3] * 3,
            "scores": final, "entropies": entropies.tolist(), "lens_scores": lens.tolist(),
        })
    return records


class TestCalibrationSearch:
    def test_picks_the_cheapest_setting_that_never_changes_a_decision(self):
        from benchmarks.calibration.calibrate_cgee import load_records, search

        chosen = search(load_records(synthetic_records()), target_error=0.05)
        assert chosen["thresholds"] == {"tau_conf": 0.9, "margin": 1.0, "theta": 0.75, "epsilon": 0.02, "min_layer": 12}
        assert chosen["calibration"]["errors"] == 0 and chosen["calibration"]["skip_rate"] == 0.5
        assert chosen["calibration"]["mean_batch_exit_layer"] == 13

    def test_per_dataset_search_sees_what_pooling_hides(self):
        from benchmarks.calibration.calibrate_cgee import load_records, per_dataset, search

        # "easy": the synthetic set (a confident skip is always right). "hard": the same, except that
        # on 2 of its 80 problems two of three candidates agree and the full-depth verifier prefers
        # the third, so skipping them is wrong. Pooled (160 problems, up to 3 errors under a 5%
        # bound) the search skips them; on "hard" alone (80 problems: no error allowed) it must not.
        easy = [{**r, "dataset": "easy"} for r in synthetic_records()]
        hard = [{**r, "dataset": "hard"} for r in synthetic_records()]
        for r in hard[:2]:
            r["answers"], r["scores"] = ["a", "a", "b"], [0.1, 0.1, 0.9]
            r["lens_scores"] = [[s] * 30 for s in r["scores"]]
        pooled = search(load_records(easy + hard), target_error=0.05)["calibration"]
        split = per_dataset(easy + hard, target_error=0.05)
        assert pooled["errors"] == 2 and pooled["skip_rate"] == 0.5
        assert split["easy"]["calibration"]["errors"] == 0 and split["easy"]["calibration"]["skip_rate"] == 0.5
        assert split["hard"]["calibration"]["errors"] == 0 and split["hard"]["calibration"]["skip_rate"] == 38 / 80

    def test_refuses_a_target_the_sample_cannot_support(self):
        from benchmarks.calibration.calibrate_cgee import load_records, search

        with pytest.raises(ValueError, match="even with no error"):
            search(load_records(synthetic_records(num_problems=20)), target_error=0.05)


class FakeReq:
    def __init__(self, params: EarlyExitParams | None = None):
        if params is not None:
            self.rksc_early_exit = params


class FakeAdder:
    def __init__(self, *admitted: FakeReq):
        self.can_run_list = list(admitted)


class TestBatchIsolation:
    """``PrefillAdder.add_one_req`` (AROUND): flagged and ordinary requests never share a prefill."""

    def admit(self, adder, req):
        from radix_ext.cgee.requests import _same_batch_class

        calls = []
        result = _same_batch_class(lambda a, r, *args: calls.append(r) or "admitted", adder, req, False, None)
        return result, calls

    def test_a_request_of_the_other_class_waits_for_the_next_batch(self):
        from sglang.srt.managers.schedule_policy import AddReqResult

        for first, candidate in ((FakeReq(RULE), FakeReq()), (FakeReq(), FakeReq(RULE))):
            result, calls = self.admit(FakeAdder(first), candidate)
            assert result == AddReqResult.OTHER and calls == []

    def test_requests_of_the_same_class_go_through_sglang_admission(self):
        for first, candidate in ((FakeReq(RULE), FakeReq(RULE)), (FakeReq(), FakeReq())):
            assert self.admit(FakeAdder(first), candidate) == ("admitted", [candidate])
        assert self.admit(FakeAdder(), FakeReq(RULE))[0] == "admitted"


class TestRequestCheck:
    """``SamplingParams.verify`` (AFTER): what the tokenizer refuses before the scheduler sees it."""

    def check(self, custom_params, max_new_tokens=1):
        from types import SimpleNamespace

        from radix_ext.cgee.requests import _check_request

        return _check_request(None, SimpleNamespace(custom_params=custom_params, max_new_tokens=max_new_tokens))

    def test_a_flagged_request_must_generate_exactly_its_verdict_token(self):
        with pytest.raises(ValueError, match="max_new_tokens == 1"):
            self.check(RULE.to_custom_params(), max_new_tokens=8)
        assert self.check(RULE.to_custom_params()) is None

    def test_unflagged_requests_are_not_constrained(self):
        assert self.check(None, max_new_tokens=128) is None


class TestTensorParallelRefusal:
    """``Scheduler._create_generation_req`` (AFTER): under ``--tp-size`` > 1 a flagged request is
    aborted with a 400 instead of running a forward whose ranks could exit at different layers."""

    class Req:
        def __init__(self, custom_params):
            from types import SimpleNamespace

            self.rid = "r1"
            self.sampling_params = SimpleNamespace(custom_params=custom_params)
            self.aborted = None

        def set_finish_with_abort(self, error_msg, *args, **kwargs):
            self.aborted = error_msg

    def flag(self, custom_params, tp_size):
        from types import SimpleNamespace

        from radix_ext.cgee.requests import _flag_request, params_of

        req = self.Req(custom_params)
        _flag_request(req, SimpleNamespace(tp_size=tp_size), None)
        return req, params_of(req)

    def test_flagged_request_is_refused_naming_tp_size(self):
        req, params = self.flag(RULE.to_custom_params(), tp_size=2)
        assert params is None and "--tp-size 1" in req.aborted and "2 ranks" in req.aborted
        assert not getattr(req, "skip_radix_cache_insert", False)

    def test_single_rank_flags_the_request(self):
        req, params = self.flag(RULE.to_custom_params(), tp_size=1)
        assert req.aborted is None and params == RULE and req.skip_radix_cache_insert

    def test_plain_requests_run_under_any_tp_size(self):
        req, params = self.flag(None, tp_size=4)
        assert req.aborted is None and params is None
