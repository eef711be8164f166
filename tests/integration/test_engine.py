"""The real in-process engine with the real model, driven through SGLang's frontend language."""

from __future__ import annotations

import pytest
import sglang as sgl

from programs.datasets import load
from programs.sc import SamplingConfig, branch_openers, majority_vote, solve_batch
from tests.integration.kv import assert_no_kv_leak

pytestmark = pytest.mark.integration


@sgl.function
def forked_answers(s, question: str, num_branches: int):
    s += sgl.system("You are a helpful assistant.")
    s += sgl.user(question)
    forks = s.fork(num_branches)
    forks += sgl.assistant(sgl.gen("answer", max_tokens=8, temperature=0.8))
    metas = [f.get_meta_info("answer") for f in forks]
    forks.join()
    return metas


class TestRadixSharing:
    def test_forked_branches_reuse_the_shared_prompt(self, engine_backend):
        question = "Name three colours of the rainbow, and explain where rainbows come from."
        metas = forked_answers.run(question=question, num_branches=4, backend=engine_backend).ret_value
        assert len(metas) == 4
        # fork() first sends the prompt as a zero-token request (rksc_sgl.program_state makes sure of it
        # even on a fresh state), so every branch finds all but its assistant header cached.
        assert all(m["cached_tokens"] >= m["prompt_tokens"] - 5 for m in metas), metas

    def test_prompt_and_cache_counters_add_up(self, engine_backend):
        engine_backend.reset_counters()
        forked_answers.run(question="What is the capital of France?", num_branches=2, backend=engine_backend)
        totals = engine_backend.reset_counters()
        assert totals.requests == 3  # the zero-token prefix request and two branches
        assert 0 < totals.cached_tokens < totals.prompt_tokens
        assert totals.prefill_tokens == totals.prompt_tokens - totals.cached_tokens

    def test_pool_accounting_balances_when_idle(self, engine_backend):
        forked_answers.run(question="Say hello.", num_branches=3, backend=engine_backend)
        assert_no_kv_leak(engine_backend)
        assert engine_backend.kv_pool()["cache_class"].endswith("RadixCache")


class TestSelfConsistency:
    def test_branches_vote_and_keep_token_logprobs(self, engine_backend):
        problems = load("gsm8k", limit=2)
        config = SamplingConfig(num_branches=3, max_new_tokens=24, temperature=0.7)
        results = solve_batch(problems, config, engine_backend, progress_bar=False)
        assert [r.problem for r in results] == problems
        for result in results:
            assert len(result.branches) == 3
            for branch in result.branches:
                assert 1 <= len(branch.token_logprobs) <= 24
                assert all(lp <= 0.0 for lp in branch.token_logprobs)
            assert result.answer == majority_vote([b.answer for b in result.branches])[0]
        assert_no_kv_leak(engine_backend)

    def test_greedy_generation_is_reproducible_and_cache_transparent(self, engine_backend):
        prompt = "The three primary colours are"
        params = {"temperature": 0, "max_new_tokens": 12}
        first = engine_backend.run(engine_backend.engine.async_generate(prompt=prompt, sampling_params=params))
        second = engine_backend.run(engine_backend.engine.async_generate(prompt=prompt, sampling_params=params))
        assert second["meta_info"]["cached_tokens"] > 0  # the second one is served from the cache
        assert first["text"] == second["text"]

    def test_diverse_branches_share_the_prompt_and_start_with_their_openers(self, engine_backend):
        problems = load("gsm8k", limit=1)
        config = SamplingConfig(num_branches=4, max_new_tokens=4, temperature=0.0)
        counted = {}
        for diverse in (False, True):
            engine_backend.reset_counters()
            results = solve_batch(problems, config, engine_backend, progress_bar=False, diverse=diverse)
            counted[diverse] = engine_backend.reset_counters()
            assert len(results[0].branches) == 4
        opener_tokens = sum(len(engine_backend.token_ids(o + "\n")) for o in branch_openers(4))
        # Same requests but for the openers in front of each branch's answer ...
        assert counted[True].prompt_tokens - counted[False].prompt_tokens == pytest.approx(opener_tokens, abs=4)
        # ... and the branches still share the prompt's KV.
        assert counted[True].cached_tokens > 0
        assert_no_kv_leak(engine_backend)


class TestTwoEngines:
    """Engines share a process: tests, benchmarks and programs start several (see rksc_sgl.engine)."""

    def test_a_second_engine_runs_and_shuts_down_without_harming_the_first(self, engine_backend, server_url):
        import psutil
        import requests

        from rksc_sgl.engine import launch_engine

        first_children = {p.pid for p in engine_backend.engine._rksc_children}
        assert first_children  # at least the scheduler
        second = launch_engine(max_total_tokens=2048, log_level="error")
        try:
            # Called from this thread while the backend's loop runs in its own: separate loops.
            out = second.generate(prompt="The capital of France is", sampling_params={"max_new_tokens": 2})
            assert out["meta_info"]["completion_tokens"] == 2
            second_children = {p.pid for p in second._rksc_children}
            assert second_children and not second_children & first_children
            tasks = set(second.tokenizer_manager.asyncio_tasks)
        finally:
            second.shutdown()
        # SGLang leaves them pending, and each is logged at exit as "destroyed but it is pending"
        # (under pytest: a "Logging error" into its closed streams after the summary).
        assert tasks and all(t.done() for t in tasks)
        assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                       for pid in second_children)
        # SGLang's own shutdown would have killed every child of this process: the first engine's
        # scheduler and the HTTP server started by the session fixture.
        assert all(psutil.pid_exists(pid) for pid in first_children)
        assert engine_backend.run(engine_backend.engine.async_generate(
            prompt="1, 2, 3,", sampling_params={"max_new_tokens": 2}))["meta_info"]["completion_tokens"] == 2
        assert requests.get(f"{server_url}/health_generate", timeout=60).status_code == 200

    def test_an_endpoints_shutdown_leaves_none_of_its_engines_tasks_pending(self):
        from rksc_sgl.engine import launch_engine
        from rksc_sgl.engine_endpoint import RkscEngineEndpoint

        endpoint = RkscEngineEndpoint(launch_engine(max_total_tokens=2048, log_level="error"))
        try:
            endpoint.run(endpoint.engine.async_generate(prompt="1, 2, 3,", sampling_params={"max_new_tokens": 2}))
            tasks = set(endpoint.engine.tokenizer_manager.asyncio_tasks)
        finally:
            endpoint.shutdown()
        assert tasks and all(t.done() for t in tasks)
