"""The training helpers: data preparation for each task, the label-smoothed loss, metrics, the loss plot."""

import copy
import functools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from datasets import Dataset, DatasetDict
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import VOCAB, lm_inputs, tiny_config, tiny_lm
from tiny_tokenizers import CORPUS, byte_level_bpe, wordpiece
from tokenizers import Tokenizer
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    default_data_collator,
)
from transformers.loss.loss_utils import ForQuestionAnsweringLoss
from transformers.testing_utils import CaptureLogger
from transformers.tokenization_utils_base import logger as tokenization_logger

from hf_scratch_transformer import (
    ScratchEncoderForSequenceClassification,
    ScratchEncoderForTokenClassification,
    evaluation,
    mixed_precision,
    training,
    training_data,
)
from tokenizer_training import train_tokenizer

# ---------------------------------------------------------------------------------------------- loss


@pytest.mark.parametrize("family", ["decoder", "seq2seq", "encoder"])
def test_unsmoothed_loss_equals_the_models_own(family):
    model = tiny_lm(family)
    inputs = lm_inputs(family)
    if family == "encoder":
        inputs["labels"][:, ::2] = -100
    out = model(**inputs)
    task = {"decoder": "causal-lm", "encoder": "masked-lm", "seq2seq": "seq2seq"}[family]
    loss = training.smoothed_loss_function(task, 0.0)(out, inputs["labels"])
    torch.testing.assert_close(loss, out.loss)


def test_smoothed_loss_is_the_textbook_formula_on_shifted_labels():
    logits = torch.randn(2, 5, VOCAB)
    labels = torch.randint(0, VOCAB, (2, 5))
    labels[0, 2] = -100
    epsilon = 0.1
    loss = training.label_smoothed_loss(logits, labels, epsilon, shift=True)
    log_probs = logits[:, :-1].log_softmax(-1)
    targets = labels[:, 1:]
    keep = targets != -100
    nll = -log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    uniform = -log_probs.mean(-1)
    expected = ((1 - epsilon) * nll + epsilon * uniform)[keep].mean()
    torch.testing.assert_close(loss, expected)


def test_smoothed_loss_divides_by_num_items_in_batch():
    logits, labels = torch.randn(2, 5, VOCAB), torch.randint(0, VOCAB, (2, 5))
    mean = training.label_smoothed_loss(logits, labels, 0.1, shift=False)
    torch.testing.assert_close(training.label_smoothed_loss(logits, labels, 0.1, shift=False, num_items_in_batch=20),
                               mean / 2)


@pytest.mark.parametrize("family", ["decoder", "encoder", "seq2seq"])
def test_evaluation_under_label_smoothing_reports_the_plain_loss(family, tmp_path):
    """Smoothing is a training objective: the evaluation loss (and the perplexity and card taken from it) is the
    model's cross-entropy, as without smoothing and as Seq2SeqTrainer's generating evaluation reports it;
    exp(smoothed loss) overstated the perplexity."""
    from transformers import Trainer, TrainingArguments

    model = tiny_lm(family)
    inputs = lm_inputs(family, batch=4)
    if family == "seq2seq":  # as DataCollatorForSeq2Seq: Trainer gives a loss function's model no labels
        inputs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(inputs["labels"])
    rows = [{key: value[i] for key, value in inputs.items()} for i in range(4)]
    task = {"decoder": "causal-lm", "encoder": "masked-lm", "seq2seq": "seq2seq"}[family]
    trainer = Trainer(model=model, args=TrainingArguments(str(tmp_path), per_device_eval_batch_size=4, report_to=[],
                                                          use_cpu=True),
                      compute_loss_func=training.smoothed_loss_function(task, 0.1), eval_dataset=rows)
    with torch.no_grad():
        plain = model(**inputs).loss.item()
    assert trainer.evaluate()["eval_loss"] == pytest.approx(plain, rel=1e-5)


def token_classifier():
    torch.manual_seed(0)
    return ScratchEncoderForTokenClassification(tiny_config("encoder", num_labels=5)).eval()


def text_classifier():
    torch.manual_seed(0)
    return ScratchEncoderForSequenceClassification(tiny_config("encoder", num_labels=3)).eval()


@pytest.mark.parametrize("family, overrides, smoothing", [
    ("decoder", {}, 0.0), ("encoder", {}, 0.0), ("token-classification", {}, 0.0), ("text-classification", {}, 0.0),
    ("encoder", {"sparse_prediction": True}, 0.0), ("seq2seq", {}, 0.0),
    ("decoder", {}, 0.1), ("encoder", {"sparse_prediction": True}, 0.1), ("seq2seq", {}, 0.1)])
def test_evaluation_loss_is_the_mean_over_every_labelled_token_at_any_batch_size(family, overrides, smoothing,
                                                                                  tmp_path):
    """Sequences carrying 1 to 5 labels: the evaluation loss is the model's loss over all of them at once (each
    token counted alike), whatever the evaluation batch; Trainer's mean of batch means moved with the batch size.
    The seq2seq trainer evaluates by generating, and computes the loss with a forward of its own. Also under label
    smoothing (`train --label-smoothing`), where Trainer gives the model no labels: the loss was Trainer's mean of
    batch means again, a masked LM's 6.38 in two processes where one process said 4.78 for the same weights. A text
    classifier's texts carry one label each (`finetune`'s trainer: Trainer's loss moved with the processes)."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    classifiers = {"token-classification": token_classifier, "text-classification": text_classifier}
    model = classifiers[family]() if family in classifiers else tiny_lm(family, **overrides)
    inputs = lm_inputs("encoder" if family in classifiers else family, batch=5)
    if family == "token-classification":
        inputs["labels"] %= 5
    if family == "text-classification":
        inputs["labels"] = torch.tensor([0, 2, 1, 1, 0])
    else:
        for row, labels in enumerate(inputs["labels"]):
            labels[row + 2:] = -100  # the causal LM's label 0 is never predicted: 1 to 5 labels
    if family == "seq2seq":
        inputs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(inputs["labels"])
    with torch.no_grad():
        every_token = model(**inputs).loss.item()
    rows = [{key: value[i] for key, value in inputs.items()} for i in range(5)]

    class Evaluating(evaluation.TokenWeightedEvaluationLoss, Seq2SeqTrainer):
        pass

    for batch in (1, 2, 5):
        arguments = Seq2SeqTrainingArguments(str(tmp_path), per_device_eval_batch_size=batch, report_to=[],
                                             use_cpu=True, predict_with_generate=family == "seq2seq",
                                             generation_max_length=4)
        task = {"decoder": "causal-lm", "seq2seq": "seq2seq"}.get(family, "masked-lm")
        trainer = Evaluating(model=model, args=arguments, eval_dataset=rows, compute_metrics=lambda _: {},
                             compute_loss_func=training.smoothed_loss_function(task, smoothing) if smoothing else None)
        assert trainer.evaluate()["eval_loss"] == pytest.approx(every_token, rel=1e-5), batch
        assert trainer.predict(rows).metrics["test_loss"] == pytest.approx(every_token, rel=1e-5), batch


def test_masked_lm_evaluation_masks_each_sequence_once_from_the_seed(tmp_path):
    """`predict` on the masked-LM trainer masked its batches from the global RNG: two calls on the same weights gave
    two losses; and each process masked its batches from its own stream, so the loss moved with the number of
    processes. Each sequence is masked once, from the run's seed and its place in the data: `evaluate` and `predict`
    give the model's loss over those masks, whatever the batch size, call after call."""
    from transformers import Trainer, TrainingArguments

    class MaskedLMTrainer(training.MasksOfEachStep, evaluation.TokenWeightedEvaluationLoss, Trainer):
        pass  # as scripts/train.py's

    tokenizer = wordpiece()
    model = tiny_lm("encoder", vocab_size=len(tokenizer)).eval()
    rows = Dataset.from_list([dict(tokenizer(line, return_special_tokens_mask=True))
                              for line in CORPUS.read_text().splitlines()[:16] if line])
    masking = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3)
    masked = training_data.mask_once(rows, masking, seed=7)
    assert masked["labels"][:5] == training_data.mask_once(rows.select(range(5)), masking, seed=7)["labels"]
    assert masked["labels"] != training_data.mask_once(rows, masking, seed=8)["labels"]
    with torch.no_grad():
        every_token = model(**DataCollatorForTokenClassification(tokenizer)(list(masked))).loss.item()
    for batch in (1, 4):
        trainer = MaskedLMTrainer(model=model, eval_dataset=rows, data_collator=masking,
                                  args=TrainingArguments(str(tmp_path), per_device_eval_batch_size=batch, seed=7,
                                                         report_to=[], use_cpu=True))
        assert trainer.evaluate()["eval_loss"] == pytest.approx(every_token, rel=1e-5), batch
        for _ in range(2):
            assert trainer.predict(rows).metrics["test_loss"] == pytest.approx(every_token, rel=1e-5), batch


