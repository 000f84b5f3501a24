"""What the training scripts share beyond data (`training_data`), precision (`mixed_precision`) and evaluation
(`evaluation`): loading a model to train, the label-smoothed loss, masked-LM masks drawn per step, stopping on a time
budget or a SIGTERM, and the loss-curve plot. No model file imports this module (it never travels to the Hub).
"""

import copy
import ctypes
import itertools
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import torch
from accelerate.utils import reduce
from torch.nn import functional as F
from transformers import DataCollatorForTokenClassification, DataCollatorWithPadding, TrainerCallback

from hf_scratch_transformer import training_data
from hf_scratch_transformer.scratch_loss import cross_entropy

TASKS = ("causal-lm", "masked-lm", "seq2seq")

# ---------------------------------------------------------------------------------------------- model


def load_to_train(model_class, folder, **kwargs):
    """`model_class.from_pretrained(folder, **kwargs)` in float32, whatever dtype the folder was saved in.
    transformers 5 loads a folder in its own dtype (`dtype="auto"`): a bf16 folder (`hf-scratch convert` of a bf16
    Llama writes one) trained in bf16, where AdamW at a learning rate of 1e-5 left 84% of a tiny model's weights as
    they were after 5 steps (fp16 alike, with fp16's overflow besides). Weights and optimizer state train in
    float32, as with --bf16 autocast (docs/training.md), and the trained folder is saved in float32."""
    return model_class.from_pretrained(folder, dtype=torch.float32, **kwargs)


def head_on(head_class, base, **settings):
    """`head_class` (an Auto class with a task's head: `AutoModelForSequenceClassification`) built on the weights of
    `base`, a model in memory, with the config `settings` (`num_labels`, ...), as `load_to_train` loads it from `base`
    saved: float32, the head new unless `base` has it. Nothing is written (the Auto class itself needs a folder)."""
    config = copy.deepcopy(base.config)
    config.update(settings)
    return load_to_train(head_class._model_mapping[type(config)], None, config=config, state_dict=base.state_dict())


# ---------------------------------------------------------------------------------------------- loss


def next_token_labels(labels: torch.Tensor) -> torch.Tensor:
    """A causal LM's labels are its inputs: position t predicts label t + 1, the last position nothing (-100), as
    transformers' `ForCausalLMLoss` shifts them. (batch, length) -> (batch, length)."""
    return F.pad(labels, (0, 1), value=-100)[..., 1:]


def label_smoothed_loss(logits: torch.Tensor, labels: torch.Tensor, epsilon: float, shift: bool,
                        num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
    """Cross-entropy with label smoothing `epsilon` (Szegedy et al., 2016), -100 ignored. `shift=True` for the
    causal LM, whose labels are its inputs: position t predicts label t + 1. Divided by `num_items_in_batch` when
    given (gradient accumulation counts the whole accumulated batch), else by the number of labelled tokens. On CPU
    through `scratch_loss.cross_entropy`, whose backward costs a fraction of `F.cross_entropy`'s."""
    if shift:
        labels = next_token_labels(labels)
    labels = labels.reshape(-1).to(logits.device)
    total = cross_entropy(logits.reshape(labels.shape[0], -1), labels, reduction="sum", label_smoothing=epsilon)
    count = num_items_in_batch if num_items_in_batch is not None else (labels != -100).sum()
    return total / count


def smoothed_loss_function(task: str, epsilon: float) -> Callable:
    """A `Trainer(compute_loss_func=...)` applying `label_smoothed_loss` the right way for `task`. Unlike Trainer's
    own `label_smoothing_factor`, smoothing is the training objective only: evaluation (run without gradients) gets
    the plain cross-entropy, so that the validation loss, the perplexity taken from it and the card's figures are the
    model's own, not the smoothed objective."""

    def compute_loss(outputs, labels, num_items_in_batch=None):
        smoothing = epsilon if torch.is_grad_enabled() else 0.0
        return label_smoothed_loss(outputs.logits, labels, smoothing, shift=task == "causal-lm",
                                   num_items_in_batch=num_items_in_batch)

    return compute_loss


def weight_decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW's parameter groups: weight decay on matrices and embeddings, none on biases and norms (nanoGPT's rule
    by shape). For every preset these are the tensors Trainer's `get_decay_parameter_names` picks by name
    (tests/test_trainer.py), so that `train` and `train-accelerate` optimise alike."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in parameters if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0}]


# ---------------------------------------------------------------------------------------------- memory

