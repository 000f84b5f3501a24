"""`Trainer` with crash-safe checkpoints (`CrashSafeCheckpoints`, a mixin for `Trainer` classes): its checkpoints
written aside and committed as Accelerate's are (`checkpointing.commit_checkpoint`), `--resume` taking the newest
that verifies, and what Trainer gets wrong on resume checked (another model, config, head or labels; the optimizer's
settings; a missing random state; the loss since the last log). No model file imports this module. docs/checkpoints.md.
"""

import json
import os
from pathlib import Path

import torch
from torch.distributed.fsdp import register_fsdp_forward_method
from transformers import Seq2SeqTrainer, Trainer, TrainerCallback, TrainerState
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_pt_utils import nested_gather
from transformers.trainer_utils import TrainOutput

from .checkpointing import (
    LOSS_WINDOW,
    PARTIAL_SUFFIX,
    TRAINER_PREFIX,
    CheckpointError,
    check_loaded_weights_finite,
    check_loop,
    check_same_config,
    check_same_optimizer,
    check_same_tensors,
    check_sharding,
    check_step_finite,
    check_weights_finite,
    checkpoint_config,
    checkpoint_path,
    checkpoint_to_resume,
    commit_checkpoint,
    optimizer_settings,
    remove_leftovers,
    reported_as_not_written,
    tied_copies,
    verify_checkpoint,
)


