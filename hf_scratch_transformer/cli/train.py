"""Train a Scratch model with `Trainer`: tokenizer, data, training, evaluation, a Hub-ready folder with model card
and loss curve, then a reload through the Auto classes and a sample. The main job (`make quickstart`):

    hf-scratch train                                   # causal LM on the embedded Tiny Shakespeare
    hf-scratch train --task masked-lm --train-files my.txt --preset bert-prenorm --set num_hidden_layers=4
    hf-scratch train --task seq2seq --preset transformer-base --recipe vaswani --max-steps 100000 \\
        --source-files train.en --target-files train.de --validation-source val.en --validation-target val.de
    hf-scratch train --model outputs/causal-lm/model --output-dir outputs/causal-lm-more \\
        --max-steps 200               # continue a saved folder, into a new --output-dir (not its run's own)
    hf-scratch train ... --resume                        # pick up the last checkpoint of an interrupted run

Writes OUTPUT_DIR/model (weights, config, model code, tokenizer, README.md card, loss_curve.png,
eval_results.json) and OUTPUT_DIR/checkpoints.
"""

import argparse
import copy
import json
import os
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainingArguments,
    TrainingArguments,
    set_seed,
)

import hf_scratch_transformer  # noqa: F401  (registers the Scratch families with the Auto classes)
from hf_scratch_command import command_help, is_rank_zero
from hf_scratch_transformer import evaluation, hub, mixed_precision, training, training_data
from hf_scratch_transformer.checkpointing import TRAINER_PREFIX, CheckpointError, checkpoint_to_resume
from hf_scratch_transformer.cli.output_folder import add_run_safety_arguments, claim_output_dir, remove_the_earlier_run
from hf_scratch_transformer.cli.run_data import (
    data_settings,
    load_run_data,
    run_data_files,
    run_data_name,
    run_data_on_hub,
)
from hf_scratch_transformer.cli.run_errors import fail, note, say
from hf_scratch_transformer.cli.run_options import (
    AUTO_MODEL,
    DEFAULTS,
    EVALUATION_SCHEDULES,
    STEP_SCHEDULES,
    TOKENIZER_VOCAB_SIZE,
    RunParser,
    add_data_and_model_arguments,
    check_model_fits,
    check_model_folder,
    check_warmup,
    config_file_fields_replaced,
    config_overrides,
    follow_the_tokenizer,
    fraction,
    freeze_imported_objects,
    load_run_tokenizer,
    model_tokenizer,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    random_seed,
    refuse_another_family,
    refuse_another_tokenizer,
    refuse_force_bf16_alone,
    refuse_fp16_on_cpu,
    refuse_lone_processes,
    repo_id,
    stop_cleanly_on_ctrl_c,
    train_until_stopped,
    trainer_model_folder,
)
from hf_scratch_transformer.presets import get_preset
from hf_scratch_transformer.sharding import ShardedTrainer
from hf_scratch_transformer.trainer_checkpoints import CrashSafeSeq2SeqTrainer, CrashSafeTrainer
from tokenizer_training import padded_vocab_size, special_token_ids, train_tokenizer

# The seeds' recipe (Vaswani et al., 2017, section 5.3-5.4): Noam warmup, Adam (0.9, 0.98, 1e-9), smoothing 0.1.
RECIPES = {"vaswani": dict(lr_scheduler="inverse_sqrt", warmup_steps=4000, adam_beta2=0.98, adam_epsilon=1e-9,
                           label_smoothing=0.1, max_grad_norm=1.0)}


class ShardedCrashSafeTrainer(training.ParametersCountedOnce, evaluation.TokenWeightedEvaluationLoss, ShardedTrainer,
                              CrashSafeTrainer):
    """The causal LM's, token-weighted too: the last packed block of the validation data is short, and Trainer's
    loss (each process's divided by the labels of all) weighed it against the labels of the repeated blocks that
    fill the other processes' last batch (3% off in two processes, tests/test_accelerate.py)."""


class MaskedLMTrainer(training.MasksOfEachStep, ShardedCrashSafeTrainer):
    pass