# ---------------------------------------------------------------------------------------------- data


@pytest.fixture(scope="module")
def bpe():
    return byte_level_bpe(family="decoder")


def test_packing_makes_full_blocks_of_documents_ending_in_eos(bpe):
    texts = Dataset.from_dict({"text": ["To be, or not to be.", "That is the question.", "Whether 'tis nobler"] * 5})
    packed = training_data.pack_for_causal_lm(texts, bpe, block_size=8)
    assert all(len(ids) == 8 for ids in packed["input_ids"])
    assert packed["input_ids"][:-1] == packed["labels"][:-1]  # the last block may be padded (see below)
    stream = [token for ids in packed["input_ids"] for token in ids]
    assert stream.count(bpe.eos_token_id) >= 1 and stream[0] == bpe.bos_token_id
    document = bpe("To be, or not to be.").input_ids + [bpe.eos_token_id]
    assert stream[: len(document)] == document


def packed_stream(packed) -> list[int]:
    """The tokens the blocks train on, in order; checks that padding (labels -100) ends the last block only."""
    for number, (ids, labels) in enumerate(zip(packed["input_ids"], packed["labels"], strict=True)):
        kept = [label for label in labels if label != -100]
        assert ids[: len(kept)] == labels[: len(kept)] == kept, "padding only at the end of a block"
        assert len(kept) == len(ids) or number == len(packed) - 1, "only the last block is short"
    return [label for labels in packed["labels"] for label in labels if label != -100]


@functools.cache
def eos_appending_tokenizer():
    """A tokenizer made elsewhere that ends every text with `</s>` itself (BART's, T5's; it records no family)."""
    appending = byte_level_bpe(family="seq2seq")  # `$A </s>`
    return type(appending)(tokenizer_object=appending.backend_tokenizer, **appending.special_tokens_map)


@pytest.mark.parametrize("appends_eos", [False, True])
@settings(max_examples=25, deadline=None)
@given(documents=st.lists(st.text(max_size=30), min_size=1, max_size=12), block_size=st.integers(2, 12))
def test_packing_keeps_every_token_once_in_order(bpe, appends_eos, documents, block_size):
    """Blocks hold the documents' `<s> ... </s>` streams end to end, each document ended by one `</s>` whether or not
    the tokenizer appends it: no token lost (the last, short block is padded with labels -100, so data shorter than
    a block still gives one), none repeated."""
    tokenizer = eos_appending_tokenizer() if appends_eos else bpe
    packed = training_data.pack_for_causal_lm(Dataset.from_dict({"text": documents}), tokenizer, block_size)
    assert all(len(ids) == block_size for ids in packed["input_ids"])
    eos = [] if appends_eos else [tokenizer.eos_token_id]
    assert packed_stream(packed) == [token for text in documents for token in [*tokenizer(text).input_ids, *eos]]


def test_packing_runs_on_across_batches_of_documents(bpe):
    """More documents than one `map` batch (1000): blocks still continue the stream where the batch ends."""
    documents = [f"line {i}" for i in range(2100)]
    packed = training_data.pack_for_causal_lm(Dataset.from_dict({"text": documents}), bpe, block_size=16)
    assert packed_stream(packed) == [token for text in documents for token in [*bpe(text).input_ids, bpe.eos_token_id]]


def test_packing_documents_longer_than_the_tokenizers_maximum_does_not_warn(bpe):
    """Packing cuts the token stream into blocks, so a document past the tokenizer's model_max_length is no problem:
    the main job printed transformers' "Token indices sequence length is longer than the specified maximum sequence
    length for this model (1006 > 32). Running this sequence through the model will result in indexing errors". The
    tokenizer still says it of a text tokenized elsewhere."""
    tokenizer = type(bpe)(tokenizer_object=bpe.backend_tokenizer, bos_token="<s>", eos_token="</s>",
                          model_max_length=8)
    text = "To be, or not to be, that is the question."
    with CaptureLogger(tokenization_logger) as captured:
        packed = training_data.pack_for_causal_lm(Dataset.from_dict({"text": [text] * 3}), tokenizer, block_size=8)
    assert len(packed) > 3 and "Token indices sequence length" not in captured.out
    with CaptureLogger(tokenization_logger) as captured:
        tokenizer(text)
    assert "Token indices sequence length is longer than the specified maximum" in captured.out


def test_packing_ends_each_document_with_one_eos_also_where_the_tokenizer_appends_it():
    # A tokenizer made elsewhere that ends a text with `</s>` (BART's, T5's; it records no family) got a second one:
    # the model learnt `</s> </s>` between documents.
    foreign = eos_appending_tokenizer()
    documents = ["To be, or not to be.", "That is the question."]
    packed = training_data.pack_for_causal_lm(Dataset.from_dict({"text": documents}), foreign, block_size=64)
    assert packed_stream(packed) == [token for text in documents for token in foreign(text).input_ids]
    assert packed_stream(packed).count(foreign.eos_token_id) == 2


@settings(max_examples=30, deadline=None)
@given(documents=st.lists(st.text(alphabet="abc de\n", min_size=1, max_size=30), min_size=1, max_size=12),
       block_size=st.integers(2, 9), batch=st.integers(1, 5))
def test_the_collator_of_packed_blocks_stacks_them_as_transformers_default_one(bpe, documents, block_size, batch):
    """`stack_blocks` (both entry points' causal-LM collator) gives `default_data_collator`'s batch, padding and
    labels -100 of the last block included: the same keys, int64 tensors and values."""
    blocks = list(training_data.pack_for_causal_lm(Dataset.from_dict({"text": documents}), bpe, block_size))
    rows = blocks[-batch:]
    ours, theirs = training_data.stack_blocks(rows), default_data_collator(rows)
    assert ours.keys() == theirs.keys() == {"input_ids", "labels"}
    for key in ours:
        assert ours[key].dtype == theirs[key].dtype == torch.int64 and torch.equal(ours[key], theirs[key])


def test_packing_needs_an_eos_token(bpe):
    # A tokenizer without one (made elsewhere) put None into the blocks, where the first batch failed to collate.
    without_eos = type(bpe)(tokenizer_object=bpe.backend_tokenizer, bos_token="<s>")
    with pytest.raises(ValueError, match="no eos_token, which causal-lm data needs"):
        training_data.pack_for_causal_lm(Dataset.from_dict({"text": ["To be."]}), without_eos, block_size=8)


def test_mlm_collator_masks_fifteen_percent_with_80_10_10():
    tokenizer = wordpiece()
    texts = Dataset.from_dict({"text": ["To be, or not to be: that is the question of the day"] * 400})
    encoded = training_data.tokenize_for_mlm(texts, tokenizer, max_length=32)
    batch = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)(list(encoded))
    original = torch.tensor(encoded["input_ids"])
    chosen = batch["labels"] != -100
    assert 0.12 < chosen.float().mean() < 0.18
    assert torch.equal(batch["labels"][chosen], original[chosen])
    masked = batch["input_ids"][chosen] == tokenizer.mask_token_id
    kept = batch["input_ids"][chosen] == original[chosen]
    assert 0.75 < masked.float().mean() < 0.85
    assert 0.06 < kept.float().mean() < 0.14
    special = torch.isin(original, torch.tensor([tokenizer.cls_token_id, tokenizer.sep_token_id]))
    assert not chosen[special].any(), "special tokens are never masked"


@settings(max_examples=20, deadline=None)
@given(documents=st.lists(st.text(st.sampled_from("ab cd,\n"), max_size=60), min_size=1, max_size=6),
       max_length=st.integers(3, 12))
def test_mlm_sequences_hold_every_token_of_long_documents(documents, max_length):
    """Each sequence is `[CLS] ... [SEP]` of at most `max_length` tokens, and a longer document continues in the
    next ones: truncated, the tail of every long document never trained."""
    tokenizer = wordpiece()
    encoded = training_data.tokenize_for_mlm(Dataset.from_dict({"text": documents}), tokenizer, max_length)
    inner = []
    for ids, special in zip(encoded["input_ids"], encoded["special_tokens_mask"], strict=True):
        assert len(ids) <= max_length and ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert special == [1] + [0] * (len(ids) - 2) + [1]
        inner += ids[1:-1]
    assert inner == [token for text in documents for token in tokenizer(text, add_special_tokens=False).input_ids]