# glibc's mallopt parameters (malloc.h) and the largest mmap threshold it takes on 64-bit systems (32 MiB)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep the memory a training step frees for the next step (our training commands call this
    once). A step frees its activations and gradients and allocates them again. By default malloc gives the free
    memory at the top of its heap back to the system once more than its trim threshold is free there, a threshold
    it sets to twice the largest block it has unmapped (a few MiB), so the next step faults every page in again:
    about 1,100 minor page faults a step at nanoGPT's size (4 x 128, 12 x 64 tokens, 2 faults with this) on a
    2-core AVX2 AMD EPYC VM, where a fault is dear (docs/nanogpt.md). Blocks up to 32 MiB now come from the heap and
    up to 256 MiB of free heap is kept; larger ones are mapped and unmapped as before. True where it took effect:
    glibc only (Linux), elsewhere nothing changes."""
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # glibc's own symbol: musl's mallopt ignores these parameters
        return False
    return libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1


# ---------------------------------------------------------------------------------------------- Trainer's step


class ParametersCountedOnce:
    """`Trainer` mixin: the FLOP estimate of each step (`total_flos`, 6 x input tokens x non-embedding parameters, as
    Trainer's `floating_point_ops`) from the model's parameters counted once, not at every step: `num_parameters`
    walks every module and parameter, 0.4-0.5 ms of a 60 ms step at nanoGPT's size (4 x 128, 12 x 64 tokens, a 2-core
    AVX2 EPYC; docs/nanogpt.md). Counted again if the Trainer's model is another object."""

    def floating_point_ops(self, inputs: dict) -> int:
        main_input = getattr(self.model, "main_input_name", "input_ids")
        if main_input not in inputs or not hasattr(self.model, "num_parameters"):
            return super().floating_point_ops(inputs)
        counted = getattr(self, "_counted_parameters", None)
        if counted is None or counted[0] is not self.model:
            counted = self._counted_parameters = (self.model, self.model.num_parameters(exclude_embeddings=True))
        return 6 * inputs[main_input].numel() * counted[1]


# ---------------------------------------------------------------------------------------------- masked-LM batches


class MasksOfEachStep:
    """`Trainer` mixin for masked-LM training with `DataCollatorForLanguageModeling`: the masks of a training batch
    are drawn as its step takes it (`get_batch_samples`), each row's from a generator seeded with the run's seed, the
    step and the row's tokens (`training_data.mask_each_row`), not from the global RNG as the DataLoader collates it.
    Accelerate's DataLoader fetches one batch ahead, and a resumed Trainer restores the global RNG only after taking
    its first step's batches: either way a resumed run drew other masks than the uninterrupted one (its losses left
    the uninterrupted run's at the first step after the checkpoint). Seeded per batch and process, two processes of
    batch 2 masked other tokens than one process of batch 4; per row, they mask the same. An evaluated (or
    `predict`ed) dataset is masked once per sequence from the run's seed (`training_data.mask_once`, unless it comes
    with its `labels` so masked, as `hf-scratch train` masks its validation set once): every evaluation masks the
    same tokens in any number of processes, so that two of them differ by the weights only (from the global RNG, the
    final evaluation of a run's last weights gave another loss than the evaluation of the same weights at its last
    step)."""

    def get_train_dataloader(self):
        masking = self.data_collator  # the DataLoader pads only; `get_batch_samples` masks
        self.data_collator = DataCollatorWithPadding(masking.tokenizer, pad_to_multiple_of=masking.pad_to_multiple_of)
        try:
            return super().get_train_dataloader()
        finally:
            self.data_collator = masking

    def get_eval_dataloader(self, eval_dataset=None):
        if eval_dataset is None or isinstance(eval_dataset, str):  # Trainer's, or one of its dict of datasets
            eval_dataset = self.eval_dataset if eval_dataset is None else self.eval_dataset[eval_dataset]
        return self._masked_from_the_seed(super().get_eval_dataloader, eval_dataset)

    def get_test_dataloader(self, test_dataset):
        return self._masked_from_the_seed(super().get_test_dataloader, test_dataset)

    def _masked_from_the_seed(self, get_dataloader, dataset):
        masking = self.data_collator
        self.data_collator = DataCollatorForTokenClassification(  # pads the labels mask_once drew with -100
            masking.tokenizer, pad_to_multiple_of=masking.pad_to_multiple_of)
        try:
            if "labels" not in dataset.column_names:  # not masked yet
                dataset = training_data.mask_once(dataset, masking, self.args.seed)
            return get_dataloader(dataset)
        finally:
            self.data_collator = masking

    def get_batch_samples(self, epoch_iterator, num_batches: int, device: torch.device):
        batches = (self._masked(batch) for batch in itertools.islice(epoch_iterator, num_batches))
        return super().get_batch_samples(batches, num_batches, device)

    def _masked(self, batch: dict) -> dict:
        """The batch with its masks drawn, on the CPU as the collator draws them (the same masks on any device)."""
        step, device = self.state.global_step + 1, batch["input_ids"].device  # the step that trains on the batch
        masked = training_data.mask_training_rows(self.data_collator,
                                                  {name: value.cpu() for name, value in batch.items()},
                                                  self.args.seed, step)
        return {name: value.to(device) for name, value in masked.items()}