class ShardedSeq2SeqTrainer(training.ParametersCountedOnce, evaluation.TokenWeightedEvaluationLoss, ShardedTrainer,
                            CrashSafeSeq2SeqTrainer):
    def prediction_step(self, *args, **kwargs):
        """Seq2SeqTrainer's, leaving the model's generation config as it was: transformers' writes every legacy
        default into it in place (max_length 20, greedy search, top_k 50, ...), and the saved folder shipped them to
        `generate()` and the scratch-text2text pipeline (whose own defaults are 4 beams and 256 new tokens)."""
        kept = copy.deepcopy(self.model.generation_config)
        try:
            return super().prediction_step(*args, **kwargs)
        finally:
            self.model.generation_config = kept

    def evaluation_loop(self, *args, **kwargs):
        """Trainer's, counting each validation pair once under several processes. Accelerate fills the last batch of
        each process with repeats of the first pairs; Seq2SeqTrainer gathers with `accelerator.gather` (for
        `num_return_sequences` > 1, which this script never asks for), which kept them, and BLEU, chrF and the loss
        scored them as pairs of their own. `gather_for_metrics` drops them, as Trainer does for the other tasks."""
        self.gather_function = self.accelerator.gather_for_metrics
        return super().evaluation_loop(*args, **kwargs)


# ----------------------------------------------------------------------------------------------- arguments
parser = RunParser(description=command_help(__doc__), formatter_class=argparse.RawTextHelpFormatter)
parser.add_argument("--task", choices=training.TASKS, default="causal-lm", help="default: causal-lm")
parser.add_argument("--output-dir", type=Path, help="default: outputs/<task>")
add_data_and_model_arguments(parser)
optim = parser.add_argument_group("optimisation")
optim.add_argument("--recipe", choices=sorted(RECIPES), help="the seeds' recipe; explicit flags below still win")
optim.add_argument("--max-steps", type=positive_int, default=600, help="default 600")
optim.add_argument("--batch-size", type=positive_int, default=16, help="sequences per device step (default 16)")
optim.add_argument("--gradient-accumulation-steps", type=positive_int, default=1, help="default 1")
optim.add_argument("--learning-rate", type=positive_float, default=1e-3, help="default 1e-3")
optim.add_argument("--lr-scheduler", choices=STEP_SCHEDULES + EVALUATION_SCHEDULES, metavar="NAME",
                   help=f"default cosine (inverse_sqrt = Noam): {', '.join(STEP_SCHEDULES)};\nstepped with the "
                   f"evaluation loss: {', '.join(EVALUATION_SCHEDULES)}")
optim.add_argument("--warmup-steps", type=non_negative_int, help="default 5%% of the steps")
optim.add_argument("--adam-beta2", type=fraction, help="default 0.99")
optim.add_argument("--adam-epsilon", type=non_negative_float, help="default 1e-8")
optim.add_argument("--weight-decay", type=non_negative_float, default=0.01, help="default 0.01")
optim.add_argument("--label-smoothing", type=fraction, help="default 0")
optim.add_argument("--max-grad-norm", type=non_negative_float, help="default 1.0")
optim.add_argument("--bf16", action="store_true", help="bf16 autocast")
optim.add_argument("--force-bf16", action="store_true", help="bf16 even on a CPU where it is slower than fp32")
optim.add_argument("--fsdp", action="store_true", help="FSDP2 with ScratchBlock units and sharded checkpoints, as "
                   "configs/accelerate/fsdp.yaml (for launchers without that config, e.g. torchrun)")
run = parser.add_argument_group("run")
run.add_argument("--eval-steps", type=positive_int, help="default: 4 evaluations per run")
run.add_argument("--max-eval-samples", type=positive_int,
                 help="evaluate on the first N validation sequences (default: all)")
run.add_argument("--save-steps", type=positive_int, help="checkpoint every N steps (default: as --eval-steps)")
run.add_argument("--max-minutes", type=positive_float, help="stop training after this many minutes, checkpointed "
                 "(the main job's budget on slow machines; --resume continues to --max-steps)")
