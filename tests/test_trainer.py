"""A short `Trainer` run lowers the loss of each family on a small synthetic task; gradient accumulation gives each
head the update of one batch."""

import pytest
import torch
from tiny_models import LM_CLASSES, VOCAB, tiny_config, tiny_lm
from tiny_native import bert_question_answering
from transformers import Trainer, TrainingArguments
from transformers.trainer_pt_utils import LabelSmoother

import hf_scratch_transformer as hst
from hf_scratch_transformer.presets import PRESETS, get_preset
from hf_scratch_transformer.training import ParametersCountedOnce, weight_decay_groups


def _examples(family: str, count: int = 64, length: int = 12) -> list[dict]:
    """Learnable patterns: arithmetic sequences (LM and MLM), reversal (seq2seq)."""
    generator = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(count):
        start, step = torch.randint(3, VOCAB, (1,), generator=generator).item(), 1 + torch.randint(0, 3, (1,)).item()
        ids = 3 + (start + step * torch.arange(length)) % (VOCAB - 3)
        if family == "decoder":
            examples.append({"input_ids": ids, "labels": ids.clone()})
        elif family == "encoder":
            masked = torch.rand(length, generator=generator) < 0.25
            masked[length // 2] = True
            examples.append({"input_ids": ids.masked_fill(masked, 3), "labels": ids.masked_fill(~masked, -100)})
        else:
            examples.append({"input_ids": ids, "labels": ids.flip(0)})
    return examples


@pytest.mark.parametrize("family", ["decoder", "encoder", "seq2seq"])
def test_trainer_lowers_the_loss(family, tmp_path):
    model = tiny_lm(family, hidden_size=64, intermediate_size=128).train()
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=40,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        warmup_steps=4,
        logging_steps=5,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=_examples(family))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 8
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_the_flop_estimate_counts_the_parameters_once_and_equals_trainers(family, tmp_path, monkeypatch):
    """`ParametersCountedOnce` (our commands' Trainers) reaches Trainer's `total_flos` with one parameter count in
    place of one a step, and counts again for another model."""
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, save_strategy="no",
                             report_to=[], disable_tqdm=True, use_cpu=True)
    runs = {}
    for name, trainer_class in (("Trainer", Trainer), ("ours", type("Ours", (ParametersCountedOnce, Trainer), {}))):
        model = tiny_lm(family)
        counts = []
        monkeypatch.setattr(model, "num_parameters", lambda *a, _m=model, _c=counts, **k: _c.append(1) or
                            type(_m).num_parameters(_m, *a, **k))
        trainer = trainer_class(model=model, args=args, train_dataset=_examples(family, count=12))
        trainer.train()
        runs[name] = trainer.state.total_flos, len(counts)
    assert runs["ours"][0] == runs["Trainer"][0] > 0 and runs["ours"][1] == 1 < runs["Trainer"][1]
    inputs = {"input_ids": torch.ones(2, 5, dtype=torch.long)}
    trainer.model = tiny_lm(family, hidden_size=64, intermediate_size=128)
    assert trainer.floating_point_ops(inputs) == 6 * 10 * trainer.model.num_parameters(exclude_embeddings=True)


HEADS = [
    ("ScratchEncoderForSequenceClassification", "single_label_classification"),
    ("ScratchEncoderForSequenceClassification", "regression"),
    ("ScratchEncoderForSequenceClassification", "multi_label_classification"),
    ("ScratchDecoderForSequenceClassification", "single_label_classification"),
    ("ScratchEncoderForTokenClassification", None),
]


def _head_example(index: int, problem_type: str | None) -> dict:
    generator = torch.Generator().manual_seed(index)
    ids = torch.randint(3, VOCAB, (6,), generator=generator)
    labels = {
        "single_label_classification": index % 3,
        "regression": torch.randn((), generator=generator).item(),
        "multi_label_classification": torch.randint(0, 2, (3,), generator=generator).float(),
        None: torch.randint(0, 3, (6,), generator=generator),
    }[problem_type]
    return {"input_ids": ids, "labels": labels}


