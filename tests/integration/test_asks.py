"""ASKS in the real engine: identity at tau = 1, exact reuse when it adopts, reports, no leaks,
and the trust boundary between substitution groups.

Engines, one at a time beside the session's stock engine: ASKS at tau = 1 (must equal stock),
then ASKS with its calibrated signature but its gate wide open (tau = 0: every candidate passes)
and a small KV pool (so a run of several problems evicts). The open gate exercises adoption
whatever tau the calibration ships (the shipped, safe tau accepts few paraphrases), and leaves
only the substitution groups to keep two programs' spans apart.
"""

from __future__ import annotations

import dataclasses

import uuid

import pytest

from programs.datasets import load
from programs.paraphrase_sc import exemplars_for, paraphrase_program, solve
from programs.paraphrases import EVAL
from programs.sampling import SamplingConfig
from programs.sc import branch_seed, solve_batch as sc_solve_batch
from rksc_sgl import RkscConfig
from rksc_sgl.protocol import ASKS_KEY
from tests.integration.engines import Engines
from tests.integration.kv import assert_no_kv_leak, wait_until_idle
from tests.integration.linears import FLOAT32_LINEARS, ROW_INVARIANT

pytestmark = pytest.mark.integration

CONFIG = SamplingConfig(num_branches=4, max_new_tokens=16, temperature=0.7, seed=3)
SHOTS = 3
ENGINES = {
    "tau1": dict(max_total_tokens=16384, rksc=RkscConfig(asks=True, asks_mode="adopt", asks_tau=1.0)),
    "asks": dict(max_total_tokens=1500, rksc=RkscConfig(asks=True, asks_mode="adopt", asks_tau=0.0)),
}


@pytest.fixture(scope="module")
def engines():
    pool = Engines(ENGINES)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def problems():
    everything = load("gsm8k")
    return everything[:6], tuple(everything[-200:])


def asks_stats(backend) -> dict:
    return backend.get_server_info()["internal_states"][0]["rksc_cache"]["asks"]


def run_programs(backend, problems) -> dict:
    """Paraphrase SC, SC and diverse SC on one problem each, from an empty cache."""
    tests, pool = problems
    out = {}
    backend.flush_cache()
    backend.reset_counters()
    result = solve(tests[0], 0, exemplars_for(tests[0], pool, SHOTS), CONFIG, backend)
    out["paraphrase-sc"] = ([b.text for b in result.branches], [b.asks for b in result.branches],
                            backend.reset_counters())
    for name, diverse in (("sc", False), ("diverse-sc", True)):
        backend.flush_cache()
        results = sc_solve_batch(tests[1:2], CONFIG, backend, progress_bar=False, exemplars=pool[:2], diverse=diverse)
        out[name] = ([b.text for b in results[0].branches], backend.reset_counters())
    return out


@pytest.fixture(scope="module")
def stock_runs(engine_backend, problems):
    return run_programs(engine_backend, problems)


@pytest.fixture(scope="module")
def tau1_runs(engines, problems):
    return run_programs(engines.get("tau1"), problems)


class TestTauOneIsStock:
    @pytest.mark.parametrize("program", ["paraphrase-sc", "sc", "diverse-sc"])
    def test_outputs_and_token_counts_equal_stock(self, tau1_runs, stock_runs, program):
        ours, stock = tau1_runs[program], stock_runs[program]
        assert ours[0] == stock[0]  # every branch's text
        if program == "paraphrase-sc":
            assert ours[-1] == stock[-1]  # requests, prompt, cached and completion tokens
        else:  # forked branches race for the shared prefix: how much of it each found cached depends
            # on which prefill batch it joined (seen 1081 against 1078 without the overlap schedule)
            assert dataclasses.replace(ours[-1], cached_tokens=0) == dataclasses.replace(stock[-1], cached_tokens=0)
        if program == "paraphrase-sc":
            assert ours[1] == [None] * CONFIG.num_branches  # no decision, no report at tau = 1


@pytest.fixture(scope="module")
def adopted(engines, problems):
    backend = engines.get("asks")
    backend.flush_cache()
    tests, pool = problems
    exemplars = exemplars_for(tests[0], pool, SHOTS)
    return backend, tests[0], exemplars, solve(tests[0], 0, exemplars, CONFIG, backend)


