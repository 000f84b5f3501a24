"""Extractive question answering on SQuAD-style data, as transformers' run_qa example does it: long contexts cut into
overlapping windows (features) with each answer's first and last token as labels, the predicted span of each question
read back from its windows' logits, and SQuAD's exact match and F1.

Data rows hold a question, a context and SQuAD's answers, `{"text": [...], "answer_start": [...]}` (character offsets
into the context); empty lists mark a question the context does not answer (SQuAD 2.0). Such a question, and a window
its answer is not in, is labelled at the first token ([CLS]), as BERT's SQuAD 2.0 recipe and run_qa do.
"""

import re
import string
from collections import Counter
from collections.abc import Callable

import numpy as np

NO_ANSWER_TOKEN = 0  # where a window without the answer points: [CLS] in BERT's layout
BEST_STARTS_AND_ENDS = 20  # the start and end tokens tried per window (run_qa's n_best_size)
MAX_ANSWER_TOKENS = 30  # the longest span predicted (run_qa's max_answer_length)


def is_text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def answer_problems(questions: list, contexts: list, answers: list) -> dict[str, list[int]]:
    """What is wrong with rows of SQuAD data, by problem: {"question": rows without a question's text, "context":
    rows without a context, "answers": rows whose answers are not SQuAD's dict of two lists of the same length,
    "misplaced": rows where an answer's text is not at its answer_start in the context}. Rows count from 0."""
    problems = {"question": [], "context": [], "answers": [], "misplaced": []}
    for row, (question, context, answer) in enumerate(zip(questions, contexts, answers, strict=True)):
        if not is_text(question):
            problems["question"].append(row)
        if not is_text(context):
            problems["context"].append(row)
        elif not _squad_answers(answer):
            problems["answers"].append(row)
        elif any(context[start:start + len(text)] != text
                 for text, start in zip(answer["text"], answer["answer_start"], strict=True)):
            problems["misplaced"].append(row)
    return {problem: rows for problem, rows in problems.items() if rows}


def _squad_answers(answer) -> bool:
    if not isinstance(answer, dict) or not {"text", "answer_start"} <= set(answer):
        return False
    texts, starts = answer["text"], answer["answer_start"]
    return (isinstance(texts, list) and isinstance(starts, list) and len(texts) == len(starts)
            and all(is_text(text) for text in texts)
            and all(isinstance(start, int) and not isinstance(start, bool) and start >= 0 for start in starts))


def has_no_answer(answers: list[dict]) -> bool:
    """Whether any question of the data has no answer in its context (SQuAD 2.0): then the model may answer none."""
    return any(not answer["text"] for answer in answers)


def span_encoder(tokenizer, max_length: int, stride: int) -> Callable[[dict, list[int]], dict]:
    """The `datasets.map` function (batched, with indices) from rows with "question", "context" and "answers" to
    windows of at most `max_length` tokens, `[CLS] question [SEP] context piece [SEP]`, the context pieces overlapping
    by `stride` tokens. Each window's labels are the first and last token of its row's first answer (`NO_ANSWER_TOKEN`
    where the answer is not wholly in it); "offset_mapping" keeps the character span of each context token (None for
    the others) and "example" the index of its row, for reading the predicted answer back."""

    def encode(batch: dict, indices: list[int]) -> dict:
        encoded = tokenizer(batch["question"], batch["context"], truncation="only_second", max_length=max_length,
                            stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True)
        rows = encoded.pop("overflow_to_sample_mapping")
        encoded["start_positions"], encoded["end_positions"], encoded["example"] = [], [], []
        for window, row in enumerate(rows):
            offsets = [offset if sequence == 1 else None for offset, sequence
                       in zip(encoded["offset_mapping"][window], encoded.sequence_ids(window), strict=True)]
            start, end = _answer_tokens(batch["answers"][row], offsets)
            encoded["offset_mapping"][window] = offsets
            encoded["start_positions"].append(start)
            encoded["end_positions"].append(end)
            encoded["example"].append(indices[row])
        return encoded

    return encode