def test_mlm_sequences_refuse_a_tokenizer_that_loses_the_overflow(monkeypatch):
    """tokenizers 0.23.1-0.23.2 returned truncated texts with little or none of their overflow (a checkout run
    without installing the package escapes the import's check): the run stops with what to install, not training on
    a document's first sequence alone."""
    tokenizer = wordpiece()
    call = type(tokenizer).__call__

    def first_sequences_only(self, texts, **kwargs):  # 0.23.1's answer: no overflow at all
        encoded = call(self, texts, **kwargs)
        if kwargs.get("return_overflowing_tokens"):
            firsts = [encoded["overflow_to_sample_mapping"].index(text) for text in range(len(texts))]
            for name in encoded:
                encoded[name] = [encoded[name][sequence] for sequence in firsts]
        return encoded

    monkeypatch.setattr(type(tokenizer), "__call__", first_sequences_only)
    long, short = (tokenizer(text, add_special_tokens=False).input_ids for text in ("ab cd " * 50, "ab"))
    texts = Dataset.from_dict({"text": ["ab cd " * 50, "ab"]})
    kept = 16 - 2 + len(short)  # the long text's first sequence, between [CLS] and [SEP]
    with pytest.raises(RuntimeError, match=rf"' {len(long) + len(short)} tokens into sequences that hold {kept}: the "
                                           r"overflow .* lost\. "
                                           r"tokenizers \S+ is installed; .* Install tokenizers>=0\.23\.3"):
        training_data.tokenize_for_mlm(texts, tokenizer, max_length=16)


def mask_as_training(tokenizer, features: list[dict], masker) -> dict:
    """Both commands' training batches: padded, then each row masked from the seed, the step and its tokens."""
    seed = int(torch.randint(2**16, ()))
    return training_data.mask_training_rows(masker, DataCollatorWithPadding(tokenizer)(features), seed, step=1)


def mask_as_validation(tokenizer, features: list[dict], masker) -> dict:
    """The validation set of both commands: masked once per sequence (`mask_once`), then padded with labels -100."""
    masked = training_data.mask_once(Dataset.from_list(features), masker, seed=int(torch.randint(2**16, ())))
    return DataCollatorForTokenClassification(tokenizer)(list(masked))


@pytest.mark.parametrize("collate", [mask_as_training, mask_as_validation])
@settings(max_examples=15, deadline=None)
@given(words=st.lists(st.integers(0, 12), min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_mlm_masking_never_touches_special_tokens_or_padding(collate, words, seed):
    tokenizer = wordpiece()
    texts = Dataset.from_dict({"text": [" ".join(["question"] * n) for n in words]})
    features = list(training_data.tokenize_for_mlm(texts, tokenizer, max_length=16))
    torch.manual_seed(seed)
    batch = collate(tokenizer, features, DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.9))
    original = torch.tensor([ids + [tokenizer.pad_token_id] * (batch["input_ids"].shape[1] - len(ids))
                             for ids in (feature["input_ids"] for feature in features)])
    kept = (batch["attention_mask"] == 0) | torch.isin(original, torch.tensor(tokenizer.all_special_ids))
    assert (batch["labels"][kept] == -100).all() and torch.equal(batch["input_ids"][kept], original[kept])
    chosen = batch["labels"] != -100
    assert torch.equal(batch["labels"][chosen], original[chosen])


@settings(max_examples=15, deadline=None)
@given(words=st.lists(st.integers(0, 12), min_size=2, max_size=6), split=st.integers(1, 5),
       padding_side=st.sampled_from(["right", "left"]))
def test_a_rows_training_masks_do_not_depend_on_the_rows_beside_it(words, split, padding_side):
    """Masks were drawn per batch from a seed of the step, the micro-batch and the process: two processes of batch 2
    masked other tokens than one process of batch 4. Each row's are now drawn from the seed, the step and its
    tokens, on its tokens alone: a batch split anywhere, padded to other lengths on either side, masks alike."""
    tokenizer = copy.deepcopy(wordpiece())  # the cached one stays as it is
    tokenizer.padding_side = padding_side
    texts = Dataset.from_dict({"text": [" ".join(["question"] * n) for n in words]})
    features = list(training_data.tokenize_for_mlm(texts, tokenizer, max_length=16))
    split = min(split, len(features) - 1)
    masker = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.5)

    def masked_rows(part: list[dict]) -> list[tuple[list[int], list[int]]]:
        batch = mask_as_training(tokenizer, part, masker)
        real = batch["attention_mask"].bool()
        return [(ids[keep].tolist(), labels[keep].tolist())
                for ids, labels, keep in zip(batch["input_ids"], batch["labels"], real, strict=True)]

    torch.manual_seed(0)  # the same run seed for all three batches
    whole = masked_rows(features)
    torch.manual_seed(0)
    first = masked_rows(features[:split])
    torch.manual_seed(0)
    assert whole == first + masked_rows(features[split:])


@pytest.fixture(scope="module")
def corpus_sequences() -> list[dict]:
    """64 masked-LM sequences of the corpus, padded to one batch: about 1500 tokens that masking may choose."""
    tokenizer = wordpiece()
    texts = Dataset.from_dict({"text": CORPUS.read_text().split("\n\n")[:80]})
    return list(training_data.tokenize_for_mlm(texts, tokenizer, max_length=32).select(range(64)))


def five_sigmas(share: float, draws: torch.Tensor) -> float:
    """How far the share seen in `draws` Bernoulli draws may stray from `share`: five standard deviations, a miss
    once in millions of seeds (fixed bounds of 0.04 and 0.08 failed about one seed in a hundred), plus 1% for a
    random replacement that drew the token it replaced."""
    return 5 * math.sqrt(share * (1 - share) / draws.item()) + 0.01


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), step=st.integers(0, 10**6), probability=st.sampled_from([0.15, 0.3, 0.5]),
       replace=st.sampled_from([(0.8, 0.1), (0.5, 0.4), (1.0, 0.0)]))
def test_training_masks_choose_the_configured_share_and_replace_it_as_configured(corpus_sequences, seed, step,
                                                                                 probability, replace):
    """Drawn row by row from the seed, the step and each row's tokens, the masks still choose `mlm_probability` of
    the real tokens, and of those put [MASK] at `mask_replace_prob`, a random token at `random_replace_prob` and keep
    the rest (80/10/10 by default); drawn again for the same step they are the same, for the next step others."""
    tokenizer = wordpiece()
    masker = DataCollatorForLanguageModeling(tokenizer, mlm_probability=probability, mask_replace_prob=replace[0],
                                             random_replace_prob=replace[1])
    batch = DataCollatorWithPadding(tokenizer)(corpus_sequences)
    masked = training_data.mask_training_rows(masker, dict(batch), seed, step)
    original, chosen = batch["input_ids"], masked["labels"] != -100
    maskable = (batch["attention_mask"] == 1) & (batch["special_tokens_mask"] == 0)
    assert abs(chosen.sum() / maskable.sum() - probability) < five_sigmas(probability, maskable.sum())
    as_mask = (masked["input_ids"][chosen] == tokenizer.mask_token_id).float().mean()
    kept = (masked["input_ids"][chosen] == original[chosen]).float().mean()
    assert abs(as_mask - replace[0]) < five_sigmas(replace[0], chosen.sum())
    assert abs(1 - as_mask - kept - replace[1]) < five_sigmas(replace[1], chosen.sum())
    again = training_data.mask_training_rows(masker, dict(batch), seed, step)
    assert all(torch.equal(masked[name], again[name]) for name in ("input_ids", "labels"))
    assert not torch.equal(training_data.mask_training_rows(masker, dict(batch), seed, step + 1)["labels"],
                           masked["labels"])


def repeated_sequences(tokenizer) -> list[dict]:
    """Eight copies of one masked-LM sequence: what masks they get depends on the draw alone."""
    texts = Dataset.from_dict({"text": ["To be, or not to be: that is the question of the day"] * 8})
    return list(training_data.tokenize_for_mlm(texts, tokenizer, max_length=32))


def test_a_sequence_seen_at_a_later_step_is_masked_anew():
    """Dynamic masking, as RoBERTa's: a sequence trained on again (the next epoch) gets new masks, drawn from the
    step; drawn from the seed and its tokens alone, every epoch masked the same tokens of it."""
    tokenizer = wordpiece()
    masker = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3)
    batch = DataCollatorWithPadding(tokenizer)(repeated_sequences(tokenizer))

    def labels(step: int) -> torch.Tensor:
        return training_data.mask_training_rows(masker, dict(batch), seed=7, step=step)["labels"]

    assert torch.equal(labels(1), labels(1)), "a step's masks are its own, drawn alike again on resume"
    assert not torch.equal(labels(1), labels(2))


def test_each_validation_sequence_draws_masks_of_its_own():
    """Validation masks come from the seed and each sequence's place in the data: one seed for all masked every
    sequence at the same positions, so the validation loss scored a handful of positions only."""
    tokenizer = wordpiece()
    masker = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3)
    masked = training_data.mask_once(Dataset.from_list(repeated_sequences(tokenizer)), masker, seed=7)
    assert len({tuple(labels) for labels in masked["labels"]}) > 1