class TestAdoption:
    def test_paraphrased_branches_adopt_branch_zero_wording_and_reuse_its_kv(self, adopted):
        backend, _, _, result = adopted
        reports = [b.asks for b in result.branches]
        assert not reports[0]["adopted"]  # branch 0's own full prompt is cached: nothing to adopt
        for report in reports[1:]:
            assert report["adopted"] and report["sigma"] >= report["tau"], report
            assert report["reused_tokens"] > 300, report  # the exemplars and question, not recomputed
        stats = asks_stats(backend)
        assert stats["adopted"] >= CONFIG.num_branches - 1 and stats["background"]
        assert stats["signature_bytes"] == stats["live_signature_bytes"] > 0
        assert_no_kv_leak(backend)

    def test_adopted_branch_equals_stock_run_on_the_donor_wording(self, adopted, engine_backend):
        _, problem, exemplars, result = adopted
        from programs.sc import user_prompt

        for b in (1, 3):
            state = paraphrase_program.run(systems=[EVAL.paraphrases[0]], prompt=user_prompt(problem, exemplars),
                                           gen_tokens=CONFIG.max_new_tokens, gen_temperature=CONFIG.temperature,
                                           seeds=[branch_seed(CONFIG.seed, 0, b)], backend=engine_backend)
            assert state.ret_value[0][0] == result.branches[b].text

    def test_runtime_sigma_matches_the_calibration_computation(self, adopted):
        """The same gate on transformers' hidden states of the same spans (how the defaults were
        chosen) gives the sigma the runtime reported: capture and background are the calibrated ones."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from benchmarks.calibration.calibrate_asks import signatures
        from radix_ext.asks import background as asks_background
        from radix_ext.asks.gate import layer_weights, similarity
        from rksc_sgl.config import parse_layers
        from rksc_sgl.model_cache import default_model_path

        _, _, _, result = adopted
        report = result.branches[1].asks
        assert report["span_start"] == 3  # paraphrases 0 and 1 part right after the system header
        path = default_model_path()
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        config = RkscConfig()
        layers = parse_layers(config.asks_layers, model.config.num_hidden_layers)
        sig = signatures(model, AutoTokenizer.from_pretrained(path), list(EVAL.paraphrases[:2]), config.asks_pooling)
        background = asks_background.load("auto", asks_background.fingerprint(model.model.norm.weight), layers,
                                          config.asks_pooling)
        index = [layer - 1 for layer in layers]
        expected = similarity(sig[0][index], sig[1][index],
                              layer_weights(layers, model.config.num_hidden_layers, config.asks_alpha), background)
        # The calibration computes float32 hidden states; int8 linears (the default here) move the
        # runtime's by their rounding (0.238 against 0.251 was seen), float32 ones by summation order.
        assert report["sigma"] == pytest.approx(expected, abs=2e-3 if FLOAT32_LINEARS else 0.03)

    def test_control_instruction_sigma_is_below_the_shipped_tau(self, adopted):
        backend, group = adopted[0], in_group(uuid.uuid4().hex)
        head, suffix = backend.chat_template.get_prefix_and_suffix("system", [])
        tail = f"{suffix}A request that only checks how the cache treats two different system messages."
        backend.prefill(head + EVAL.controls[1], custom_params=group)
        backend.prefill(head + EVAL.controls[1] + tail, custom_params=group)
        backend.prefill(head + EVAL.paraphrases[5], custom_params=group)  # a wording the fixture did not commit
        report = backend.prefill(head + EVAL.paraphrases[5] + tail, custom_params=group)[ASKS_KEY][0]
        assert report["candidates"] == 1 and report["sigma"] < RkscConfig().asks_tau, report

    def test_request_can_opt_out(self, adopted):
        backend, problem, exemplars, _ = adopted
        from programs.paraphrase_sc import prompt_text
        from programs.sc import user_prompt

        text = prompt_text(backend.chat_template, EVAL.paraphrases[2], user_prompt(problem, exemplars))
        meta = backend.prefill(text, custom_params={ASKS_KEY: {"enabled": False}})
        assert meta[ASKS_KEY][0]["outcome"] == "skipped:opted-out"
        assert meta["prompt_tokens"] == len(backend.token_ids(text))  # as sent

    def test_malformed_option_is_rejected_naming_the_field(self, adopted):
        backend = adopted[0]
        with pytest.raises(Exception, match="custom_params.rksc_asks.enabled"):
            backend.prefill("Hello", custom_params={ASKS_KEY: {"enabled": "yes"}})

    def test_no_leak_under_eviction_pressure(self, adopted, problems):
        """Six problems at once in a 1,500-token pool: donors get evicted between decisions and
        admissions; every request completes, the pool balances, signature bytes match live nodes."""
        backend = adopted[0]
        tests, pool = problems
        evicted_before = backend.kv_pool()["evicted_tokens"]
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            futures = [ex.submit(solve, p, i, exemplars_for(p, pool, SHOTS), CONFIG, backend)
                       for i, p in enumerate(tests)]
            results = [f.result() for f in futures]
        assert all(len(r.branches) == CONFIG.num_branches for r in results)
        wait_until_idle(backend)
        assert backend.kv_pool()["evicted_tokens"] > evicted_before
        assert_no_kv_leak(backend)
        stats = asks_stats(backend)
        assert stats["signature_bytes"] == stats["live_signature_bytes"]


def in_group(group: str) -> dict:
    """custom_params of a request in ASKS substitution group ``group``."""
    return {ASKS_KEY: {"group": group}}


def commit_span(backend, group: str, system: str, tail: str) -> dict:
    """A program's span commit of ``system``, then its prompt ``system + tail``: the ASKS report."""
    head = backend.chat_template.get_prefix_and_suffix("system", [])[0]
    backend.prefill(head + system, custom_params=in_group(group))
    return backend.prefill(head + system + tail, custom_params=in_group(group))[ASKS_KEY][0]


