"""Libraries built on transformers, used on our families as on the native models: PEFT (LoRA, prefix tuning), TRL
(supervised fine-tuning; the dropout switch of its preference trainers), lm-evaluation-harness and
sentence-transformers. Where a native
model has the same computation, the same weights with the same adapter give the same outputs and gradients as
there."""

import json

import pytest
import torch
from load_without_package import output_of, run_without_package
from peft import LoraConfig, PeftModel, PrefixTuningConfig, TaskType, get_peft_model
from safetensors.torch import load_file
from tiny_models import lm_inputs, tiny_lm
from tiny_native import ATOL, VOCAB, bert, bert_question_answering, gpt2, llama, marian
from tiny_tokenizers import byte_level_bpe, wordpiece
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    GPT2ForTokenClassification,
    LlamaForTokenClassification,
)

import hf_scratch_transformer as hst
from hf_scratch_transformer.conversion import from_hf

# LoRA on the same products of each layer, in the order the layers hold them. Q, K and V are one fused product in
# ours and in GPT-2 (a LoRA update of rank r to the fused product is not one to each of three), so BERT and Marian
# pair only their output, up and down products.
LORA_TARGETS = {  # native factory: (task, native target modules, ours)
    gpt2: (TaskType.CAUSAL_LM, ["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"],
           ["qkv_proj", "o_proj", "up_proj", "down_proj"]),
    bert: (None, ["output.dense", "intermediate.dense"], ["o_proj", "up_proj", "down_proj"]),
    marian: (TaskType.SEQ_2_SEQ_LM, ["out_proj", "fc1", "fc2"], ["o_proj", "up_proj", "down_proj"]),
}


def _inputs(native) -> dict:
    ids = torch.randint(3, VOCAB - 2, (2, 7), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "labels": ids}
    if native.config.is_encoder_decoder:
        inputs["labels"] = ids[:, :5].clone()  # Marian views them
    return inputs


def _lora_layers(model) -> list:
    return [module for module in model.modules() if hasattr(module, "lora_A")]


def _lora(model, task, targets, **options):
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, task_type=task, init_lora_weights=False, **options)
    return get_peft_model(model, config)


@pytest.mark.parametrize("native_factory", list(LORA_TARGETS), ids=lambda factory: factory.__name__)
def test_lora_on_ours_computes_what_lora_on_the_native_model_computes(native_factory):
    """The same adapter on the same weights: the same logits and the same adapter gradients; merged into the
    weights (`merge_and_unload`), the same logits again."""
    task, native_targets, our_targets = LORA_TARGETS[native_factory]
    native = native_factory()
    ours = from_hf(native)
    native = _lora(native, task, native_targets, fan_in_fan_out=native_factory is gpt2)  # GPT-2's Conv1D
    ours = _lora(ours, task, our_targets)
    pairs = list(zip(_lora_layers(native), _lora_layers(ours), strict=True))
    with torch.no_grad():
        for native_layer, our_layer in pairs:
            for name in ("lora_A", "lora_B"):
                getattr(our_layer, name).default.weight.copy_(getattr(native_layer, name).default.weight)
    inputs = _inputs(native)
    expected, actual = native(**inputs), ours(**inputs)
    torch.testing.assert_close(actual.logits, expected.logits, atol=ATOL, rtol=0)
    expected.loss.backward()
    actual.loss.backward()
    for native_layer, our_layer in pairs:
        for name in ("lora_A", "lora_B"):
            torch.testing.assert_close(getattr(our_layer, name).default.weight.grad,
                                       getattr(native_layer, name).default.weight.grad, atol=1e-5, rtol=1e-4)
    trainable = {name for name, parameter in ours.named_parameters() if parameter.requires_grad}
    assert trainable and all(".lora_" in name for name in trainable), "only the adapter trains"

    with torch.no_grad():
        merged = ours.merge_and_unload()
        assert not _lora_layers(merged) and type(merged) is type(from_hf(native_factory()))
        torch.testing.assert_close(merged(**inputs).logits, expected.logits, atol=ATOL, rtol=0)


