"""Adaptive sampling on the real engine: rounds stop once the rule is decided, the finished
branches are the full run's first branches (same seeds), and no KV is left behind.

A round has another batch shape than the full fork, so a branch may part from the full run's at
a near-tie of two perturbed scores (``tests/integration/test_seeded_sampling.py``); as there, at
most one branch of a test may differ.
"""

from __future__ import annotations

import pytest
import sglang as sgl

from rksc_sgl import StopRule, adaptive_fork, branch_options
from rksc_sgl.adaptive import replay
from tests.integration.kv import assert_no_kv_leak

pytestmark = pytest.mark.integration

SEEDS = [11, 12, 13, 14, 15, 16]


@sgl.function
def program(s, rule, vote):
    s += sgl.user("Name a colour.")

    def body(f, b):
        branch_options(f, sampling_seed=SEEDS[b])
        f += sgl.assistant(sgl.gen("out", max_tokens=12, temperature=1.0))

    forks = adaptive_fork(s, len(SEEDS), rule, body, lambda f: vote(f["out"]))
    return [f["out"] for f in forks], forks.decided


def differing(texts: list[str], reference: list[str]) -> int:
    return sum(a != b for a, b in zip(texts, reference, strict=True))


def run(backend, rule, vote):
    state = program.run(rule, vote, backend=backend)
    assert state.error() is None, state.error()
    return state.ret_value


class TestAdaptiveFork:
    def test_a_decided_rule_launches_no_further_round_and_keeps_the_full_runs_samples(self, engine_backend):
        full, full_decided = run(engine_backend, None, lambda text: "same")
        early, decided = run(engine_backend, StopRule.parse("esc:2"), lambda text: "same")
        assert len(full) == len(SEEDS) and not full_decided
        assert decided and len(early) == 2
        assert differing(early, full[:2]) <= 1  # branch b draws with seeds[b] either way
        assert_no_kv_leak(engine_backend)

    def test_an_undecided_rule_samples_every_branch_in_rounds(self, engine_backend):
        texts, decided = run(engine_backend, StopRule.parse("esc:3"), lambda text: text)  # answers all differ
        full, _ = run(engine_backend, None, lambda text: text)
        assert not decided and len(texts) == len(SEEDS) and differing(texts, full) <= 1 and len(set(texts)) > 1
        assert_no_kv_leak(engine_backend)


def test_self_consistency_stops_early_on_a_real_problem_and_its_branches_are_the_full_runs(engine_backend):
    from programs.datasets import load
    from programs.sampling import SamplingConfig
    from programs.sc import solve_batch

    problems = load("arc-challenge", limit=2)
    config = SamplingConfig(num_branches=6, max_new_tokens=24, temperature=0.7, seed=3)
    full = solve_batch(problems, config, engine_backend, progress_bar=False)
    rule = StopRule.parse("beta:0.6:1")  # decided by the first answered branch
    early = solve_batch(problems, config, engine_backend, progress_bar=False, rule=rule)
    parted = 0
    for f, e in zip(full, early):
        k = len(e.branches)
        parted += differing([b.text for b in e.branches], [b.text for b in f.branches[:k]])
        # The runtime stops where the rule, replayed on the full run, stops (unless a branch parted).
        assert k == replay(rule, [b.answer for b in f.branches]) or parted
        assert k < config.num_branches or not rule.decided([b.answer for b in e.branches])
    assert parted <= 1
    assert_no_kv_leak(engine_backend)


@sgl.function
def runtime_program(s, rule, pattern):
    s += sgl.user("Name a colour.")

    def body(f, b):
        branch_options(f, sampling_seed=SEEDS[b])
        # Each branch ends at its first "e", so at its own step.
        f += sgl.assistant(sgl.gen("out", max_tokens=64, temperature=1.0, stop="e"))

    forks = adaptive_fork(s, len(SEEDS), rule, body, lambda f: "", answer_pattern=pattern)
    return [f["out"] for f in forks], forks.indices, forks.stopped, forks.decided


def test_in_the_runtime_the_first_finished_branches_decide_and_the_scheduler_stops_the_rest(engine_backend):
    """With an answer pattern the branches run at once and the scheduler applies the rule: every
    finished member votes "" (pattern ``^``), so Beta at c = 0.7 is decided by the first branch to
    finish and the branches still running are stopped. The ones that finished are the full run's
    samples at their indices (same seeds)."""
    full, _ = run(engine_backend, None, lambda text: text)
    state = runtime_program.run(StopRule.parse("beta:0.7:1"), "^", backend=engine_backend)
    assert state.error() is None, state.error()
    texts, indices, stopped, decided = state.ret_value
    assert decided and stopped >= 1 and len(indices) + stopped == len(SEEDS), (indices, stopped)
    assert list(indices) == sorted(indices) and set(indices) <= set(range(len(SEEDS)))
    # ``program`` samples 12 tokens with no stop string: one text is a prefix of the other.
    assert sum(not (full[b].startswith(text) or text.startswith(full[b])) for text, b in zip(texts, indices)) <= 1
    assert_no_kv_leak(engine_backend)