def test_trainer_masks_a_batch_split_into_micro_batches_as_the_whole_batch(tmp_path):
    """One Trainer step of 4 rows and one of 2 micro-batches of 2 rows: the same masks, so the same loss and the same
    weights after it (as 2 processes of 2 rows, tests/test_accelerate.py). Seeded per micro-batch, they differed."""
    from transformers import Trainer, TrainingArguments

    class MaskedLMTrainer(training.MasksOfEachStep, Trainer):
        pass

    tokenizer = wordpiece()
    rows = training_data.tokenize_for_mlm(Dataset.from_dict({"text": CORPUS.read_text().split("\n\n")[:4]}),
                                          tokenizer, 24).select(range(4))
    trained = []
    for batch, accumulation in ((4, 1), (2, 2)):
        torch.manual_seed(0)
        model = tiny_lm("encoder", vocab_size=len(tokenizer), dropout=0.0, attention_dropout=0.0,
                        embedding_dropout=0.0)
        arguments = TrainingArguments(str(tmp_path / str(batch)), per_device_train_batch_size=batch, max_steps=1,
                                      gradient_accumulation_steps=accumulation, logging_steps=1, report_to=[],
                                      use_cpu=True, save_strategy="no", seed=3)
        trainer = MaskedLMTrainer(model=model, args=arguments, train_dataset=rows,
                                  data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3))
        trainer.train()
        trained.append((trainer.state.log_history[0]["loss"], model.state_dict()))
    (loss, weights), (split_loss, split_weights) = trained
    assert split_loss == pytest.approx(loss, rel=1e-5)
    for name, tensor in weights.items():
        torch.testing.assert_close(split_weights[name], tensor, rtol=0, atol=1e-6)


def test_seq2seq_tokenization_gives_sources_and_labels_ending_in_eos():
    tokenizer = byte_level_bpe(family="seq2seq")
    pairs = Dataset.from_dict({"source": ["a man rides a horse"], "target": ["ein Mann reitet ein Pferd"]})
    encoded = training_data.tokenize_for_seq2seq(pairs, tokenizer, max_length=32)[0]
    assert encoded["input_ids"][-1] == encoded["labels"][-1] == tokenizer.eos_token_id
    assert tokenizer.decode(encoded["labels"], skip_special_tokens=True) == "ein Mann reitet ein Pferd"


def test_seq2seq_sides_cut_at_max_length_are_counted():
    """Pairs longer than --max-length were cut without a word (as run_translation.py cuts them): the sides cut are
    counted for a note, a side of exactly `max_length` tokens (`</s>` included) not among them."""
    tokenizer = byte_level_bpe(family="seq2seq")
    fits, longer = "a b c d e f", "a b c d e f g"  # 8 tokens with `</s>`, and 10
    assert [len(ids) for ids in tokenizer([fits, longer]).input_ids] == [8, 10]
    pairs = Dataset.from_dict({"source": [longer, "a b", fits], "target": ["a b", longer, fits]})
    reported = []
    encoded = training_data.tokenize_for_seq2seq(pairs, tokenizer, max_length=8, report=reported.append)
    assert reported == ["--max-length 8 cuts 1 of the 3 sources and 1 of the 3 targets"]
    assert encoded.column_names == ["input_ids", "attention_mask", "labels"]
    assert encoded["input_ids"] == tokenizer(list(pairs["source"]), truncation=True, max_length=8).input_ids
    training_data.tokenize_for_seq2seq(pairs, tokenizer, max_length=10, report=reported.append)
    assert len(reported) == 1  # nothing cut, nothing said


@settings(max_examples=15, deadline=None)
@given(pairs=st.lists(st.tuples(st.text(max_size=20), st.text(max_size=20)), min_size=1, max_size=5),
       max_length=st.integers(2, 10))
def test_seq2seq_batches_pad_labels_with_minus_100_and_shift_them_into_decoder_inputs(pairs, max_length):
    tokenizer = byte_level_bpe(family="seq2seq")
    model = tiny_lm("seq2seq", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    data = Dataset.from_dict({"source": [source for source, _ in pairs], "target": [target for _, target in pairs]})
    reported = []
    features = list(training_data.tokenize_for_seq2seq(data, tokenizer, max_length, report=reported.append))
    # The note counts the sides longer than `max_length` tokens, as tokenizing them whole tells
    cut = [sum(len(ids) > max_length for ids in tokenizer(**{side: list(data[column])}).input_ids)
           for side, column in (("text", "source"), ("text_target", "target"))]
    assert reported == ([f"--max-length {max_length} cuts {cut[0]} of the {len(pairs)} sources and {cut[1]} of the "
                         f"{len(pairs)} targets"] if any(cut) else [])
    batch = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)(features)
    sources, targets = batch["input_ids"].shape[1], batch["labels"].shape[1]
    for row, feature in enumerate(features):
        labels, inputs = feature["labels"], feature["input_ids"]
        assert len(labels) <= max_length and labels[-1] == tokenizer.eos_token_id  # truncated, `</s>` kept
        assert batch["labels"][row].tolist() == labels + [-100] * (targets - len(labels))
        assert batch["attention_mask"][row].tolist() == [1] * len(inputs) + [0] * (sources - len(inputs))
    # Decoder inputs: `decoder_start_token_id`, then the labels shifted right, padding where they are -100.
    shifted = batch["labels"][:, :-1].masked_fill(batch["labels"][:, :-1] == -100, tokenizer.pad_token_id)
    assert (batch["decoder_input_ids"][:, 0] == model.config.decoder_start_token_id).all()
    assert torch.equal(batch["decoder_input_ids"][:, 1:], shifted)


@pytest.mark.parametrize("task", ["masked-lm", "seq2seq"])
def test_tokenizing_with_truncation_leaves_no_truncation_in_the_saved_tokenizer(task, tmp_path):
    # The tokenizer.json of every seq2seq model trained here cut texts to --max-length for `tokenizers` users.
    if task == "seq2seq":
        tokenizer = train_tokenizer("bpe", "seq2seq", files=[CORPUS], vocab_size=300)
        training_data.tokenize_for_seq2seq(Dataset.from_dict({"source": ["a b c"], "target": ["d e"]}), tokenizer, 8)
    else:
        tokenizer = train_tokenizer("wordpiece", "encoder", files=[CORPUS], vocab_size=300)
        training_data.tokenize_for_mlm(Dataset.from_dict({"text": ["a b c"]}), tokenizer, 8)
    tokenizer.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer.json").read_text())["truncation"] is None
    assert len(Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode("to be or not " * 10).ids) > 8


@pytest.mark.parametrize("family,config", [("decoder", {}), ("seq2seq", {}), ("encoder", {"type_vocab_size": 0}),
                                           ("encoder", {"type_vocab_size": 2})])
def test_a_wordpiece_tokenizer_gives_segment_ids_only_to_a_model_with_token_types(family, config):
    """A pair's second text gets segment ids 1, which a model without a token-type table refuses: the decoder and
    seq2seq families (no such knob) kept them, so a pair given to their tokenizer failed in the model."""
    tokenizer = copy.deepcopy(wordpiece())
    model = tiny_lm(family, vocab_size=len(tokenizer), **config)
    training_data.keep_the_inputs_the_model_reads(tokenizer, model.config)
    pair = tokenizer("a dog", "a horse", return_tensors="pt")
    assert ("token_type_ids" in pair) == bool(config.get("type_vocab_size"))
    model(**pair, **({"decoder_input_ids": pair["input_ids"]} if family == "seq2seq" else {}))  # read as given


def test_text_files_are_read_by_paragraph_and_split(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"Speaker {i}:\nline one\nline two" for i in range(40)))
    data = training_data.load_texts([str(corpus)], validation_split=0.1)
    assert len(data["train"]) == 36 and len(data["validation"]) == 4
    assert "\nline one\n" in data["train"][0]["text"]


def test_paragraphs_are_split_at_any_blank_line_and_hold_no_blank_lines(tmp_path):
    # `datasets` splits at "\n\n" only: a line of spaces joined two paragraphs, a third line break began the next
    # document with "\n", and a run of blank lines became a document of its own (`<s> \n </s>`, or an MLM
    # sequence with nothing to mask); the file's last paragraph kept its line break.
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one\n\n\n\ntwo a\n  two b\n \t\nthree\n\n \n\n\n")
    data = training_data.load_texts([str(corpus)], validation_files=[str(corpus)])
    assert list(data["train"]["text"]) == list(data["validation"]["text"]) == ["one", "two a\n  two b", "three"]


