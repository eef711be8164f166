"""CGEE on the real engine: early exit really skips layers, leaves no trace, and spares other requests."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from radix_ext.cgee.forward import LAYER_CALL_COUNTER
from rksc_sgl.protocol import EarlyExitParams
from rksc_sgl.cgee import Candidate, CgeeThresholds, verdict_token_ids, verifier_prompt, verify
from rksc_sgl.config import RkscConfig
from tests.integration.kv import assert_no_kv_leak
from tests.integration.linears import FLOAT32_LINEARS, ROW_INVARIANT

pytestmark = pytest.mark.integration

NUM_LAYERS = 30  # SmolLM2-135M
CONTEXT = (
    "<|im_start|>system\nYou are a careful assistant who solves problems step by step.<|im_end|>\n"
    "<|im_start|>user\nTom has 3 boxes with 4 apples each. He eats 2 apples. How many are left?<|im_end|>\n"
    "<|im_start|>assistant\n3 boxes times 4 apples is 12 apples. 12 - 2 = 10. The answer is 10.<|im_end|>\n"
)
EARLY = EarlyExitParams(theta=20.0, epsilon=20.0, min_layer=3)  # fires at the first allowed layer
GREEDY = {"max_new_tokens": 8, "temperature": 0}
_blockers = itertools.count()


@pytest.fixture(scope="module")
def backend():
    """An engine whose decoder layers count their calls (SGLang's ``forward_hooks``)."""
    from rksc_sgl.engine import launch_engine
    from rksc_sgl.engine_endpoint import RkscEngineEndpoint

    b = RkscEngineEndpoint(launch_engine(max_total_tokens=16384, log_level="error",
                                         forward_hooks=[LAYER_CALL_COUNTER]))
    yield b
    b.shutdown()


def generate(backend, text, sampling: dict, **extra):
    body = {"text": text, "sampling_params": sampling, "return_logprob": True, "top_logprobs_num": 5, **extra}
    return backend._generate_http_request(None, body)


def flagged(params: EarlyExitParams, **sampling) -> dict:
    return {"max_new_tokens": 1, "temperature": 0, **sampling, "custom_params": params.to_custom_params()}


def info(out: dict, key: str):
    value = out["meta_info"].get(key)
    return value[0] if value else None


def computation(out: dict):
    """What a request computed: its tokens, their log-probabilities and top-5 alternatives."""
    m = out["meta_info"]
    return out["text"], m["output_token_logprobs"], m["output_top_logprobs"]


def queued_behind_a_blocker(backend, body: dict):
    """Send ``body`` while the scheduler is busy with a long prefill, so its requests are all
    waiting when the next prefill batch is formed (and can share it)."""
    blocker_text = f"Note {next(_blockers)} {time.time()}: " + "the quick brown fox jumps over the lazy dog. " * 80
    blocker = threading.Thread(target=generate, args=(backend, blocker_text, GREEDY | {"max_new_tokens": 1}))
    states = backend.engine.tokenizer_manager.rid_to_state
    before = len(states)
    blocker.start()
    deadline = time.monotonic() + 30
    while len(states) <= before and time.monotonic() < deadline:  # the blocker went to the scheduler
        time.sleep(0.005)
    # The scheduler exposes nothing while a prefill runs, so "the blocker's prefill has started"
    # cannot be observed from here: give it a moment (the one timing assumption left in this file).
    time.sleep(0.5)
    try:
        return backend._generate_http_request(None, body)
    finally:
        blocker.join()


class TestNoTraceInvariant:
    def test_a_later_request_computes_exactly_what_it_computes_on_a_fresh_cache(self, backend):
        prompt = verifier_prompt(backend, CONTEXT)
        # Reference: a fresh radix tree holding the context (as after generating it), then the request.
        backend.flush_cache()
        generate(backend, CONTEXT, {"max_new_tokens": 1})
        reference = generate(backend, prompt, GREEDY)
        # Same state, but an early-exited verification of the same prompt runs in between.
        backend.flush_cache()
        generate(backend, CONTEXT, {"max_new_tokens": 1})
        verdict = generate(backend, prompt, flagged(EARLY))
        assert info(verdict, "rksc_exit_layer") == 3 and info(verdict, "rksc_layer_calls") == 3
        after = generate(backend, prompt, GREEDY)
        # Nothing of the truncated pass was matched: the same tokens came from the cache ...
        assert after["meta_info"]["cached_tokens"] == reference["meta_info"]["cached_tokens"]
        assert reference["meta_info"]["cached_tokens"] < reference["meta_info"]["prompt_tokens"] - 5
        # ... and the computation is bit-for-bit the fresh one (same batch shape, same KV).
        assert computation(after) == computation(reference)
        assert_no_kv_leak(backend)

    def test_control_an_ordinary_request_does_leave_its_prompt_in_the_cache(self, backend):
        prompt = verifier_prompt(backend, CONTEXT)
        backend.flush_cache()
        first = generate(backend, prompt, {"max_new_tokens": 1, "temperature": 0})
        second = generate(backend, prompt, {"max_new_tokens": 1, "temperature": 0})
        assert second["meta_info"]["cached_tokens"] >= first["meta_info"]["prompt_tokens"] - 1


class TestLayersAfterTheExitDoNotRun:
    def test_decoder_layer_calls_stop_at_the_exit_layer(self, backend):
        out = generate(backend, verifier_prompt(backend, CONTEXT), flagged(EarlyExitParams(theta=20.0, epsilon=20.0, min_layer=7)))
        assert info(out, "rksc_exit_layer") == 7
        assert info(out, "rksc_layer_calls") == 7 == info(out, "rksc_layers_run")
        entropies = info(out, "rksc_entropies")
        assert [e is not None for e in entropies] == [6 <= layer <= 7 for layer in range(1, NUM_LAYERS + 1)]

    def test_min_layer_at_full_depth_takes_sglangs_own_forward(self, backend):
        out = generate(backend, verifier_prompt(backend, CONTEXT), flagged(EarlyExitParams(theta=20.0, epsilon=20.0, min_layer=NUM_LAYERS)))
        assert info(out, "rksc_exit_layer") == info(out, "rksc_layer_calls") == NUM_LAYERS
        assert info(out, "rksc_entropies") == [None] * NUM_LAYERS  # no lens was computed

    def test_full_depth_runs_every_layer_and_computes_what_sglang_computes(self, backend):
        prompt = verifier_prompt(backend, CONTEXT)
        yes, no = verdict_token_ids(backend)
        for _ in range(2):  # the second is served from the cache, as the flagged one below will be
            stock = generate(backend, prompt, {"max_new_tokens": 1, "temperature": 0}, token_ids_logprob=[*yes, *no])
        lens = generate(backend, prompt, flagged(EarlyExitParams(full_depth=True, lens_token_ids=yes + no)),
                        token_ids_logprob=[*yes, *no])
        assert info(lens, "rksc_layer_calls") == NUM_LAYERS == info(lens, "rksc_exit_layer")
        assert computation(lens) == computation(stock)  # our copy of the loop is SGLang's loop
        entropies = info(lens, "rksc_entropies")
        assert len(entropies) == NUM_LAYERS and all(e is not None and e >= 0 for e in entropies)
        # The lens at the last layer is the model's own output distribution (up to float32
        # summation order: the two passes see different batch shapes; 2e-5 was seen under load).
        final = [lp for lp, _, _ in stock["meta_info"]["output_token_ids_logprobs"][0]]
        assert info(lens, "rksc_lens_logprobs")[-1] == pytest.approx(final, abs=1e-4)
        assert_no_kv_leak(backend)


class TestBatches:
    def test_an_ordinary_request_sent_with_a_verification_is_computed_as_alone(self, backend):
        prompt = verifier_prompt(backend, CONTEXT)
        for _ in range(2):  # the second is served from the cache, as the one sent below will be
            alone = generate(backend, prompt, GREEDY)
        outs = queued_behind_a_blocker(backend, {
            "text": [prompt, prompt], "sampling_params": [GREEDY, flagged(EARLY)],
            "return_logprob": True, "top_logprobs_num": 5,
        })
        # Its prefill (where early exit acts) is bit-for-bit the lone one. Its decode steps need
        # not be: they share steps with whatever else runs (under SGLang's overlap schedule, which
        # retires a request one step late, even with requests that finished at prefill).
        # With int8 linears and invariant attention each row's output is the lone one's bits
        # (the blocker is greedy: SGLang's sampler reads log-probabilities as log_softmax in an
        # all-greedy batch and as log(softmax) otherwise, 3e-8 apart). Float32 linears round a
        # 2-row step differently from a 1-row one (under 1e-4); int8 linears with SDPA's
        # attention made that whole rounding steps (6.2e-4 seen; tests.integration.linears).
        text, logprobs, top = computation(outs[0])
        text_alone, logprobs_alone, top_alone = computation(alone)
        assert text == text_alone and top[0] == top_alone[0]
        if ROW_INVARIANT:
            assert logprobs == logprobs_alone
        bound = 1e-4 if FLOAT32_LINEARS else 2e-3
        assert [lp for lp, *_ in logprobs] == pytest.approx([lp for lp, *_ in logprobs_alone], abs=bound)
        # The verification ran in its own prefill batch, so it really stopped at its exit layer.
        assert info(outs[1], "rksc_batch_rows") == 1
        assert info(outs[1], "rksc_layer_calls") == info(outs[1], "rksc_exit_layer") == 3
        assert "rksc_exit_layer" not in outs[0]["meta_info"]
        assert_no_kv_leak(backend)

    def test_rows_exiting_at_different_layers_share_a_batch_without_affecting_each_other(self, backend):
        prompts = [verifier_prompt(backend, CONTEXT), verifier_prompt(backend, CONTEXT.replace("= 10", "= 11"))]
        rules = [EARLY, EarlyExitParams(full_depth=True)]
        solo = [generate(backend, p, flagged(r)) for p, r in zip(prompts, rules)]
        together = queued_behind_a_blocker(backend, {
            "text": prompts, "sampling_params": [flagged(r) for r in rules], "return_logprob": True, "top_logprobs_num": 5,
        })
        assert [info(o, "rksc_batch_rows") for o in together] == [2, 2]
        assert [info(o, "rksc_exit_layer") for o in together] == [3, NUM_LAYERS]
        assert info(together[0], "rksc_layer_calls") == NUM_LAYERS  # the batch waits for its last row
        for alone, shared in zip(solo, together):
            assert shared["text"] == alone["text"]
            top_alone = [lp for lp, _, _ in alone["meta_info"]["output_top_logprobs"][0]]
            top_shared = [lp for lp, _, _ in shared["meta_info"]["output_top_logprobs"][0]]
            assert top_shared == pytest.approx(top_alone, abs=1e-4)
        assert_no_kv_leak(backend)


class TestRequestValidation:
    def test_bad_options_are_refused_naming_the_field_and_the_engine_keeps_serving(self, backend):
        prompt = verifier_prompt(backend, CONTEXT)
        with pytest.raises(ValueError, match="max_new_tokens"):
            generate(backend, prompt, flagged(EARLY, max_new_tokens=4))
        with pytest.raises(ValueError, match="rksc_early_exit.theta"):
            generate(backend, prompt, {"max_new_tokens": 1, "custom_params": {"rksc_early_exit": {"epsilon": 1}}})
        assert generate(backend, prompt, {"max_new_tokens": 1})["meta_info"]["completion_tokens"] == 1

    def test_bad_options_over_http_get_a_400_naming_the_field(self, server_url):
        import requests

        body = {"text": "Hi", "sampling_params": {"max_new_tokens": 1, "custom_params": {"rksc_early_exit": {"theta": 1}}}}
        bad = requests.post(f"{server_url}/generate", json=body, timeout=120)
        assert bad.status_code == 400 and "rksc_early_exit.epsilon" in bad.text
        good = requests.post(f"{server_url}/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 1}}, timeout=120)
        assert good.status_code == 200


class TestVerifyPrimitive:
    CANDIDATES = (
        Candidate(CONTEXT, "10", (-0.1, -0.2)),
        Candidate(CONTEXT.replace("= 10. The answer is 10", "= 11. The answer is 11"), "11", (-0.3, -0.2)),
        Candidate(CONTEXT.replace("12 - 2 = 10. The answer is 10", "12 + 2 = 14. The answer is 14"), "14", (-0.5,)),
    )
    ALWAYS_VERIFY = CgeeThresholds(tau_conf=1.0, margin=1.0, theta=20.0, epsilon=20.0, min_layer=5)

    def test_full_and_cgee_modes_score_every_candidate(self, backend):
        full = verify(backend, self.CANDIDATES, mode="full", lens=True)
        assert not full.skipped and full.exit_layers == (NUM_LAYERS,) * 3
        assert all(0.0 < s < 1.0 for s in full.scores)
        assert full.winner == max(range(3), key=lambda i: full.scores[i])
        assert full.lens_scores[0][-1] == pytest.approx(full.scores[0], abs=1e-4)
        cgee = verify(backend, self.CANDIDATES, mode="cgee", thresholds=self.ALWAYS_VERIFY)
        assert not cgee.skipped and cgee.exit_layers == (5, 5, 5) and cgee.layers_run == (5, 5, 5)
        assert_no_kv_leak(backend)

    def test_works_over_http_with_rksc_endpoint(self, server_url):
        from rksc_sgl.endpoint import RkscEndpoint

        endpoint = RkscEndpoint(server_url)
        result = verify(endpoint, self.CANDIDATES[:2], mode="cgee", thresholds=self.ALWAYS_VERIFY)
        assert result.exit_layers == (5, 5) and all(0.0 < s < 1.0 for s in result.scores)
        confident = CgeeThresholds(tau_conf=0.5, margin=0.5, theta=1.0, epsilon=0.2, min_layer=8)
        assert verify(endpoint, self.CANDIDATES[:1], mode="cgee", thresholds=confident).skipped


# Non-default on every threshold: level 1 never skips (tau_conf = 1), level 2 exits at layer 4.
SERVER_POLICY = CgeeThresholds(tau_conf=1.0, margin=1.0, theta=20.0, epsilon=20.0, min_layer=4)


@pytest.fixture(scope="module")
def policy_server_url(tmp_path_factory):
    """``rksc_sgl.launch_server`` started with ``SERVER_POLICY`` as its ``--cgee-*`` flags."""
    from rksc_sgl.servers import http_server

    flags = {"--cgee-tau-conf": SERVER_POLICY.tau_conf, "--cgee-margin": SERVER_POLICY.margin,
             "--cgee-theta": SERVER_POLICY.theta, "--cgee-epsilon": SERVER_POLICY.epsilon,
             "--cgee-min-layer": SERVER_POLICY.min_layer}
    args = ["--max-total-tokens", "16384", "--log-level", "warning",
            *(str(x) for flag, value in flags.items() for x in (flag, value))]
    with http_server("rksc_sgl.launch_server", args, tmp_path_factory.mktemp("cgee-server"), timeout_s=900) as url:
        yield url


class TestServerPolicy:
    """The server's ``--cgee-*`` flags are what an HTTP client's ``verify`` uses unless the program
    passes its own thresholds."""

    CANDIDATES = TestVerifyPrimitive.CANDIDATES[:2]

    def test_http_clients_verify_with_the_servers_thresholds(self, policy_server_url):
        from rksc_sgl.endpoint import RkscEndpoint

        endpoint = RkscEndpoint(policy_server_url)
        assert CgeeThresholds.of_server(endpoint) == SERVER_POLICY  # reachable through the API
        result = verify(endpoint, self.CANDIDATES, mode="cgee")  # no thresholds: the server's
        assert not result.skipped and result.exit_layers == (4, 4) and result.layers_run == (4, 4)

    def test_a_programs_own_thresholds_override_the_servers(self, policy_server_url):
        from rksc_sgl.endpoint import RkscEndpoint

        endpoint = RkscEndpoint(policy_server_url)
        own = CgeeThresholds(tau_conf=1.0, margin=1.0, theta=20.0, epsilon=20.0, min_layer=6)
        assert verify(endpoint, self.CANDIDATES, mode="cgee", thresholds=own).exit_layers == (6, 6)
        confident = CgeeThresholds(tau_conf=0.5, margin=0.5, theta=1.0, epsilon=0.2, min_layer=8)
        assert verify(endpoint, self.CANDIDATES[:1], mode="cgee", thresholds=confident).skipped

    def test_an_engine_reports_its_own_defaults(self, backend):
        assert CgeeThresholds.of_server(backend) == CgeeThresholds.from_config(RkscConfig())