def test_lora_for_question_answering_trains_the_head_as_on_bert():
    """PEFT's question-answering task trains LoRA and the head it knows by BERT's name, `qa_outputs` (a copy of it,
    `modules_to_save`): on the same weights ours gives BERT's start and end logits, loss and gradients."""
    native, ours = bert_question_answering()
    native, ours = (_lora(model, TaskType.QUESTION_ANS, targets) for model, targets in
                    ((native, ["output.dense", "intermediate.dense"]), (ours, ["o_proj", "up_proj", "down_proj"])))
    pairs = list(zip(_lora_layers(native), _lora_layers(ours), strict=True))
    with torch.no_grad():
        for native_layer, our_layer in pairs:
            for name in ("lora_A", "lora_B"):
                getattr(our_layer, name).default.weight.copy_(getattr(native_layer, name).default.weight)
    inputs = {"input_ids": _inputs(native)["input_ids"], "start_positions": torch.tensor([1, 3]),
              "end_positions": torch.tensor([2, 6])}
    expected, actual = native(**inputs), ours(**inputs)
    for name in ("start_logits", "end_logits", "loss"):
        torch.testing.assert_close(actual[name], expected[name], atol=ATOL, rtol=0)
    expected.loss.backward()
    actual.loss.backward()
    trained = {name: parameter for name, parameter in ours.named_parameters() if parameter.requires_grad}
    assert {name for name in trained if ".lora_" not in name} == {
        "base_model.model.qa_outputs.modules_to_save.default.weight",
        "base_model.model.qa_outputs.modules_to_save.default.bias"}
    native_head = native.base_model.model.qa_outputs.modules_to_save.default
    torch.testing.assert_close(trained["base_model.model.qa_outputs.modules_to_save.default.weight"].grad,
                               native_head.weight.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("native_class, make_config, native_targets, head", [
    (GPT2ForTokenClassification, lambda: gpt2().config, ["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"], "classifier"),
    (LlamaForTokenClassification, lambda: llama().config, ["o_proj", "down_proj"], "score"),
], ids=["gpt2", "llama"])
def test_lora_for_token_classification_trains_a_decoders_head_as_on_the_native_model(native_class, make_config,
                                                                                    native_targets, head):
    """PEFT's token-classification task trains LoRA and a copy of the head it knows by name (`classifier` or
    `score`, `modules_to_save`): on the same weights ours gives GPT-2's and Llama's logits, loss and gradients."""
    config = make_config()
    config.num_labels = 3
    native = native_class(config).eval()
    ours = from_hf(native)
    gpt2_like = native_class is GPT2ForTokenClassification
    our_targets = ["qkv_proj", "o_proj", "up_proj", "down_proj"] if gpt2_like else ["o_proj", "down_proj"]
    native = _lora(native, TaskType.TOKEN_CLS, native_targets, fan_in_fan_out=gpt2_like)
    ours = _lora(ours, TaskType.TOKEN_CLS, our_targets)
    pairs = list(zip(_lora_layers(native), _lora_layers(ours), strict=True))
    with torch.no_grad():
        for native_layer, our_layer in pairs:
            for name in ("lora_A", "lora_B"):
                getattr(our_layer, name).default.weight.copy_(getattr(native_layer, name).default.weight)
    ids = _inputs(native)["input_ids"]
    inputs = {"input_ids": ids, "labels": torch.randint(0, 3, ids.shape, generator=torch.Generator().manual_seed(1))}
    expected, actual = native(**inputs), ours(**inputs)
    for name in ("logits", "loss"):
        torch.testing.assert_close(actual[name], expected[name], atol=ATOL, rtol=0)
    expected.loss.backward()
    actual.loss.backward()
    trained = {name: parameter for name, parameter in ours.named_parameters() if parameter.requires_grad}
    assert {name for name in trained if ".lora_" not in name} == {
        "base_model.model.classifier.modules_to_save.default.weight",
        "base_model.model.classifier.modules_to_save.default.bias"}
    native_head = getattr(native.base_model.model, head).modules_to_save.default
    torch.testing.assert_close(trained["base_model.model.classifier.modules_to_save.default.weight"].grad,
                               native_head.weight.grad, atol=1e-5, rtol=1e-4)
    for native_layer, our_layer in pairs:
        torch.testing.assert_close(our_layer.lora_B.default.weight.grad, native_layer.lora_B.default.weight.grad,
                                   atol=1e-5, rtol=1e-4)


AUTO_LM = {"decoder": (AutoModelForCausalLM, TaskType.CAUSAL_LM), "encoder": (AutoModelForMaskedLM, None),
           "seq2seq": (AutoModelForSeq2SeqLM, TaskType.SEQ_2_SEQ_LM)}


@pytest.mark.parametrize("family", list(AUTO_LM))
def test_a_lora_adapter_saved_alone_loads_onto_the_saved_model(family, tmp_path):
    """The base folder and the adapter folder apart, as published: `PeftModel.from_pretrained` on the base loaded
    through the Auto class gives the adapted model's outputs; the adapter folder holds the adapter only."""
    auto_class, task = AUTO_LM[family]
    tiny_lm(family).save_pretrained(tmp_path / "base")
    adapted = _lora(auto_class.from_pretrained(tmp_path / "base"), task, ["qkv_proj", "o_proj"]).eval()
    adapted.save_pretrained(tmp_path / "adapter")
    inputs = lm_inputs(family)
    with torch.no_grad():
        expected = adapted(**inputs).logits
        reloaded = PeftModel.from_pretrained(auto_class.from_pretrained(tmp_path / "base"), tmp_path / "adapter")
        torch.testing.assert_close(reloaded.eval()(**inputs).logits, expected, atol=1e-6, rtol=0)
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert saved and all(".lora_" in name for name in saved)


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_prefix_tuning_on_ours_computes_what_it_computes_on_the_native_model(family):
    """PEFT's prefix tuning: virtual keys and values for every layer from one trained embedding, handed to the
    model as `past_key_values`, behind an attention mask that covers them. The same prefix weights give the native
    outputs (GPT-2's logits; BERT's hidden states, through the trunks); the prefix alone trains."""
    if family == "decoder":
        native, task, output = gpt2(), TaskType.CAUSAL_LM, "logits"
        ours = from_hf(native)
    else:
        native_lm = bert()
        native, ours = native_lm.bert, from_hf(native_lm).model
        task, output = TaskType.FEATURE_EXTRACTION, "last_hidden_state"
    config = PrefixTuningConfig(num_virtual_tokens=3, task_type=task)
    native, ours = get_peft_model(native, config), get_peft_model(ours, config)
    with torch.no_grad():
        native.prompt_encoder.default.embedding.weight.normal_()
        ours.prompt_encoder.default.embedding.weight.copy_(native.prompt_encoder.default.embedding.weight)
    ids = _inputs(native)["input_ids"]
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    expected = getattr(native(input_ids=ids, attention_mask=mask), output)
    actual = getattr(ours(input_ids=ids, attention_mask=mask), output)
    kept = mask.bool()
    torch.testing.assert_close(actual[kept], expected[kept], atol=ATOL, rtol=0)
    actual.sum().backward()
    trainable = [name for name, parameter in ours.named_parameters() if parameter.requires_grad]
    assert trainable == ["prompt_encoder.default.embedding.weight"]
    assert ours.prompt_encoder.default.embedding.weight.grad.abs().sum() > 0


def test_trl_sft_trains_ours_as_it_trains_llama(tmp_path):
    """TRL's `SFTTrainer` on plain texts, with and without its packing (best-fit sequences in one row, told apart
    by position ids that restart): Llama's losses step for step, and a saved folder the Auto class loads. (Not
    GPT-2: Trainer divides a causal LM's summed loss by the labels it counts, unshifted for a class whose name is
    not `...ForCausalLM`, four more here, so GPT-2's losses come out 5% low.)"""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tokenizer = byte_level_bpe()
    texts = Dataset.from_dict({"text": [f"the {word} walks to house {number}" for number in range(12)
                                        for word in ("man", "dog", "horse")]})
    for packing in (False, True):
        native = llama(vocab_size=len(tokenizer))
        ours = from_hf(native)
        losses = {}
        for name, model in (("native", native), ("ours", ours)):
            arguments = SFTConfig(output_dir=str(tmp_path / name), max_steps=3, learning_rate=1e-3, packing=packing,
                                  per_device_train_batch_size=4, max_length=32, report_to=[], use_cpu=True,
                                  save_strategy="no", disable_tqdm=True, logging_steps=1)
            trainer = SFTTrainer(model=model.train(), args=arguments, train_dataset=texts,
                                 processing_class=tokenizer)
            trainer.train()
            losses[name] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        assert len(losses["ours"]) == 3
        torch.testing.assert_close(losses["ours"], losses["native"], atol=0, rtol=1e-3)  # AdamW: fp32 rounding grows
    trainer.save_model(str(tmp_path / "model"))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert isinstance(reloaded, hst.ScratchDecoderForCausalLM)
    torch.testing.assert_close(reloaded.state_dict(), ours.state_dict())


@pytest.mark.parametrize("family", list(AUTO_LM))
def test_trls_dropout_switch_turns_ours_off(family):
    """TRL's DPO and reward trainers call `disable_dropout_in_model`, which sets p = 0 on every `nn.Dropout`."""
    from trl.trainer.utils import disable_dropout_in_model

    rates = dict(dropout=0.3, attention_dropout=0.3, activation_dropout=0.3, embedding_dropout=0.3)
    model = tiny_lm(family, **rates)
    inputs = lm_inputs(family)
    with torch.no_grad():
        expected = model(**inputs).logits
        model.train()
        assert not torch.equal(model(**inputs).logits, expected), "dropout is on in training mode"
        disable_dropout_in_model(model)
        assert torch.equal(model(**inputs).logits, expected)


# lm-evaluation-harness tasks on a local file (no Hub): one of each kind of request the harness makes of a model.
LM_EVAL_DOCS = [{"context": f"The {animal} walks to the", "choices": [" house", " street", " dog"], "label": index % 3,
                 "text": f"The {animal} sees a red house in the street."}
                for index, animal in enumerate(["man", "woman", "dog", "horse"])]
LM_EVAL_TASKS = {  # task: its request type (loglikelihood, loglikelihood_rolling, generate_until) and metric
    "scratch_choice": "output_type: multiple_choice\ndoc_to_text: '{{context}}'\ndoc_to_choice: '{{choices}}'\n"
                      "doc_to_target: '{{label}}'\n"
                      "metric_list:\n  - {metric: acc, aggregation: mean, higher_is_better: true}\n",
    "scratch_perplexity": "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
                          "metric_list:\n  - {metric: word_perplexity, aggregation: weighted_perplexity,"
                          " higher_is_better: false}\n",
    "scratch_generate": "output_type: generate_until\ndoc_to_text: '{{context}}'\ndoc_to_target: ' house'\n"
                        "generation_kwargs:\n  until: ['.']\n  max_gen_toks: 6\n  do_sample: false\n"
                        "metric_list:\n  - {metric: exact_match, aggregation: mean, higher_is_better: true}\n",
}


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_lm_eval_scores_a_saved_folder_as_it_scores_the_native_model(family, tmp_path):
    """`lm_eval --model hf --model_args pretrained=FOLDER,trust_remote_code=True` (and `backend=seq2seq` for the
    encoder-decoder: the harness picks its path from the native model tables, which do not list ours), on tasks
    asking for choices' log-likelihoods, a rolling perplexity and greedy generations: GPT-2's and Marian's scores,
    sample by sample, from the same weights."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps(doc) for doc in LM_EVAL_DOCS))
    for task, body in LM_EVAL_TASKS.items():
        (tmp_path / f"{task}.yaml").write_text(
            f"task: {task}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path / 'docs.jsonl'}"
            f"\ntest_split: test\n{body}")
    tokenizer = byte_level_bpe(family=family)
    special = {} if family == "decoder" else dict(pad_token_id=tokenizer.pad_token_id,
                                                  eos_token_id=tokenizer.eos_token_id,
                                                  decoder_start_token_id=tokenizer.pad_token_id)
    native = (gpt2 if family == "decoder" else marian)(vocab_size=len(tokenizer), **special)
    tasks = TaskManager(include_path=str(tmp_path), include_defaults=False)  # the harness's own 10,000s: 12 s
    samples, scores = {}, {}
    for name, model in (("native", native), ("ours", from_hf(native))):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        backend = "causal" if family == "decoder" else "seq2seq"
        harness = HFLM(pretrained=str(tmp_path / name), trust_remote_code=True, backend=backend, device="cpu",
                       batch_size=2)
        assert type(harness.model).__name__.startswith("Scratch" if name == "ours" else ("GPT2", "Marian"))
        output = lm_eval.simple_evaluate(model=harness, tasks=list(LM_EVAL_TASKS), log_samples=True,
                                         task_manager=tasks)
        samples[name] = {task: [sample["resps"] for sample in output["samples"][task]] for task in LM_EVAL_TASKS}
        scores[name] = {task: {metric: value for metric, value in result.items()  # "acc,none": 0.25, ...
                               if "," in metric and "stderr" not in metric}
                        for task, result in output["results"].items()}
    assert set(scores["ours"]) == set(LM_EVAL_TASKS)
    assert samples["ours"]["scratch_generate"] == samples["native"]["scratch_generate"]
    for task in ("scratch_choice", "scratch_perplexity"):  # each choice's and text's log-likelihood
        torch.testing.assert_close(_floats(samples["ours"][task]), _floats(samples["native"][task]), rtol=1e-5, atol=0)
    torch.testing.assert_close(scores["ours"], scores["native"], rtol=1e-4, atol=0)


def _floats(responses) -> torch.Tensor:
    """The numbers of the harness's nested responses ([(log-likelihood, is greedy)] per choice, ...), flat."""
    if isinstance(responses, (list, tuple)):
        return torch.cat([_floats(item) for item in responses]) if responses else torch.empty(0)
    return torch.tensor([float(responses)], dtype=torch.float64)


SENTENCES = ["a dog runs in the street", "the man sees a big red house", "a horse"]


def test_sentence_transformers_embeds_and_trains_ours_as_bert(tmp_path):
    """`SentenceTransformer(FOLDER)` (a saved masked LM: the trunk, mean pooling) embeds as it embeds the BERT of the
    same weights; `SentenceTransformerTrainer` with an in-batch contrastive loss trains it to the same losses and
    embeddings; the saved sentence model loads with `trust_remote_code=True` where the package is missing."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    tokenizer = wordpiece()
    torch.manual_seed(0)
    native = bert(vocab_size=len(tokenizer), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    for name, model in (("native", native), ("ours", from_hf(native))):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    pairs = Dataset.from_dict({"anchor": ["a dog runs", "the man walks", "a big horse", "the red house", "a woman sees",
                                          "the small street"],
                               "positive": ["the dog runs far", "a man walks home", "the horse is big",
                                            "a house is red", "the woman sees a dog", "a street is small"]})
    losses, embeddings = {}, {}
    for name in ("native", "ours"):
        model = SentenceTransformer(str(tmp_path / name), device="cpu")
        embeddings[f"{name}-before"] = model.encode(SENTENCES, convert_to_tensor=True)
        arguments = SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path / f"run-{name}"), max_steps=3, per_device_train_batch_size=3, learning_rate=1e-3,
            seed=0, report_to=[], logging_steps=1, save_strategy="no", use_cpu=True)
        trainer = SentenceTransformerTrainer(model=model, args=arguments, train_dataset=pairs,
                                             loss=MultipleNegativesRankingLoss(model))
        trainer.train()
        losses[name] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        embeddings[name] = model.encode(SENTENCES, convert_to_tensor=True)
        model.save(str(tmp_path / f"sentences-{name}"))
    torch.testing.assert_close(embeddings["ours-before"], embeddings["native-before"], atol=ATOL, rtol=0)
    assert len(losses["ours"]) == 3 and losses["ours"] == pytest.approx(losses["native"], abs=1e-5)
    torch.testing.assert_close(embeddings["ours"], embeddings["native"], atol=ATOL, rtol=0)
    assert not torch.allclose(embeddings["ours"], embeddings["ours-before"], atol=1e-3)  # it trained
    script = tmp_path / "embed.py"
    script.write_text(
        "import torch\n"
        "from sentence_transformers import SentenceTransformer\n"
        f"model = SentenceTransformer({str(tmp_path / 'sentences-ours')!r}, trust_remote_code=True, device='cpu')\n"
        f"torch.save(model.encode({SENTENCES!r}, convert_to_tensor=True), {str(tmp_path / 'embedded.pt')!r})\n")
    completed = run_without_package(tmp_path, "--run", script)
    assert "Traceback" not in output_of(completed, script), output_of(completed, script)[-3000:]
    torch.testing.assert_close(torch.load(tmp_path / "embedded.pt"), embeddings["ours"], atol=ATOL, rtol=0)


def test_sentence_transformers_cross_encoder_scores_and_trains_ours_as_berts_classifier(tmp_path):
    """`CrossEncoder(FOLDER)` on a one-label sequence classifier (ours converted from BERT's, with its pooler) scores
    pairs, and `CrossEncoderTrainer` with a binary cross-entropy trains it, to BERT's scores and losses."""
    from datasets import Dataset
    from sentence_transformers import CrossEncoder
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = wordpiece()
    torch.manual_seed(0)
    native = BertForSequenceClassification(BertConfig(**bert(
        vocab_size=len(tokenizer), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).config.to_dict()
        | {"num_labels": 1}))
    for name, model in (("native", native), ("ours", from_hf(native))):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    texts = ["a dog runs", "the red house", "a horse runs", "the street", "the man runs", "a big house"]
    data = Dataset.from_dict({"query": ["what runs ?"] * 6, "text": texts, "label": [1.0, 0.0] * 3})
    pairs = [("what runs ?", text) for text in texts[:2]]
    scores, losses = {}, {}
    for name in ("native", "ours"):
        model = CrossEncoder(str(tmp_path / name), device="cpu")
        assert type(model.model).__name__ == ("BertForSequenceClassification" if name == "native"
                                              else "ScratchEncoderForSequenceClassification")
        scores[f"{name}-before"] = model.predict(pairs, convert_to_tensor=True)
        arguments = CrossEncoderTrainingArguments(
            output_dir=str(tmp_path / f"run-{name}"), max_steps=3, per_device_train_batch_size=2, learning_rate=1e-3,
            seed=0, report_to=[], logging_steps=1, save_strategy="no", use_cpu=True)
        trainer = CrossEncoderTrainer(model=model, args=arguments, train_dataset=data,
                                      loss=BinaryCrossEntropyLoss(model))
        trainer.train()
        losses[name] = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        scores[name] = model.predict(pairs, convert_to_tensor=True)
    torch.testing.assert_close(scores["ours-before"], scores["native-before"], atol=1e-5, rtol=0)
    assert len(losses["ours"]) == 3 and losses["ours"] == pytest.approx(losses["native"], abs=1e-5)
    torch.testing.assert_close(scores["ours"], scores["native"], atol=1e-5, rtol=0)
    assert not torch.allclose(scores["ours"], scores["ours-before"], atol=1e-4)  # it trained
