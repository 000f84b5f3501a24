"""Train a Scratch model with an Accelerate loop: mixed precision, gradient accumulation, clipping, an LR schedule,
atomic checkpoints with exact resume, and any number of processes (DDP, FSDP). Data, tokenizer and model options
are those of `hf-scratch train`.

    hf-scratch train-accelerate                          # causal LM on the embedded Tiny Shakespeare
    hf-scratch train-accelerate --mixed-precision bf16 --gradient-accumulation-steps 4 --label-smoothing 0.1
    hf-scratch train-accelerate --task seq2seq --lr-scheduler inverse_sqrt --warmup-steps 4000 --max-steps 100000 \\
        --adam-betas 0.9 0.98 --adam-epsilon 1e-9 --label-smoothing 0.1 \\
        --source-files train.en --target-files train.de      # the seeds' recipe
    hf-scratch train-accelerate ... --resume             # continue from the newest checkpoint that verifies
    accelerate launch --config_file configs/accelerate/ddp.yaml -m hf_scratch_transformer.cli.train_accelerate \\
        --batch-size 8
    accelerate launch --config_file configs/accelerate/fsdp.yaml -m hf_scratch_transformer.cli.train_accelerate \\
        --preset gpt2-small
        (configs/ of a checkout; installed with the package too: `python -m hf_scratch_transformer.configs` prints
        their folder)
    torchrun --nproc_per_node 2 -m hf_scratch_transformer.cli.train_accelerate --batch-size 8             # 2 GPUs
    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 -m hf_scratch_transformer.cli.train_accelerate --cpu    # 2 CPUs

--batch-size is per process and micro-step; the loss of a step is normalised over the labelled tokens of its whole
global batch (all micro-steps, all processes), so 2 processes x batch 8 take the same steps as 1 process x batch 16.
Writes OUTPUT_DIR/loss_curve.jsonl (one line per step), OUTPUT_DIR/checkpoints/step-N (atomic: see
hf_scratch_transformer/checkpointing.py; each carries the run's tokenizer), OUTPUT_DIR/tokenizer and OUTPUT_DIR/model
(save_pretrained, tokenizer, loss_curve.png, model card). --resume-from a checkpoint of another run continues it as a
branch in a new --output-dir, with its tokenizer, and leaves that run's folder as it was. See docs/checkpoints.md.
"""

import argparse
import functools
import json
import os
import tempfile
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import (
    DataLoaderConfiguration,
    DistributedType,
    GradientAccumulationPlugin,
    broadcast_object_list,
    set_seed,
)
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    get_scheduler,
)
from transformers.trainer_utils import align_special_tokens

import hf_scratch_transformer  # noqa: F401  (registers the Scratch families with the Auto classes)
from hf_scratch_command import command_help
from hf_scratch_transformer import checkpointing, evaluation, hub, mixed_precision, sharding, training, training_data
from hf_scratch_transformer.cli.output_folder import (
    add_run_safety_arguments,
    claim_output_dir,
    continues_run,
    remove_the_earlier_run,
)
from hf_scratch_transformer.cli.run_data import (
    data_settings,
    load_run_data,
    run_data_files,
    run_data_name,
    run_data_on_hub,
)
from hf_scratch_transformer.cli.run_errors import fail, fail_together, fail_with, note
from hf_scratch_transformer.cli.run_options import (
    AUTO_MODEL,
    DEFAULTS,
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
    main_process_first,
    model_folder_written,
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
    repo_id,
    run_file_written,
    stop_after_sigterm,
    stop_cleanly_on_ctrl_c,
)
from hf_scratch_transformer.presets import get_preset
from tokenizer_training import padded_vocab_size, special_token_ids, train_tokenizer

# ----------------------------------------------------------------------------------------------- arguments
parser = RunParser(description=command_help(__doc__),
                   formatter_class=argparse.RawTextHelpFormatter)
parser.add_argument("--task", choices=training.TASKS, default="causal-lm", help="default: causal-lm")
parser.add_argument("--output-dir", type=Path, help="default: outputs/accelerate/<task>")
add_data_and_model_arguments(parser)
optim = parser.add_argument_group("optimisation")
optim.add_argument("--max-steps", type=positive_int, default=600, help="optimizer steps (default 600)")
optim.add_argument("--batch-size", type=positive_int, default=16,
                   help="sequences per process and micro-step (default 16)")
