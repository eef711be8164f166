"""ASKS's gate (``radix_ext.asks.gate``) and its options, on tensors: no engine."""

from __future__ import annotations

import math

import pytest
import torch

from radix_ext.asks.gate import Gate, Signature, adopts, layer_weights, similarity
from rksc_sgl.config import RkscConfig, parse_layers
from rksc_sgl.protocol import AsksOptions

torch.manual_seed(0)
A, B = torch.randn(4, 16), torch.randn(4, 16)
W = layer_weights((1, 2, 3, 4), 4, 2.0)


def test_weights_are_exp_alpha_l_over_L():
    assert torch.allclose(layer_weights((2, 4), 4, 3.0), torch.tensor([math.exp(1.5), math.exp(3.0)]))
    assert torch.equal(layer_weights((1, 2, 3), 3, 0.0), torch.ones(3))


def test_similarity_is_symmetric():
    assert similarity(A, B, W) == pytest.approx(similarity(B, A, W), abs=1e-7)


def test_identical_spans_have_sigma_one_and_opposite_minus_one():
    assert similarity(A, A, W) == pytest.approx(1.0, abs=1e-6)
    assert similarity(A, -A, W) == pytest.approx(-1.0, abs=1e-6)


def test_sigma_ignores_each_layers_scale():
    scales = torch.tensor([[0.1], [3.0], [7.0], [100.0]])
    assert similarity(A * scales, B, W) == pytest.approx(similarity(A, B, W), abs=1e-6)


def test_sigma_is_the_weighted_mean_of_per_layer_cosines():
    cos = torch.nn.functional.cosine_similarity(A, B, dim=-1)
    assert similarity(A, B, W) == pytest.approx(float((W * cos).sum() / W.sum()), abs=1e-6)
    # alpha moves weight to later layers: with one agreeing late layer, sigma rises with alpha
    b = -A.clone()
    b[3] = A[3]
    assert similarity(A, b, layer_weights((1, 2, 3, 4), 4, 4.0)) > similarity(A, b, layer_weights((1, 2, 3, 4), 4, 0.0))


def test_background_centring_removes_a_shared_component():
    shared = 50 * torch.randn(4, 16)
    a, b = shared + A, shared + B
    assert similarity(a, b, W) > 0.95  # raw: the shared part dominates
    assert similarity(a, b, W, background=shared) == pytest.approx(similarity(A, B, W), abs=1e-5)


@pytest.mark.parametrize("tau", [1.0, 1.5])
def test_tau_of_one_or_more_never_adopts(tau):
    assert not adopts(1.0, tau)


def test_gate_boundary_and_nan():
    assert adopts(0.5, 0.5) and not adopts(0.4999, 0.5)
    assert not adopts(float("nan"), 0.0)
    assert math.isnan(similarity(torch.zeros(4, 16), B, W))  # a zero vector: NaN, never adopts


def test_gate_refuses_signatures_of_another_layer_set():
    gate = Gate(tau=0.0, alpha=0.0, layers=(1, 2), num_layers=2)
    a = Signature(A[:2].half(), (1, 2), 0, 3)
    b = Signature(B[:2].half(), (1, 3), 0, 3)
    assert math.isnan(gate.sigma(a, b)) and not adopts(gate.sigma(a, b), gate.tau)
    assert gate.sigma(a, a) == pytest.approx(1.0, abs=1e-3)


def test_signature_bytes_and_end():
    sig = Signature(torch.zeros(10, 576, dtype=torch.float16), tuple(range(1, 11)), 3, 20)
    assert sig.nbytes == 10 * 576 * 2 and sig.end == 23


class TestOptions:
    def test_layers_spec(self):
        assert parse_layers("all") is None and parse_layers("all", 4) == (1, 2, 3, 4)
        assert parse_layers("11-13,2") == (2, 11, 12, 13)

    @pytest.mark.parametrize("spec", ["", "0", "5-3", "a", "1-", "3,,4"])
    def test_bad_layers_name_the_flag(self, spec):
        with pytest.raises(ValueError, match="--asks-layers"):
            parse_layers(spec)

    def test_layer_beyond_the_model_names_it(self):
        with pytest.raises(ValueError, match="layer 31; this model has 30"):
            parse_layers("20-31", 30)

    @pytest.mark.parametrize("field,value,flag", [
        ("asks_tau", -0.1, "--asks-tau"), ("asks_tau", float("nan"), "--asks-tau"),
        ("asks_min_tail", 0, "--asks-min-tail"), ("asks_signature_cap_mb", -1, "--asks-signature-cap-mb"),
        ("asks_layers", "x", "--asks-layers"), ("asks", 1, "--asks"),
    ])
    def test_bad_config_names_the_flag(self, field, value, flag):
        with pytest.raises(ValueError, match=flag):
            RkscConfig(**{field: value})

    def test_asks_implies_the_backend(self):
        assert RkscConfig(asks=True).server_overrides() == {"radix_cache_backend": "rksc"}

    def test_request_opt_out_round_trips_and_bad_entries_name_the_field(self):
        params = AsksOptions(enabled=False).to_custom_params({"other": 1})
        assert params["other"] == 1 and AsksOptions.from_custom_params(params) == AsksOptions(False)
        assert AsksOptions.from_custom_params(None).enabled
        for bad in ({"rksc_asks": {"enabled": "no"}}, {"rksc_asks": {"on": False}}, {"rksc_asks": 3}):
            with pytest.raises(ValueError, match="custom_params.rksc_asks"):
                AsksOptions.from_custom_params(bad)


