"""Small texts for the tests, drawn from a 15-word vocabulary by seed: sentences, SQuAD-style and multiple-choice
rows."""

import json
import re
from pathlib import Path

import torch

VOCABULARY = "the a man woman dog horse rides walks runs sees red big small house street".split()


def words(count: int, seed: int) -> list[str]:
    """`count` sentences of five words."""
    generator = torch.Generator().manual_seed(seed)
    return [" ".join(VOCABULARY[i] for i in torch.randint(0, len(VOCABULARY), (5,), generator=generator))
            for _ in range(count)]


def squad_rows(count: int, seed: int) -> list[dict]:
    """SQuAD rows: "which animal is there ?" of a context of two to six `words` sentences, answered by its first dog
    or horse (none, as SQuAD 2.0 gives it, where it has neither)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        context = " ".join(words(int(torch.randint(2, 7, (1,), generator=generator)), seed + len(rows)))
        found = [match for match in re.finditer(r"\b(dog|horse)\b", context)]
        answers = {"text": [found[0].group()] if found else [], "answer_start": [found[0].start()] if found else []}
        rows.append({"question": "which animal is there ?", "context": context, "answers": answers})
    return rows


def choice_rows(count: int, seed: int, choices: int = 3) -> list[dict]:
    """Multiple-choice rows: "what runs ?" with `choices` two-word choices, one of them (the label's) an animal."""
    generator = torch.Generator().manual_seed(seed)
    things = "the man", "a woman", "the house", "a street", "the red house"
    rows = []
    for _ in range(count):
        picked = [things[i] for i in torch.randperm(len(things), generator=generator)[:choices - 1]]
        label = int(torch.randint(0, choices, (1,), generator=generator))
        animal = ("the dog", "a horse")[int(torch.randint(0, 2, (1,), generator=generator))]
        rows.append({"question": "what runs ?", "choices": [*picked[:label], animal, *picked[label:]], "label": label})
    return rows


def write_json_lines(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return path