optim.add_argument("--gradient-accumulation-steps", type=positive_int, default=1,
                   help="micro-steps per step (default 1)")
optim.add_argument("--learning-rate", type=positive_float, default=1e-3, help="default 1e-3")
optim.add_argument("--lr-scheduler", default="cosine", choices=STEP_SCHEDULES, metavar="NAME",
                   help=f"default cosine (inverse_sqrt = Noam): {', '.join(STEP_SCHEDULES)}")
optim.add_argument("--warmup-steps", type=non_negative_int, help="default 5%% of the steps")
optim.add_argument("--adam-betas", type=fraction, nargs=2, default=[0.9, 0.99], help="default 0.9 0.99")
optim.add_argument("--adam-epsilon", type=non_negative_float, default=1e-8, help="default 1e-8")
optim.add_argument("--weight-decay", type=non_negative_float, default=0.01,
                   help="on matrices and embeddings (default 0.01)")
optim.add_argument("--label-smoothing", type=fraction, default=0.0, help="default 0")
optim.add_argument("--max-grad-norm", type=non_negative_float, default=1.0,
                   help="clip gradients to this norm; 0: no clipping (default 1.0)")
optim.add_argument("--mixed-precision", choices=["no", "bf16", "fp16"],
                   help="default: the `accelerate launch` config, else no. bf16 runs on CPU and GPU, fp16 on GPU only")
optim.add_argument("--force-bf16", action="store_true", help="bf16 even on a CPU where it is slower than fp32")
run = parser.add_argument_group("checkpoints and logging")
run.add_argument("--save-steps", type=positive_int, help="checkpoint every N steps (default: 4 per run) and at the end")
run.add_argument("--keep-checkpoints", type=positive_int, default=2, help="complete checkpoints kept (default 2)")
run.add_argument("--resume", action="store_true", help="continue from the newest checkpoint that verifies, if any")
run.add_argument("--resume-from", type=Path, help="continue from this checkpoint folder; one of another run "
                 "continues that run as a branch, in a new --output-dir")
add_run_safety_arguments(run)
run.add_argument("--stop-at-step", type=positive_int, help="end this run after that step (checkpointed); the "
                 "schedule still runs to --max-steps")
run.add_argument("--max-eval-samples", type=positive_int,
                 help="final validation loss on the first N sequences (default: all)")
run.add_argument("--model-name", type=repo_id, help="the card's title and repo id (default: <preset>-<data>)")
run.add_argument("--seed", type=random_seed, default=1337, help="default 1337")
run.add_argument("--cpu", action="store_true", help="train on CPU even with a GPU; needed for several CPU processes")
args = parser.parse_args()
stop_cleanly_on_ctrl_c()
freeze_imported_objects()


if args.warmup_steps is not None:
    check_warmup(parser, args.warmup_steps, args.lr_scheduler, args.max_steps)
task, accumulation = args.task, args.gradient_accumulation_steps
output_dir = args.output_dir or Path("outputs/accelerate") / task
checkpoints = output_dir / "checkpoints"
accelerator = Accelerator(
    cpu=args.cpu,
    mixed_precision=args.mixed_precision,
    # One optimizer step per `accumulation` micro-steps, also across epoch ends (the data is an endless stream).
    gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=accumulation, sync_with_dataloader=False),
    # The data order of epoch e is a permutation seeded by seed + e, the same in every process and every run.
    dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=args.seed),
    step_scheduler_with_optimizer=False,  # stepped once per optimizer step below, whatever the process count
)
if sharding.fsdp_launched_on_cpu(accelerator):
    sharding.shard_on_cpu(accelerator)  # an FSDP launch on CPU processes: Accelerate alone would run it as DDP
if accelerator.num_processes != int(os.environ.get("WORLD_SIZE", 1)):  # else each process would train alone
    parser.error(f"launched as {os.environ['WORLD_SIZE']} processes, but Accelerate found no device to join them on: "
                 "on CPU pass --cpu (or set ACCELERATE_USE_CPU=1).")