# ---------------------------------------------------------------------------------------------- stopping


class Preemption:
    """SIGTERM as a request to stop after the optimizer step under way, with a checkpoint of that step: what job
    schedulers (SLURM, Kubernetes, spot instances) send before they kill a job after a grace period, and torchrun
    forwards to every process. Only around the training steps (`with Preemption() as preemption:`): the handler
    sets `requested`, which the loop reads after each step, every process agreeing (`StopAfterStep`, the Accelerate
    loop's loss reduction); the loop then saves, sets `stopped_at` and stops. Further SIGTERMs change nothing (SLURM
    signals every process of a job step, and torchrun forwards its own: a worker gets two); SIGKILL and Ctrl-C still
    end the run at once, a save included, which leaves that checkpoint incomplete, passed over by --resume.
    Elsewhere SIGTERM ends the process at once, as it always did: before training (data, tokenizer work), and in
    the final evaluation and model folder, which a short grace period would not see through."""

    def __init__(self):
        self.requested, self.stopped_at, self._before = False, None, None

    def __enter__(self):
        self._before = signal.signal(signal.SIGTERM, self._request)
        return self

    def _request(self, signum, frame) -> None:
        self.requested = True

    def __exit__(self, error_type, *rest) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if self._before is None else self._before)  # None: set in C
        if self.requested and self.stopped_at is None and error_type is None:
            # It came after the last step's check (during the last checkpoint): the process ends now, as it did.
            os.kill(os.getpid(), signal.SIGTERM)


class StopAfterStep(TrainerCallback):
    """Stop `Trainer` after an optimizer step, with a checkpoint of that step, once `seconds` of training have passed
    (a time budget: the run then evaluates and saves its model as at its last step, and `--resume` continues the
    schedule to `max_steps`; a budget in time as well as in steps keeps a run's length the same on slow machines),
    or once `preemption` caught a SIGTERM (also after the last step: the command then ends without its evaluation
    and model folder, `Preemption`). Both are checked after each optimizer step; `stopped_at` is the step."""

    def __init__(self, seconds: float | None = None, preemption: Preemption | None = None):
        self.seconds, self.preemption, self.start, self.stopped_at = seconds, preemption, None, None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        over = self.seconds is not None and time.monotonic() - self.start > self.seconds
        preempted = self.preemption is not None and self.preemption.requested
        if args.world_size > 1:
            # Every process stops after the same step: one that stopped alone left the others waiting in the next
            # step's gradient exchange for it, for good. The clocks cross the budget, and a SIGTERM reaches the
            # processes, at different steps. One two-number reduction per step, for both. (In one process, no
            # tensor: making one and reading it back cost 75 us a step, 0.1% at nanoGPT's size.)
            flags = torch.tensor([over, preempted], dtype=torch.float, device=args.device)
            over, preempted = reduce(flags, "max").tolist()
        if preempted:
            self.preemption.stopped_at = state.global_step
        if preempted or (over and state.global_step < state.max_steps):
            control.should_training_stop = control.should_save = True
            self.stopped_at = state.global_step

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.stopped_at == state.global_step:  # saved; an epoch strategy would evaluate it and save it again
            control.should_evaluate = control.should_save = False


# ---------------------------------------------------------------------------------------------- plot


def plot_loss_curve(log_history: list[dict], path: Path, title: str = "") -> Path:
    """Training loss per logged step, and evaluation loss where evaluated, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    from matplotlib import pyplot as plt

    train = [(e["step"], e["loss"]) for e in log_history if "loss" in e]
    evaluation = [(e["step"], e["eval_loss"]) for e in log_history if "eval_loss" in e]
    figure, axis = plt.subplots(figsize=(7, 4))
    for points, label, style in ((train, "training loss", "-"), (evaluation, "validation loss", "o-")):
        if points:
            axis.plot(*zip(*points, strict=True), style, label=label)
    axis.set_xlabel("optimizer step")
    axis.set_ylabel("loss")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