class CrashSafeCheckpoints:
    """Mix into a `Trainer` class (`class MyTrainer(CrashSafeCheckpoints, Trainer)`): its checkpoints are
    written aside and committed like Accelerate's (`commit_checkpoint`), `train(resume_from_checkpoint=True)` takes
    the newest `checkpoint-N` that verifies, and a missing or unloadable RNG state is an error (Trainer logs it at
    INFO and carries on with another random stream). The optimizer and scheduler files are checked by the
    manifest: a checkpoint lacking one does not verify.

    A checkpoint also keeps the training loss summed since the last log (`LOSS_WINDOW`), which Trainer starts
    again from zero when it resumes: with it, the resumed run logs the same losses as the uninterrupted one, also
    when the checkpoint falls between two logs (a `--max-minutes` stop). Its manifest records the arguments that
    shape the steps (`STEP_SETTINGS`, and the command's own `step_settings`): a run resumed with others is told
    which, as the Accelerate loop tells it."""

    # Taken from the resuming command, not the checkpoint: other values change the steps (the schedule is rebuilt
    # from the resumed step; another batch or seed draws other batches; clipping and precision), which Trainer did
    # without a word. The optimizer's own settings (learning rate, betas, epsilon, weight decay) must match: refused.
    STEP_SETTINGS = ("max_steps", "lr_scheduler_type", "warmup_steps", "per_device_train_batch_size",
                     "gradient_accumulation_steps", "seed", "max_grad_norm", "bf16")
    _staging_dir: Path | None = None
    _resumed_loss_window: dict | None = None

    def __init__(self, *args, step_settings: dict | None = None, **kwargs):
        """`step_settings`: the command's own settings that shape the steps as well (--max-length, the data),
        recorded and compared with `STEP_SETTINGS`."""
        model = kwargs.get("model", args[0] if args else None)
        self._model_use_cache = getattr(getattr(model, "config", None), "use_cache", None)  # before Trainer's switch
        super().__init__(*args, **kwargs)
        self._own_step_settings = step_settings or {}
        self.add_callback(_RestoreLossWindow(self))

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        # Trainer switches the model's cache off for training (`TrainingArguments.use_cache`, False since transformers
        # 5), and every folder it saved kept the switch: a trained model returned no cache from a plain forward,
        # transformers' ExecuTorch wrapper refused it, and `convert` carried it on. Saved with the model's own value.
        config = getattr(self.model, "config", None)
        if config is None or self._model_use_cache is None:
            return super().save_model(output_dir, _internal_call)
        training_value, config.use_cache = config.use_cache, self._model_use_cache
        try:
            super().save_model(output_dir, _internal_call)
        finally:
            config.use_cache = training_value

    def _get_output_dir(self, trial) -> str:
        # While a checkpoint is saved, Trainer writes `<staging>/checkpoint-N` and rotates inside <staging>.
        return str(self._staging_dir) if self._staging_dir is not None else super()._get_output_dir(trial)

    def _maybe_log_save_evaluate(self, tr_loss, grad_norm, model, trial, *args, **kwargs) -> None:
        # After each optimizer step, before its log and save. Its gradient norm, the same in every process, is nan or
        # inf whenever a loss of the step is (which Trainer's log leaves out, `logging_nan_inf_filter`). Read at every
        # step where that is free; on a GPU at the steps that log or save, which wait for the step anyway (Trainer
        # keeps its other steps free of such waits), and the weights are checked before every save.
        on_accelerator = isinstance(grad_norm, torch.Tensor) and grad_norm.device.type != "cpu"
        if not on_accelerator or self.control.should_log or self.control.should_save:
            check_step_finite(self.state.global_step, {"gradient norm": grad_norm},
                              lambda: self.accelerator.optimizer_step_was_skipped, self._get_output_dir(trial),
                              TRAINER_PREFIX)
        super()._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, *args, **kwargs)

    def _save_checkpoint(self, model, trial) -> None:
        step = self.state.global_step
        check_weights_finite(self.model, step, self._get_output_dir(trial), TRAINER_PREFIX)
        final = checkpoint_path(self._get_output_dir(trial), step, TRAINER_PREFIX)
        staging = final.with_name(final.name + PARTIAL_SUFFIX)
        if self.args.should_save:
            with reported_as_not_written(final):  # a new folder fails on a full disk too (ext4 gives it a block)
                remove_leftovers(final.parent)
                staging.mkdir(parents=True)
        self.accelerator.wait_for_everyone()
        self._staging_dir = staging
        try:
            with reported_as_not_written(final):
                super()._save_checkpoint(model, trial)
        finally:
            self._staging_dir = None
        # The mean over processes: each adds its own losses to it, and the log takes the mean again.
        window = {"loss": nested_gather(self._tr_loss, self.args.parallel_mode).mean().item(),
                  "last_logged_step": self._globalstep_last_logged}
        self.accelerator.wait_for_everyone()  # every process's RNG state is on disk
        staged = staging / final.name
        best_is_new = self.state.best_model_checkpoint == str(staged)
        if best_is_new:  # every process: each loads the best model at the end, from its final name
            self.state.best_model_checkpoint = str(final)
        if self.args.should_save:
            with reported_as_not_written(final):
                (staged / LOSS_WINDOW).write_text(json.dumps(window), encoding="utf-8")
                if best_is_new:  # the state it saved named the staging folder, which a resumed run would drop
                    self.state.save_to_json(str(staged / TRAINER_STATE_NAME))
                # Trainer keeps the best checkpoint past save_total_limit, to load it at the end: so does the prune.
                commit_checkpoint(staged, final, step, self._step_settings(), keep=self.args.save_total_limit,
                                  protect=self.state.best_model_checkpoint)
            staging.rmdir()
        self.accelerator.wait_for_everyone()

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        if resume_from_checkpoint is True:
            folder = self._get_output_dir(None)
            report = print if self.is_world_process_zero() else None
            resume_from_checkpoint = checkpoint_to_resume(folder, TRAINER_PREFIX, report)
        if resume_from_checkpoint:
            manifest = verify_checkpoint(resume_from_checkpoint)
            then = manifest["metadata"]  # an older checkpoint's: none
            check_loop(resume_from_checkpoint, TRAINER_PREFIX)
            check_sharding(resume_from_checkpoint, self.is_fsdp_enabled,
                           self.accelerator.state.fsdp_plugin.state_dict_type if self.is_fsdp_enabled else None)
            finished = self._finished_state(resume_from_checkpoint)
            if finished is None:  # a run with steps left needs every process's random state: said before any work
                self._check_random_states(resume_from_checkpoint)
            if self.is_world_process_zero():
                changed = {key: (then[key], now) for key, now in self._step_settings().items()
                           if key in then and then[key] != now}  # (checkpoint's, now)
                print(f"resuming from {resume_from_checkpoint}" + (f"; changed settings {changed} make the steps "
                      "differ from an uninterrupted run" if changed else "") + (
                      " (written before checkpoints had a manifest: taken whole, as it holds every file Trainer "
                      "writes, trainer_state.json last)" if manifest["format"] == 0 else ""))
            resume_from_checkpoint = str(resume_from_checkpoint)
            if finished is not None:
                return self._finished_run(resume_from_checkpoint, finished)
            window = Path(resume_from_checkpoint) / LOSS_WINDOW
            self._resumed_loss_window = json.loads(window.read_text(encoding="utf-8")) if window.is_file() else None
        return super().train(resume_from_checkpoint=resume_from_checkpoint or None, **kwargs)

    def _step_settings(self) -> dict:
        settings = {key: getattr(self.args, key) for key in self.STEP_SETTINGS} | self._own_step_settings
        return {key: json.loads(json.dumps(value, default=str)) for key, value in settings.items()}

    def _finished_state(self, checkpoint: str) -> TrainerState | None:
        """The checkpoint's state if it is at or past `max_steps`, else None. Trainer tests `max_steps` only after a
        step, so resuming such a checkpoint would train one step more and save a checkpoint beyond the run's end."""
        state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME))
        return state if 0 < self.args.max_steps <= state.global_step else None

    def _finished_run(self, checkpoint: str, state: TrainerState) -> TrainOutput:
        """A run with nothing left to train: the checkpoint's weights and state are loaded, as resuming would, and no
        step is taken."""
        if self.is_world_process_zero():
            print(f"{Path(checkpoint).name} is at step {state.global_step}, --max-steps {self.args.max_steps}: "
                  "nothing left to train")
        if self.is_fsdp_enabled:
            # FSDP2 shards a model only together with its optimizer (evaluating the model alone, Accelerate refuses
            # it): the model is sharded as `train` shards it, then the sharded checkpoint is loaded into it.
            self.create_optimizer()
            self.model, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)
            self.model_wrapped = self.model
            # As `train` does: `generate` runs as a forward of the root unit. Without it a seq2seq evaluation's
            # first forward was the encoder's, which FSDP2 refuses ("requires a single root module").
            register_fsdp_forward_method(self.model, "generate")
        self._load_from_checkpoint(checkpoint, self.model_wrapped if self.is_fsdp_enabled else None)
        self.state = state
        return TrainOutput(state.global_step, float("nan"), {})  # no loss: this call trained nothing

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        # Trainer loads weights non-strictly (a tied head is not saved): a checkpoint of another model would fail
        # with a traceback about sizes, or, of the same sizes with other tensors, leave them at their initialisation.
        _check_same_class(resume_from_checkpoint, self.model if model is None else model)
        check_same_tensors(resume_from_checkpoint, self.model if model is None else model)
        check_same_config(resume_from_checkpoint, self.model if model is None else model)
        _check_same_labels(resume_from_checkpoint, self.model if model is None else model)
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        check_loaded_weights_finite(self.model if model is None else model, resume_from_checkpoint)

    def _issue_warnings_after_load(self, load_result) -> None:
        # Trainer warned "There were missing keys in the checkpoint model loaded: ['lm_head.weight']" on every resume
        # of a tied model (native ones alike), which reads as lost weights: a tied copy is not missing.
        still_tied = tied_copies(self.model)
        missing = [name for name in load_result.missing_keys if name not in still_tied]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        settings = optimizer_settings(self.optimizer) if checkpoint is not None else None
        super()._load_optimizer_and_scheduler(checkpoint)
        if settings is not None:
            check_same_optimizer(checkpoint, settings, self.optimizer)

    def _random_state_names(self) -> list[str]:
        """The random state file of each process, as Trainer names them."""
        if self.args.world_size == 1:
            return ["rng_state.pth"]
        return [f"rng_state_{process}.pth" for process in range(self.args.world_size)]

    def _check_random_states(self, checkpoint: str) -> None:
        # Every process checks the files of all, so that all stop together, none waits for another that stopped.
        missing = [name for name in self._random_state_names() if not (Path(checkpoint) / name).is_file()]
        if missing:
            raise CheckpointError(f"Checkpoint {checkpoint} has no random state {missing[0]}: it was saved by another "
                                  "number of processes, or the file was removed.")

    def _load_rng_state(self, checkpoint: str | None) -> None:
        if checkpoint is None:
            return
        name = self._random_state_names()[self.args.process_index]
        try:
            super()._load_rng_state(checkpoint)
        except Exception as error:
            raise CheckpointError(f"Checkpoint {checkpoint}: the random state {name} cannot be loaded ({error}).") \
                from error