refuse_fp16_on_cpu(parser, accelerator.mixed_precision, accelerator.device)
refuse_force_bf16_alone(parser, args.force_bf16, accelerator.mixed_precision, "--mixed-precision bf16")
if refusal := mixed_precision.slow_bf16_refusal(accelerator.mixed_precision, accelerator.device, args.force_bf16,
                                         "--mixed-precision bf16"):
    parser.error(refusal)
check_model_folder(parser, args.model, task=task)
overrides = config_overrides(parser, args)
claim_output_dir(parser, output_dir, args.resume or args.resume_from is not None, args.overwrite_output_dir,
                 accelerator.is_main_process, resume_from=args.resume_from, accelerator=accelerator,
                 model=args.model)
try:  # fail before any work if the checkpoint is missing, incomplete or corrupt
    if args.resume_from:
        resume, manifest = args.resume_from, checkpointing.verify_checkpoint(args.resume_from)
        checkpointing.check_loop(resume)
    else:
        resume = checkpointing.checkpoint_to_resume(checkpoints, report=accelerator.print) if args.resume else None
        manifest = checkpointing.verify_checkpoint(resume) if resume else None  # files not read again
except checkpointing.CheckpointError as error:
    fail(parser, str(error))
if manifest and args.stop_at_step and args.stop_at_step < manifest["step"]:  # else nothing is trained, "stopped at"
    parser.error(f"--stop-at-step {args.stop_at_step} is before step {manifest['step']}, where {resume} is: give a "
                 "later step, or none.")
default_preset, default_kind, tokenizer_family = DEFAULTS[task]

# ----------------------------------------------------------------------------------------------- data
with main_process_first(accelerator):  # the main process fills the `datasets` cache, the others then read it
    raw, tokenizer_texts = load_run_data(parser, args)

# ----------------------------------------------------------------------------------------------- tokenizer
# A new run trains one once, by the main process; the other processes load its files, and it is written to
# OUTPUT_DIR/tokenizer once every check has passed (below). Every checkpoint carries the run's tokenizer (TOKENIZER/),
# and a resumed run takes it from there, never trains one again: WordPiece and Unigram training is not deterministic,
# so the vocabulary could change under the weights.
TOKENIZER = "tokenizer"
tokenizer_dir = output_dir / TOKENIZER
given = model_tokenizer(args.model) or args.tokenizer  # a folder that holds the tokenizer, among others


def resumed_tokenizer_folder(checkpoint: Path) -> Path | None:
    """The folder holding the tokenizer of the run `checkpoint` belongs to: the one the checkpoint carries, or for a
    checkpoint written before checkpoints carried one, its run folder's (RUN/tokenizer beside RUN/checkpoints).
    None when neither exists: the run was given --tokenizer or --model."""
    if (checkpoint / TOKENIZER).is_dir():
        return checkpoint / TOKENIZER
    run_tokenizer = checkpoint.parent.parent / TOKENIZER
    if checkpoint.parent.name == "checkpoints" and run_tokenizer.is_dir():
        accelerator.print(f"note: {checkpoint} carries no tokenizer (written before checkpoints carried one): using "
                          f"its run's, {run_tokenizer}")
        return run_tokenizer
    if not given:
        parser.error(f"{checkpoint} carries no tokenizer (written before checkpoints carried one) and its run folder "
                     "has none: pass the tokenizer it was trained with as --tokenizer.")
    accelerator.print(f"note: {checkpoint} carries no tokenizer (written before checkpoints carried one): using "
                      f"{given}")
    return None


def tokenizer_files(folder: Path | None) -> dict[str, bytes]:
    """The tokenizer's files as each checkpoint carries them ("tokenizer/NAME" -> bytes): those of `folder`, a
    tokenizer folder, byte for byte, or else `tokenizer` saved (--tokenizer and --model folders hold other files)."""
    with tempfile.TemporaryDirectory() as saved:
        if folder is None:
            tokenizer.save_pretrained(saved)
        return {f"{TOKENIZER}/{file.name}": file.read_bytes() for file in sorted(Path(folder or saved).iterdir())
                if file.is_file()}