def test_a_data_file_of_a_datasets_format_is_not_read_as_text_files(tmp_path):
    # `--train-files data.csv` trained on the CSV lines, header and commas included, as paragraphs of text.
    (tmp_path / "data.csv").write_text("text,label\n" + "".join(f"line {i},1\n\n" for i in range(20)))
    with pytest.raises(ValueError, match=r"data.csv is a CSV file, not plain text: .*as a dataset"):
        training_data.load_texts([str(tmp_path / "data.csv")])


@settings(max_examples=50, deadline=None)
@given(paragraphs=st.lists(st.lists(st.text(st.characters(exclude_characters="\n"), min_size=1).filter(
           lambda line: not line.isspace()), min_size=1, max_size=3), min_size=1, max_size=6),
       blanks=st.lists(st.lists(st.text(" \t", max_size=3), min_size=1, max_size=3), min_size=7, max_size=7))
def test_paragraphs_are_the_runs_of_non_blank_lines(paragraphs, blanks):
    """Any paragraphs, separated by any blank lines (empty or spaces and tabs), come back as they were written."""
    separators = ["\n" + "".join(blank + "\n" for blank in run) for run in blanks]
    leading = "".join(blank + "\n" for blank in blanks[-1])  # blank lines before the first paragraph too
    text = leading + "".join("\n".join(lines) + separators[i] for i, lines in enumerate(paragraphs))
    assert training_data._paragraphs({"text": [text]})["text"] == ["\n".join(lines) for lines in paragraphs]


@settings(max_examples=25, deadline=None)
@given(count=st.integers(2, 60), share=st.floats(0.01, 0.5), seed=st.integers(0, 2**16))
def test_the_validation_split_takes_its_share_of_the_pairs_and_leaves_the_rest_to_training(count, share, seed):
    """Split off the training data, the validation set is `ceil(share * count)` of its examples (at least one), each
    pair whole; training keeps all the others, none in both, none lost; the same seed splits alike again."""
    pairs = Dataset.from_dict({"source": [f"source {i}" for i in range(count)],
                               "target": [f"target {i}" for i in range(count)]})
    data = training_data._with_validation(DatasetDict(train=pairs), share, seed, "pairs", "line")
    rows = {split: [(row["source"], row["target"]) for row in data[split]] for split in ("train", "validation")}
    assert len(rows["validation"]) == math.ceil(share * count) and rows["train"]
    assert sorted(rows["train"] + rows["validation"]) == sorted(zip(pairs["source"], pairs["target"], strict=True))
    again = training_data._with_validation(DatasetDict(train=pairs), share, seed, "pairs", "line")
    assert list(again["validation"]["source"]) == [source for source, _ in rows["validation"]]


def test_a_byte_order_mark_is_not_read_as_text(tmp_path):
    # Windows editors save UTF-8 with a BOM: U+FEFF began the first document / sentence, where the model learnt it.
    for name, text in [("doc.txt", "one\n\ntwo\n"), ("a.en", "one\ntwo\n"), ("a.de", "eins\nzwei\n")]:
        (tmp_path / name).write_text(text, encoding="utf-8-sig")
    doc, en, de = ([str(tmp_path / name)] for name in ("doc.txt", "a.en", "a.de"))
    assert sorted(training_data.load_texts(doc, validation_files=doc)["validation"]["text"]) == ["one", "two"]
    pairs = training_data.load_parallel(en, de, en, de)["validation"]
    assert list(zip(pairs["source"], pairs["target"], strict=True)) == [("one", "eins"), ("two", "zwei")]
    # as are the text files of a --dataset folder (`datasets`' text builder reads them as UTF-8, BOM and all)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder/train.txt").write_text("one\ntwo\n", encoding="utf-8-sig")
    (tmp_path / "folder/validation.txt").write_text("three\n", encoding="utf-8-sig")
    data = training_data.load_texts(dataset=str(tmp_path / "folder"))
    assert sorted(data["train"]["text"]) == ["one", "two"] and list(data["validation"]["text"]) == ["three"]


def test_a_datasets_text_columns_must_hold_text_and_rows_missing_one_are_left_out(tmp_path):
    # An empty CSV cell is None: tokenizing it failed with a bare TypeError, after the tokenizer's training.
    rows = ["hello world,1,hallo Welt", ",0,leer", "no target,1,"] + [f"line {i},1,Zeile {i}" for i in range(10)]
    (tmp_path / "data.csv").write_text("\n".join(["text,label,de", *rows]) + "\n")
    texts = training_data.load_texts(dataset=str(tmp_path))
    kept = [*texts["train"]["text"], *texts["validation"]["text"]]
    assert sorted(kept) == sorted(["hello world", "no target", *(f"line {i}" for i in range(10))])
    pairs = training_data.load_parallel(dataset=str(tmp_path), source_column="text", target_column="de")
    assert pairs["train"].num_rows + pairs["validation"].num_rows == 11
    with pytest.raises(ValueError, match=r"column 'label' holds Value\('int64'\), not text"):
        training_data.load_texts(dataset=str(tmp_path), text_column="label")


def test_a_datasets_blank_texts_are_no_examples(tmp_path):
    # A folder of text files is read line by line: each blank line was a document, `<s> </s>` (or an MLM sequence with
    # nothing to mask), as an empty JSON string was; an empty CSV cell (None) was already left out.
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts/a.txt").write_text("one\n\ntwo\n   \nthree\n")
    texts = training_data.load_texts(dataset=str(tmp_path / "texts"))
    assert sorted([*texts["train"]["text"], *texts["validation"]["text"]]) == ["one", "three", "two"]
    rows = [{"text": "eins", "de": "one"}, {"text": "", "de": "none"}, {"text": "zwei", "de": " "},
            {"text": "drei", "de": "three"}]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    pairs = training_data.load_parallel(dataset=str(tmp_path / "pairs.jsonl"), source_column="text", target_column="de")
    assert sorted([*pairs["train"]["source"], *pairs["validation"]["source"]]) == ["drei", "eins"]


def test_one_column_for_both_sides_of_the_pairs_is_named(tmp_path):
    # --source-column text --target-column text renamed the column once: no "source", a KeyError when tokenizing.
    (tmp_path / "data.csv").write_text("text\n" + "".join(f"line {i}\n" for i in range(4)))
    with pytest.raises(ValueError, match="'text' is both the source and the target column: name"):
        training_data.load_parallel(dataset=str(tmp_path / "data.csv"), source_column="text", target_column="text")


def test_a_dataset_without_a_train_split_is_named(tmp_path):
    # A folder holding test.csv only: the loaders failed with a bare KeyError: 'train'.
    (tmp_path / "test.csv").write_text("text,de\n" + "".join(f"line {i},Zeile {i}\n" for i in range(4)))
    with pytest.raises(ValueError, match=r"has no 'train' split \(it has test\)"):
        training_data.load_texts(dataset=str(tmp_path))
    with pytest.raises(ValueError, match=r"has no 'train' split \(it has test\)"):
        training_data.load_parallel(dataset=str(tmp_path), source_column="text", target_column="de")


def test_a_dataset_can_be_a_single_local_file(tmp_path):
    # As docs/training.md says; `load_dataset` looked for the file's name on the Hub.
    (tmp_path / "data.csv").write_text("text\n" + "".join(f"line {i}\n" for i in range(20)))
    assert training_data.load_texts(dataset=str(tmp_path / "data.csv"))["train"].num_rows == 19
    (tmp_path / "data.xml").write_text("<rows/>")
    with pytest.raises(ValueError, match=r"data.xml: unknown file type '.xml'; use one of .txt, .csv"):
        training_data.load_texts(dataset=str(tmp_path / "data.xml"))


def test_a_dataset_name_the_hub_cannot_answer_is_an_error_naming_it():
    # Offline (as the tests run), a name that is no local path (a Hub id, or a mistyped local folder) stopped with
    # `datasets`' ConnectionError traceback.
    with pytest.raises(ValueError, match=r"someuser/nothere: no such local file or folder, and the Hub cannot be"):
        training_data.load_texts(dataset="someuser/nothere")


def test_parallel_files_must_align(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "a.de").write_text("eins\n")
    with pytest.raises(ValueError, match="differ in length"):
        training_data.load_parallel([str(tmp_path / "a.en")], [str(tmp_path / "a.de")])


def test_parallel_files_must_align_file_by_file(tmp_path):
    """A line lost in one file and one too many in another: the totals agree, and every pair from the lost line on
    was misaligned (two <-> drei, three <-> vier, ...)."""
    for name, text in (("a.en", "one\ntwo\nthree\n"), ("a.de", "eins\ndrei\n"), ("b.en", "four\nfive\n"),
                       ("b.de", "vier\nfuenf\nsechs\n")):
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=r"a.en has 3 lines, .*a.de 2"):
        training_data.load_parallel([str(tmp_path / "a.en"), str(tmp_path / "b.en")],
                               [str(tmp_path / "a.de"), str(tmp_path / "b.de")])