class TestGroupsAndPooling:
    def test_group_round_trips_and_bad_groups_name_the_field(self):
        params = AsksOptions(group="g-1").to_custom_params()
        assert params == {"rksc_asks": {"enabled": True, "group": "g-1"}}
        assert AsksOptions.from_custom_params(params).group == "g-1"
        assert AsksOptions.from_custom_params(None).group is None  # no group: never rewritten
        for bad in ("", 7, "x" * 129, ["g"]):
            with pytest.raises(ValueError, match="custom_params.rksc_asks.group must be a string of 1 to 128"):
                AsksOptions.from_custom_params({"rksc_asks": {"group": bad}})

    def test_a_requests_gate_round_trips_and_bad_gates_name_the_field(self):
        params = AsksOptions(group="g", max_deviation=0.05).to_custom_params()
        assert params == {"rksc_asks": {"enabled": True, "group": "g", "max_deviation": 0.05}}
        assert AsksOptions.from_custom_params(params).max_deviation == 0.05
        assert AsksOptions.from_custom_params({"rksc_asks": {"group": "g"}}).max_deviation is None  # the server's
        for bad in (0, -0.1, float("nan"), "0.05", True):
            with pytest.raises(ValueError, match="custom_params.rksc_asks.max_deviation must be a number > 0"):
                AsksOptions.from_custom_params({"rksc_asks": {"max_deviation": bad}})

    def test_bad_pooling_names_the_flag(self):
        with pytest.raises(ValueError, match="--asks-pooling must be one of mean, last"):
            RkscConfig(asks_pooling="max")

    def test_background_without_the_pooling_names_the_flag(self, tmp_path):
        from radix_ext.asks import background as asks_background

        path = tmp_path / "bg.pt"
        asks_background.save(path, backgrounds={"mean": torch.zeros(3, 4)}, model_fp="fp", model_name="m")
        assert asks_background.load(str(path), "fp", (1, 3), "mean").shape == (2, 4)
        with pytest.raises(ValueError, match="no background for --asks-pooling last"):
            asks_background.load(str(path), "fp", (1, 3), "last")


class TestProbeSimilarity:
    """``benchmarks.calibration.calibrate_asks.probe_similarity``: 1 - JSD / ln 2 of two next-token distributions."""

    def test_same_distribution_is_one_and_disjoint_ones_are_zero(self):
        from benchmarks.calibration.calibrate_asks import probe_similarity

        p = torch.log_softmax(torch.randn(50), dim=-1)
        assert probe_similarity(p, p) == pytest.approx(1.0, abs=1e-6)
        a = torch.log(torch.tensor([0.5, 0.5, 1e-30, 1e-30]))
        b = torch.log(torch.tensor([1e-30, 1e-30, 0.5, 0.5]))
        assert probe_similarity(a, b) == pytest.approx(0.0, abs=1e-6)

    def test_symmetric_and_between_zero_and_one(self):
        from benchmarks.calibration.calibrate_asks import probe_similarity

        a, b = torch.log_softmax(torch.randn(50), dim=-1), torch.log_softmax(torch.randn(50), dim=-1)
        assert probe_similarity(a, b) == pytest.approx(probe_similarity(b, a), abs=1e-6)
        assert 0.0 < probe_similarity(a, b) < 1.0


def test_calibration_cosine_matrices_give_the_gates_sigma():
    """``benchmarks.calibrate_asks`` scores its grid from per-layer cosine matrices: the same sigma
    as ``similarity`` on each pair, centred or raw, for any layer subset and alpha."""
    from benchmarks.calibration.calibrate_asks import cosines

    sig, background = torch.randn(5, 4, 16), torch.randn(4, 16)
    index, weights = [1, 3], layer_weights((2, 4), 4, 2.0)
    for bg in (None, background):
        cos = cosines(sig, bg)
        sigma = (weights[:, None, None] * cos[index]).sum(dim=0) / weights.sum()
        for i, j in ((0, 1), (2, 4), (3, 3)):
            expected = similarity(sig[i][index], sig[j][index], weights, None if bg is None else bg[index])
            assert float(sigma[i, j]) == pytest.approx(expected, abs=1e-5)
