"""ASKS blend in the real engine: exact at recompute 1.0, close to exact at the default share while
computing a fraction of the prefill, approximate KV never in the tree, groups kept apart (in
process and between two HTTP clients of one server), and no KV leak.

Engines, one at a time beside the session's stock engine (``engine_backend``): blend at recompute
1.0 (every reused token recomputed, must equal stock token for token), at 0.9999 (the same after the
check layers ran) and at the shipped default share. Paraphrase self-consistency
(``programs.paraphrase_sc``) at 8 shots: branch ``b`` opens with its own wording, then the same
exemplars and question; ``paraphrase_fork`` commits the openings and branch 0's whole prompt, so
branches 1-3 find the tail below branch 0's opening.
"""

from __future__ import annotations

import math
import uuid

import pytest

from programs.datasets import load
from programs.paraphrase_sc import exemplars_for, prompt_text, solve
from programs.paraphrases import EVAL
from programs.sampling import SamplingConfig
from programs.sc import user_prompt
from rksc_sgl import RkscConfig
from rksc_sgl.protocol import ASKS_KEY, AsksOptions
from tests.integration.engines import Engines
from tests.integration.kv import assert_no_kv_leak

pytestmark = pytest.mark.integration

CONFIG = SamplingConfig(num_branches=4, max_new_tokens=16, temperature=0.7, seed=3)
SHOTS = 8
DEFAULT = RkscConfig().asks_recompute
CHUNK = 1024  # a prefill chunk that holds one branch's prompt (about 760 tokens), not two
ENGINES = {
    "all": dict(rksc=RkscConfig(asks=True, asks_recompute=1.0)),
    # a share just below 1: the check runs (two layers), then every reused token is recomputed
    "checked-all": dict(rksc=RkscConfig(asks=True, asks_recompute=0.9999)),
    "default": dict(rksc=RkscConfig(asks=True)),
    "small-chunks": dict(rksc=RkscConfig(asks=True), chunked_prefill_size=CHUNK),
}


@pytest.fixture(scope="module")
def engines():
    pool = Engines(ENGINES)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def problem():
    everything = load("gsm8k")
    test, pool = everything[0], tuple(everything[-200:])
    return test, exemplars_for(test, pool, SHOTS)


def run(backend, problem, group: str | None = None):
    backend.flush_cache()
    backend.reset_counters()
    result = solve(problem[0], 0, problem[1], CONFIG, backend, group=group)
    return result, backend.reset_counters()


@pytest.fixture(scope="module")
def stock(engine_backend, problem):
    return run(engine_backend, problem)


@pytest.fixture(scope="module")
def recompute_all(engines, problem):
    return run(engines.get("all"), problem)


@pytest.fixture(scope="module")
def default(engines, problem):
    backend = engines.get("default")
    group = f"blend-{uuid.uuid4().hex}"
    return backend, group, *run(backend, problem, group)


def first_token_kl(exact: dict[int, float], approx: dict[int, float]) -> float:
    """KL(exact || approx) over exact's top tokens (``approx`` floored where it lacks one)."""
    floor = min(approx.values())
    return sum(math.exp(lp) * (lp - approx.get(tok, floor)) for tok, lp in exact.items())


class TestRecomputeOne:
    def test_every_branch_is_token_identical_to_exact(self, recompute_all, stock):
        ours, theirs = recompute_all[0], stock[0]
        assert [b.token_ids for b in ours.branches] == [b.token_ids for b in theirs.branches]
        assert recompute_all[1].prefill_tokens == stock[1].prefill_tokens

    def test_the_blend_path_ran_and_recomputed_every_reused_token(self, recompute_all):
        reports = [b.asks for b in recompute_all[0].branches[1:]]
        assert all(r["mode"] == "blend" and r["outcome"] == "blended" for r in reports), reports
        assert all(r["reused_tokens"] == 0 and r["recomputed_tokens"] > 500 for r in reports), reports
        assert all(r["max_deviation"] is None for r in reports), reports  # at 1.0 no gate applies