def test_blank_lines_ending_a_parallel_file_are_no_sentences(tmp_path):
    # An editor's extra line break at the end of one file: "differ in length: 2 source vs 3 target lines".
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "a.de").write_text("eins\nzwei\n\n \n")
    files = [str(tmp_path / "a.en")], [str(tmp_path / "a.de")]
    pairs = training_data.load_parallel(*files, *files)["validation"]
    assert list(zip(pairs["source"], pairs["target"], strict=True)) == [("one", "eins"), ("two", "zwei")]


def test_a_pair_with_a_blank_side_is_no_example_from_files_as_from_a_dataset(tmp_path):
    """A blank line inside parallel files made the pair ("", "drei") an example, where the --dataset route left such
    pairs out; the alignment of the other pairs holds."""
    (tmp_path / "a.en").write_text("one\ntwo\n\nfour\n")
    (tmp_path / "a.de").write_text("eins\n \ndrei\nvier\n")
    files = [str(tmp_path / "a.en")], [str(tmp_path / "a.de")]
    pairs = training_data.load_parallel(*files, *files)["validation"]
    assert list(zip(pairs["source"], pairs["target"], strict=True)) == [("one", "eins"), ("four", "vier")]


def test_parallel_files_split_at_line_breaks_only(tmp_path):
    # `str.splitlines` also split at \u2028 and \x0c: 5 "lines" on each side, so nothing was refused, and every pair
    # after "two" was silently out of alignment ("half" -> "drei"). Universal newlines split at a lone \r (a stray
    # carriage return inside a sentence): one more line on that side, and pairs out of alignment up to a line missing.
    (tmp_path / "a.en").write_text("one\ntwo\u2028half\nthree\r\nfour\n", encoding="utf-8")
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\r\nvier\x0cfünf\rsechs\n", encoding="utf-8")
    files = [str(tmp_path / "a.en")], [str(tmp_path / "a.de")]
    pairs = training_data.load_parallel(*files, *files)["validation"]
    assert list(zip(pairs["source"], pairs["target"], strict=True)) == [
        ("one", "eins"), ("two\u2028half", "zwei"), ("three", "drei"), ("four", "vier\x0cfünf\rsechs")]


def test_files_or_dataset_not_both():
    with pytest.raises(ValueError, match="either"):
        training_data.load_texts(["x.txt"], dataset="name")


# ---------------------------------------------------------------------------------------------- metrics


def test_mlm_accuracy_counts_masked_positions_only():
    prediction = SimpleNamespace(predictions=np.array([[1, 2, 3]]), label_ids=np.array([[1, -100, 4]]))
    assert evaluation.mlm_accuracy(prediction) == {"mlm_accuracy": 0.5, "masked_tokens": 2}
    nothing_masked = SimpleNamespace(predictions=np.array([[1, 2]]), label_ids=np.array([[-100, -100]]))
    assert evaluation.mlm_accuracy(nothing_masked) == {"masked_tokens": 0}  # no share of no token


def test_sparse_mlm_predictions_are_put_back_in_place_of_their_labels():
    """`sparse_prediction` logits (one row per labelled position) become predictions shaped like the labels, which
    Trainer can trim by examples (a last, short batch) without misaligning them."""
    labels = torch.tensor([[5, -100, 7], [-100, -100, 2]])
    logits = torch.nn.functional.one_hot(torch.tensor([5, 1, 2]), 9).float()  # argmax 5, 1, 2
    placed = evaluation.argmax_logits(logits, labels)
    assert placed.tolist() == [[5, -100, 1], [-100, -100, 2]]
    trimmed = SimpleNamespace(predictions=placed[:1].numpy(), label_ids=labels[:1].numpy())
    assert evaluation.mlm_accuracy(trimmed) == {"mlm_accuracy": 0.5, "masked_tokens": 2}
    dense = torch.nn.functional.one_hot(torch.tensor([[5, 0, 1], [3, 3, 2]]), 9).float()
    assert evaluation.argmax_logits(dense, labels).tolist() == [[5, 0, 1], [3, 3, 2]]


@given(st.data())
def test_summed_span_losses_over_their_count_are_the_question_answering_loss(data):
    """The evaluation's sum over windows, divided by its count, is the model's loss (transformers' question-answering
    loss, which clamps positions to [0, length]: one before the window is its first token); a position at or past the
    window's end counts nothing, as there."""
    batch, length = data.draw(st.integers(1, 5)), data.draw(st.integers(2, 9))
    positions = st.lists(st.integers(-2, length - 1), min_size=batch, max_size=batch)
    starts, ends = torch.tensor(data.draw(positions)), torch.tensor(data.draw(positions))
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    start_logits, end_logits = torch.randn(2, batch, length, generator=generator)
    summed, count = evaluation.summed_span_losses(start_logits, end_logits, starts, ends).sum(0).tolist()
    assert count == 2 * batch
    assert summed / count == pytest.approx(ForQuestionAnsweringLoss(start_logits, end_logits, starts, ends).item(),
                                           rel=1e-5)
    past = evaluation.summed_span_losses(start_logits, end_logits, starts, torch.full_like(ends, length + 1))
    assert past[:, 1].tolist() == [1.0] * batch  # the start alone
    assert past[:, 0].tolist() == pytest.approx(torch.nn.functional.cross_entropy(
        start_logits, starts.clamp(min=0), reduction="none").tolist(), rel=1e-5)


def test_classification_metrics():
    prediction = SimpleNamespace(predictions=np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]),
                                 label_ids=np.array([0, 1, 1]))
    metrics = evaluation.classification_metrics(prediction)
    assert metrics["accuracy"] == pytest.approx(2 / 3)
    assert metrics["f1"] == pytest.approx((2 / 3 + 2 / 3) / 2)


def test_macro_f1_counts_classes_that_are_only_predicted():
    """As scikit-learn's macro-F1 (which `evaluate`'s f1 is): every class in the labels or the predictions counts.
    Here class 2 is predicted once, wrongly, so its F1 is 0: (1 + 2/3 + 0) / 3; counting only the labels' classes
    gave (1 + 2/3) / 2, a better score for a worse model."""
    tokens = SimpleNamespace(predictions=np.array([[0, 0, 1, 2, 0]]), label_ids=np.array([[0, 0, 1, 1, -100]]))
    metrics = evaluation.classification_metrics(tokens)
    assert metrics["accuracy"] == pytest.approx(3 / 4)
    assert metrics["f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)


def test_entity_tags_are_told_from_other_token_labels():
    assert evaluation.names_entities(["O", "B-PER", "I-PER", "B-LOC", "I-LOC"])  # IOB2
    assert evaluation.names_entities(["O", "S-PER", "B-PER", "I-PER", "E-PER"])  # IOBES
    assert not evaluation.names_entities(["O", "ANIMAL"])  # no scheme: word classes
    assert not evaluation.names_entities(["O"]) and not evaluation.names_entities(["O", "B-"])


TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def test_token_metrics_score_entities_as_conlleval_over_the_labelled_words():
    """Two texts; -100 marks the word pieces after a word's first (not scored). Entities, (type, first, last word):
    true PER(0, 1), LOC(3, 3) and LOC(0, 0); predicted PER(0, 0) (a word short: wrong), LOC(3, 3) and LOC(0, 0),
    the last starting with I- after nothing, which conlleval (seqeval's default mode) reads as a new entity. So 2 of
    3 predicted entities right (precision 2/3) and 2 of 3 true ones found (recall 2/3), where 4 of the 6 words have
    the right tag (that I- counts as a wrong word)."""
    label_ids = np.array([[1, 2, -100, 0, 3], [3, 0, -100, -100, -100]])
    predicted = np.array([[1, 0, 4, 0, 3], [4, 0, 0, 0, 0]])
    metrics = evaluation.token_classification_metrics(TAGS)(SimpleNamespace(predictions=predicted, label_ids=label_ids))
    assert metrics["accuracy"] == pytest.approx(4 / 6)
    assert metrics["entity_precision"] == pytest.approx(2 / 3)
    assert metrics["entity_recall"] == pytest.approx(2 / 3)
    assert metrics["entity_f1"] == pytest.approx(2 / 3)
    logits = np.eye(len(TAGS))[predicted]  # (texts, tokens, labels) as the model returns them
    assert evaluation.token_classification_metrics(TAGS)(SimpleNamespace(predictions=logits, label_ids=label_ids)) \
        == metrics
    words = evaluation.token_classification_metrics(["O", "ANIMAL"])(SimpleNamespace(
        predictions=np.array([[0, 1]]), label_ids=np.array([[0, 1]])))
    assert set(words) == {"accuracy", "f1"}  # word classes: no entities to score


def test_translation_metrics_score_the_translations_against_the_references_as_written():
    """sacrebleu's corpus BLEU and chrF of the translations decoded (special tokens and padding left out) against the
    evaluation set's targets as written. The labels cut at --max-length were the references: a translation of the
    whole sentence then scored 5.5 BLEU against "a ma" and "two", where it is the reference (100)."""
    import sacrebleu

    tokenizer = byte_level_bpe(family="seq2seq")
    references = ["a man rides a horse in the street", "two dogs play"]
    labels = np.array(tokenizer(references, padding=True, truncation=True, max_length=4).input_ids)
    labels = np.where(labels == tokenizer.pad_token_id, -100, labels)
    metrics = evaluation.translation_metrics(tokenizer, references)
    whole = np.array(tokenizer(references, padding=True).input_ids)
    whole[1, -1] = -100  # Trainer pads the generations of several batches with -100
    perfect = metrics(SimpleNamespace(predictions=whole, label_ids=labels))
    assert perfect["bleu"] == pytest.approx(100.0) and perfect["chrf"] == pytest.approx(100.0)
    hypotheses = ["a man rides the horse", "water"]
    scores = metrics(SimpleNamespace(predictions=np.array(tokenizer(hypotheses, padding=True).input_ids),
                                     label_ids=labels))
    assert scores == {"bleu": pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score),
                      "chrf": pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)}
    assert 0 < scores["bleu"] < 30
    with pytest.raises(ValueError, match="1 translations for 2 references"):
        metrics(SimpleNamespace(predictions=whole[:1], label_ids=labels[:1]))