def _answer_tokens(answers: dict, offsets: list) -> tuple[int, int]:
    """The first and last token of the first answer in a window whose context tokens span `offsets` (character
    (start, end) each, None outside the context); `NO_ANSWER_TOKEN` twice where it has none or holds only part."""
    if not answers["text"]:
        return NO_ANSWER_TOKEN, NO_ANSWER_TOKEN
    first = answers["answer_start"][0]
    last = first + len(answers["text"][0])  # one past the answer's last character
    context = [(token, offset) for token, offset in enumerate(offsets) if offset is not None]
    if not context or context[0][1][0] > first or context[-1][1][1] < last:
        return NO_ANSWER_TOKEN, NO_ANSWER_TOKEN
    start = max(token for token, (begin, _) in context if begin <= first)
    end = min(token for token, (_, stop) in context if stop >= last)
    return start, end


def predicted_answers(start_logits: np.ndarray, end_logits: np.ndarray, windows: dict, contexts: list[str],
                      may_answer_none: bool) -> list[str]:
    """The answer text to each context's question: the best-scoring span (start logit + end logit) over its windows,
    at most `MAX_ANSWER_TOKENS` long and within the context, or "" for none where `may_answer_none` and every window's
    no-answer score (at `NO_ANSWER_TOKEN`) beats it, as run_qa's post-processing. `start_logits`, `end_logits`:
    (windows, tokens), padded past a window's tokens; `windows`: "example" and "offset_mapping" per window."""
    best = [(-np.inf, "") for _ in contexts]  # (score, text) per context
    no_answer = [np.inf for _ in contexts]  # the lowest no-answer score of its windows, as run_qa takes
    for window, (row, offsets) in enumerate(zip(windows["example"], windows["offset_mapping"], strict=True)):
        starts, ends = start_logits[window], end_logits[window]
        no_answer[row] = min(no_answer[row], starts[NO_ANSWER_TOKEN] + ends[NO_ANSWER_TOKEN])
        tokens = len(offsets)  # the logits past them are Trainer's padding
        for start in np.argsort(starts[:tokens])[::-1][:BEST_STARTS_AND_ENDS]:
            for end in np.argsort(ends[:tokens])[::-1][:BEST_STARTS_AND_ENDS]:
                if (offsets[start] is None or offsets[end] is None or end < start
                        or end - start + 1 > MAX_ANSWER_TOKENS):
                    continue
                score = starts[start] + ends[end]
                if score <= best[row][0]:
                    continue  # most pairs: no slice of the context cut for them
                text = contexts[row][offsets[start][0]:offsets[end][1]]
                # Where "" means no answer, a span of no characters (a token of none: a byte-level BPE's lone space)
                # is no candidate: run_qa takes the best span with text
                if text or not may_answer_none:
                    best[row] = (score, text.strip())
    return ["" if may_answer_none and no_answer[row] > score else text
            for row, (score, text) in enumerate(best)]


def normalized_answer(text: str) -> str:
    """SQuAD's normalization before comparing answers: lower case, without punctuation, articles and extra spaces."""
    text = "".join(character for character in text.lower() if character not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def exact_match(prediction: str, reference: str) -> float:
    return float(normalized_answer(prediction) == normalized_answer(reference))


def f1(prediction: str, reference: str) -> float:
    """The F1 of the two answers' words (normalized), as SQuAD 2.0's script scores it: an empty answer against
    another scores 1 if both are empty, else 0."""
    predicted, true = normalized_answer(prediction).split(), normalized_answer(reference).split()
    if not predicted or not true:
        return float(predicted == true)
    common = sum((Counter(predicted) & Counter(true)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(true)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: list[str], answers: list[dict]) -> dict:
    """Exact match and F1 in percent, each question scored against its best-matching reference answer ("" for a
    question without one), as `evaluate`'s "squad" and "squad_v2" metrics compute them."""
    references = [answer["text"] or [""] for answer in answers]
    return {name: 100 * float(np.mean([max(score(prediction, reference) for reference in options)
                                       for prediction, options in zip(predictions, references, strict=True)]))
            for name, score in (("exact_match", exact_match), ("f1", f1))}


def answer_metrics(windows: dict, contexts: list[str], answers: list[dict], may_answer_none: bool
                   ) -> Callable[[object], dict]:
    """`compute_metrics` for `Trainer`: exact match and F1 of the answers predicted from an evaluation over the
    windows `windows` (in their order) of the rows with `contexts` and `answers`."""

    def compute(eval_prediction) -> dict:
        start_logits, end_logits = eval_prediction.predictions
        predictions = predicted_answers(start_logits, end_logits, windows, contexts, may_answer_none)
        return squad_scores(predictions, answers)

    return compute
