"""The agent workloads without an engine: the chain's prompts (the relay), the grader's prompt and
pick, the streamed and timed request, the steady state's halves, their command line and their
rows' columns (``programs.agents``, ``programs.grader``, ``programs.timed``,
``benchmarks.bench.agent_workloads``)."""

from __future__ import annotations

import math
import types

import pytest
from sglang.lang.chat_template import get_chat_template

from benchmarks.bench.agent_workloads import (agent_columns, grader_columns, latency_columns, print_latency,
                                              split_steady)
from benchmarks.bench.run import parse_args
from programs.agents import AGENTS, problem_group, solve, user_message
from programs.datasets import Problem
from programs.grader import GRADER_MAX_DEVIATION, GRADER_QUESTION, grade, grader_message, pick, verdict
from programs.sampling import SamplingConfig
from programs.timed import generate_timed, request_body
from rksc_sgl.endpoint import RkscEndpoint
from rksc_sgl.protocol import ASKS_KEY, GROUP_MAX_CHARS, AsksOptions

GSM = Problem("gsm8k", "g1", "Tom has 3 apples and buys 4 more. How many?", (), "7")
ARC = Problem("arc-challenge", "a1", "Which is a gas?", ("ice", "steam"), "B")


class StreamingEndpoint(RkscEndpoint):
    """An ``RkscEndpoint`` whose stream answers every request with ``reply(body)`` (two events, as
    a request with ``stream_interval`` above its tokens streams) and records what was sent."""

    def __init__(self, reply=lambda body: "out", token_ids_logprobs=None):
        self.model_info = {"model_path": "a-model"}
        self.chat_template = get_chat_template("chatml")
        self._init_counters()
        self.sent, self.reply, self.token_ids_logprobs = [], reply, token_ids_logprobs

    def _send_stream(self, data, routing_key=None):
        self.sent.append((data, routing_key))
        text = self.reply(data)
        meta = {"prompt_tokens": 10, "cached_tokens": 4, "completion_tokens": 2,
                "output_token_logprobs": [(-0.1, 5, None), (-0.2, 6, None)],
                "output_top_logprobs": [[(-0.1, 5, None), (-2.0, 9, None)], []],
                ASKS_KEY: [{"mode": "blend", "outcome": "blended", "reused_tokens": 3}]}
        if self.token_ids_logprobs is not None:
            meta["output_token_ids_logprobs"] = [self.token_ids_logprobs]
        yield {"text": text[:1], "meta_info": {**meta, "completion_tokens": 1}}
        yield {"text": text, "meta_info": meta}


class TestChainPrompts:
    def test_each_agent_reads_the_question_then_every_earlier_output_verbatim_under_its_label(self):
        outputs = ["1. Add.\n", " 3 + 4 = 7 ", "Correct."]
        message = user_message(GSM, 3, outputs)
        assert message.startswith(f"Question: {GSM.question}\n\n")
        at = [message.index(f"{agent.label}:\n{text}\n\n") for agent, text in zip(AGENTS, outputs)]
        assert at == sorted(at)  # verbatim, whitespace kept, in the chain's order
        assert message.endswith("The answer is N.' where N is a number.")
        assert user_message(GSM, 0, []).endswith(AGENTS[0].task) and "Plan:" not in user_message(GSM, 0, [])

    def test_the_answerer_asks_for_a_letter_on_multiple_choice_and_the_counts_are_checked(self):
        assert "B) steam" in user_message(ARC, 3, ["a", "b", "c"]) and "letter" in user_message(ARC, 3, ["a", "b", "c"])
        with pytest.raises(ValueError, match="reads 1 earlier outputs"):
            user_message(GSM, 1, [])
        with pytest.raises(ValueError, match="agent_index"):
            user_message(GSM, len(AGENTS), ["x"] * len(AGENTS))

    def test_every_agent_has_its_own_persona_and_a_problems_group_is_its_own(self):
        assert len({a.system for a in AGENTS}) == len(AGENTS) == 4
        groups = {problem_group("k" * 16, i) for i in range(3)}
        assert len(groups) == 3 and all(AsksOptions(group=g).group == g for g in groups)
        assert len(problem_group("k" * 16, 10**6)) <= GROUP_MAX_CHARS

    def test_a_chain_relays_each_output_into_the_next_request_in_the_problems_group_with_its_seeds(self):
        backend = StreamingEndpoint(reply=lambda body: f"said-{len(body['text'])} The answer is 7.")
        result = solve(GSM, 5, SamplingConfig(1, 16, 0.0, 3), backend, group="grp")
        assert len(backend.sent) == 4 and result.correct and len(result.ttft_s) == len(result.latency_s) == 4
        for (body, key), earlier in zip(backend.sent[1:], result.branches):
            assert earlier.text in body["text"] and key == "grp"  # the relay, routed with the problem
        params = [body["sampling_params"] for body, _ in backend.sent]
        assert all(p["custom_params"] == {ASKS_KEY: {"enabled": True, "group": "grp"}} for p in params)
        assert len({p["sampling_seed"] for p in params}) == 4 and all(p["max_new_tokens"] == 16 for p in params)
        assert backend.sent[0][0]["text"].startswith(f"<|im_start|>system\n{AGENTS[0].system}<|im_end|>")
        assert result.branches[0].asks["reused_tokens"] == 3
        assert result.branches[0].first_top_logprobs == {5: -0.1, 9: -2.0}
        assert backend.counters.requests == 4 and backend.counters.completion_tokens == 8  # counted once each