def test_seq2seq_training_scores_bleu_against_the_validation_targets_as_written(monkeypatch, tmp_path):
    """`train --task seq2seq` gives sacrebleu the validation target file's lines as the references, whole, as
    sacrebleu scores a system against a reference file: they were the labels decoded, cut at --max-length here."""
    import sacrebleu
    from tiny_tokenizers import write_run_corpus

    from hf_scratch_transformer.cli import main

    write_run_corpus(tmp_path, families=("seq2seq",))
    sources = (tmp_path / "train.src").read_text().splitlines()[:3]
    targets = [f"{line} and then {line}" for line in (tmp_path / "train.tgt").read_text().splitlines()[:3]]
    (tmp_path / "valid.src").write_text("\n".join(sources))
    (tmp_path / "valid.tgt").write_text("\n".join(targets))
    scored, corpus_bleu = [], sacrebleu.corpus_bleu
    monkeypatch.setattr(sacrebleu, "corpus_bleu", lambda hypotheses, references: scored.append(references) or
                        corpus_bleu(hypotheses, references))
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    main(["train", "--task", "seq2seq", "--source-files", str(tmp_path / "train.src"), "--target-files",
          str(tmp_path / "train.tgt"), "--validation-source", str(tmp_path / "valid.src"), "--validation-target",
          str(tmp_path / "valid.tgt"), "--tokenizer", str(tmp_path / "seq2seq"), "--max-steps", "1", "--max-length",
          "8", "--batch-size", "4", "--num-beams", "1", "--output-dir", str(tmp_path / "out"), "--set",
          "encoder_layers=1", "decoder_layers=1", "hidden_size=32", "num_attention_heads=2", "intermediate_size=64"])
    assert scored and all(references == [targets] for references in scored)


def test_loss_curve_is_a_png(tmp_path):
    history = [{"step": s, "loss": 5 - s / 10} for s in range(1, 20)] + [{"step": 10, "eval_loss": 4.2}]
    path = training.plot_loss_curve(history, tmp_path / "loss_curve.png", title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------- precision


@pytest.fixture
def matmul_rates(monkeypatch):
    """`matmul_rates(bf16, fp32)` makes the measured GFLOP/s those; returns the dtypes measured."""
    measured = []

    def set_rates(bf16: float, fp32: float) -> list:
        def rate(dtype, *args, **kwargs):
            measured.append(dtype)
            return {torch.bfloat16: bf16, torch.float32: fp32}[dtype]

        monkeypatch.setattr(mixed_precision, "matmul_gflops", rate)
        return measured

    return set_rates


def test_bf16_on_a_cpu_without_native_bf16_is_refused_with_the_measured_rates(matmul_rates):
    matmul_rates(bf16=1.3, fp32=177.0)  # the AVX2 EPYC of issue 13
    refusal = mixed_precision.slow_bf16_refusal("bf16", "cpu", force=False, option="--bf16")
    assert "1.3 GFLOP/s" in refusal and "177.0" in refusal and "136.2x" in refusal
    assert "Train in fp32 (without --bf16)" in refusal and "--force-bf16" in refusal


@pytest.mark.parametrize("bf16", [179.0, 117.0])  # the Xeon's one-core check read 0.38-0.64 of fp32's rate
def test_bf16_slower_than_fp32_but_native_trains_with_a_warning_naming_the_rates(matmul_rates, bf16):
    """AVX-512 BF16 without AMX (an Intel Xeon: bf16 products at 0.38-0.64x fp32's rate, our models trained 0.85-0.96x
    as fast in bf16): not refused (bf16 still takes less memory), but not silent either."""
    matmul_rates(bf16=bf16, fp32=309.0)
    with pytest.warns(UserWarning, match=rf"slower than fp32 .*{bf16} GFLOP/s.*309.0 \(.*x faster\).*without --bf16"):
        assert mixed_precision.slow_bf16_refusal("bf16", "cpu", force=False, option="--bf16") is None


def test_emulated_bf16_on_avx512_without_bf16_is_refused(matmul_rates):
    matmul_rates(bf16=31.0, fp32=174.0)  # an AMX Xeon with oneDNN limited to AVX512_CORE: no bf16 instructions
    assert "Train in fp32" in mixed_precision.slow_bf16_refusal("bf16", "cpu", force=False, option="--bf16")


def test_bf16_as_fast_as_fp32_passes_without_a_warning(matmul_rates, recwarn):
    matmul_rates(bf16=300.0, fp32=300.0)
    assert mixed_precision.slow_bf16_refusal("bf16", "cpu", force=False, option="--bf16") is None
    assert not [warning for warning in recwarn if "bf16" in str(warning.message)]


def test_forced_bf16_on_a_slow_cpu_warns_and_goes_on(matmul_rates):
    matmul_rates(bf16=70.0, fp32=370.0)
    with pytest.warns(UserWarning, match="70.0 GFLOP/s.*training in bf16 anyway"):
        assert mixed_precision.slow_bf16_refusal("bf16", "cpu", force=True, option="--mixed-precision bf16") is None


@pytest.mark.parametrize("precision, device", [("bf16", "cpu"), ("no", "cpu"), ("bf16", "cuda")])
def test_fast_bf16_fp32_and_gpus_pass(matmul_rates, precision, device):
    measured = matmul_rates(bf16=900.0, fp32=450.0)
    assert mixed_precision.slow_bf16_refusal(precision, device, force=False, option="--bf16") is None
    assert len(measured) == (2 if (precision, device) == ("bf16", "cpu") else 0)  # measured only on CPU bf16


def test_matmul_gflops_measures_a_positive_rate():
    assert mixed_precision.matmul_gflops(torch.float32, size=32) > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_folder_is_loaded_for_training_in_float32(dtype, tmp_path):
    """transformers 5 loads a folder in the dtype it was saved in (`dtype="auto"`): `train --model`, train-accelerate
    and finetune trained a bf16 folder (`hf-scratch convert` of a bf16 Llama writes one) in bf16, where AdamW at a
    learning rate of 1e-5 left most weights as they were (fp16 alike). Loaded for
    training, the weights are the saved ones in float32 (the optimizer state then too, as with --bf16 autocast)."""
    from transformers import AutoModelForCausalLM

    tiny_lm("decoder").to(dtype).save_pretrained(tmp_path)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert saved.dtype == dtype  # what a plain load gives
    model = training.load_to_train(AutoModelForCausalLM, tmp_path)
    assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}
    for (name, parameter), original in zip(model.named_parameters(), saved.parameters(), strict=True):
        assert torch.equal(parameter, original.float()), name
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    before = [parameter.detach().clone() for parameter in model.parameters()]
    model.train()(**lm_inputs("decoder")).loss.backward()
    optimizer.step()
    assert all(not torch.equal(old, new) for old, new in zip(before, model.parameters(), strict=True))