run.add_argument("--resume", action="store_true", help="continue from the newest checkpoint that verifies")
add_run_safety_arguments(run)
run.add_argument("--num-beams", type=positive_int, default=4, help="seq2seq evaluation and sample (default 4)")
run.add_argument("--sample-prompt", default="ROMEO:", help="causal LM sample prompt (default ROMEO:)")
run.add_argument("--model-name", type=repo_id, help="the card's title and repo id (default: <preset>-<data>)")
run.add_argument("--seed", type=random_seed, default=1337, help="default 1337")
args = parser.parse_args()
stop_cleanly_on_ctrl_c()
freeze_imported_objects()
if int(os.environ.get("WORLD_SIZE", 1)) > 1 and not (args.model or args.tokenizer):  # torchrun / accelerate launch
    parser.error("with several processes each would train its own tokenizer: train one first "
                 "(python -m tokenizer_training ...) and pass --tokenizer")

recipe = RECIPES.get(args.recipe, {})
optimisation = {
    name: getattr(args, name) if getattr(args, name) is not None else recipe.get(name, default)
    for name, default in [("lr_scheduler", "cosine"), ("warmup_steps", max(1, args.max_steps // 20)),
                          ("adam_beta2", 0.99), ("adam_epsilon", 1e-8), ("label_smoothing", 0.0),
                          ("max_grad_norm", 1.0)]
}
if args.warmup_steps is not None:
    check_warmup(parser, args.warmup_steps, optimisation["lr_scheduler"], args.max_steps)
elif "warmup_steps" in recipe:
    check_warmup(parser, recipe["warmup_steps"], optimisation["lr_scheduler"], args.max_steps,
                 f"--recipe {args.recipe}'s warmup of")
# Trainer's mixed precision: --bf16's, else the launch config's (`TrainingArguments` reads it so)
refuse_force_bf16_alone(parser, args.force_bf16, "bf16" if args.bf16 else os.environ.get(
    "ACCELERATE_MIXED_PRECISION", "no"), "--bf16")
task = args.task
output_dir = args.output_dir or Path("outputs") / task
is_main_process = is_rank_zero()
check_model_folder(parser, args.model, task=task)
overrides = config_overrides(parser, args)
claim_output_dir(parser, output_dir, args.resume, args.overwrite_output_dir, is_main_process, model=args.model)
resumed = None  # the checkpoint this run continues: chosen once, before the tokenizer (it holds the run's own)
if args.resume:
    try:
        resumed = checkpoint_to_resume(output_dir / "checkpoints", TRAINER_PREFIX, print if is_main_process else None)
    except CheckpointError as error:
        fail(parser, str(error))
set_seed(args.seed)
default_preset, default_kind, tokenizer_family = DEFAULTS[task]

# ----------------------------------------------------------------------------------------------- data
raw, tokenizer_texts = load_run_data(parser, args)
say(f"data: {len(raw['train'])} training and {len(raw['validation'])} validation examples")

# ----------------------------------------------------------------------------------------------- tokenizer
given = model_tokenizer(args.model) or args.tokenizer
# A resumed run keeps the tokenizer its checkpoint was trained with (Trainer saves it there; FSDP checkpoints do not,
# but several processes need --tokenizer anyway): trained again, a tokenizer need not come out the same (WordPiece
# does not), and another one given would change the ids under the weights.
saved = resumed is not None and (resumed / "tokenizer_config.json").is_file()
if saved:
    tokenizer = load_run_tokenizer(parser, resumed, args.max_length)
    refuse_another_tokenizer(parser, given, tokenizer, resumed)
    say(f"tokenizer: the run's own, from {resumed}")
elif given:
    tokenizer = load_run_tokenizer(parser, given, args.max_length)
elif resumed is not None:
    fail(parser, f"{resumed} holds no tokenizer: pass the one the run was trained with as --tokenizer.")
else:
    try:
        tokenizer = train_tokenizer(args.tokenizer_kind or default_kind, tokenizer_family, dataset=tokenizer_texts,
                                    vocab_size=args.vocab_size or TOKENIZER_VOCAB_SIZE,
                                    model_max_length=args.max_length)
    except ValueError as error:  # a --vocab-size below the alphabet of the text
        fail(parser, str(error))
    say(f"tokenizer: trained {args.tokenizer_kind or default_kind}, {len(tokenizer)} tokens")
refuse_another_family(parser, tokenizer, task, resumed if saved else given)

# ----------------------------------------------------------------------------------------------- model
if args.model:
    model = training.load_to_train(AUTO_MODEL[task], args.model)
    preset = None
else:
    overrides |= special_token_ids(tokenizer, tokenizer_family)
    overrides.setdefault("vocab_size", padded_vocab_size(tokenizer))  # a --set size is kept (check_model_fits)
    overrides.setdefault("max_position_embeddings", max(args.max_length, 64))
    if args.config:
        config = AutoConfig.from_pretrained(args.config, **overrides)
        preset = None
    else:
        preset = args.preset or default_preset
        config = get_preset(preset, **overrides)
    follow_the_tokenizer(config, dict(args.set))
    if args.config and (replaced := config_file_fields_replaced(args.config, config, dict(args.set))):
        say(replaced)
    model = AUTO_MODEL[task].from_config(config)
check_model_fits(parser, model, tokenizer, args.max_length)
training_data.keep_the_inputs_the_model_reads(tokenizer, model.config)
say(f"model: {type(model).__name__}, {model.num_parameters() / 1e6:.2f}M parameters")

if task == "causal-lm":
    datasets = {split: training_data.pack_for_causal_lm(texts, tokenizer, args.max_length)
                for split, texts in raw.items()}
    # Packed blocks have equal length and carry their labels: stacking is all. (Left as None, Trainer would pad them
    # with the tokenizer, twice the time per batch.)
    collator = training_data.stack_blocks
elif task == "masked-lm":
    datasets = {split: training_data.tokenize_for_mlm(texts, tokenizer, args.max_length)
                for split, texts in raw.items()}
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)  # 80% [MASK], 10% random, 10% kept
else:
    datasets = {split: training_data.tokenize_for_seq2seq(pairs, tokenizer, args.max_length, report=note)
                for split, pairs in raw.items()}
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)