@pytest.mark.parametrize("head, problem_type", HEADS)
def test_gradient_accumulation_gives_the_update_of_one_batch(head, problem_type, tmp_path):
    """Trainer passes `num_items_in_batch` to a model whose forward takes **kwargs, and then no longer divides the
    loss by the number of micro-batches: each head's loss must divide by that count (the classification heads took
    the mean, so 6 examples in micro-batches of 4 and 2 moved the weights about twice as far as one batch of 6)."""
    examples = [_head_example(i, problem_type) for i in range(6)]
    weights = []
    for batch_size, accumulation in [(6, 1), (4, 2)]:
        torch.manual_seed(0)
        family = "decoder" if "Decoder" in head else "encoder"
        num_labels = 1 if problem_type == "regression" else 3
        model = getattr(hst, head)(tiny_config(family, num_labels=num_labels, problem_type=problem_type))
        args = TrainingArguments(
            output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation, optim="sgd", learning_rate=1.0, lr_scheduler_type="constant",
            max_grad_norm=0, save_strategy="no", report_to=[], disable_tqdm=True, use_cpu=True, seed=0,
        )
        Trainer(model=model, args=args, train_dataset=examples).train()
        weights.append(torch.cat([parameter.detach().flatten() for parameter in model.parameters()]))
    torch.testing.assert_close(weights[1], weights[0])


def test_trainer_trains_the_question_answering_head_as_it_trains_berts(tmp_path):
    """Trainer finds the head's labels by its class name (`start_positions`, `end_positions`: without them it would
    neither train nor evaluate) and accumulates its loss as BERT's: micro-batches of 4 and 2 move ours as they move
    BERT with the same weights, and the evaluation loss is BERT's."""
    generator = torch.Generator().manual_seed(0)
    examples = [{"input_ids": torch.randint(3, VOCAB, (8,), generator=generator),
                 "start_positions": start, "end_positions": start + 2} for start in (0, 1, 4, 5, 7, 2)]
    examples[3]["end_positions"] = 8  # past the window: BERT counts nothing for it
    native, ours = bert_question_answering(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    evaluated = []
    for model in (native, ours):
        args = TrainingArguments(
            output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, gradient_accumulation_steps=2,
            optim="sgd", learning_rate=1.0, lr_scheduler_type="constant", max_grad_norm=0, save_strategy="no",
            report_to=[], disable_tqdm=True, use_cpu=True, seed=0,
        )
        trainer = Trainer(model=model, args=args, train_dataset=examples, eval_dataset=examples)
        trainer.train()
        evaluated.append(trainer.evaluate()["eval_loss"])
    assert evaluated[1] == pytest.approx(evaluated[0], rel=1e-5)
    torch.testing.assert_close(ours.qa_outputs.weight, native.qa_outputs.weight, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(ours.model.embeddings.embed_tokens.weight, native.bert.embeddings.word_embeddings.weight,
                               atol=1e-6, rtol=1e-4)


def test_trainer_label_smoothing_shifts_the_causal_lm_labels(tmp_path):
    """Trainer's `label_smoothing_factor` shifts labels only for class names in transformers'
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES (`Auto*.register` does not add them there): our causal LM was trained to
    predict each position's own token, where GPT-2 learns the next one."""
    model = tiny_lm("decoder")
    args = TrainingArguments(output_dir=str(tmp_path), label_smoothing_factor=0.1, report_to=[], use_cpu=True)
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    labels = ids.masked_fill(torch.arange(9) > 6, -100)
    loss = Trainer(model=model, args=args).compute_loss(model, {"input_ids": ids, "labels": labels})
    logits = model(input_ids=ids).logits
    expected = LabelSmoother(0.1)({"logits": logits}, labels, shift_labels=True)
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_train_accelerates_weight_decay_groups_are_trainers(name):
    """train-accelerate groups AdamW's parameters by shape (`training.weight_decay_groups`), Trainer by name
    (`get_decay_parameter_names`): for every preset both must decay the same tensors, or `train` and
    `train-accelerate` optimise otherwise (docs/training.md, "train and train-accelerate")."""
    config = get_preset(name)
    with torch.device("meta"):  # the full preset's parameters, none allocated
        model = LM_CLASSES[PRESETS[name]["family"]](config)
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    decayed, kept = (group["params"] for group in weight_decay_groups(model, 0.1))
    # The method reads only its model argument: Trainer's own rule, without building a Trainer around a meta model.
    # It names a tied head's weight too, which `named_parameters` (as Trainer's groups) gives once, as the embedding.
    by_trainer = set(Trainer.get_decay_parameter_names(None, model)) & set(names.values())
    assert {names[id(parameter)] for parameter in decayed} == by_trainer
    assert {names[id(parameter)] for parameter in kept}.isdisjoint(by_trainer)
    assert len(decayed) + len(kept) == len(names)