class TestTimedRequest:
    def test_the_body_streams_with_an_interval_past_its_tokens_so_only_the_first_token_comes_early(self):
        body = request_body("hi", max_new_tokens=8, temperature=0.0, top_logprobs_num=20, seed=7,
                            custom_params={"x": 1}, token_ids_logprob=[1, 2])
        assert body["stream"] and body["sampling_params"]["stream_interval"] > 8
        assert body["sampling_params"]["sampling_seed"] == 7 and body["sampling_params"]["custom_params"] == {"x": 1}
        assert body["token_ids_logprob"] == [1, 2] and body["top_logprobs_num"] == 20
        assert "sampling_seed" not in request_body("hi", max_new_tokens=1, temperature=0.0,
                                                   top_logprobs_num=5)["sampling_params"]

    def test_it_times_the_first_output_keeps_the_last_and_refuses_an_unstreamed_body(self):
        backend = StreamingEndpoint(reply=lambda body: "whole text")
        out = generate_timed(backend, request_body("hi", max_new_tokens=2, temperature=0.0, top_logprobs_num=1),
                             routing_key="k")
        assert out.text == "whole text" and 0 <= out.ttft_s <= out.latency_s and backend.sent[0][1] == "k"
        assert out.meta_info["completion_tokens"] == 2 and backend.counters.requests == 1
        with pytest.raises(ValueError, match="stream=True"):
            generate_timed(backend, {"text": "hi", "sampling_params": {}})


class TestGrader:
    def test_the_grader_reads_the_question_and_the_candidate_verbatim_then_asks_yes_or_no(self):
        message = grader_message(ARC, "  Steam is water as a gas.\n")
        assert message.startswith(f"Question: {ARC.question}")
        assert "\n\nProposed solution:\n  Steam is water as a gas.\n\n" in message
        assert message.endswith(GRADER_QUESTION)

    def test_pick_takes_the_highest_p_yes_ties_to_the_first_and_verdicts_are_read_as_words(self):
        assert pick([0.2, 0.7, 0.7]) == 1 and pick([0.5]) == 0
        with pytest.raises(ValueError):
            pick([])
        assert [verdict(t) for t in ("Yes", " no.", "Maybe", "")] == ["yes", "no", None, None]

    def test_a_grader_request_is_one_greedy_token_in_the_group_with_its_yes_no_probability(self):
        backend = StreamingEndpoint(reply=lambda body: "Yes", token_ids_logprobs=[(-0.5, 1, None), (-1.5, 2, None)])
        backend._rksc_verdict_ids = ((1,), (2,))  # as verdict_token_ids caches them
        branch, p_yes, ttft, latency = grade(GSM, "3 + 4 = 7", backend, "grp", recompute=0.5)
        body, key = backend.sent[0]
        assert body["sampling_params"]["max_new_tokens"] == 1 and body["sampling_params"]["temperature"] == 0.0
        assert body["sampling_params"]["custom_params"][ASKS_KEY] == {"enabled": True, "group": "grp", "recompute": 0.5,
                                                                       "max_deviation": GRADER_MAX_DEVIATION}
        assert body["token_ids_logprob"] == [1, 2] and key == "grp" and "3 + 4 = 7" in body["text"]
        assert branch.answer == "yes" and p_yes == pytest.approx(1 / (1 + math.exp(-1.0)))
        assert 0 <= ttft <= latency


class TestSteadyState:
    def test_the_first_half_warms_and_the_second_is_measured(self):
        assert split_steady([1, 2, 3, 4, 5], True) == ([1, 2], [3, 4, 5])
        assert split_steady([1, 2], False) == ([], [1, 2])
        with pytest.raises(ValueError, match="at least 2"):
            split_steady([1], True)