if args.max_eval_samples:
    kept = min(args.max_eval_samples, len(datasets["validation"]))
    datasets["validation"] = datasets["validation"].select(range(kept))
if task == "masked-lm":  # once, not at each evaluation (MasksOfEachStep masks a dataset given without labels)
    datasets["validation"] = training_data.mask_once(datasets["validation"], collator, args.seed)

# ----------------------------------------------------------------------------------------------- training
training.keep_freed_memory()  # each step's tensors reused, not faulted in again (docs/nanogpt.md)
eval_steps = args.eval_steps or max(1, args.max_steps // 4)
arguments = dict(
    output_dir=str(output_dir / "checkpoints"),
    max_steps=args.max_steps,
    per_device_train_batch_size=args.batch_size,
    per_device_eval_batch_size=args.batch_size,
    gradient_accumulation_steps=args.gradient_accumulation_steps,
    learning_rate=args.learning_rate,
    lr_scheduler_type=optimisation["lr_scheduler"],
    warmup_steps=optimisation["warmup_steps"],
    adam_beta1=0.9,
    adam_beta2=optimisation["adam_beta2"],
    adam_epsilon=optimisation["adam_epsilon"],
    weight_decay=args.weight_decay,
    max_grad_norm=optimisation["max_grad_norm"],
    bf16=args.bf16,
    use_cpu=args.bf16 and not torch.cuda.is_available(),  # Trainer's bf16 on CPU must be asked for explicitly
    dataloader_pin_memory=torch.accelerator.is_available(),  # pinned host memory is for copies to a GPU
    eval_strategy="steps",
    eval_steps=eval_steps,
    save_strategy="steps",
    save_steps=args.save_steps or eval_steps,
    save_total_limit=2,
    logging_steps=max(1, min(eval_steps, args.max_steps // 20)),
    prediction_loss_only=task == "causal-lm",  # perplexity needs the loss only, not every logit
    report_to=[],
    seed=args.seed,
    # Every parameter of our language models takes part in each step (test_presets), as Accelerate's loop assumes:
    # Trainer's default for a PreTrainedModel searched the graph for unused ones at every step, and said so.
    ddp_find_unused_parameters=False,
)
if args.fsdp:  # as configs/accelerate/fsdp.yaml
    arguments |= dict(fsdp=True, fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": ["ScratchBlock"],
                                               "reshard_after_forward": True, "state_dict_type": "SHARDED_STATE_DICT"})
trainer_kwargs = dict(model=model, train_dataset=datasets["train"], eval_dataset=datasets["validation"],
                      data_collator=collator, processing_class=tokenizer,
                      step_settings={"max_length": args.max_length, "data": data_settings(args),
                                     "label_smoothing": optimisation["label_smoothing"]})
preemption = training.Preemption()
stopper = training.StopAfterStep(60 * args.max_minutes if args.max_minutes else None, preemption)
trainer_kwargs["callbacks"] = [stopper]
if optimisation["label_smoothing"] > 0:
    trainer_kwargs["compute_loss_func"] = training.smoothed_loss_function(task, optimisation["label_smoothing"])
if task == "seq2seq":
    arguments |= dict(predict_with_generate=True, generation_num_beams=args.num_beams,
                      generation_max_length=args.max_length)
    # BLEU and chrF against the validation targets as written (not the labels decoded: cut at --max-length)
    references = raw["validation"].select(range(len(datasets["validation"])))["target"]
    trainer = ShardedSeq2SeqTrainer(args=Seq2SeqTrainingArguments(**arguments),
                                    compute_metrics=evaluation.translation_metrics(tokenizer, list(references)),
                                    **trainer_kwargs)
else:
    if task == "masked-lm":
        trainer_kwargs |= dict(compute_metrics=evaluation.mlm_accuracy,
                               preprocess_logits_for_metrics=evaluation.argmax_logits)
    trainer_class = MaskedLMTrainer if task == "masked-lm" else ShardedCrashSafeTrainer
    trainer = trainer_class(args=TrainingArguments(**arguments), **trainer_kwargs)
refuse_fp16_on_cpu(parser, trainer.args.mixed_precision, trainer.args.device)  # from the launch config
bf16_option = "--bf16" if args.bf16 else "the launch config's mixed_precision bf16"
if refusal := mixed_precision.slow_bf16_refusal(trainer.args.mixed_precision, trainer.args.device, args.force_bf16,
                                                bf16_option):
    parser.error(refusal)  # bf16 from --bf16 or the launch config, on a CPU without native bf16
refuse_lone_processes(parser, trainer)
remove_the_earlier_run(parser, output_dir, args.overwrite_output_dir, is_main_process, tokenizer=given)
train_until_stopped(parser, trainer, resumed, preemption)
if stopper.stopped_at:
    say(f"--max-minutes {args.max_minutes:g}: stopped after step {stopper.stopped_at} of {args.max_steps} "
        "(checkpointed: --resume continues)")

# ----------------------------------------------------------------------------------------------- evaluation
metrics = trainer.evaluate()
results = {key.removeprefix("eval_"): value for key, value in metrics.items()
           if key.removeprefix("eval_") in ("loss", "mlm_accuracy", "bleu", "chrf")}
if task == "causal-lm":
    results["perplexity"] = evaluation.perplexity(results["loss"])
if metrics.get("eval_masked_tokens") == 0:  # its loss is 0 / 0: NaN, which no JSON reader takes
    say(f"evaluation: no token of the {len(datasets['validation'])} validation sequences was masked; no loss or "
        "accuracy to report (give more validation text)")
    results = {}
if results:
    say("evaluation: " + ", ".join(f"{key} {value:.4f}" for key, value in results.items()))

# ----------------------------------------------------------------------------------------------- Hub-ready folder
folder = output_dir / "model"
with trainer_model_folder(parser, trainer, folder) as written:  # put in place complete; the others wait for it
    if trainer.is_world_process_zero():  # the main process writes the rest of the folder
        (written / "eval_results.json").write_text(json.dumps(results, indent=2))
        training.plot_loss_curve(trainer.state.log_history, written / "loss_curve.png",
                                 title=f"{preset or 'model'} {task}")
        files = run_data_files(args)
        dataset_name = run_data_name(args, files)
        hub.write_model_card(
            written, task=task, preset=preset,
            model_name=args.model_name or hub.default_repo_name(preset or "scratch", dataset_name),
            config=model.config.to_dict(),
            num_parameters=model.num_parameters(),
            dataset=dataset_name,
            dataset_on_hub=run_data_on_hub(args, files),
            dataset_description="Files: " + ", ".join(f"`{f.name}`" for f in files) if not args.dataset else "",
            tokenizer_description=f"{type(tokenizer).__name__}, {len(tokenizer)} tokens",
            hyperparameters={"max_steps": args.max_steps, "steps_trained": trainer.state.global_step,
                             "global_batch_size":
                                 args.batch_size * args.gradient_accumulation_steps * trainer.args.world_size,
                             "learning_rate": args.learning_rate, "lr_scheduler": optimisation["lr_scheduler"],
                             "warmup_steps": optimisation["warmup_steps"],
                             "adam_betas": (0.9, optimisation["adam_beta2"]),
                             "adam_epsilon": optimisation["adam_epsilon"], "weight_decay": args.weight_decay,
                             **{key: optimisation[key] for key in ("label_smoothing", "max_grad_norm")},
                             "mixed_precision": trainer.args.mixed_precision,  # --bf16's, or the launch config's
                             "eval_sequences": len(datasets["validation"])},  # all, or the first --max-eval-samples
            eval_results={("eval_loss" if key == "loss" else key): value for key, value in results.items()},
        )
if not trainer.is_world_process_zero():
    raise SystemExit(0)
print(f"saved a Hub-ready folder: {folder}")

# ----------------------------------------------------------------------------------------------- reload and sample
reloaded = AUTO_MODEL[task].from_pretrained(folder).eval()
tokenizer = AutoTokenizer.from_pretrained(folder)
# The sample's inputs and outputs stay within the model's absolute positions (a validation text can be longer, and
# failing here would end a run whose folder is saved with a traceback).
positions = reloaded.config.max_position_embeddings
if task == "causal-lm":
    inputs = tokenizer(args.sample_prompt, return_tensors="pt", truncation=True, max_length=positions - 1)
    room = positions - inputs.input_ids.shape[1]
    output = reloaded.generate(**inputs, max_new_tokens=min(80, room), do_sample=True, top_k=40, temperature=0.8)
    print("sample from the reloaded model:\n" + tokenizer.decode(output[0], skip_special_tokens=True))
elif task == "seq2seq":
    source = raw["validation"][0]["source"]
    inputs = tokenizer(source, return_tensors="pt", truncation=True, max_length=min(args.max_length, positions))
    output = reloaded.generate(**inputs, num_beams=args.num_beams, max_new_tokens=min(60, positions - 1))
    print(f"source: {source}\ntranslation: {tokenizer.decode(output[0], skip_special_tokens=True)}")
else:
    text = raw["validation"][0]["text"].split("\n")[0]
    # As many tokens as [CLS] ... [SEP] leaves room for; masking the last word adds none.
    text = tokenizer.decode(tokenizer(text, add_special_tokens=False, truncation=True,
                                      max_length=min(args.max_length, positions) - 2).input_ids)
    words = text.split()
    masked = " ".join(words[:-1] + [tokenizer.mask_token]) if words else tokenizer.mask_token
    logits = reloaded(**tokenizer(masked, return_tensors="pt")).logits[0]
    position = tokenizer(masked).input_ids.index(tokenizer.mask_token_id)
    print(f"fill-mask: {masked} -> {tokenizer.decode([int(logits[position].argmax())])}")