class _RestoreLossWindow(TrainerCallback):
    """Puts a resumed checkpoint's loss window back once Trainer has reset its own, before the first step."""

    def __init__(self, trainer: CrashSafeCheckpoints):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        window, self.trainer._resumed_loss_window = self.trainer._resumed_loss_window, None
        if window is not None:
            self.trainer._tr_loss += window["loss"]
            self.trainer._globalstep_last_logged = window["last_logged_step"]


def _check_same_class(checkpoint: str, model) -> None:
    """A Trainer checkpoint must hold a model of `model`'s class, which `save_pretrained` records in its config's
    `architectures`; else `CheckpointError` naming both. A text classifier's checkpoint resumed by a token
    classification run (`finetune --task`) of as many labels has the same tensors, and its head, trained on one
    vector per text, went on as the head of every word without a word."""
    saved_config = checkpoint_config(checkpoint, model)
    saved = (saved_config.architectures or [None])[0] if saved_config is not None else None
    if saved is not None and saved not in {cls.__name__ for cls in type(model).__mro__}:  # FSDP2: a subclass of it
        raise CheckpointError(
            f"Checkpoint {checkpoint} holds a {saved}; this run trains a {type(model).__name__.removeprefix('FSDP')}. "
            "Resume with the run's own task, or start a new run in another output folder."
        )


def _check_same_labels(checkpoint: str, model) -> None:
    """A classifier's checkpoint must have been trained for the labels of `model`, in the same order of ids; else
    `CheckpointError` naming both. Its head has one row per class: loaded under other names (or the same names in
    another order), of the same number, it would predict the class each row was trained for under another name."""
    saved_config = checkpoint_config(checkpoint, model)
    if saved_config is None:
        return
    saved = [label for _, label in sorted(saved_config.id2label.items())]
    labels = [label for _, label in sorted(model.config.id2label.items())]
    if saved != labels:
        raise CheckpointError(
            f"Checkpoint {checkpoint} was trained for the labels {saved} (by id); this run's are {labels}, which its "
            "classification head would predict under the wrong names. Resume with the run's own data, or start a "
            "new run in another output folder."
        )


class CrashSafeTrainer(CrashSafeCheckpoints, Trainer):
    """`Trainer` with crash-safe checkpoints."""


class CrashSafeSeq2SeqTrainer(CrashSafeCheckpoints, Seq2SeqTrainer):
    """`Seq2SeqTrainer` with crash-safe checkpoints."""