def write_tokenizer_files(files: dict[str, bytes], folder: Path) -> None:
    """`tokenizer_files`' files into `folder`, made here if need be."""
    folder.mkdir(exist_ok=True)
    for name, content in files.items():
        (folder / Path(name).name).write_bytes(content)


def tokenizer_of(files: dict[str, bytes]):
    """The tokenizer of `tokenizer_files`' files."""
    with tempfile.TemporaryDirectory() as folder:
        write_tokenizer_files(files, Path(folder))
        return AutoTokenizer.from_pretrained(folder)


if resume:
    tokenizer_source = resumed_tokenizer_folder(Path(resume))
    tokenizer = load_run_tokenizer(parser, tokenizer_source or given, args.max_length)
    if tokenizer_source:  # else the tokenizer is the given one
        refuse_another_tokenizer(parser, given, tokenizer, resume, tokenizer_source)
else:
    tokenizer_source, problem = None, None
    if not given and accelerator.is_main_process:  # the main process trains it; the others load its files
        try:
            tokenizer = train_tokenizer(args.tokenizer_kind or default_kind, tokenizer_family,
                                        dataset=tokenizer_texts, vocab_size=args.vocab_size or TOKENIZER_VOCAB_SIZE,
                                        model_max_length=args.max_length)
        except ValueError as error:  # a --vocab-size below the alphabet of the text
            problem = str(error)
    fail_together(parser, accelerator, problem)  # the others stopped with a gloo traceback as the main one left
    if given:
        tokenizer = load_run_tokenizer(parser, given, args.max_length)
checkpoint_files = tokenizer_files(tokenizer_source) if accelerator.is_main_process else {}
trained = not resume and not given
if trained:  # its files reach the other processes from the main one's memory, not from OUTPUT_DIR/tokenizer (below)
    checkpoint_files = broadcast_object_list([checkpoint_files])[0]
    if not accelerator.is_main_process:
        tokenizer = tokenizer_of(checkpoint_files)
refuse_another_family(parser, tokenizer, task, tokenizer_source or given)
accelerator.print(f"data: {len(raw['train'])} training examples; tokenizer: {len(tokenizer)} tokens")

# ----------------------------------------------------------------------------------------------- model
set_seed(args.seed)  # the same initial weights in every process
if args.model:
    model, preset = training.load_to_train(AUTO_MODEL[task], args.model), None
else:
    overrides |= special_token_ids(tokenizer, tokenizer_family)
    overrides.setdefault("vocab_size", padded_vocab_size(tokenizer))  # a --set size is kept (check_model_fits)
    overrides.setdefault("max_position_embeddings", max(args.max_length, 64))
    preset = None if args.config else args.preset or default_preset
    config = AutoConfig.from_pretrained(args.config, **overrides) if args.config else get_preset(preset, **overrides)
    follow_the_tokenizer(config, dict(args.set))
    if args.config and (replaced := config_file_fields_replaced(args.config, config, dict(args.set))):
        accelerator.print(replaced)
    model = AUTO_MODEL[task].from_config(config)
check_model_fits(parser, model, tokenizer, args.max_length)
# The tokenizer's pad, bos and eos ids into the config and generation config, as Trainer does (`train`, `finetune`):
# the data is made with the tokenizer's, and a --model folder whose config says others was saved so, its `generate()`
# stopping at an eos the model never learnt, where `train` saved the tokenizer's with transformers' warning.
align_special_tokens(model, tokenizer)
training_data.keep_the_inputs_the_model_reads(tokenizer, model.config)
accelerator.print(f"model: {type(model).__name__}, {model.num_parameters() / 1e6:.2f}M parameters; "
                  f"{accelerator.num_processes} x {accelerator.distributed_type.value}, {accelerator.mixed_precision}")

