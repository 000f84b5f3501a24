"""Multiple choice's data path (`hf_scratch_transformer.multiple_choice`): each row's question paired with each of its
choices, the row's pairs kept together and labelled with the right choice's index, and the rows refused by problem."""

import torch
from hypothesis import given
from hypothesis import strategies as st
from tiny_texts import VOCABULARY
from tiny_tokenizers import byte_level_bpe, wordpiece
from transformers import DataCollatorForMultipleChoice

from hf_scratch_transformer.multiple_choice import choice_count, choice_encoder, choice_problems

TOKENIZERS = {"wordpiece": wordpiece(), "bpe": byte_level_bpe(family="encoder")}
texts = st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=12).map(" ".join)


@st.composite
def choice_batches(draw):
    """(tokenizer kind, rows, max_length): 1-4 rows of a question and 2-5 choices each (as many in every row)."""
    choices = draw(st.integers(2, 5))
    rows = [{"question": draw(texts), "choices": draw(st.lists(texts, min_size=choices, max_size=choices)),
             "label": draw(st.integers(0, choices - 1))} for _ in range(draw(st.integers(1, 4)))]
    return draw(st.sampled_from(sorted(TOKENIZERS))), rows, draw(st.integers(4, 40))


@given(choice_batches())
def test_each_row_holds_its_question_paired_with_each_choice_and_the_right_ones_index(case):
    """Row r's pair c is the tokenizer's own encoding of (question r, choice c) cut to max_length, whatever the
    other rows hold; the collator then pads the rows into (rows, choices, length) in that order."""
    kind, rows, max_length = case
    tokenizer = TOKENIZERS[kind]
    batch = {key: [row[key] for row in rows] for key in ("question", "choices", "label")}
    encoded = choice_encoder(tokenizer, max_length)(batch)
    assert encoded["labels"] == [row["label"] for row in rows]
    for row, ids in zip(rows, encoded["input_ids"], strict=True):
        assert ids == [tokenizer(row["question"], choice, truncation=True, max_length=max_length)["input_ids"]
                       for choice in row["choices"]]
    features = [{name: values[index] for name, values in encoded.items()} for index in range(len(rows))]
    padded = DataCollatorForMultipleChoice(tokenizer)(features)
    assert padded["input_ids"].shape[:2] == (len(rows), len(rows[0]["choices"]))
    assert torch.equal(padded["labels"], torch.tensor(encoded["labels"]))
    for row, ids in enumerate(encoded["input_ids"]):
        for choice, pair in enumerate(ids):
            assert padded["input_ids"][row, choice, :len(pair)].tolist() == pair
            assert padded["attention_mask"][row, choice].sum() == len(pair)


def test_rows_are_refused_by_problem():
    rows = [("what runs ?", ["a dog", "a house"], 0),  # fine
            ("", ["a dog", "a house"], 1),  # no question
            ("what runs ?", ["a dog"], 0),  # one choice
            ("what runs ?", ["a dog", None], 0),  # a choice without text
            ("what runs ?", ["a dog", "a house", "a man"], 0),  # another number of choices
            ("what runs ?", ["a dog", "a house"], 2),  # past the choices
            ("what runs ?", ["a dog", "a house"], True),  # not an index
            ("what runs ?", ["a dog", "a house"], 1.0)]  # a whole float is one (pandas writes ids so)
    questions, choices, labels = (list(column) for column in zip(*rows, strict=True))
    assert choice_count(choices) == 2
    assert choice_problems(questions, choices, labels, choice_count(choices)) == {
        "question": [1], "choices": [2, 3], "count": [4], "label": [5, 6]}
