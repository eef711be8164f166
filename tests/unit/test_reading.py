"""The reading workloads' pure parts: CoQA problems, short answers, scoring, the vote, the
multi-document orders (``programs.reading``, ``programs.datasets.coqa``, ``programs.multi_doc``)."""

from __future__ import annotations

import pytest

from programs.reading import F1_CORRECT, MAX_ANSWER_WORDS, is_correct, normalize, short_answer, token_f1, vote


class TestShortAnswer:
    def test_normalisation_drops_case_punctuation_and_articles(self):
        assert normalize("The  Cat, a dog!") == "cat dog"

    def test_first_line_first_sentence_without_an_answer_prefix(self):
        assert short_answer("\nAnswer: White. She was happy.\nMore text") == "white"
        assert short_answer("The answer is: in a barn") == "in barn"

    def test_nothing_left_is_no_answer(self):
        assert short_answer("  \n ...") is None and short_answer("") is None


class TestScoring:
    def test_token_f1_is_the_bag_of_words_f1(self):
        assert token_f1("cotton is white", "white") == pytest.approx(0.5)
        assert token_f1("a b", "c") == 0.0 and token_f1("", "") == 1.0

    def test_an_answer_with_f1_at_the_threshold_is_correct(self):
        assert token_f1("is white", "white") >= F1_CORRECT and is_correct("is white", ("white",))

    def test_a_short_sentence_containing_the_gold_is_correct_a_long_one_is_not(self):
        assert is_correct("cotton was little white kitten", ("white",))
        long = " ".join(["word"] * MAX_ANSWER_WORDS) + " white"
        assert not is_correct(long, ("white",))

    def test_the_gold_words_must_be_contiguous(self):
        assert is_correct("she lived in barn near farm", ("in a barn",))
        assert not is_correct("barn was where she lived in spring", ("in a barn",))

    def test_yes_no_golds_are_matched_by_the_first_word(self):
        assert is_correct("yes she did", ("Yes.",)) and not is_correct("no she did not say yes", ("yes",))

    def test_any_annotator_answer_counts_and_no_answer_is_wrong(self):
        assert is_correct("suspect", ("Gary Giordano", "the suspect"))
        assert not is_correct(None, ("white",)) and not is_correct("", ("white",))


class TestVote:
    def test_the_majority_wins(self):
        assert vote(["x", "y", "y", None]) == ("y", {"x": 1, "y": 2})

    def test_a_tie_goes_to_the_answer_the_others_support_most_then_the_first(self):
        assert vote(["red car", "blue boat", "red bike"])[0] == "red car"
        assert vote(["a", "b"])[0] == "a"

    def test_no_answers_no_vote(self):
        assert vote([None, None]) == (None, {})


class TestCoqa:
    def test_one_first_question_per_story_with_every_annotator_answer(self):
        from programs.datasets import is_correct as dataset_correct, load

        problems = load("coqa")
        assert len(problems) == 500 and len({p.id for p in problems}) == 500
        first = problems[0]
        assert first.question == "What color was Cotton?" and first.answers == ("white",) * 4
        assert first.answer == "white" and "Cotton" in first.passage
        assert dataset_correct(first, "Cotton was white.\nMore") and not dataset_correct(first, "orange")

    def test_the_short_set_keeps_the_short_stories_under_its_own_name(self):
        from programs.datasets import load
        from programs.datasets.coqa import SHORT_MAX_WORDS

        short = load("coqa-short")
        assert short and all(len(p.passage.split()) <= SHORT_MAX_WORDS and p.dataset == "coqa-short" for p in short)


class TestMultiDoc:
    def test_each_branch_reads_a_permutation_distinct_while_there_are_enough(self):
        from programs.multi_doc import branch_orders

        orders = branch_orders("story-1", 4, 8)
        assert all(sorted(o) == [0, 1, 2, 3] for o in orders) and len(set(orders)) == 8
        assert orders == branch_orders("story-1", 4, 8) != branch_orders("story-2", 4, 8)
        assert branch_orders("s", 2, 3) == [*branch_orders("s", 2, 2), branch_orders("s", 2, 2)[0]]

    def test_documents_are_the_problems_own_passage_then_others_of_the_pool(self):
        from programs.datasets import load
        from programs.multi_doc import NUM_DOCS, documents_for

        pool = load("coqa-short")
        docs = documents_for(pool[0], pool)
        assert len(docs) == NUM_DOCS == len(set(docs)) and docs[0] == pool[0].passage
        assert docs == documents_for(pool[0], list(reversed(pool)))  # by hash, not by pool order
        with pytest.raises(ValueError, match="multi-doc"):
            documents_for(pool[0], pool[:2])

    def test_a_chunk_is_the_same_text_at_every_position(self):
        from programs.multi_doc import chunk

        assert chunk("abc") == "Document:\nabc\n\n"