def test_a_column_named_as_ours_beside_the_columns_read_is_left_out(tmp_path):
    # --text-column summary of a dataset that also has a "text" column (or --source-column en beside a "source"
    # column) failed the renaming to "text" with a KeyError traceback: 'Field "text" exists 2 times in schema'.
    rows = [{"text": f"text {i}", "summary": f"summary {i}", "source": f"source {i}", "en": f"en {i}", "de": f"de {i}"}
            for i in range(10)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    texts = training_data.load_texts(dataset=str(tmp_path / "data.jsonl"), text_column="summary")
    assert texts["train"].column_names == ["text"]
    assert sorted([*texts["train"]["text"], *texts["validation"]["text"]]) == [f"summary {i}" for i in range(10)]
    pairs = training_data.load_parallel(dataset=str(tmp_path / "data.jsonl"), source_column="en", target_column="de")
    assert pairs["train"].column_names == ["source", "target"]
    assert all(pair["source"] == "en" + pair["target"].removeprefix("de") for pair in pairs["train"])


def test_an_accelerate_evaluation_that_masked_nothing_says_so(monkeypatch, capsys, tmp_path):
    # Two validation words, neither masked at 15%: train-accelerate printed "evaluation: " and nothing after it, where
    # `train` says why there is no figure.
    from tiny_tokenizers import write_run_corpus

    from hf_scratch_transformer.cli import main

    write_run_corpus(tmp_path, families=("encoder",))
    (tmp_path / "validation.txt").write_text("the dog")  # masked at 15% or not, the same every time (seeded): here not
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    main(["train-accelerate", "--cpu", "--task", "masked-lm", "--train-files", str(tmp_path / "corpus.txt"),
          "--validation-files", str(tmp_path / "validation.txt"), "--tokenizer", str(tmp_path / "encoder"),
          "--max-steps", "2", "--max-length", "32", "--batch-size", "4", "--output-dir", str(tmp_path / "out"),
          "--set", "num_hidden_layers=1", "hidden_size=32", "num_attention_heads=2", "intermediate_size=64"])
    assert "evaluation: no token of the 1 validation sequences was masked; no loss to report" in capsys.readouterr().out


def test_a_local_dataset_named_from_another_folder_is_the_same_data(monkeypatch, tmp_path):
    # Resumed with its absolute path, a run started with `--dataset data.csv` said the data had changed.
    from hf_scratch_transformer.cli.run_data import data_settings

    (tmp_path / "data.csv").write_text("text\none\n")
    monkeypatch.chdir(tmp_path)
    settings = [data_settings(SimpleNamespace(task="causal-lm", train_files=None, dataset=dataset))
                for dataset in ("data.csv", str(tmp_path / "data.csv"), "user/corpus")]
    assert settings == [{"dataset": str(tmp_path / "data.csv")}] * 2 + [{"dataset": "user/corpus"}]


@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.5, 4.0]), st.integers(-300, 300).map(lambda i: i / 100)),
                min_size=3, max_size=30))
@settings(deadline=None)  # the first case imports SciPy
def test_regression_metrics_are_scipys_correlations_with_ties(pairs):
    """Pearson's and Spearman's correlations as SciPy computes them (ties ranked by their mean); NaN for constant
    labels or scores, as SciPy gives them."""
    from scipy import stats
    from transformers import EvalPrediction

    from hf_scratch_transformer.evaluation import regression_metrics

    labels, scores = (np.array(column) for column in zip(*pairs, strict=True))
    metrics = regression_metrics(EvalPrediction(predictions=scores[:, None], label_ids=labels))
    assert metrics["mse"] == pytest.approx(np.mean((scores - labels) ** 2))
    if np.ptp(labels) == 0 or np.ptp(scores) == 0:
        assert np.isnan(metrics["pearson"]) and np.isnan(metrics["spearman"])
        return
    assert metrics["pearson"] == pytest.approx(stats.pearsonr(scores, labels).statistic, abs=1e-9)
    assert metrics["spearman"] == pytest.approx(stats.spearmanr(scores, labels).statistic, abs=1e-9)


def test_every_column_option_of_the_commands_is_recorded_with_the_data_a_run_reads():
    """A run resumed with another column (`--choices-column` was left out of the record) is told its data changed."""
    from hf_scratch_transformer.cli.run_data import DATA_OPTIONS

    cli = Path(__file__).resolve().parent.parent / "hf_scratch_transformer/cli"
    sources = "".join(path.read_text() for path in cli.glob("*.py"))
    options = {name.replace("-", "_") for name in re.findall(r'add_argument\(\s*"--([\w-]+-column)"', sources)}
    assert {"choices_column", "question_column", "text_column"} <= options
    assert options <= set(DATA_OPTIONS)


def test_pairs_left_out_of_a_dataset_for_a_blank_side_are_reported(tmp_path):
    (tmp_path / "pairs.csv").write_text("en,de\none,eins\n,zwei\nthree, \nfour,vier\n")
    reports = []
    pairs = training_data.load_parallel(dataset=str(tmp_path / "pairs.csv"), source_column="en", target_column="de",
                                   report=reports.append)
    assert len(pairs["train"]) + len(pairs["validation"]) == 2
    assert reports == ["2 of the 4 training examples left out: their source or target is blank or missing"]


@pytest.mark.parametrize("command", [["train"], ["train-accelerate", "--cpu"]])
def test_overwriting_a_run_leaves_no_tokenizer_or_log_of_the_earlier_one(monkeypatch, tmp_path, command):
    """Under --overwrite-output-dir, a run given --tokenizer (or --model), or any `train` run, left the earlier
    train-accelerate run's tokenizer/ (another vocabulary, which `--resume` takes for a checkpoint carrying none) and
    `train` its loss_curve.jsonl beside the new run's model and checkpoints. A --tokenizer that is that folder stays."""
    import shutil

    from tiny_tokenizers import write_run_corpus

    from hf_scratch_transformer.cli import main

    write_run_corpus(tmp_path)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    earlier, reused = tmp_path / "earlier", tmp_path / "reused"
    for output in (earlier, reused):
        (output / "checkpoints/step-9").mkdir(parents=True)
        (output / "loss_curve.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    (earlier / "tokenizer").mkdir()
    (earlier / "tokenizer/tokenizer.json").write_text("the earlier run's")
    (earlier / "tokenizer.deleted").mkdir()  # what a removal of it that was killed leaves: cleared by the next run
    shutil.copytree(tmp_path / "decoder", reused / "tokenizer")
    for output, tokenizer in ((earlier, tmp_path / "decoder"), (reused, reused / "tokenizer")):
        main([*command, "--train-files", str(tmp_path / "corpus.txt"), "--tokenizer", str(tokenizer), "--max-steps",
              "2", "--max-length", "32", "--batch-size", "4", "--output-dir", str(output), "--overwrite-output-dir",
              "--set", "num_hidden_layers=1", "hidden_size=32", "num_attention_heads=2", "intermediate_size=64"])
        log = output / "loss_curve.jsonl"  # `train` writes none; train-accelerate its own
        assert not (output / "checkpoints/step-9").exists()
        assert not log.exists() if command == ["train"] else '"loss": 9.0' not in log.read_text()
    assert not (earlier / "tokenizer").exists() and not (earlier / "tokenizer.deleted").exists()
    assert (reused / "tokenizer/tokenizer.json").read_bytes() == (tmp_path / "decoder/tokenizer.json").read_bytes()


FAULTS_OF_STEPS = """
import ctypes, resource
from hf_scratch_transformer import training
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
SIZES = [2 << 20] * 12 + [n << 18 for n in range(1, 20)]  # 24 MiB of 2 MiB blocks, then 256 KiB to 4.75 MiB
def faults_of_steps(steps=10):
    # a step allocates blocks of many sizes, as a training step's activations and gradients, writes them, frees them
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        blocks = [libc.malloc(size) for size in SIZES]
        for block, size in zip(blocks, SIZES):
            libc.memset(block, 1, size)
        for block in blocks:
            libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_of_steps(2)
default = faults_of_steps()
took = training.keep_freed_memory()
faults_of_steps(2)  # the heap grows to a step's size once
print(default, took, faults_of_steps())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_training_commands_keep_a_steps_freed_memory_instead_of_faulting_it_in_again(tmp_path):
    """`keep_freed_memory` (the training commands call it): steps that free and allocate the same tensors again
    caused tens of thousands of minor page faults each with glibc's default thresholds, none after it."""
    (tmp_path / "steps.py").write_text(FAULTS_OF_STEPS)
    # The steps call malloc themselves: with torch tensors, whose small C++ objects land on the heap among the data,
    # whether the freed top of the heap could go back depended on the heap's layout, which moved with the size of the
    # environment (960 and 1,408 faults by default in some, 167,370 in most; a CI run failed on 1,217). A fresh
    # interpreter, not one forked from forked_python's server, whose thresholds have grown with its own allocations.
    done = subprocess.run([sys.executable, str(tmp_path / "steps.py")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=os.environ | {"HF_HUB_OFFLINE": "1"}, check=False)
    default, took, kept = done.stdout.split()[-3:]
    assert int(default) > 10_000 and took == "True" and int(kept) < 100, done.stdout + done.stderr