class TestCommandLine:
    def test_the_agent_workloads_run_on_gsm8k_with_64_tokens_and_their_shots(self):
        for name, shots in (("agents", 0), ("agents-steady", 0), ("bon-grader", 3), ("bon-grader-steady", 3)):
            args = parse_args(["--workload", name])
            assert args.dataset_names == ["gsm8k"] and args.settings.max_new_tokens == 64 and args.shots == shots
        assert parse_args(["--workload", "agents", "--max-new-tokens", "48"]).settings.max_new_tokens == 48
        assert parse_args([]).settings.max_new_tokens == 96  # other workloads keep BenchSettings'
        assert parse_args(["--workload", "agents", "--datasets", "arc-challenge"]).dataset_names == ["arc-challenge"]

    def test_a_steady_state_needs_two_problems_and_the_grader_refuses_a_reading_set(self, capsys):
        with pytest.raises(SystemExit):
            parse_args(["--workload", "agents-steady", "--limit", "1"])
        assert "--limit must be >= 2" in capsys.readouterr().err
        with pytest.raises(SystemExit):
            parse_args(["--workload", "bon-grader", "--datasets", "coqa"])
        assert "'coqa'" in capsys.readouterr().err
        assert parse_args(["--workload", "bon-grader", "--asks-recompute-sweep", "0,1"]).mode_objs[-1].recompute == 1.0


def _run(details, **stats):
    return types.SimpleNamespace(details=details, stats=stats)


def _chain(ttft, tokens=(1,), text="a", problem=GSM):
    branch = types.SimpleNamespace(token_ids=tokens, text=text)
    return types.SimpleNamespace(problem=problem, ttft_s=ttft, latency_s=tuple(t * 2 for t in ttft),
                                 branches=(branch,) * len(AGENTS))


class TestColumns:
    def test_ttft_pools_every_request_of_every_repeat_against_exacts_median(self):
        runs = [_run([_chain((1.0, 2.0, 3.0, 4.0))]), _run([_chain((5.0, 6.0, 7.0, 8.0))])]
        exact = [_run([_chain((9.0,) * 4)])]
        out = latency_columns(runs, exact)
        assert out["ttft_requests"] == 8 and out["ttft_median_s"] == 4.5 and out["latency_median_s"] == 9.0
        assert out["ttft_p90_s"] == pytest.approx(7.3) and out["ttft_median_vs_exact"] == 2.0
        assert "ttft_median_vs_exact" not in latency_columns(runs, None)

    def test_agent_columns_split_identity_and_rouge_by_agent(self):
        mine = [_run([_chain((1.0,) * 4, (1, 2), "x y"), _chain((1.0,) * 4, (3,), "z")])]
        exact = [_run([_chain((1.0,) * 4, (1, 2), "x y"), _chain((1.0,) * 4, (4,), "w")])]
        out = agent_columns(mine, exact)
        assert out["agent_output_identical_vs_exact"] == {a.name: 0.5 for a in AGENTS}
        assert out["agent_rouge_l_vs_exact"]["planner"] == 0.5 and set(out["ttft_median_s_by_agent"]) == {
            a.name for a in AGENTS}
        assert "agent_output_identical_vs_exact" not in agent_columns(mine, None)

    def test_grader_columns_compare_picks_and_p_yes_with_exacts(self):
        def graded(pick_, p_yes):
            return types.SimpleNamespace(ttft_s=(0.1,), latency_s=(0.1,), pick=pick_, p_yes=p_yes)

        mine = [_run([graded(0, (0.6, 0.4)), graded(1, (0.2, 0.9))], verify_s=2.0, sample_s=5.0)]
        exact = [_run([graded(0, (0.5, 0.4)), graded(0, (0.8, 0.7))], verify_s=4.0, sample_s=5.0)]
        out = grader_columns(mine, exact)
        assert out["grader_picks"] == [0, 1] and out["grader_same_pick_vs_exact"] == 0.5
        assert out["grader_p_yes_abs_diff_vs_exact"] == pytest.approx((0.1 + 0 + 0.6 + 0.2) / 4, abs=1e-4)
        assert out["verify_s"] == 2.0 and out["verify_time_vs_exact"] == 2.0 and out["sample_s"] == 5.0

    def test_the_table_and_the_report_show_rows_with_ttft_only(self, capsys):
        from benchmarks.report.latency import latency_table

        row = {"dataset": "gsm8k", "mode": "asks-only", "wall_s": 10.0, "speedup_vs_exact": 1.5, "ttft_median_s": 0.2,
               "ttft_p90_s": 0.4, "ttft_median_vs_exact": 2.0, "accuracy": 0.1,
               "agent_output_identical_vs_exact": {"planner": 1.0, "solver": 0.5},
               "ttft_median_s_by_agent": {"planner": 0.5, "solver": 0.125}}
        print_latency([row, {"mode": "exact", "wall_s": 1.0}])
        assert "asks-only" in capsys.readouterr().out
        table = latency_table([row])
        assert "planner 1.00 / solver 0.50" in table[-1] and latency_table([{"mode": "exact"}]) == []
        assert "| planner 0.500 / solver 0.125 |" in table[-1]
        grader_row = {**row, "grader_picks": [0], "verify_s": 3.0, "grader_same_pick_vs_exact": 1.0}
        assert "| 3.0 |" in latency_table([grader_row])[-1]
