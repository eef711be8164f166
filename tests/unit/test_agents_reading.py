"""The agents' reading team without an engine (``programs.agents`` on CoQA): its user messages
(the passage first, right after each persona), the team chosen by the problem's dataset, the
GSM8K team's prompts pinned byte for byte, the workloads' datasets and the per-agent columns
named by team (``benchmarks.bench.agent_workloads.agent_columns``)."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.bench.agent_workloads import agent_columns
from benchmarks.bench.run import parse_args
from programs.agents import AGENTS, READING_AGENTS, solve, team_of, user_message
from programs.datasets.coqa import ReadingProblem
from programs.role_sc import INSTRUCTION as READING_INSTRUCTION
from programs.sampling import SamplingConfig
from tests.unit.test_agent_workloads import ARC, GSM, StreamingEndpoint, _chain, _run

STORY = "Cotton was a little white kitten.\nShe lived in a barn."
COQA = ReadingProblem("coqa", "c1", "What color was Cotton?", (), "white", STORY, ("white", "White."))


class TestReadingTeam:
    def test_the_team_follows_the_dataset_and_every_reader_has_its_own_persona(self):
        short = dataclasses.replace(COQA, dataset="coqa-short")
        assert team_of(COQA) is team_of(short) is READING_AGENTS and team_of(GSM) is team_of(ARC) is AGENTS
        assert [a.name for a in READING_AGENTS] == ["finder", "drafter", "checker", "answer"]
        assert [a.label for a in READING_AGENTS[:3]] == ["Evidence", "Draft", "Check"]
        assert len({a.system for a in READING_AGENTS}) == 4 and READING_AGENTS[-1].task == ""

    def test_each_reader_reads_the_passage_first_then_every_earlier_output_under_its_label(self):
        opening = f"Passage:\n{STORY}\n\nQuestion: {COQA.question}\n\n"
        outputs = ["She was white.\n", " white ", "The draft is right."]
        for i, agent in enumerate(READING_AGENTS):
            message = user_message(COQA, i, outputs[:i])
            assert message.startswith(opening)
            assert message == opening + "".join(f"{a.label}:\n{t}\n\n" for a, t in zip(READING_AGENTS, outputs[:i])) + (
                agent.task or f"Using the work above, give the final answer. {READING_INSTRUCTION}")
        assert "Plan:" not in user_message(COQA, 3, outputs) and "A)" not in user_message(COQA, 3, outputs)
        with pytest.raises(ValueError, match="agent checker reads 2 earlier outputs"):
            user_message(COQA, 2, outputs[:1])

    def test_the_math_teams_messages_are_unchanged(self):
        question = "Question: Tom has 3 apples and buys 4 more. How many?\n\n"
        assert user_message(GSM, 0, []) == (
            question + "Write a short plan for solving this problem. Do not compute the answer.")
        assert user_message(GSM, 3, ["p", "s", "r"]) == (
            question + "Plan:\np\n\nSolution:\ns\n\nReview:\nr\n\nUsing the work above, give the final answer. "
            "Think step by step, then finish with 'The answer is N.' where N is a number.")
        assert user_message(ARC, 3, ["p", "s", "r"]).startswith(
            "Question: Which is a gas?\n\nA) ice\nB) steam\n\nPlan:")

    def test_a_reading_chain_opens_each_persona_with_the_passage_and_scores_against_every_annotator(self):
        backend = StreamingEndpoint(reply=lambda body: "White.\nShe was a kitten.")
        result = solve(COQA, 0, SamplingConfig(1, 16, 0.0, 3), backend, group="grp")
        for (body, _), agent in zip(backend.sent, READING_AGENTS):
            assert body["text"].startswith(f"<|im_start|>system\n{agent.system}<|im_end|>\n"
                                           f"<|im_start|>user\nPassage:\n{STORY}\n\n")
        assert result.answer == "white" and result.correct and len(result.branches) == 4
        wrong = solve(dataclasses.replace(COQA, answers=("black",)), 0, SamplingConfig(1, 16, 0.0, 3),
                      StreamingEndpoint(reply=lambda body: "White."), group="grp")
        assert not wrong.correct


class TestWorkloads:
    def test_the_agent_workloads_take_the_reading_sets_and_keep_gsm8k_by_default(self):
        for name in ("agents", "agents-steady"):
            assert parse_args(["--workload", name, "--datasets", "coqa"]).dataset_names == ["coqa"]
            assert parse_args(["--workload", name, "--datasets", "coqa-short,gsm8k"]).dataset_names == [
                "coqa-short", "gsm8k"]
            assert parse_args(["--workload", name]).dataset_names == ["gsm8k"]

    def test_an_unknown_dataset_is_refused_naming_the_valid_ones(self, capsys):
        with pytest.raises(SystemExit):
            parse_args(["--workload", "agents", "--datasets", "squad"])
        err = capsys.readouterr().err
        assert "unknown dataset 'squad' for --workload agents" in err and "coqa-short" in err and "gsm8k" in err

    def test_agent_columns_name_the_agents_of_the_problems_team(self):
        mine = [_run([_chain((1.0, 2.0, 3.0, 4.0), (1,), "x y", COQA)])]
        exact = [_run([_chain((1.0,) * 4, (2,), "x", COQA)])]
        out = agent_columns(mine, exact)
        names = [a.name for a in READING_AGENTS]
        assert out["ttft_median_s_by_agent"] == dict(zip(names, (1.0, 2.0, 3.0, 4.0)))
        assert out["agent_output_identical_vs_exact"] == dict.fromkeys(names, 0.0)
        assert list(out["agent_rouge_l_vs_exact"]) == names
        assert list(agent_columns([_run([_chain((1.0,) * 4)])], None)["ttft_median_s_by_agent"]) == [
            a.name for a in AGENTS]