@pytest.fixture(scope="module")
def open_gate(engines):
    backend = engines.get("asks")
    backend.flush_cache()
    return backend


class TestTrustBoundary:
    """Two programs (clients) on one engine, each with its own substitution group, the gate open."""

    def test_neither_program_adopts_the_others_span_while_each_substitutes_within_its_own(self, open_gate):
        a, b = f"client-a-{uuid.uuid4().hex}", f"client-b-{uuid.uuid4().hex}"
        suffix = open_gate.chat_template.get_prefix_and_suffix("system", [])[1]
        tails = [f"{suffix}Request {i} of a test that two clients' system messages never stand in for each other."
                 for i in range(2)]
        commit_span(open_gate, a, EVAL.paraphrases[0], tails[0])  # A's prompt is cached ...
        report = commit_span(open_gate, b, EVAL.paraphrases[1], tails[0])  # ... B's would adopt it
        assert report["outcome"] == "no-donor" and not report["adopted"], report
        commit_span(open_gate, b, EVAL.paraphrases[2], tails[1])  # and the reverse
        report = commit_span(open_gate, a, EVAL.paraphrases[3], tails[1])
        assert report["outcome"] == "no-donor" and not report["adopted"], report
        for group, system, tail in ((a, EVAL.paraphrases[4], tails[0]), (b, EVAL.paraphrases[5], tails[1])):
            report = commit_span(open_gate, group, system, tail)  # within one group: the donor is seen
            assert report["candidates"] == 1 and report["outcome"] in ("adopted", "gate"), report
            assert report["adopted"] == (report["sigma"] >= report["tau"]), report  # only the gate decides
        assert_no_kv_leak(open_gate)

    def test_request_without_a_group_is_never_rewritten(self, open_gate):
        head, suffix = open_gate.chat_template.get_prefix_and_suffix("system", [])
        tail = f"{suffix}A request of a test that a request without a group keeps its prompt as sent."
        commit_span(open_gate, uuid.uuid4().hex, EVAL.paraphrases[0], tail)
        open_gate.prefill(head + EVAL.paraphrases[1])
        meta = open_gate.prefill(head + EVAL.paraphrases[1] + tail)
        assert meta[ASKS_KEY][0]["outcome"] == "skipped:no-group"
        assert meta["prompt_tokens"] == len(open_gate.token_ids(head + EVAL.paraphrases[1] + tail))

    def test_paraphrase_programs_of_two_groups_adopt_only_their_own_wording(self, open_gate, problems,
                                                                              engine_backend):
        """Program A (wordings 0-3) runs first; program B (wordings 4-7), same problem and
        exemplars, then sees only its own branch 0's wording as a donor: each of its branches is
        decided by the gate against it, and each adopted branch equals a stock run on wording 4."""
        from programs.sc import user_prompt

        open_gate.flush_cache()
        tests, pool = problems
        exemplars = exemplars_for(tests[2], pool, SHOTS)
        solve(tests[2], 0, exemplars, CONFIG, open_gate)
        b = solve(tests[2], 0, exemplars, CONFIG, open_gate, paraphrases=EVAL.paraphrases[4:])
        reports = [branch.asks for branch in b.branches[1:]]
        assert all(r["candidates"] >= 1 and r["outcome"] in ("adopted", "gate") for r in reports), reports
        for i in [i for i, r in enumerate(reports, 1) if r["adopted"]]:
            state = paraphrase_program.run(systems=[EVAL.paraphrases[4]], prompt=user_prompt(tests[2], exemplars),
                                           gen_tokens=CONFIG.max_new_tokens, gen_temperature=CONFIG.temperature,
                                           seeds=[branch_seed(CONFIG.seed, 0, i)], backend=engine_backend)
            if FLOAT32_LINEARS or ROW_INVARIANT:
                assert state.ret_value[0][0] == b.branches[i].text
            else:  # int8 with SDPA's attention: a KV reused vs recomputed can part late in the text
                assert state.ret_value[0][0][:16] == b.branches[i].text[:16]
        assert_no_kv_leak(open_gate)