masker = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15) if task == "masked-lm" else None
with accelerator.main_process_first():
    if task == "causal-lm":
        prepare, collate = training_data.pack_for_causal_lm, training_data.stack_blocks  # blocks with their labels
    elif task == "masked-lm":  # padded here, masked in the loop (see `masked_to_device`)
        prepare, collate = training_data.tokenize_for_mlm, DataCollatorWithPadding(tokenizer)
    else:
        prepare = functools.partial(training_data.tokenize_for_seq2seq, report=note)
        collate = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    datasets = {split: prepare(texts, tokenizer, args.max_length) for split, texts in raw.items()}
    kept = min(args.max_eval_samples or len(datasets["validation"]), len(datasets["validation"]))
    datasets["validation"] = datasets["validation"].select(range(kept))
    eval_collate = collate
    if masker is not None:  # masked once from the seed: the same tokens in any number of processes
        datasets["validation"] = training_data.mask_once(datasets["validation"], masker, args.seed)
        eval_collate = DataCollatorForTokenClassification(tokenizer)  # pads the labels with -100

# ----------------------------------------------------------------------------------------------- optimisation
optimizer = torch.optim.AdamW(training.weight_decay_groups(model, args.weight_decay), lr=args.learning_rate,
                              betas=tuple(args.adam_betas), eps=args.adam_epsilon)
