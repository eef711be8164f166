"""``rksc_sgl.protocol``: what every option parser does with a ``custom_params`` that is not an
object (SGLang declares it an object but passes anything through to the tokenizer's checks)."""

from __future__ import annotations

import pytest

from rksc_sgl.protocol import AsksOptions, BranchTag, EarlyExitParams


@pytest.mark.parametrize("parser", [BranchTag, EarlyExitParams, AsksOptions])
@pytest.mark.parametrize("bad", ["x", 3, ["rksc"]])
def test_custom_params_that_is_not_an_object_is_refused(parser, bad):
    with pytest.raises(ValueError, match="custom_params must be an object"):
        parser.from_custom_params(bad)


@pytest.mark.parametrize("parser", [BranchTag, EarlyExitParams])
def test_absent_options_are_none(parser):
    assert parser.from_custom_params(None) is None
    assert parser.from_custom_params({"someone_else": 1}) is None


class TestStopOptions:
    """The early-stop entries: each malformed field is named (an HTTP 400 through the verify hook)."""

    @pytest.mark.parametrize("entry, field", [
        ({"window": 0, "top_k": 3, "threshold": 1.0}, "rksc_conf_stop.window"),
        ({"window": 8, "top_k": True, "threshold": 1.0}, "rksc_conf_stop.top_k"),
        ({"window": 8, "top_k": 3, "threshold": -1}, "rksc_conf_stop.threshold"),
        ({"window": 8, "top_k": 3, "threshold": float("nan")}, "rksc_conf_stop.threshold"),
        ({"window": 8, "top_k": 3}, "rksc_conf_stop needs"),
        ({"window": 8, "top_k": 3, "threshold": 1, "tau": 2}, "unknown field"),
    ])
    def test_a_bad_confidence_stop_names_the_field(self, entry, field):
        from rksc_sgl.stop_options import ConfStop

        with pytest.raises(ValueError, match=field):
            ConfStop.from_custom_params({"rksc_conf_stop": entry})

    @pytest.mark.parametrize("entry, field", [
        ({"answer_pattern": "(", "rule": "esc"}, "answer_pattern is not a valid regex"),
        ({"answer_pattern": "", "rule": "esc"}, "answer_pattern"),
        ({"answer_pattern": "x" * 513, "rule": "esc"}, "answer_pattern must be at most 512 characters, got 513"),
        ({"answer_pattern": "x", "rule": "vote"}, "rule must be one of"),
        ({"answer_pattern": "x", "rule": "esc", "window": 0}, "window"),
        ({"answer_pattern": "x", "rule": "beta", "confidence": 1.0}, "confidence"),
        ({"answer_pattern": "x", "rule": "beta", "min_samples": 0}, "min_samples"),
        ({"rule": "beta"}, "needs"),
        ({"answer_pattern": [], "rule": "esc"}, "answer_pattern must list 1 to 8 patterns, got 0"),
        ({"answer_pattern": ["x"] * 9, "rule": "esc"}, "answer_pattern must list 1 to 8 patterns, got 9"),
        ({"answer_pattern": ["x", "("], "rule": "esc"}, r"answer_pattern\[1\] is not a valid regex"),
        ({"answer_pattern": ["x", ""], "rule": "esc"}, r"answer_pattern\[1\] must be a non-empty regex"),
        ({"answer_pattern": ["x", 3], "rule": "esc"}, r"answer_pattern\[1\] must be a non-empty regex"),
        ({"answer_pattern": ["x" * 513], "rule": "esc"}, r"answer_pattern\[0\] must be at most 512 characters, got 513"),
        ({"answer_pattern": {"x": 1}, "rule": "esc"}, "answer_pattern must be a non-empty regex"),
        ({"answer_pattern": "x", "rule": "esc", "answer_normalize": "digits"}, "answer_normalize must be"),
        ({"answer_pattern": "x", "rule": "esc", "answer_normalize": "letter:"}, "answer_normalize must be"),
        ({"answer_pattern": "x", "rule": "esc", "answer_normalize": "letter:ab"}, "answer_normalize must be"),
        ({"answer_pattern": "x", "rule": "esc", "answer_normalize": "letter:AA"}, "answer_normalize must be"),
        ({"answer_pattern": "x", "rule": "esc", "answer_normalize": 1}, "answer_normalize must be"),
    ])
    def test_a_bad_group_policy_names_the_field(self, entry, field):
        from rksc_sgl.stop_options import GroupPolicy

        with pytest.raises(ValueError, match=field):
            GroupPolicy.from_custom_params({"rksc_group_policy": entry})

    def test_a_group_policy_takes_an_ordered_list_of_patterns_and_a_normalisation(self):
        from rksc_sgl.stop_options import GroupPolicy

        entry = {"answer_pattern": ["answer is (\\d+)", "\\d+"], "rule": "beta", "answer_normalize": "number"}
        policy = GroupPolicy.from_custom_params({"rksc_group_policy": entry})
        assert policy.patterns == ("answer is (\\d+)", "\\d+") and policy.answer_normalize == "number"
        assert GroupPolicy.from_custom_params(policy.to_custom_params()) == policy
        assert GroupPolicy("x", "esc").patterns == ("x",)  # one pattern as a string, as before
        assert GroupPolicy("x", "esc", answer_normalize="letter:ABCDE").answer_normalize == "letter:ABCDE"

    @pytest.mark.parametrize("entry, field", [
        ({"id": "", "index": 0}, "rksc_group.id"),
        ({"id": "g", "index": -1}, "rksc_group.index"),
        ({"id": "g"}, "rksc_group needs"),
    ])
    def test_a_bad_group_tag_names_the_field(self, entry, field):
        from rksc_sgl.stop_options import GroupTag

        with pytest.raises(ValueError, match=field):
            GroupTag.from_custom_params({"rksc_group": entry})

    def test_each_option_round_trips_through_custom_params(self):
        from rksc_sgl.stop_options import ConfStop, GroupPolicy, GroupTag

        for option in (ConfStop(8, 3, 1.5), GroupPolicy(r"(\d+)", "beta", confidence=0.9), GroupTag("g", 2)):
            assert type(option).from_custom_params(option.to_custom_params({"x": 1})) == option
