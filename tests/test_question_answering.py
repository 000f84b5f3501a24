"""Question answering's data path (`hf_scratch_transformer.question_answering`): SQuAD rows cut into windows with
their answer's tokens as labels, those labels read back as the answer's text, and SQuAD's exact match and F1."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tiny_tokenizers import byte_level_bpe, wordpiece

from hf_scratch_transformer import question_answering
from hf_scratch_transformer.question_answering import (
    NO_ANSWER_TOKEN,
    answer_problems,
    predicted_answers,
    span_encoder,
    squad_scores,
)

WORDS = "the a man woman dog horse rides walks runs sees red big small house street Verona, Romeo's".split()
TOKENIZERS = {"wordpiece": wordpiece, "bpe": lambda: byte_level_bpe(family="encoder")}


def squad_row(words: list[str], first: int, count: int, question: str) -> dict:
    """A SQuAD row whose answer is `count` words of `words` from word `first` (none where `count` is 0)."""
    context = " ".join(words)
    if not count:
        return {"question": question, "context": context, "answers": {"text": [], "answer_start": []}}
    start = len(" ".join(words[:first])) + (1 if first else 0)
    return {"question": question, "context": context,
            "answers": {"text": [" ".join(words[first:first + count])], "answer_start": [start]}}


@st.composite
def squad_batches(draw):
    """(tokenizer kind, rows, max_length, stride): contexts of 1-60 words, answers of 0-4 words, windows from a
    few context tokens to more than the longest context."""
    rows = []
    for _ in range(draw(st.integers(1, 3))):
        words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=60))
        first = draw(st.integers(0, len(words) - 1))
        count = draw(st.integers(0, min(4, len(words) - first)))
        question = " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=5))) + " ?"
        rows.append(squad_row(words, first, count, question))
    kind = draw(st.sampled_from(sorted(TOKENIZERS)))
    tokenizer = TOKENIZERS[kind]()
    longest_question = max(len(tokenizer(row["question"], add_special_tokens=False).input_ids) for row in rows)
    least = longest_question + tokenizer.num_special_tokens_to_add(pair=True) + 1  # one context token per window
    max_length = draw(st.integers(least, least + 120))
    stride = draw(st.integers(0, max_length - least))  # less than the context tokens a window holds
    return kind, rows, max_length, stride


def encoded(tokenizer, rows: list[dict], max_length: int, stride: int) -> dict:
    batch = {key: [row[key] for row in rows] for key in ("question", "context", "answers")}
    return span_encoder(tokenizer, max_length, stride)(batch, list(range(len(rows))))


@given(squad_batches())
def test_windows_cover_each_context_and_label_its_answer_wherever_it_is_whole(case):
    kind, rows, max_length, stride = case
    tokenizer = TOKENIZERS[kind]()
    windows = encoded(tokenizer, rows, max_length, stride)
    assert max(map(len, windows["input_ids"])) <= max_length
    for row, squad in enumerate(rows):
        mine = [window for window, example in enumerate(windows["example"]) if example == row]
        assert mine == list(range(mine[0], mine[-1] + 1))  # a row's windows follow each other
        # Every context token is in a window: the same character spans as the whole pair, untruncated
        whole = tokenizer(squad["question"], squad["context"], return_offsets_mapping=True)
        context_spans = [tuple(span) for span, sequence in zip(whole["offset_mapping"], whole.sequence_ids(),
                                                               strict=True) if sequence == 1]
        covered = {tuple(span) for window in mine for span in windows["offset_mapping"][window] if span is not None}
        assert covered == set(context_spans)
        answer = squad["answers"]["text"][0] if squad["answers"]["text"] else None
        labelled = []
        for window in mine:
            start, end = windows["start_positions"][window], windows["end_positions"][window]
            offsets = windows["offset_mapping"][window]
            if (start, end) == (NO_ANSWER_TOKEN, NO_ANSWER_TOKEN):
                continue
            labelled.append(window)
            # the labels are context tokens, and their characters are the answer's (a byte-level token may hold the
            # space before its word)
            assert offsets[start] is not None and offsets[end] is not None and start <= end
            assert squad["context"][offsets[start][0]:offsets[end][1]].strip() == answer
        if answer is None:
            assert labelled == []
            continue
        first_token = next(token for token, span in enumerate(context_spans)
                           if span[1] > squad["answers"]["answer_start"][0])
        last_token = max(token for token, span in enumerate(context_spans)
                         if span[0] < squad["answers"]["answer_start"][0] + len(answer))
        # Windows overlap by `stride` tokens: an answer of at most stride + 1 tokens is whole in one of them
        if last_token - first_token <= stride or len(mine) == 1:
            assert labelled


@given(squad_batches())
def test_the_labels_read_back_as_the_answers(case):
    """Logits that point at each window's labels give back every answer whole in a window (and none for the others):
    the windows, their offsets and the post-processing agree. Scored, that is 100 exact match and F1."""
    kind, rows, max_length, stride = case
    windows = encoded(TOKENIZERS[kind](), rows, max_length, stride)
    width = max(map(len, windows["input_ids"])) + 3  # Trainer pads the logits of shorter batches (-100)
    start_logits, end_logits = np.full((2, len(windows["example"]), width), -100.0)
    for window, (start, end) in enumerate(zip(windows["start_positions"], windows["end_positions"], strict=True)):
        length = len(windows["input_ids"][window])
        start_logits[window, :length] = end_logits[window, :length] = 0.0
        start_logits[window, start] = end_logits[window, end] = 10.0
    predictions = predicted_answers(start_logits, end_logits, windows, [row["context"] for row in rows],
                                    may_answer_none=True)
    found = {windows["example"][window] for window, start in enumerate(windows["start_positions"])
             if start != NO_ANSWER_TOKEN}
    expected = [row["answers"]["text"][0] if index in found else "" for index, row in enumerate(rows)]
    assert predictions == expected
    answerable = [row["answers"] for index, row in enumerate(rows) if index in found or not row["answers"]["text"]]
    if answerable:
        assert squad_scores([p for i, p in enumerate(predictions) if i in found or not rows[i]["answers"]["text"]],
                            answerable) == {"exact_match": 100.0, "f1": 100.0}


def test_the_best_span_over_the_windows_and_no_answer_where_it_scores_higher():
    context = "Romeo met Juliet in Verona"
    # two windows of one question: "Romeo" (0-5) "met" (6-9) | "Juliet" (10-16) "in" (17-19) "Verona" (20-26)
    windows = {"example": [0, 0], "offset_mapping": [[None, (0, 5), (6, 9), None],
                                                     [None, (10, 16), (17, 19), (20, 26)]]}
    start_logits = np.array([[0.0, 3.0, 0.0, 9.0], [0.0, 1.0, 0.0, 4.0]])  # 9.0: a special token, never an answer
    end_logits = np.array([[0.0, 0.0, 1.0, 9.0], [0.0, 2.0, 0.0, 3.0]])
    # spans: "Romeo met" 3 + 1 = 4, "Juliet" 1 + 2 = 3, "Verona" 4 + 3 = 7 (the best), "Juliet in Verona" 1 + 3 = 4;
    # "met" .. "Romeo" ends before it starts
    assert predicted_answers(start_logits, end_logits, windows, [context], may_answer_none=False) == ["Verona"]
    # No answer scores each window at its first token: the lowest of them, 0 + 0, is below 7
    assert predicted_answers(start_logits, end_logits, windows, [context], may_answer_none=True) == ["Verona"]
    start_logits[:, NO_ANSWER_TOKEN] = end_logits[:, NO_ANSWER_TOKEN] = 4.0  # 8 > 7 in both windows
    assert predicted_answers(start_logits, end_logits, windows, [context], may_answer_none=True) == [""]
    assert predicted_answers(start_logits, end_logits, windows, [context], may_answer_none=False) == ["Verona"]
    # A span of no characters (a byte-level BPE's token of a lone space) is no answer where "" means none: the best
    # span with text is weighed against no answer, as run_qa does; else it is the answer, "", as run_qa's SQuAD 1 mode
    spaced = {"example": [0], "offset_mapping": [[None, (0, 5), (6, 9), (9, 9)]]}
    starts, ends = np.array([[0.0, 2.0, 0.0, 9.0]]), np.array([[0.0, 0.0, 2.0, 9.0]])  # "Romeo met" to it: 2 + 9
    assert predicted_answers(starts, ends, spaced, [context], may_answer_none=True) == ["Romeo met"]
    assert predicted_answers(starts, ends, spaced, [context], may_answer_none=False) == [""]
    # A span longer than the longest answer is not taken
    long = {"example": [0], "offset_mapping": [[None] + [(i, i + 1) for i in range(40)]]}
    starts, ends = np.zeros((2, 1, 41))
    starts[0, 1], ends[0, 40], ends[0, 3] = 5.0, 5.0, 1.0
    assert predicted_answers(starts, ends, long, ["x" * 40], may_answer_none=False) == ["xxx"]


@pytest.mark.parametrize("prediction, references, exact, f1", [
    ("the Eiffel Tower!", ["Eiffel Tower"], 1.0, 1.0),  # articles, punctuation and case do not count
    ("Eiffel", ["Eiffel Tower"], 0.0, 2 / 3),  # precision 1, recall 1/2
    ("in Paris, France", ["Paris", "France in Europe"], 0.0, 2 / 3),  # the best reference: 2 of 3 words each way
    ("tower tower", ["tower"], 0.0, 2 / 3),  # words counted with their repeats: precision 1/2, recall 1
    ("", [], 1.0, 1.0),  # no answer, rightly
    ("Paris", [], 0.0, 0.0),
    ("", ["Paris"], 0.0, 0.0),
    ("a the", ["an"], 1.0, 1.0),  # both empty once normalized: SQuAD 2.0's script scores 1
])
def test_scores_as_squads_evaluation_script(prediction, references, exact, f1):
    answers = {"text": references, "answer_start": [0] * len(references)}
    assert squad_scores([prediction], [answers]) == pytest.approx({"exact_match": 100 * exact, "f1": 100 * f1})


def test_scores_are_means_over_the_questions():
    answers = [{"text": ["Eiffel Tower"], "answer_start": [0]}, {"text": [], "answer_start": []}]
    assert squad_scores(["Eiffel", ""], answers) == pytest.approx({"exact_match": 50.0, "f1": 100 * (2 / 3 + 1) / 2})


def test_answer_problems_name_each_rows_problem():
    context = "Romeo met Juliet in Verona"
    rows = [
        ("Where?", context, {"text": ["Verona"], "answer_start": [20]}),  # right
        ("Who?", context, {"text": [], "answer_start": []}),  # no answer (SQuAD 2.0): right
        (" ", context, {"text": ["Verona"], "answer_start": [20]}),
        ("Where?", None, {"text": ["Verona"], "answer_start": [20]}),
        ("Where?", context, "Verona"),
        ("Where?", context, {"text": ["Verona", "in Verona"], "answer_start": [20]}),
        ("Where?", context, {"text": ["Verona"], "answer_start": [-1]}),
        ("Where?", context, {"text": ["Verona"], "answer_start": ["20"]}),
        ("Where?", context, {"text": ["Verona"], "answer_start": [19]}),  # off by one
        ("Where?", context, {"text": ["Juliet", "Verona"], "answer_start": [10, 21]}),  # its second answer
    ]
    problems = answer_problems(*zip(*rows, strict=True))
    assert problems == {"question": [2], "context": [3], "answers": [4, 5, 6, 7], "misplaced": [8, 9]}


def test_any_question_without_an_answer_lets_the_model_answer_none():
    answered, unanswered = {"text": ["Verona"], "answer_start": [20]}, {"text": [], "answer_start": []}
    assert not question_answering.has_no_answer([answered, answered])
    assert question_answering.has_no_answer([answered, unanswered])