warmup_steps = args.warmup_steps if args.warmup_steps is not None else max(1, args.max_steps // 20)
scheduler = get_scheduler(args.lr_scheduler, optimizer, num_warmup_steps=warmup_steps,
                          num_training_steps=args.max_steps)
# The loaders own a generator, so that starting an epoch never draws from the global RNG: dropout then uses it in step
# order only, and the RNG state a checkpoint saves is exactly what the next step needs.
loader, eval_loader = (DataLoader(datasets[split], batch_size=args.batch_size, shuffle=split == "train",
                                  drop_last=split == "train", collate_fn=collator, generator=torch.Generator())
                       for split, collator in (("train", collate), ("validation", eval_collate)))
if accelerator.distributed_type == DistributedType.FSDP:
    sharding.share_embedding_modules(model)
model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
accelerator.register_save_state_pre_hook(checkpointing.leave_out_tied_copies)  # a tied matrix is saved once, unwarned
loader, eval_loader = (accelerator.prepare_data_loader(d, device_placement=False) for d in (loader, eval_loader))
if len(loader) == 0:
    fail(parser, f"{len(datasets['train'])} training sequences do not fill one batch per process.")

layout = {key: getattr(args, key) for key in ("task", "batch_size", "gradient_accumulation_steps", "max_steps",
                                             "lr_scheduler", "max_length", "seed", "label_smoothing",
                                             "max_grad_norm")} | {
    "warmup_steps": warmup_steps, "num_processes": accelerator.num_processes, "data": data_settings(args),
    "mixed_precision": accelerator.mixed_precision}
history, start_step = [], 0


def regrouped_global_batch(then: dict, changed: dict) -> str:
    """Take the batch size and process count out of `changed` (setting -> (checkpoint's, now)) when the run splits
    the checkpoint's global batch over fewer processes (batch x processes the same), and say so; else "". The seedable
    sampler deals an epoch's batches to the processes in turn, so 1 process x batch 4 takes the sequences 2 x batch 2
    took, step for step across epoch ends, and each row's MLM masks come from its tokens: the steps are the
    uninterrupted run's but for dropout, whose masks each process draws from its own stream."""
    now = args.batch_size * accelerator.num_processes
    if "num_processes" not in changed or then.get("batch_size", 0) * then["num_processes"] != now:
        return ""
    changed.pop("batch_size", None)
    processes, _ = changed.pop("num_processes")
    return (f"its global batch of {now} sequences per micro-step, split over {processes} processes, now over "
            f"{accelerator.num_processes}: the same batches and steps, but for dropout (each process draws its own "
            "masks)")


if resume:
    problem = None  # each process loads its own random state
    try:
        # model (the same tensors), optimizer (the same settings), schedule, RNG
        checkpointing.load_checkpoint(accelerator, resume, model=model, optimizer=optimizer)
    except checkpointing.CheckpointError as error:
        problem = str(error)
    fail_together(parser, accelerator, problem)
    start_step = manifest["step"]
    history = [json.loads(line) for line in (Path(resume) / "loss_curve.jsonl").read_text().splitlines()]
    then = manifest["metadata"]  # an older checkpoint's records fewer settings: those are not compared
    changed = {key: (then[key], value) for key, value in layout.items()
               if key in then and then[key] != value}  # (checkpoint's, now)
    regrouped = regrouped_global_batch(then, changed)
    accelerator.print(f"resumed from {resume} at step {start_step}" + (f"; {regrouped}" if regrouped else "") + (
        f"; changed settings {changed} make the steps differ from an uninterrupted run" if changed else ""))
else:
    set_seed(args.seed, device_specific=True)  # dropout of its own in each process


def micro_batches(start: int):
    """This process's micro-batches from number `start` on, epoch after epoch. Epoch e's order depends on e alone,
    so a resumed run skips to its position (`skip_first_batches`, without loading the skipped data) and sees
    exactly the batches an uninterrupted run would."""
    epoch, skip = divmod(start, len(loader))
    while True:
        loader.set_epoch(epoch)
        yield from accelerator.skip_first_batches(loader, skip) if skip else loader
        epoch, skip = epoch + 1, 0


def to_device(batch: dict) -> dict:
    return {key: value.to(accelerator.device) for key, value in batch.items()}


def masked_to_device(batch: dict, step: int) -> dict:
    """A training batch of `step`, MLM-masked (80/10/10) each row from the seed, the step and its tokens
    (`training_data.mask_each_row`): a resumed run draws the masks the uninterrupted one drew, and any number of
    processes the masks of one process with their combined batch."""
    if masker is not None:
        batch = training_data.mask_training_rows(masker, batch, args.seed, step)
    return to_device(batch)


def without_repeats(batch: dict) -> dict:
    """The batch with the labels of repeated rows set to -100, so that they count in neither loss nor tokens. Under
    several processes Accelerate fills the last batch of each process to the same size with rows from the start of
    the data (`even_batches`: under FSDP every process must run every forward); `gather_for_metrics` drops those
    repeats from what it gathers, which tells each process which of its rows they are."""
    if accelerator.num_processes == 1:
        return batch
    rows = len(batch["labels"])
    positions = torch.arange(rows, device=accelerator.device) + accelerator.process_index * rows
    repeated = ~torch.isin(positions, accelerator.gather_for_metrics(positions))
    return batch | {"labels": batch["labels"].masked_fill(repeated[:, None], -100)}


def count_labels(labels: torch.Tensor) -> torch.Tensor:
    """Labelled tokens; the causal LM's first label is never predicted (labels shift inside the model)."""
    return (labels[:, 1:] if task == "causal-lm" else labels).ne(-100).sum()


def summed_loss(batch: dict, epsilon: float) -> torch.Tensor:
    """The loss summed over the batch's labelled tokens, label-smoothed when epsilon > 0."""
    if epsilon == 0:  # the model's own loss (sparse MLM prediction projects only the labelled positions)
        return model(**batch, num_items_in_batch=1).loss
    labels = batch.pop("labels")
    return training.label_smoothed_loss(model(**batch).logits, labels, epsilon, shift=task == "causal-lm",
                                        num_items_in_batch=1)


# ----------------------------------------------------------------------------------------------- training loop
training.keep_freed_memory()  # each step's tensors reused, not faulted in again (docs/nanogpt.md)
stop = min(args.max_steps, args.stop_at_step or args.max_steps)
save_steps = args.save_steps or max(1, args.max_steps // 4)
log_file = output_dir / "loss_curve.jsonl"
remove_the_earlier_run(parser, output_dir, args.overwrite_output_dir, accelerator.is_main_process,
                       tokenizer=given)
if accelerator.is_main_process:  # the log so far, as the checkpoint saw it
    with run_file_written(parser, "The run's tokenizer and loss log", output_dir):
        output_dir.mkdir(parents=True, exist_ok=True)
        # The tokenizer trained here, or a branch's (the other run's, as a run that trained one would leave it):
        # written once every check has passed, as the earlier run's checkpoints and tokenizer are removed (none of its
        # files left among this one's). Written as it was trained, a run then refused (the model's checks, too little
        # data) had replaced the earlier run's tokenizer, or left a folder that looked like an earlier run, and the
        # corrected command was refused over it. Written aside and put in place whole: killed between its files, it
        # held tokenizer.json alone, which the same command refused as an earlier run, and --tokenizer as no tokenizer.
        if trained or resume and not continues_run(resume, output_dir):
            written = checkpointing.folder_aside(tokenizer_dir)
            write_tokenizer_files(checkpoint_files, written)
            checkpointing.replace_folder(written, tokenizer_dir)
        log_file.write_text("".join(json.dumps(record) + "\n" for record in history))
stream = micro_batches(start_step * accumulation)
# Each checkpoint carries the model's config, which a resumed run's must equal (shapes alone let a changed activation
# pass: `checkpointing.check_same_config`).
config_json = accelerator.unwrap_model(model).config.to_json_string()
progress = tqdm(total=args.max_steps, initial=start_step, disable=not accelerator.is_main_process, desc="training")
model.train()
with training.Preemption() as preemption:  # a SIGTERM stops after the step under way, checkpointed
    for step in range(start_step + 1, stop + 1):
        batches = [masked_to_device(next(stream), step) for _ in range(accumulation)]
        # Labelled tokens in the whole global batch (all micro-steps, all processes), as Trainer's num_items_in_batch.
        labelled = accelerator.reduce(sum(count_labels(batch["labels"]) for batch in batches), "sum")
        # The loss's divisor: a step with none (a masked LM that masked no token) has a loss of 0, not 0 / 0. The log
        # records the count itself: it said 1 there.
        num_items = labelled.clamp(min=1)
        step_loss = torch.zeros((), device=accelerator.device)
        for batch in batches:
            with accelerator.accumulate(model):
                loss = summed_loss(batch, args.label_smoothing) / num_items
                # `backward` divides by the accumulation steps and DDP averages over processes: undo both, so that the
                # gradient is that of the mean loss over the global batch's tokens.
                accelerator.backward(loss * accumulation * accelerator.num_processes)
                step_loss += loss.detach()
        assert accelerator.sync_gradients, "the last micro-step must synchronise the gradients"
        # The norm before clipping; without clipping (--max-grad-norm 0) the norm alone, as Trainer logs it (the log
        # said null there, and a step's inf gradient was caught only by the next step's nan loss).
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm or float("inf"))
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        if not accelerator.optimizer_step_was_skipped:  # fp16: the GradScaler skips steps with inf/nan gradients
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        # The step's loss summed over the processes, and whether any caught a SIGTERM, in one reduction (the log's): a
        # launcher's SIGTERM reaches the processes at different steps, and all stop after the same one.
        requested = torch.tensor(float(preemption.requested), device=accelerator.device)
        loss, preempted = accelerator.reduce(torch.stack([step_loss, requested]), "sum").tolist()
        record = {"step": step, "loss": loss, "lr": lr, "tokens": labelled.item(), "grad_norm": float(grad_norm)}
        history.append(record)
        if accelerator.is_main_process:
            with run_file_written(parser, "The loss log", output_dir), log_file.open("a") as log:
                log.write(json.dumps(record) + "\n")
        progress.update(1)
        progress.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{lr:.2e}")
        try:  # a nan loss, nan weights or a checkpoint not written (a full disk): say so, without a traceback
            # Read for the log already, the same in every process: nan or inf stops the run before it saves the weights
            checkpointing.check_step_finite(step, {"loss": record["loss"], "gradient norm": record["grad_norm"]},
                                            lambda: accelerator.optimizer_step_was_skipped, checkpoints)
            if step % save_steps == 0 or step == stop or preempted:
                checkpointing.check_weights_finite(model, step, checkpoints)
                extra_files = {"loss_curve.jsonl": log_file.read_text(), "config.json": config_json,
                               **checkpoint_files} if accelerator.is_main_process else None
                checkpointing.save_checkpoint(accelerator, checkpoints, step, metadata=layout,
                                              keep=args.keep_checkpoints, extra_files=extra_files)
        except checkpointing.CheckpointError as error:
            fail_with(parser, error)
        if preempted:
            preemption.stopped_at = step
            break
progress.close()
if (step := preemption.stopped_at) is not None:
    stop_after_sigterm(accelerator, step, args.max_steps, checkpointing.checkpoint_path(checkpoints, step))
if stop < args.max_steps:
    accelerator.print(f"stopped after step {stop} of {args.max_steps}; continue with --resume")
    accelerator.end_training()
    raise SystemExit(0)

# ----------------------------------------------------------------------------------------------- evaluation
steps_trained = max(start_step, stop)  # a checkpoint past --max-steps is resumed as it is: no step taken
model.eval()
total = torch.zeros(2, device=accelerator.device)  # summed loss, labelled tokens
with torch.no_grad():
    for batch in map(without_repeats, map(to_device, eval_loader)):
        total += torch.stack([summed_loss(batch, 0.0).float(), count_labels(batch["labels"]).float()])
total = accelerator.reduce(total, "sum")
results = {"eval_loss": (total[0] / total[1]).item()} if total[1] else {}  # none without validation data
if results and task == "causal-lm":
    results["perplexity"] = evaluation.perplexity(results["eval_loss"])
if results:
    accelerator.print("evaluation: " + ", ".join(f"{key} {value:.4f}" for key, value in results.items()))
else:  # a masked LM's validation text too short for a mask to fall in it: this said "evaluation: ", and nothing more
    accelerator.print(f"evaluation: no token of the {len(datasets['validation'])} validation sequences was masked; "
                      "no loss to report (give more validation text)")

# ----------------------------------------------------------------------------------------------- final model
# Written aside and put in place complete: a kill leaves the earlier model folder, the new one, or none.
folder = output_dir / "model"
written = checkpointing.folder_aside(folder, accelerator.is_main_process)  # only the main process writes there
state_dict = accelerator.get_state_dict(model)  # every process takes part (FSDP gathers the shards)
if accelerator.distributed_type == DistributedType.FSDP:
    state_dict = sharding.tie_state_dict(state_dict, model)
if accelerator.is_main_process:
    with model_folder_written(parser, folder):
        # Not in the other processes: save_pretrained makes and lists the folder there too, racing the main process,
        # which renames it (a FileNotFoundError in one, and the launcher then kills the main one while it writes).
        with sharding.own_class(accelerator.unwrap_model(model)) as unwrapped:
            unwrapped.save_pretrained(written, save_function=accelerator.save, state_dict=state_dict)
        tokenizer.save_pretrained(written)
        history.append({"step": steps_trained, **results})
        training.plot_loss_curve(history, written / "loss_curve.png", title=f"{preset or 'model'} {task} (Accelerate)")
        files = run_data_files(args)
        dataset = run_data_name(args, files)
        unwrapped = accelerator.unwrap_model(model)
        hyperparameters = {"max_steps": args.max_steps, "steps_trained": steps_trained,
                           "global_batch_size": args.batch_size * accumulation * accelerator.num_processes,
                           "learning_rate": args.learning_rate, "lr_scheduler": args.lr_scheduler,
                           "warmup_steps": warmup_steps, "adam_betas": tuple(args.adam_betas),
                           **{key: getattr(args, key) for key in ("adam_epsilon", "weight_decay", "label_smoothing",
                                                                  "max_grad_norm")},
                           "mixed_precision": accelerator.mixed_precision,
                           "eval_sequences": len(datasets["validation"])}  # all, or the first --max-eval-samples
        hub.write_model_card(written, task=task,
                             model_name=args.model_name or hub.default_repo_name(preset or "scratch", dataset),
                             preset=preset, config=unwrapped.config.to_dict(),
                             num_parameters=unwrapped.num_parameters(),
                             dataset=dataset, dataset_on_hub=run_data_on_hub(args, files),
                             tokenizer_description=f"{type(tokenizer).__name__}, {len(tokenizer)} tokens",
                             hyperparameters=hyperparameters, eval_results=results)
        checkpointing.replace_folder(written, folder)
    accelerator.print(f"saved {folder}")
# The others wait until the main process has written the model: when one process of a run fails, the launcher kills
# the rest, and one that aborted in its own teardown (seen once, gloo's "terminate called without an active
# exception") took the folder the main process was still writing with it.
accelerator.wait_for_everyone()
accelerator.end_training()