class TestEverythingRecomputedAfterTheCheck:
    """Every row kept after the check layers ran: the kept rows' path from the check's queries
    (one C++ call here) gives exact's tokens, as SGLang's loop did."""

    def test_every_branch_is_token_identical_to_exact(self, engines, problem, stock):
        ours, counts = run(engines.get("checked-all"), problem)
        assert [b.token_ids for b in ours.branches] == [b.token_ids for b in stock[0].branches]
        # the same numbers, not only the same samples
        assert [(b.token_logprobs, b.first_top_logprobs) for b in ours.branches] == [
            (b.token_logprobs, b.first_top_logprobs) for b in stock[0].branches]
        assert counts.prefill_tokens == stock[1].prefill_tokens
        reports = [b.asks for b in ours.branches[1:]]
        assert all(r["outcome"] == "blended" and r["reused_tokens"] == 0 and r["recomputed_tokens"] > 500
                   for r in reports), reports
        assert all(r["max_deviation"] is not None for r in reports), reports  # the check and its gate ran


class TestDefaultShare:
    def test_branches_reuse_most_of_their_tail_and_keep_their_words(self, default):
        _backend, _group, result, _counters = default
        for branch in result.branches[1:]:
            report = branch.asks
            assert report["outcome"] == "blended", report
            covered = report["reused_tokens"] + report["recomputed_tokens"]
            # the share by rank, plus what the gate found past --asks-max-deviation
            assert report["max_deviation"] == RkscConfig().asks_max_deviation, report
            assert (math.ceil(DEFAULT * covered) <= report["recomputed_tokens"]
                    <= math.ceil(DEFAULT * covered) + report["deviating_tokens"]), report
            assert report["reused_tokens"] > 0.6 * report["prompt_tokens"], report

    def test_a_request_asks_its_own_gate(self, default, problem):
        """``custom_params["rksc_asks"]["max_deviation"]``: a loose gate flags no covered token,
        a tight one nearly all, and each report names the gate it applied. Openings the program's
        branches did not use: a branch's own kept tail (the relay) stands at no distance at all."""
        backend, group, *_ = default
        tail = user_prompt(problem[0], problem[1])
        loose = generate(backend, group, EVAL.paraphrases[CONFIG.num_branches], tail, max_deviation=1e9)
        tight = generate(backend, group, EVAL.paraphrases[CONFIG.num_branches + 1], tail, max_deviation=1e-9)
        assert loose["outcome"] == tight["outcome"] == "blended", (loose, tight)
        assert (loose["max_deviation"], tight["max_deviation"]) == (1e9, 1e-9), (loose, tight)
        covered = tight["reused_tokens"] + tight["recomputed_tokens"]
        assert loose["deviating_tokens"] == 0 and tight["deviating_tokens"] > 0.9 * covered, (loose, tight)
        assert loose["recomputed_tokens"] < 0.2 * covered < tight["recomputed_tokens"], (loose, tight)
        assert_no_kv_leak(backend)

    def test_prefill_is_a_fraction_of_exact(self, default, stock):
        assert default[3].prefill_tokens < 0.6 * stock[1].prefill_tokens, (default[3], stock[1])
        assert default[3].prompt_tokens == stock[1].prompt_tokens  # the same words were sent

    def test_first_token_distribution_stays_close_to_exact(self, default, stock):
        kls = [first_token_kl(e.first_top_logprobs, b.first_top_logprobs)
               for e, b in zip(stock[0].branches[1:], default[2].branches[1:])]
        assert max(kls) < 0.05, kls

    def test_approximate_kv_never_enters_the_tree(self, default, problem):
        """A blended branch's prompt, sent again by a request of no group, finds only what was
        computed exactly (the chat head, the branch's opening and the tokens before its first
        reused one), never its blended tail."""
        backend, _group, _result, _ = default
        head = backend.chat_template.get_prefix_and_suffix("system", [])[0]
        opening_tokens = backend.prefill(head + EVAL.paraphrases[1])["prompt_tokens"]
        prompt = prompt_text(backend.chat_template, EVAL.paraphrases[1], user_prompt(problem[0], problem[1]))
        meta = backend.prefill(prompt)
        exact_tokens = _result.branches[1].asks["exact_tokens"]  # its opening and what it computed in full
        assert opening_tokens <= meta["cached_tokens"] == exact_tokens < meta["prompt_tokens"] // 2, (
            meta, opening_tokens, exact_tokens)
        assert_no_kv_leak(backend)

    def test_another_groups_tail_is_never_reused(self, default, problem):
        backend, group, *_ = default
        other = run(backend, problem, f"other-{uuid.uuid4().hex}")[0]  # flushes: the tree is the other group's
        assert all(b.asks["outcome"] == "blended" for b in other.branches[1:])  # within its own group
        report = generate(backend, group, EVAL.paraphrases[2], user_prompt(problem[0], problem[1]))
        assert report["outcome"] == "no-donor", report
        stats = backend.get_server_info()["internal_states"][0]["rksc_cache"]["asks"]
        assert stats["mode"] == "blend" and stats["blend"]["blended"] >= 3, stats
        assert_no_kv_leak(backend)


    def test_a_branch_whose_opening_already_leads_into_other_text_still_blends(self, engines, problem):
        """A member of the group with branch 1's opening first reads another problem, computing
        everything: the chat turn's first tokens after that opening are then cached, and branch 1
        of the program leaves the cache inside its text. It still finds the rest of the text
        after branch 0's opening (found by content, wherever the member leaves the cache)."""
        backend = engines.get("default")
        backend.flush_cache()
        group = f"lead-{uuid.uuid4().hex}"
        everything = load("gsm8k")
        other = user_prompt(everything[1], exemplars_for(everything[1], tuple(everything[-200:]), SHOTS))
        assert generate(backend, group, EVAL.paraphrases[1], other)["outcome"] == "no-donor"
        result = solve(problem[0], 0, problem[1], CONFIG, backend, group=group)
        reports = [b.asks for b in result.branches[1:]]
        assert all(r["outcome"] == "blended" and r["reused_tokens"] > 0.6 * r["prompt_tokens"] for r in reports), reports
        assert_no_kv_leak(backend)


