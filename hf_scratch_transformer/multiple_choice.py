"""Multiple choice on SWAG-style data, as transformers' run_swag example does it: each row's question paired with each
of its choices and tokenized as a pair (the question segment 0, the choice segment 1), the row's pairs kept together
for `DataCollatorForMultipleChoice`, labelled with the index of the right choice; scored by accuracy.

Data rows hold a question (or any first text: SWAG's context), its choices (a list of texts, as many in every row,
which one batch needs) and the right choice's index, from 0.
"""

from collections.abc import Callable
from itertools import accumulate, pairwise

from .question_answering import is_text


def choice_count(choices: list) -> int | None:
    """The number of choices of the first row: every row must have as many. None where it holds no list."""
    return len(choices[0]) if choices and isinstance(choices[0], list) else None


def choice_problems(questions: list, choices: list, labels: list, count: int | None) -> dict[str, list[int]]:
    """What is wrong with rows of multiple-choice data, by problem: {"question": rows without a question's text,
    "choices": rows whose choices are not a list of two or more texts, "count": rows with another number of choices
    than `count`, "label": rows whose label is not the index of one of their choices}. Rows count from 0."""
    problems = {"question": [], "choices": [], "count": [], "label": []}
    for row, (question, row_choices, label) in enumerate(zip(questions, choices, labels, strict=True)):
        if not is_text(question):
            problems["question"].append(row)
        if not isinstance(row_choices, list) or len(row_choices) < 2 or not all(map(is_text, row_choices)):
            problems["choices"].append(row)
            continue
        if len(row_choices) != count:
            problems["count"].append(row)
        whole = isinstance(label, int | float) and not isinstance(label, bool) and float(label).is_integer()
        if not whole or not 0 <= label < len(row_choices):
            problems["label"].append(row)
    return problems


def choice_encoder(tokenizer, max_length: int) -> Callable[[dict], dict]:
    """A batched `datasets.map` function: rows of "question", "choices" (C texts) and "label" -> per row, each of the
    tokenizer's fields as C sequences (the question paired with each choice, cut to `max_length` tokens, the longer
    of the two first, as run_swag's `truncation=True`), and "labels", the right choice's index."""

    def encode(batch: dict) -> dict:
        counts = [len(choices) for choices in batch["choices"]]
        questions = [question for question, count in zip(batch["question"], counts, strict=True)
                     for _ in range(count)]
        endings = [choice for choices in batch["choices"] for choice in choices]
        encoded = tokenizer(questions, endings, truncation=True, max_length=max_length)
        starts = [0, *accumulate(counts)]  # each row's first pair among the pairs
        grouped = {name: [values[start:end] for start, end in pairwise(starts)]
                   for name, values in encoded.items()}  # (pairs,) -> (rows, C)
        grouped["labels"] = [int(label) for label in batch["label"]]
        return grouped

    return encode
