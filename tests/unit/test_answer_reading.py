"""How the scheduler's group stop reads a member's vote: the program's extractor's ordered
patterns and normalisation (``rksc_sgl.stop_rules.read_answer``, sent by ``programs.sc`` as
``rksc_group_policy.answer_pattern`` and ``answer_normalize``), so it votes with the answers the
program counts."""

from __future__ import annotations

import time

import pytest

from programs.datasets import Problem, extract_answer, extract_reading
from programs.datasets.answers import ANSWER_PATTERNS, LETTER_PATTERNS, NUMBER_PATTERNS
from rksc_sgl.stop_options import ANSWER_PATTERNS_MAX, GroupPolicy, GroupTag
from rksc_sgl.stop_rules import answer_normalizer, compile_pattern, read_answer


def problem(kind: str) -> Problem:
    if kind == "number":
        return Problem("gsm8k", "q", "How many?", (), "7")
    return Problem("mmlu-stem", "q", "Which?", ("w", "x", "y", "z"), "B")


class TestOrderedReading:
    def test_the_first_pattern_that_matches_wins_over_later_ones(self):
        assert read_answer([r"answer is (\d+)", r"\d+"], "1, 2, the answer is 3, then 4") == "3"

    def test_a_later_pattern_reads_when_the_first_finds_nothing(self):
        assert read_answer([r"answer is (\d+)", r"\d+"], "1, 2, then 4") == "4"

    def test_the_winning_pattern_gives_its_last_match(self):
        assert read_answer([r"answer is (\d+)", r"\d+"], "answer is 3; no, answer is 5. 9") == "5"

    def test_a_single_pattern_as_a_string_reads_as_before(self):
        assert read_answer(r"answer is (\d+)", "answer is 3, no: the answer is 42.") == "42"
        assert read_answer(compile_pattern(r"\d+"), "1 then 22") == "22"

    def test_an_empty_match_is_a_vote(self):
        assert read_answer("^", "anything") == ""

    @pytest.mark.parametrize("text, expected", [
        ("The answer is 1,000.", "1000"),
        ("The answer is 3.0", "3"),
        ("so \\boxed{1{,}250} in all", "1250"),
        ("The answer is $18.00.", "18"),
        ("Answer: -0.50", "-0.5"),
    ])
    def test_numbers_are_normalised(self, text, expected):
        assert read_answer(NUMBER_PATTERNS, text, "number") == expected

    def test_letters_are_upper_cased_and_limited_to_the_range(self):
        assert read_answer(LETTER_PATTERNS, "Answer: c", "letter:ABCD") == "C"
        # E is out of range: the last in-range match of the same pattern reads instead.
        assert read_answer(LETTER_PATTERNS, "the answer is B. Hmm, the answer is E.", "letter:ABCD") == "B"
        assert read_answer(LETTER_PATTERNS, "the answer is E.", "letter:ABCD") is None

    def test_a_pattern_whose_matches_do_not_normalise_falls_through(self):
        # The last box holds no number: the "answer is" pattern reads, as the extractor does.
        assert read_answer(NUMBER_PATTERNS, "\\boxed{5} and \\boxed{x}; the answer is 9", "number") == "9"

    def test_an_unknown_normalisation_is_refused(self):
        with pytest.raises(ValueError, match="unknown answer normalisation"):
            answer_normalizer("digits")

    def test_the_timeout_bounds_all_the_patterns_together(self):
        start = time.perf_counter()
        assert read_answer([r"(a|aa)+$", r"(a|aa)+$", r"a"], "a" * 34 + "b") is None
        assert time.perf_counter() - start < 1.0


# Model-like outputs (SmolLM2-135M style: short, often without the asked-for "The answer is X").
LETTER_TEXTS = (
    "The correct answer is B. Because the force doubles when the mass doubles.",
    "Answer: (C)",
    "I think the answer is option D.",
    "We get \\boxed{A}",
    "B",
    "**c.**",
    "The answer: b",
    "Let's consider choice C. It matches the definition of a catalyst.",
    "Among the options, (A) is wrong and (D) is right.",
    "A planet orbits the sun in an ellipse, so the closest choice is C",
    "The answer is E. Hmm, actually the answer is B.",
    "Think step by step: the velocity doubles, so the kinetic energy quadruples. The answer is (D).",
    "Neither statement holds, so I would pick D, not A.",
)
NUMBER_TEXTS = (
    "She has 3 apples and buys 4 more, so 3 + 4 = 7. The answer is 7.",
    "Total = $1,000.\n#### 1,000",
    "So the total is \\boxed{1{,}250}.",
    "The answer is 3.0",
    "So it costs 12 dollars per day, 84 for the week.",
    "Answer: -5",
    "The answer is $18.00.",
    "He walks 2 miles, then 3 more: 5 miles in all. The answer is 5 miles. Check: 2 + 3 = 5.",
    "Let x be the width. x = 4.5, so the answer is 4.5",
    "\\boxed{x} where x is the count; the answer is 9",
    "I am not sure.",
)


def scheduler_reading(kind: str, text: str) -> str | None:
    """``text``'s vote as the scheduler reads it: the policy ``programs.sc`` sends, parsed as the
    server parses it, joined to a registry group and read by ``radix_ext.stop.stopper._answer``."""
    from radix_ext.stop import groups, stopper as early_stop

    patterns, normalize = extract_reading(problem(kind))
    wire = {"rksc_group_policy": {"answer_pattern": list(patterns), "answer_normalize": normalize, "rule": "beta"}}
    policy = GroupPolicy.from_custom_params(wire)

    class Tokenizer:
        def decode(self, ids, skip_special_tokens=True):
            return text

    class Req:
        output_ids, finished_len, tokenizer = [0], None, Tokenizer()

        def finished(self):
            return False

    group = groups.GroupRegistry().join(GroupTag("g", 0), policy, Req())
    return early_stop._answer(Req(), group)


def test_the_scheduler_reads_the_answers_the_extractor_reads():
    texts = [("letter", t) for t in LETTER_TEXTS] + [("number", t) for t in NUMBER_TEXTS]
    agree = sum(scheduler_reading(kind, t) == extract_answer(problem(kind), t) for kind, t in texts)
    assert len(texts) >= 20 and agree / len(texts) >= 0.9
    # The one "answer is X" pattern the scheduler used before agreed on far fewer of them.
    single = sum(read_answer(ANSWER_PATTERNS[kind][0 if kind == "letter" else 2], t) == extract_answer(problem(kind), t)
                 for kind, t in texts)
    assert single / len(texts) < 0.7


def test_the_benchmark_records_the_answers_the_scheduler_reads():
    from benchmarks.bench.workloads import policy_answer

    for kind, texts in (("letter", LETTER_TEXTS), ("number", NUMBER_TEXTS)):
        assert [policy_answer(problem(kind), t) for t in texts] == [scheduler_reading(kind, t) for t in texts]


def test_the_extractors_patterns_fit_a_group_policy():
    for patterns in ANSWER_PATTERNS.values():
        assert len(patterns) <= ANSWER_PATTERNS_MAX
        GroupPolicy(patterns, "beta")  # valid regexes, each within the length bound


def test_the_group_compiles_its_patterns_once_in_order():
    from radix_ext.stop import groups

    class Member:
        pass

    member = Member()
    group = groups.GroupRegistry().join(GroupTag("g", 0), GroupPolicy(["b", "a"], "esc"), member)
    assert [p.pattern for p in group.patterns] == ["b", "a"]
    assert group.patterns[0] is compile_pattern("b")