class TestAdmission:
    def test_a_member_waits_for_a_batch_it_fits_in_whole_rather_than_be_chunked(self, engines, problem):
        """With a 1,024-token prefill chunk, branches 1-3 (about 730 tokens each) arrive together:
        SGLang would put the second into the same batch as a chunk, and a chunked prefill computes
        every token. Each waits for a batch of its own and blends."""
        backend = engines.get("small-chunks")
        backend.flush_cache()
        result = solve(problem[0], 0, problem[1], CONFIG, backend, group=f"chunks-{uuid.uuid4().hex}")
        reports = [b.asks for b in result.branches[1:]]
        assert all(CHUNK // 2 < r["prompt_tokens"] < CHUNK for r in reports), reports
        assert [r["outcome"] for r in reports] == ["blended"] * 3, reports
        assert_no_kv_leak(backend)


def generate(client, group: str, system: str, tail: str, max_deviation: float | None = None) -> dict:
    """Commit ``system``'s opening in ``group``, then generate one token from ``system + tail``
    as a member of ``group`` (asking gate ``max_deviation``, None: the server's): the ASKS report."""
    options = AsksOptions(group=group, max_deviation=max_deviation).to_custom_params()
    client.prefill(client.chat_template.get_prefix_and_suffix("system", [])[0] + system, custom_params=options)
    out = client._generate_http_request(None, {"text": prompt_text(client.chat_template, system, tail),
                                               "sampling_params": {"max_new_tokens": 1, "custom_params": options}})
    return out["meta_info"][ASKS_KEY][0]


@pytest.fixture(scope="module")
def blend_server(tmp_path_factory):
    """``python -m rksc_sgl.launch_server --asks``: blend at the default share."""
    from rksc_sgl.servers import http_server

    args = ["--asks", "--max-total-tokens", "8000", "--log-level", "warning"]
    with http_server("rksc_sgl.launch_server", args, tmp_path_factory.mktemp("blend-server")) as url:
        yield url


def test_two_http_clients_of_one_server_never_blend_from_each_other(blend_server, problem):
    """Client A runs a paraphrase program in its group; client B then sends the same words
    (another opening, A's tail) in its own group: B computes everything, while A's next branch
    reuses A's tail."""
    from rksc_sgl import RkscEndpoint

    a, b = RkscEndpoint(blend_server), RkscEndpoint(blend_server)
    group_a, group_b = f"client-a-{uuid.uuid4().hex}", f"client-b-{uuid.uuid4().hex}"
    result = solve(problem[0], 0, problem[1], CONFIG, a, group=group_a)
    assert all(x.asks["outcome"] == "blended" for x in result.branches[1:])
    tail = user_prompt(problem[0], problem[1])
    assert generate(b, group_b, EVAL.paraphrases[5], tail)["outcome"] == "no-donor"
    report = generate(a, group_a, EVAL.paraphrases[6], tail)
    assert report["outcome"] == "blended" and report["reused_tokens"] > 0, report
    assert_no_kv_leak(a)