@pytest.fixture(scope="module")
def open_gate_server(tmp_path_factory):
    """``python -m rksc_sgl.launch_server --asks --asks-mode adopt --asks-tau 0``: one server, its gate open."""
    from rksc_sgl.servers import http_server

    args = ["--asks", "--asks-mode", "adopt", "--asks-tau", "0", "--max-total-tokens", "4000", "--log-level", "warning"]
    with http_server("rksc_sgl.launch_server", args, tmp_path_factory.mktemp("asks-server")) as url:
        yield url


def test_two_http_clients_of_one_server_never_adopt_each_others_spans(open_gate_server):
    """Client A and client B, each its own ``RkscEndpoint`` and group, on one server whose gate
    passes every sigma >= 0: B's opening never takes A's cached wording, nor the reverse, while each
    client's next wording still finds its own first one as the donor, and only the gate decides
    (some paraphrase pairs have sigma < 0). The in-process test above, over HTTP."""
    from rksc_sgl import RkscEndpoint

    a, b = RkscEndpoint(open_gate_server), RkscEndpoint(open_gate_server)
    group_a, group_b = f"client-a-{uuid.uuid4().hex}", f"client-b-{uuid.uuid4().hex}"
    suffix = a.chat_template.get_prefix_and_suffix("system", [])[1]
    tails = [f"{suffix}Request {i} of two HTTP clients whose system messages never stand in for each other."
             for i in range(2)]
    commit_span(a, group_a, EVAL.paraphrases[0], tails[0])
    report = commit_span(b, group_b, EVAL.paraphrases[1], tails[0])  # A's cached wording is not B's donor
    assert report["outcome"] == "no-donor" and not report["adopted"], report
    commit_span(b, group_b, EVAL.paraphrases[2], tails[1])
    report = commit_span(a, group_a, EVAL.paraphrases[3], tails[1])  # nor B's A's
    assert report["outcome"] == "no-donor" and not report["adopted"], report
    for client, group, system, tail in ((a, group_a, EVAL.paraphrases[4], tails[0]),
                                        (b, group_b, EVAL.paraphrases[5], tails[1])):
        report = commit_span(client, group, system, tail)  # within a group the donor is there ...
        assert report["candidates"] == 1 and report["outcome"] in ("adopted", "gate"), report
        assert report["adopted"] == (report["sigma"] >= report["tau"]), report  # ... and only the gate decides
