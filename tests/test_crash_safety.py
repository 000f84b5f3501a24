"""Runs that survive crashes and mistakes, on both entry points (`hf-scratch train` on Trainer, `hf-scratch
train-accelerate`): a tiny run killed with SIGKILL again and again (inside a save, before its commit, inside a
deletion, between steps), each time resumed, ends bit for bit as the uninterrupted run; leftovers never block a
save; corrupt or unloadable state is an error naming the file; an earlier run is never replaced unless asked."""

import errno
import json
import multiprocessing
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from forked_python import run_python
from full_disk import fail_as_on_a_full_disk
from safetensors.torch import load_file, save_file
from test_accelerate import two_cpu_processes
from tiny_models import tiny_lm
from tiny_tokenizers import wordpiece, write_run_corpus
from transformers import TrainerControl, TrainingArguments
from transformers.testing_utils import CaptureLogger
from transformers.trainer import logger as transformers_trainer_logger

from hf_scratch_transformer import checkpointing, trainer_checkpoints, training
from hf_scratch_transformer.cli import output_folder, run_options

HERE = Path(__file__).resolve().parent
TINY = ["--set", "num_hidden_layers=1", "hidden_size=32", "num_attention_heads=2", "intermediate_size=64"]
COMMON = ["--max-length", "32", "--max-eval-samples", "8", "--batch-size", "4", "--max-steps", "10", "--save-steps",
          "2", *TINY]
# entry point -> (module, its own options, checkpoint prefix); both keep 2 checkpoints
ENTRY_POINTS = {
    "accelerate": ("hf_scratch_transformer.cli.train_accelerate",
                   ["--gradient-accumulation-steps", "2", "--keep-checkpoints", "2"], checkpointing.ACCELERATE_PREFIX),
    "trainer": ("hf_scratch_transformer.cli.train", ["--eval-steps", "2", "--sample-prompt", "the"],
                checkpointing.TRAINER_PREFIX),
}
# (kill point, occurrence) in turn, each run resuming the one before (see crash_injection.py). With saves every 2
# steps and 2 kept: state of step 4; deletion of the two planted checkpoints (below), then inside the prune of
# step 2; commit of step 8; between steps 8 and 9.
KILLS = [("state", 2), ("delete", 3), ("rename", 1), ("step", 3)]


def command(entry: str, workspace: Path, output: Path, *extra, kill: tuple[str, int] | None = None) -> list[str]:
    module, options, _ = ENTRY_POINTS[entry]
    launcher = [sys.executable, str(HERE / "crash_injection.py"), kill[0], str(kill[1]), module] if kill else \
        [sys.executable, "-m", module]
    data = ["--train-files", workspace / "corpus.txt", "--tokenizer", workspace / "decoder"]
    return [*launcher, *map(str, [*data, *COMMON, *options, "--output-dir", output, *extra])]


def run(arguments: list[str], cwd: Path, returncode: int = 0, env: dict | None = None,
        limit_file_size: int | None = None) -> str:
    """`limit_file_size` (bytes): a write past it fails as on a full disk (see forked_python)."""
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"} | (env or {})
    result = run_python(arguments, cwd=cwd, env=env, timeout=300, limit_file_size=limit_file_size)
    output = result.stdout + result.stderr
    assert result.returncode == returncode, output[-4000:]
    return output


def loss_curve(entry: str, output: Path) -> list:
    if entry == "accelerate":
        return (output / "loss_curve.jsonl").read_text().splitlines()
    state = json.loads((output / "checkpoints/checkpoint-10/trainer_state.json").read_text())
    return [(record["step"], record["loss"]) for record in state["log_history"] if "loss" in record]


def plant_broken_checkpoints(folder: Path, prefix: str) -> None:
    """What the former non-atomic deletion left behind: a step-5 without manifest, and a step-7 whose manifest is
    there but one of its files is not."""
    (folder / f"{prefix}-5").mkdir()
    shutil.copytree(folder / f"{prefix}-2", folder / f"{prefix}-7")
    checkpointing.write_manifest(folder / f"{prefix}-7", 7)
    next(p for p in sorted((folder / f"{prefix}-7").iterdir()) if p.name != checkpointing.MANIFEST).unlink()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return write_run_corpus(tmp_path_factory.mktemp("crash"))


@pytest.fixture(scope="module", params=list(ENTRY_POINTS))
def uninterrupted(request, workspace):
    entry = request.param
    run(command(entry, workspace, workspace / f"{entry}-full"), workspace)
    return entry, workspace / f"{entry}-full"


@pytest.mark.slow
def test_a_run_killed_again_and_again_ends_exactly_as_the_uninterrupted_run(workspace, uninterrupted):
    entry, full = uninterrupted
    prefix = ENTRY_POINTS[entry][2]
    output, folder = workspace / f"{entry}-killed", workspace / f"{entry}-killed" / "checkpoints"
    for number, kill in enumerate(KILLS):
        resume = ["--resume"] if number else []
        stdout = run(command(entry, workspace, output, *resume, kill=kill), workspace, returncode=-signal.SIGKILL)
        for path in checkpointing.checkpoints(folder, prefix):  # every checkpoint under its final name is whole
            if path.name not in (f"{prefix}-5", f"{prefix}-7"):
                checkpointing.verify_checkpoint(path)
        if number == 0:
            assert sorted(p.name for p in folder.iterdir()) == [f"{prefix}-2", f"{prefix}-4.tmp"]
            plant_broken_checkpoints(folder, prefix)
        if number == 1:
            assert f"skipping {prefix}-7: " in stdout and "the file" in stdout and "is missing" in stdout
            assert f"skipping {prefix}-5: " in stdout and "has no COMPLETE.json" in stdout
            assert (folder / f"{prefix}-2.deleted").is_dir(), "killed inside the prune of step 2"
    stdout = run(command(entry, workspace, output, "--resume"), workspace)
    assert f"{prefix}-8" in stdout  # resumed from the newest complete checkpoint
    assert sorted(p.name for p in folder.iterdir()) == [f"{prefix}-10", f"{prefix}-8"], "no leftovers remain"
    assert loss_curve(entry, output) == loss_curve(entry, full)
    expected, resumed = load_file(full / "model/model.safetensors"), load_file(output / "model/model.safetensors")
    assert expected.keys() == resumed.keys()
    assert all(torch.equal(expected[name], resumed[name]) for name in expected), "bit for bit"


@pytest.mark.slow
def test_a_masked_lm_run_of_the_trainer_resumes_with_the_masks_it_would_have_drawn(workspace, tmp_path):
    """Trainer's DataLoader (Accelerate's) collates one batch ahead: the masks of the step after a checkpoint were
    drawn before the checkpoint saved the random state, and the resumed run drew others (its losses left the
    uninterrupted run's at that step, its weights ended 2e-3 apart). Masked as the step takes its batch, a run killed
    after the checkpoint of step 4 and resumed ends bit for bit as the uninterrupted one."""
    wordpiece().save_pretrained(tmp_path / "encoder")
    arguments = ["--task", "masked-lm", "--train-files", workspace / "corpus.txt", "--tokenizer", tmp_path / "encoder",
                 *COMMON, "--max-steps", 6]
    module = ENTRY_POINTS["trainer"][0]
    run([sys.executable, "-m", module, *map(str, [*arguments, "--output-dir", tmp_path / "full"])], workspace)
    killed = [*map(str, [*arguments, "--output-dir", tmp_path / "killed"])]
    run([sys.executable, str(HERE / "crash_injection.py"), "step", "5", module, *killed], workspace,
        returncode=-signal.SIGKILL)
    stdout = run([sys.executable, "-m", module, *killed, "--resume"], workspace)
    assert f"resuming from {tmp_path / 'killed/checkpoints/checkpoint-4'}" in stdout
    expected, resumed = (json.loads((tmp_path / f"{name}/checkpoints/checkpoint-6/trainer_state.json").read_text())
                         ["log_history"] for name in ("full", "killed"))
    assert [(r["step"], r["loss"]) for r in resumed if "loss" in r] == [(r["step"], r["loss"]) for r in expected
                                                                        if "loss" in r]
    expected, resumed = (load_file(tmp_path / f"{name}/model/model.safetensors") for name in ("full", "killed"))
    assert all(torch.equal(expected[name], resumed[name]) for name in expected), "bit for bit"


def test_a_new_run_refuses_an_output_folder_that_holds_an_earlier_one(workspace, uninterrupted):
    entry, full = uninterrupted
    before = {path: path.stat().st_mtime_ns for path in full.rglob("*")}
    stderr = run(command(entry, workspace, full), workspace, returncode=2)
    assert f"{full} holds an earlier run" in stderr and "--resume" in stderr and "--overwrite-output-dir" in stderr
    assert {path: path.stat().st_mtime_ns for path in full.rglob("*")} == before, "nothing was touched"


def test_overwrite_output_dir_starts_again_without_the_earlier_checkpoints(workspace, uninterrupted):
    entry, full = uninterrupted
    output = workspace / f"{entry}-overwritten"
    shutil.copytree(full, output)
    (output / "checkpoints" / f"{ENTRY_POINTS[entry][2]}-12").mkdir()  # a later step of the earlier run
    run(command(entry, workspace, output, "--overwrite-output-dir", "--max-steps", "4"), workspace)
    assert [p.name for p in checkpointing.checkpoints(output / "checkpoints", ENTRY_POINTS[entry][2])] == \
        [f"{ENTRY_POINTS[entry][2]}-2", f"{ENTRY_POINTS[entry][2]}-4"]


def test_a_corrupt_or_unloadable_state_is_an_error_naming_the_file(workspace, uninterrupted, tmp_path):
    entry, full = uninterrupted
    prefix = ENTRY_POINTS[entry][2]
    rng_file = "random_states_0.pkl" if entry == "accelerate" else "rng_state.pth"
    optimizer_file = "optimizer.bin" if entry == "accelerate" else "optimizer.pt"

    def damaged(name: str, damage) -> Path:
        output = tmp_path / name
        shutil.copytree(full, output)
        shutil.rmtree(output / "checkpoints" / f"{prefix}-10")
        damage(output / "checkpoints" / f"{prefix}-8")
        return output

    def missing_optimizer(path: Path) -> None:
        (path / optimizer_file).unlink()

    def unloadable_rng(path: Path) -> None:  # the checksum matches (the manifest is rewritten): only loading tells
        (path / rng_file).write_bytes(b"not a pickle")
        checkpointing.write_manifest(path, 8)

    stderr = run(command(entry, workspace, damaged("no-optimizer", missing_optimizer), "--resume"), workspace, 2)
    assert "None of the 1 checkpoints" in stderr and f"the file {optimizer_file} is missing). Repair them" in stderr
    stderr = run(command(entry, workspace, damaged("bad-rng", unloadable_rng), "--resume"), workspace, 2)
    assert f"the random state {rng_file} cannot be loaded" in stderr


def test_a_trainer_checkpoint_written_before_manifests_resumes(workspace, uninterrupted, tmp_path):
    """`hf-scratch train` and `finetune` wrote Trainer's checkpoint-N in place, without COMPLETE.json (nor
    loss_window.json), until 2026-11-23. --resume skipped every such checkpoint as "interrupted while being written"
    and stopped, though each was whole. One that holds Trainer's files, trainer_state.json (written last) of its step
    among them, resumes; one without its trainer_state.json is still skipped as interrupted."""
    entry, full = uninterrupted
    if entry != "trainer":
        pytest.skip("the Accelerate loop's step-N have had a manifest from the first")
    output = tmp_path / "before-manifests"
    shutil.copytree(full, output)
    shutil.rmtree(output / "model")
    shutil.rmtree(output / "checkpoints/checkpoint-10")
    old = output / "checkpoints/checkpoint-8"
    for name in (checkpointing.MANIFEST, checkpointing.LOSS_WINDOW):
        (old / name).unlink()
    shutil.copytree(old, output / "checkpoints/checkpoint-9")  # killed while Trainer wrote it
    (output / "checkpoints/checkpoint-9/trainer_state.json").unlink()
    stdout = run(command(entry, workspace, output, "--resume"), workspace)
    assert "skipping checkpoint-9: " in stdout and "has no COMPLETE.json" in stdout
    assert f"resuming from {old} (written before checkpoints had a manifest" in stdout
    assert loss_curve(entry, output) == loss_curve(entry, full)
    expected, resumed = load_file(full / "model/model.safetensors"), load_file(output / "model/model.safetensors")
    assert all(torch.equal(expected[name], resumed[name]) for name in expected), "bit for bit"


@pytest.mark.slow
def test_a_time_budget_stops_with_a_checkpoint_that_resumes_exactly(workspace, uninterrupted):
    entry, full = uninterrupted
    if entry != "trainer":
        pytest.skip("--max-minutes is an option of the Trainer entry point (the main job)")
    output = workspace / "budget"
    stdout = run(command(entry, workspace, output, "--max-minutes", "0.0001"), workspace)
    assert "stopped after step 1 of 10" in stdout and (output / "model/model.safetensors").is_file()
    checkpointing.verify_checkpoint(output / "checkpoints/checkpoint-1")
    assert "changed settings" not in run(command(entry, workspace, output, "--resume"), workspace)
    assert loss_curve(entry, output) == loss_curve(entry, full)
    expected, resumed = load_file(full / "model/model.safetensors"), load_file(output / "model/model.safetensors")
    assert all(torch.equal(expected[name], resumed[name]) for name in expected), "bit for bit"


def test_a_time_budget_crossed_at_the_last_step_is_no_stop():
    """The budget stops a run with steps left to --resume; crossed at the last step, the run has ended: it says no
    "stopped after step 10 of 10 (checkpointed: --resume continues)", and an epoch strategy still evaluates and saves
    that step as it would. Before the last step the budget stops after the step under way, with a checkpoint."""
    stopper = training.StopAfterStep(seconds=0.0)
    arguments = SimpleNamespace(world_size=1)
    stopper.on_train_begin(arguments, None, None)
    for step, stops in ((10, False), (9, True)):
        state, control = SimpleNamespace(global_step=step, max_steps=10), TrainerControl()
        time.sleep(0.001)  # past the budget of 0 seconds
        stopper.on_step_end(arguments, state, control)
        assert (control.should_training_stop, control.should_save) == (stops, stops), step
        assert stopper.stopped_at == (step if stops else None), step


@pytest.mark.slow
def test_a_stop_between_two_logs_resumes_with_the_same_logged_losses(workspace, uninterrupted, tmp_path):
    """40 steps log every 2: stopped by the time budget after step 1, the run's checkpoint keeps step 1's loss,
    so that the resumed run logs the mean of steps 1 and 2 at step 2, as the uninterrupted run does (Trainer would
    start the sum again and log step 2's loss alone)."""
    entry, _ = uninterrupted
    if entry != "trainer":
        pytest.skip("--max-minutes is an option of the Trainer entry point (the main job)")
    longer = ["--max-steps", "40", "--eval-steps", "20", "--save-steps", "20"]
    run(command(entry, workspace, tmp_path / "full", *longer), workspace)
    output = tmp_path / "stopped"
    assert "stopped after step 1 of 40" in run(command(entry, workspace, output, *longer, "--max-minutes", "0.0001"),
                                               workspace)
    run(command(entry, workspace, output, *longer, "--resume"), workspace)

    def losses(folder: Path) -> list:
        state = json.loads((folder / "checkpoints/checkpoint-40/trainer_state.json").read_text())
        return [(record["step"], record["loss"]) for record in state["log_history"] if "loss" in record]

    assert losses(output)[0][0] == 2 and losses(output) == losses(tmp_path / "full")
    expected = load_file(tmp_path / "full/model/model.safetensors")
    resumed = load_file(output / "model/model.safetensors")
    assert all(torch.equal(expected[name], resumed[name]) for name in expected), "bit for bit"


def test_resuming_with_settings_that_change_the_steps_says_which(workspace, uninterrupted, tmp_path):
    """Trainer took a longer --max-steps (its schedule rebuilt from the resumed step: the learning rate jumped), another
    scheduler, warm-up, batch size or seed without a word; the Accelerate loop named them."""
    entry, full = uninterrupted
    output = tmp_path / "longer"
    shutil.copytree(full, output)
    stdout = run(command(entry, workspace, output, "--resume", "--max-steps", "12", "--seed", "7"), workspace)
    assert "changed settings {'max_steps': (10, 12), 'seed': (1337, 7)} make the steps differ from an uninterrupted " \
           "run" in stdout


def test_resuming_with_another_max_length_or_other_data_says_so(workspace, uninterrupted, tmp_path):
    """Trainer's resume named the changed settings of its TrainingArguments alone: --max-length and the data files,
    which make other sequences, changed without a word; the Accelerate loop named neither the data nor the schedule's
    warm-up, and neither the label smoothing nor clipping. Both commands record them in each checkpoint's manifest."""
    entry, full = uninterrupted
    output, more = tmp_path / "other-data", tmp_path / "more.txt"
    shutil.copytree(full, output)
    shutil.copy(workspace / "corpus.txt", more)
    stdout = run(command(entry, workspace, output, "--resume", "--max-length", "24", "--train-files", more,
                         "--warmup-steps", "3", "--label-smoothing", "0.1", "--max-grad-norm", "0.5"), workspace)
    corpus = str((workspace / "corpus.txt").resolve())
    changed = stdout.split("changed settings ")[1].split(" make the steps differ")[0]
    # The objective and the optimizer's settings too: a run resumed without its smoothing changed without a word
    for setting in ("'max_length': (32, 24)", "'warmup_steps': (1, 3)", "'label_smoothing': (0.0, 0.1)",
                    "'max_grad_norm': (1.0, 0.5)",
                    f"'data': ({{'train_files': ['{corpus}']}}, {{'train_files': ['{corpus}', '{more.resolve()}']}})"):
        assert setting in changed, changed


def test_resuming_a_finished_run_trains_nothing_more(workspace, uninterrupted, tmp_path):
    """Killed after its last checkpoint, before its model folder was written: resumed, the run writes the model of
    its last step (Trainer alone would train one step past --max-steps and checkpoint it)."""
    entry, full = uninterrupted
    prefix = ENTRY_POINTS[entry][2]
    output = tmp_path / "finished"
    shutil.copytree(full, output)
    shutil.rmtree(output / "model")
    run(command(entry, workspace, output, "--resume"), workspace)
    assert [path.name for path in checkpointing.checkpoints(output / "checkpoints", prefix)] == \
        [f"{prefix}-8", f"{prefix}-10"]
    expected, resumed = load_file(full / "model/model.safetensors"), load_file(output / "model/model.safetensors")
    assert all(torch.equal(expected[name], resumed[name]) for name in expected), "the last step's weights"


def test_a_run_resumed_past_its_max_steps_says_how_far_its_weights_trained(workspace, uninterrupted, tmp_path):
    """Resumed with a --max-steps below its checkpoint's step, a run trains nothing and saves the checkpoint's weights:
    train-accelerate's card then said max_steps 6 alone for weights of step 10 (Trainer's says steps_trained)."""
    entry, full = uninterrupted
    output = tmp_path / "past"
    shutil.copytree(full, output)
    shutil.rmtree(output / "model")
    run(command(entry, workspace, output, "--resume", "--max-steps", "6"), workspace)
    card = (output / "model/README.md").read_text()
    assert "| max_steps | 6 |" in card and "| steps_trained | 10 |" in card, card


def test_a_model_folder_that_cannot_be_written_is_an_error_keeping_the_earlier_one(workspace, uninterrupted, tmp_path):
    """A full disk while the model folder is written (after the last checkpoint): one error line naming it and the
    way on (--resume writes the folder from the last checkpoint), where it was a traceback; the earlier model folder
    and the checkpoints are as they were."""
    entry, full = uninterrupted
    output = tmp_path / "full-disk"
    shutil.copytree(full, output)

    def files(folder: Path) -> dict:
        return {path.relative_to(folder): path.read_bytes() for path in folder.rglob("*") if path.is_file()}

    before = {name: files(output / name) for name in ("model", "checkpoints")}
    # Each file is limited to 40 kB: the checkpoint is read, the model's weights do not fit.
    stderr = run(command(entry, workspace, output, "--resume"), workspace, returncode=2, limit_file_size=40_000)
    assert "error: The model folder could not be written in" in stderr and "File too large" in stderr, stderr[-3000:]
    assert "--resume, which writes the model folder from the last checkpoint" in stderr
    assert "Traceback" not in stderr
    assert {name: files(output / name) for name in ("model", "checkpoints")} == before


def test_a_loss_log_that_cannot_be_written_is_an_error_and_the_run_resumes(workspace, uninterrupted, tmp_path):
    """The Accelerate loop appends each step to OUTPUT_DIR/loss_curve.jsonl: a full disk there ended the run with an
    OSError traceback at a training step. One line now, as for a checkpoint; --resume continues from the newest."""
    entry, full = uninterrupted
    if entry != "accelerate":
        pytest.skip("Trainer keeps its log in its checkpoints")
    output = tmp_path / "run"
    stderr = run(command(entry, workspace, output, kill=("log", 5)), workspace, returncode=2)
    assert "error: The loss log could not be written in" in stderr and "No space left on device" in stderr, stderr
    assert "Traceback" not in stderr and "--resume" in stderr
    run(command(entry, workspace, output, "--resume"), workspace)
    assert loss_curve(entry, output) == loss_curve(entry, full)


def test_finetune_reports_a_model_folder_that_cannot_be_written_and_keeps_the_earlier_one(tmp_path):
    """As the training commands do (above): a full disk while `hf-scratch finetune` writes its model folder was a
    safetensors traceback; now one error line, the earlier folder as it was, and --resume writes it."""
    tokenizer = wordpiece()
    tiny_lm("encoder", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id).save_pretrained(tmp_path / "mlm")
    tokenizer.save_pretrained(tmp_path / "mlm")
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(
        f"the {animal} runs {i},{animal}\n" for i in range(12) for animal in ("dog", "horse")))
    finetune = [sys.executable, "-m", "hf_scratch_transformer.cli.finetune", "--model", str(tmp_path / "mlm"), "--task",
                "text-classification", "--train-file", str(tmp_path / "train.csv"), "--max-steps", "1",
                "--output-dir", str(tmp_path / "cls")]
    run(finetune, tmp_path)
    before = (tmp_path / "cls/model/model.safetensors").read_bytes()
    stderr = run([*finetune, "--resume"], tmp_path, returncode=2, limit_file_size=40_000)
    assert "error: The model folder could not be written in" in stderr and "File too large" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr
    assert (tmp_path / "cls/model/model.safetensors").read_bytes() == before
    assert "saved a Hub-ready folder" in run([*finetune, "--resume"], tmp_path)
    assert not (tmp_path / "cls/model.tmp").exists(), "what the failed write left is cleared"


def test_finetune_resumed_with_a_base_of_another_tokenizer_is_refused(tmp_path):
    """`finetune` tokenized its data with --model's tokenizer: resumed with another base of the same shapes (trained
    with another vocabulary), it went on under the checkpoint's weights with other ids, and saved that tokenizer
    beside them in the model folder, without a word. The checkpoint holds the run's tokenizer: another is refused."""
    for name, tokenizer in (("mlm", wordpiece()), ("other", wordpiece(200))):
        tiny_lm("encoder", vocab_size=300, pad_token_id=tokenizer.pad_token_id).save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    (tmp_path / "train.csv").write_text("text,label\n" + "".join(
        f"the {animal} runs {i},{animal}\n" for i in range(12) for animal in ("dog", "horse")))
    finetune = [sys.executable, "-m", "hf_scratch_transformer.cli.finetune", "--task", "text-classification",
                "--train-file", str(tmp_path / "train.csv"), "--max-steps", "2", "--output-dir", str(tmp_path / "cls")]
    run([*finetune, "--model", str(tmp_path / "mlm"), "--max-steps", "1"], tmp_path)
    before = {path: path.stat().st_mtime_ns for path in (tmp_path / "cls").rglob("*")}
    stderr = run([*finetune, "--model", str(tmp_path / "other"), "--resume"], tmp_path, returncode=2)
    assert (f"the tokenizer of {tmp_path / 'other'} differs from the one {tmp_path / 'cls/checkpoints/checkpoint-1'} "
            "was trained with, which a resumed run keeps: resume with the run's own --model") in stderr, stderr[-3000:]
    assert {path: path.stat().st_mtime_ns for path in (tmp_path / "cls").rglob("*")} == before, "nothing was touched"
    assert "saved a Hub-ready folder" in run([*finetune, "--model", str(tmp_path / "mlm"), "--resume"], tmp_path)


def test_resuming_with_another_model_is_an_error_naming_the_tensors(workspace, uninterrupted, tmp_path):
    entry, full = uninterrupted  # the Accelerate loop failed inside Accelerate's loader, with a traceback
    output = tmp_path / "other-model"
    shutil.copytree(full, output)
    wider = ["--set", "num_hidden_layers=1", "hidden_size=64", "num_attention_heads=2", "intermediate_size=64"]
    stderr = run(command(entry, workspace, output, "--resume", *wider), workspace, returncode=2)
    assert "holds another model than this run builds" in stderr and "Traceback" not in stderr
    assert "`model.embeddings.embed_tokens.weight` (320, 32) there, (320, 64) here" in stderr


def test_resuming_with_another_model_config_of_the_same_shapes_is_an_error_naming_it(workspace, uninterrupted,
                                                                                     tmp_path):
    """The tensors' shapes alone let a changed activation or norm placement resume silently, and the model folder
    then paired weights trained with one function with a config that gives another. Dropout may change."""
    entry, full = uninterrupted
    output = tmp_path / "other-config"
    shutil.copytree(full, output)
    shutil.rmtree(output / "checkpoints" / f"{ENTRY_POINTS[entry][2]}-10")  # a run killed after step 8
    before = {path: path.stat().st_mtime_ns for path in output.rglob("*")}
    other = ["--set", "hidden_act=gelu", "norm_position=post"]  # gpt-mini's: relu, pre
    stderr = run(command(entry, workspace, output, "--resume", *other), workspace, returncode=2)
    assert "was trained with another model config than this run builds" in stderr and "Traceback" not in stderr
    assert "hidden_act 'relu' there, 'gelu' here; norm_position 'pre' there, 'post' here" in stderr
    assert {path: path.stat().st_mtime_ns for path in output.rglob("*")} == before, "nothing was touched"
    assert "saved" in run(command(entry, workspace, output, "--resume", "--set", "dropout=0.2"), workspace)


def test_resuming_with_other_optimizer_settings_is_an_error_naming_them(workspace, uninterrupted, tmp_path):
    """A checkpoint's optimizer state brings back its own learning rate, Adam and weight decay settings: a
    --learning-rate changed for --resume was ignored without a word, and the model card reported the new one."""
    entry, full = uninterrupted
    output = tmp_path / "other-optimizer"
    shutil.copytree(full, output)
    shutil.rmtree(output / "checkpoints" / f"{ENTRY_POINTS[entry][2]}-10")  # a run killed after step 8
    before = {path: path.stat().st_mtime_ns for path in output.rglob("*")}
    other = ["--learning-rate", "0.05", "--weight-decay", "0.1"]
    stderr = run(command(entry, workspace, output, "--resume", *other), workspace, returncode=2)
    assert "was trained with other optimizer settings than this run's" in stderr and "Traceback" not in stderr
    assert "learning rate 0.001 there, 0.05 here; weight decay 0.01 there, 0.1 here" in stderr
    assert {path: path.stat().st_mtime_ns for path in output.rglob("*")} == before, "nothing was touched"


@pytest.mark.parametrize("setting, value, named", [
    ("betas", (0.9, 0.95), "Adam betas (0.9, 0.95) there, (0.9, 0.99) here"),
    ("eps", 1e-6, "Adam epsilon 1e-06 there, 1e-08 here"),
    ("weight_decay", 0.1, "weight decay 0.1 there, 0.01 here"),
    ("initial_lr", 0.05, "learning rate 0.05 there, 0.001 here"),
])
def test_every_optimizer_setting_a_checkpoint_would_bring_back_is_compared(setting, value, named):
    """`load_state_dict` takes each group's betas, epsilon and weight decay (and the schedule's base rate) from the
    checkpoint: a run resumed with --adam-beta2 or --adam-epsilon changed trained on with the checkpoint's, as with a
    changed learning rate, while its card said otherwise."""

    def adamw(**settings):
        parameter = torch.nn.Parameter(torch.ones(2))
        optimizer = torch.optim.AdamW([parameter], **{"lr": 1e-3, "betas": (0.9, 0.99), "eps": 1e-8,
                                                       "weight_decay": 0.01} | settings)
        optimizer.param_groups[0]["initial_lr"] = optimizer.param_groups[0]["lr"]  # as a schedule sets it
        return optimizer

    saved = adamw(**{"lr": 0.05} if setting == "initial_lr" else {setting: value}).state_dict()
    optimizer = adamw()
    before = checkpointing.optimizer_settings(optimizer)
    checkpointing.check_same_optimizer("step-8", before, optimizer)  # as it was: nothing to say
    optimizer.load_state_dict(saved)
    with pytest.raises(checkpointing.CheckpointError, match=re.escape(f"other optimizer settings than this run's "
                                                                      f"({named}), which its optimizer state")):
        checkpointing.check_same_optimizer("step-8", before, optimizer)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_diverged_run_stops_at_its_step_and_keeps_its_finite_checkpoints(workspace, entry, tmp_path):
    """A learning rate of 1e6 makes the weights after step 2 huge and the loss of step 3 nan. The runs went on to
    their end: Trainer logged the losses as 0.0, both saved checkpoints of nan weights, whose pruning (2 kept)
    deleted every finite one, and wrote a model folder of nan weights (Trainer's sample then failed with a
    traceback). A checkpoint of nan weights that such a run left is refused by name on --resume."""
    prefix = ENTRY_POINTS[entry][2]
    output, checkpoints = tmp_path / "diverged", tmp_path / "diverged" / "checkpoints"
    diverging = ["--learning-rate", "1e6", "--save-steps", "1", "--max-steps", "6"]
    stderr = run(command(entry, workspace, output, *diverging), workspace, returncode=2)
    value, good = "loss" if entry == "accelerate" else "gradient norm", re.escape(str(checkpoints / f"{prefix}-1"))
    assert re.search(f"error: Training diverged: the {value} of step 3 is (nan|inf), computed from the weights after "
                     f"step 2. .*the newest checkpoint before those weights is {good}. Lower the learning rate",
                     stderr), stderr[-2000:]
    assert "Traceback" not in stderr and not (output / "model").exists()
    saved = checkpointing.checkpoints(checkpoints, prefix)
    assert [path.name for path in saved] == [f"{prefix}-1", f"{prefix}-2"]
    assert all(tensor.isfinite().all() for path in saved for tensor in load_file(path / "model.safetensors").values())

    weights = load_file(saved[-1] / "model.safetensors")  # as a run diverged before this check saved it
    save_file({name: torch.full_like(tensor, float("nan")) for name, tensor in weights.items()},
              saved[-1] / "model.safetensors", metadata={"format": "pt"})
    checkpointing.write_manifest(saved[-1], 2)
    stderr = run(command(entry, workspace, output, *diverging, "--resume"), workspace, returncode=2)
    assert f"error: Checkpoint {saved[-1]} holds nan or inf weights: its run diverged" in stderr
    assert "Traceback" not in stderr and not (output / "model").exists()


def test_a_step_that_fp16_skipped_goes_on_and_nan_weights_are_never_saved(tmp_path):
    """fp16's GradScaler skips a step whose gradients overflowed, on purpose: the weights stay finite, and the run
    goes on. Weights that went nan or inf without a nan loss are caught before they are saved."""
    for step in (2, 4):
        (tmp_path / f"step-{step}").mkdir()
        checkpointing.write_manifest(tmp_path / f"step-{step}", step)
    checkpointing.check_step_finite(5, {"loss": float("inf"), "gradient norm": torch.tensor(float("nan"))},
                                    skipped=lambda: True, folder=tmp_path)
    with pytest.raises(checkpointing.TrainingDiverged, match="the gradient norm of step 5 is nan, computed from the "
                       f"weights after step 4. .* before those weights is {re.escape(str(tmp_path))}/step-2. Lower"):
        checkpointing.check_step_finite(5, {"loss": 2.0, "gradient norm": torch.tensor(float("nan"))},
                                        skipped=lambda: False, folder=tmp_path)
    model = tiny_lm("decoder")
    checkpointing.check_weights_finite(model, 6, tmp_path)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("inf")
    with pytest.raises(checkpointing.TrainingDiverged, match="the weights after step 6 hold nan or inf. .* before "
                       f"those weights is {re.escape(str(tmp_path))}/step-4. Lower"):
        checkpointing.check_weights_finite(model, 6, tmp_path)


def run_two_processes(arguments: list[str], cwd: Path) -> str:
    """`arguments` (a `command`) under torchrun, as two gloo processes on this CPU (forked as test_accelerate's are);
    torchrun itself reports a failed process. It must fail with every process stopping on the same error."""
    launcher, launch_env = two_cpu_processes("torchrun")
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"} | launch_env
    launched = [*launcher, "-m", *arguments[2:], *(["--cpu"] if "train_accelerate" in arguments[2] else [])]
    result = subprocess.run(launched, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-4000:]
    # Neither process died in a traceback (a gloo one when the other had left), nor printed the usage.
    assert "[rank" not in output and "gloo" not in output and "usage:" not in output, output[-4000:]
    return output


@pytest.mark.slow
def test_a_checkpoint_of_one_process_resumed_by_two_stops_once_and_cleanly(workspace, uninterrupted, tmp_path):
    """Each process checks every process's random state: all stop together, and the main process says why."""
    entry, full = uninterrupted
    output = tmp_path / "two"
    shutil.copytree(full, output)
    shutil.rmtree(output / "checkpoints" / f"{ENTRY_POINTS[entry][2]}-10")  # a run killed after step 8
    stdout = run_two_processes(command(entry, workspace, output, "--resume"), workspace)
    assert stdout.count("error: Checkpoint") == 1 and "has no random state" in stdout, stdout[-4000:]
    assert "saved by" in stdout
    assert "resuming from" not in stdout  # refused before: Trainer's said it resumed, with changed settings


@pytest.mark.slow
def test_bad_data_under_two_processes_stops_once_and_cleanly(workspace, tmp_path):
    """The main process reads the data first, the others wait: it must not leave them waiting when it stops."""
    (tmp_path / "empty.txt").write_text("\n\n")
    arguments = command("accelerate", workspace, tmp_path / "out")
    arguments[arguments.index("--train-files") + 1] = str(tmp_path / "empty.txt")
    stdout = run_two_processes(arguments, workspace)
    assert stdout.count("holds no text") == 1, stdout[-4000:]


@pytest.mark.slow
def test_a_kill_while_the_model_folder_is_written_leaves_the_earlier_one_or_none(workspace, uninterrupted, tmp_path):
    """The model folder is written aside and put in place complete, as a checkpoint is."""
    entry, full = uninterrupted
    output = tmp_path / "model-kill"
    shutil.copytree(full, output)
    longer = ["--resume", "--max-steps", "12"]  # a finished run continued, its model folder there

    def model_files() -> dict:
        return {path.name: path.read_bytes() for path in (output / "model").iterdir()}

    earlier = model_files()
    run(command(entry, workspace, output, *longer, kill=("card", 1)), workspace, returncode=-signal.SIGKILL)
    assert model_files() == earlier, "the earlier model folder, whole"
    shutil.rmtree(output / "model")
    run(command(entry, workspace, output, *longer, kill=("card", 1)), workspace, returncode=-signal.SIGKILL)
    assert not (output / "model").exists(), "no half-written model folder"
    run(command(entry, workspace, output, *longer), workspace)
    assert {"README.md", "loss_curve.png", "model.safetensors", "tokenizer.json"} <= set(model_files())
    assert sorted(path.name for path in output.iterdir() if path.name.startswith("model")) == ["model"]


def test_a_kill_while_the_runs_tokenizer_is_written_leaves_it_whole_or_none(workspace, tmp_path):
    """train-accelerate's OUTPUT_DIR/tokenizer is written aside and put in place whole. Written file by file, a kill
    after tokenizer.json left that file alone there: the same command then refused the folder as an earlier run's, a
    --tokenizer of it was no tokenizer, and --resume of a checkpoint that carries none took it for its run's."""
    output = tmp_path / "tokenizer-kill"
    arguments = [*map(str, ["--train-files", workspace / "corpus.txt", "--vocab-size", 300, *COMMON, "--max-steps", 2,
                            "--output-dir", output])]
    module = ENTRY_POINTS["accelerate"][0]
    run([sys.executable, str(HERE / "crash_injection.py"), "tokenizer", "2", module, *arguments], workspace,
        returncode=-signal.SIGKILL)
    assert not (output / "tokenizer").exists(), "no half-written tokenizer folder"
    run([sys.executable, "-m", module, *arguments], workspace)  # the same command, not refused
    carried = output / "checkpoints" / f"{checkpointing.ACCELERATE_PREFIX}-2" / "tokenizer"
    assert {path.name: path.read_bytes() for path in (output / "tokenizer").iterdir()} == \
        {path.name: path.read_bytes() for path in carried.iterdir()}
    assert not (output / "tokenizer.tmp").exists(), "what the kill left is cleared"


def test_an_output_folder_that_cannot_be_written_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """As on a read-only file system (access(2) says so even to root, whom permission bits do not stop)."""
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != read_only and access(path, mode, **kw))
    parser = run_options.RunParser(prog="train")
    for output in (read_only, read_only / "new" / "run"):
        with pytest.raises(SystemExit) as stopped:
            output_folder.claim_output_dir(parser, output, resume=False, overwrite=False)
        assert stopped.value.code == 2
        assert f"--output-dir {output} cannot be written: {read_only} is read-only" in capsys.readouterr().err
    output_folder.claim_output_dir(parser, tmp_path / "writable" / "run", resume=False, overwrite=False)


@pytest.mark.parametrize("options", [{}, {"resume": True}, {"overwrite": True}])
def test_a_file_where_the_run_writes_a_folder_is_refused_before_any_work(tmp_path, capsys, options):
    """A file named `checkpoints` failed with a traceback once the Trainer was built (after the data and tokenizer
    work); --overwrite-output-dir failed removing it, after renaming it."""
    (tmp_path / "checkpoints").write_text("the user's notes")
    with pytest.raises(SystemExit) as stopped:
        output_folder.claim_output_dir(run_options.RunParser(prog="train"), tmp_path, **{"resume": False,
                                                                                       "overwrite": False} | options)
    assert stopped.value.code == 2
    assert f"{tmp_path / 'checkpoints'} is a file, where the run writes a folder" in capsys.readouterr().err
    assert (tmp_path / "checkpoints").read_text() == "the user's notes"


@pytest.mark.parametrize("name", ["checkpoint-6", "step-8", "checkpoint-6.tmp", "step-4.deleted"])
@pytest.mark.parametrize("kind", ["file", "link", "dangling link"])
def test_a_file_or_link_named_as_a_checkpoint_is_refused_before_any_work(tmp_path, capsys, name, kind):
    """`--resume` passed over a file `checkpoints/checkpoint-6` and failed on it when it saved step 6 (renaming the
    checkpoint onto it), saying "free space"; a symbolic link there was renamed `.deleted`, then `rmtree` refused it."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "checkpoints").mkdir()
    stray = tmp_path / "checkpoints" / name
    if kind == "file":
        stray.write_text("the user's notes")
    else:
        stray.symlink_to(tmp_path / ("notes" if kind == "link" else "gone"))
    (tmp_path / "checkpoints" / "checkpoint-4").mkdir()
    for resume, overwrite in ((True, False), (False, True)):
        with pytest.raises(SystemExit) as stopped:
            output_folder.claim_output_dir(run_options.RunParser(prog="train"), tmp_path, resume, overwrite)
        assert stopped.value.code == 2
        kind_said = "a file" if kind == "file" else "a symbolic link"
        assert f"{stray} is {kind_said}, named as a checkpoint" in capsys.readouterr().err
    assert stray.is_symlink() if kind != "file" else stray.read_text() == "the user's notes", "left as it was"
    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == sorted(["checkpoint-4", name])


@pytest.mark.parametrize(("held", "options"), [("checkpoints/NOTES.md", {"overwrite": True}),
                                               ("checkpoints/wandb/run.log", {"overwrite": True}),
                                               ("tokenizer/tokenizer.onnx", {"overwrite": True}),
                                               ("model/model-f16.gguf", {"overwrite": True}),
                                               ("model/model-f16.gguf", {"resume": True}),
                                               ("model/onnx/model.onnx", {"resume": True})])
def test_what_the_run_never_wrote_in_a_folder_it_removes_whole_is_refused_before_any_work(tmp_path, capsys, held,
                                                                                          options):
    """--overwrite-output-dir removed `checkpoints/` and `tokenizer/` whole, and every run replaces `model/` whole as
    it ends: a user's notes or another tool's files put there (llama.cpp's GGUF beside the weights) went with them."""
    for name in ("checkpoints/checkpoint-4/COMPLETE.json", "checkpoints/checkpoint-6.tmp/config.json",
                 "tokenizer/tokenizer.json", "tokenizer/merges.txt", "model/model.safetensors", "model/README.md",
                 "model/loss_curve.png", "model/modeling_scratch_decoder.py", "model/.DS_Store", held):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    parser = run_options.RunParser(prog="train")
    with pytest.raises(SystemExit) as stopped:
        output_folder.claim_output_dir(parser, tmp_path, **{"resume": False, "overwrite": False} | options)
    assert stopped.value.code == 2
    folder, entry = held.split("/")[:2]
    assert f"{tmp_path / folder} holds what the run never writes there ({entry})" in capsys.readouterr().err
    assert (tmp_path / held).read_text() == held
    shutil.move(tmp_path / folder / entry, tmp_path / entry)  # moved out, as the error says: the run starts
    output_folder.claim_output_dir(parser, tmp_path, **{"resume": False, "overwrite": False} | options)


def test_a_link_to_a_folder_the_run_replaces_is_refused_before_any_work(tmp_path, capsys):
    """A symbolic link `model` (to another disk) was renamed `model.deleted` when the run wrote its model, then
    `rmtree` refused it: the run ended with a message blaming the free space. So did `checkpoints` under
    --overwrite-output-dir, with a traceback; resuming into a linked `checkpoints` works, and is left to do so."""
    parser, run, elsewhere = run_options.RunParser(prog="train"), tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    for name in ("model", "checkpoints"):
        (elsewhere / name / "step-2").mkdir(parents=True)
        (run / name).symlink_to(elsewhere / name)
    for link, resume, overwrite in (("model", True, False), ("model", False, True), ("checkpoints", False, True)):
        if link == "checkpoints":
            (run / "model").unlink()
        with pytest.raises(SystemExit) as stopped:
            output_folder.claim_output_dir(parser, run, resume, overwrite)
        assert stopped.value.code == 2
        assert f"{run / link} is a symbolic link, to a folder the run replaces" in capsys.readouterr().err
    output_folder.claim_output_dir(parser, run, resume=True, overwrite=False)
    assert (run / "checkpoints").is_symlink() and sorted(path.name for path in elsewhere.rglob("*")) == \
        ["checkpoints", "model", "step-2", "step-2"], "left as they were"


def test_an_output_folder_in_the_folder_the_run_starts_from_is_refused_before_any_work(tmp_path, capsys):
    """`--resume-from RUN/checkpoints/step-4 --output-dir` that checkpoint (or `--model` it) with
    --overwrite-output-dir removed the checkpoint's tokenizer/ and rewrote its loss log as the earlier run's: the
    checkpoint failed to verify, and its run, resumed, dropped it. An output folder in a checkpoint or in a run's
    model folder was removed whole with it by that run's pruning, or its next model folder. A folder of another
    kind may hold the output folder of a run that starts from it (the tests' layout)."""
    parser, checkpoint, model = run_options.RunParser(prog="train-accelerate"), tmp_path / "run/checkpoints/step-4", \
        tmp_path / "run/model"
    (checkpoint / "tokenizer").mkdir(parents=True)
    (checkpoint / "tokenizer/tokenizer.json").write_text("{}")
    (checkpoint / "loss_curve.jsonl").write_text('{"step": 1}\n')
    checkpointing.write_manifest(checkpoint, 4)
    model.mkdir()
    before = {path: path.read_bytes() for path in checkpoint.rglob("*") if path.is_file()}
    for output, option, source, given in ((checkpoint, "--model", checkpoint, {"model": checkpoint}),
                                          (checkpoint / "branch", "--model", checkpoint, {"model": checkpoint}),
                                          (model / "tuned", "--model", model, {"model": model}),
                                          (checkpoint, "--resume-from", checkpoint,
                                           {"resume_from": checkpoint, "resume": True})):
        with pytest.raises(SystemExit) as stopped:
            output_folder.claim_output_dir(parser, output, **{"resume": False, "overwrite": True} | given)
        assert stopped.value.code == 2
        assert f"--output-dir {output} lies in {option} {source}, the folder this run starts from" in \
            capsys.readouterr().err
    assert {path: path.read_bytes() for path in checkpoint.rglob("*") if path.is_file()} == before
    assert sorted(path.name for path in checkpoint.iterdir()) == ["COMPLETE.json", "loss_curve.jsonl", "tokenizer"]
    output_folder.claim_output_dir(parser, tmp_path / "branch", resume=True, overwrite=False, resume_from=checkpoint)
    (tmp_path / "base").mkdir()
    output_folder.claim_output_dir(parser, tmp_path / "base/tuned", resume=False, overwrite=False,
                                   model=tmp_path / "base")


def test_an_empty_checkpoints_folder_is_no_earlier_run(tmp_path, capsys):
    """A run stopped (Ctrl-C, a kill) before its first checkpoint leaves an empty `checkpoints/`: the same command
    again was refused as "holds an earlier run (checkpoints)", over a folder holding nothing to keep."""
    parser = run_options.RunParser(prog="train")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "tokenizer").mkdir()
    output_folder.claim_output_dir(parser, tmp_path, resume=False, overwrite=False)
    (tmp_path / "checkpoints" / "checkpoint-2.tmp").mkdir()  # a checkpoint being written is part of a run
    with pytest.raises(SystemExit):
        output_folder.claim_output_dir(parser, tmp_path, resume=False, overwrite=False)
    assert f"{tmp_path} holds an earlier run (checkpoints)" in capsys.readouterr().err


def test_ctrl_c_stops_with_one_line_and_the_run_resumes_exactly(workspace, uninterrupted):
    entry, full = uninterrupted
    output = workspace / f"{entry}-ctrl-c"
    stopped = run(command(entry, workspace, output, kill=("step", 6)), workspace, returncode=128 + signal.SIGINT,
                  env={"CRASH_SIGNAL": "SIGINT"})
    assert "stopped by Ctrl-C: --resume continues" in stopped and "Traceback" not in stopped, stopped[-3000:]
    run(command(entry, workspace, output, "--resume"), workspace)
    assert loss_curve(entry, output) == loss_curve(entry, full)


def test_sigterm_stops_after_the_step_with_a_checkpoint_and_the_run_resumes_exactly(workspace, uninterrupted):
    """A job scheduler's SIGTERM (SLURM, Kubernetes, spot instances: SIGKILL follows a grace period) ended the run as
    a kill: every step since the last checkpoint was lost. The run now finishes the step under way, checkpoints it
    and stops, without its evaluation and model folder; --resume continues as from any checkpoint."""
    entry, full = uninterrupted
    prefix = ENTRY_POINTS[entry][2]
    output = workspace / f"{entry}-sigterm"
    stopped = run(command(entry, workspace, output, kill=("step", 3)), workspace, returncode=128 + signal.SIGTERM,
                  env={"CRASH_SIGNAL": "SIGTERM"})  # during step 3, between the saves of steps 2 and 4
    line = f"stopped by SIGTERM after step 3 of 10, checkpointed in {output}/checkpoints/{prefix}-3: --resume continues"
    assert stopped.count(line) == 1 and "Traceback" not in stopped, stopped[-3000:]
    assert checkpointing.verify_checkpoint(output / f"checkpoints/{prefix}-3")["step"] == 3
    assert not (output / "model").exists() and not (output / "model.tmp").exists()
    run(command(entry, workspace, output, "--resume"), workspace)
    assert loss_curve(entry, output) == loss_curve(entry, full)
    expected, resumed = load_file(full / "model/model.safetensors"), load_file(output / "model/model.safetensors")
    assert all(torch.equal(expected[name], resumed[name]) for name in expected), "bit for bit"


def test_a_sigterm_after_training_ends_the_process_at_once_as_before():
    """Outside the training steps a SIGTERM ends the process at once, as it did: one that came while the last
    checkpoint was written (after the last step's check) is delivered again as training ends, so that the final
    evaluation and model folder do not run on past the scheduler's grace period. While training, further SIGTERMs
    change nothing (a torchrun worker under SLURM gets the scheduler's and torchrun's)."""

    def train(stopped: bool) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with training.Preemption() as preemption:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            assert preemption.requested
            preemption.stopped_at = 3 if stopped else None  # stopped after step 3, or it came after the last check
        os._exit(0)  # the evaluation and model folder

    for stopped, exitcode in ((True, 0), (False, -signal.SIGTERM)):
        process = multiprocessing.get_context("fork").Process(target=train, args=(stopped,))
        process.start()
        process.join(60)
        assert process.exitcode == exitcode


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_ctrl_c_and_sigterm_stop_finetune_with_one_line(tmp_path, signal_name):
    """The script (scripts/finetune.py, as docs/distributed.md launches it) ended with a KeyboardInterrupt traceback
    from every process; `hf-scratch finetune` alone stopped cleanly. A SIGTERM ended it as a kill, losing every step
    since the last checkpoint (one per epoch): it now stops after the step under way, checkpointed."""
    tokenizer = wordpiece()
    tiny_lm("encoder", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id).save_pretrained(tmp_path / "mlm")
    tokenizer.save_pretrained(tmp_path / "mlm")
    (tmp_path / "train.csv").write_text("\n".join(["text,label"] + [f"a dog runs {i},{i % 2}" for i in range(40)]))
    arguments = ["--model", tmp_path / "mlm", "--task", "text-classification", "--train-file", tmp_path / "train.csv",
                 "--max-steps", 4, "--output-dir", tmp_path / "cls"]
    stopped = run([sys.executable, str(HERE / "crash_injection.py"), "step", "2", "hf_scratch_transformer.cli.finetune",
                   *map(str, arguments)], tmp_path, returncode=128 + getattr(signal, signal_name),
                  env={"CRASH_SIGNAL": signal_name})
    line = "stopped by Ctrl-C: --resume continues" if signal_name == "SIGINT" else (
        f"stopped by SIGTERM after step 2 of 4, checkpointed in {tmp_path}/cls/checkpoints/checkpoint-2: --resume "
        "continues")
    assert line in stopped and "Traceback" not in stopped, stopped[-3000:]
    if signal_name == "SIGTERM":
        assert checkpointing.verify_checkpoint(tmp_path / "cls/checkpoints/checkpoint-2")["step"] == 2
        # saved once, not evaluated and saved again as the epoch strategy would at the epoch's end
        assert "eval_loss" not in stopped and "removing" not in stopped and not (tmp_path / "cls/model").exists()
        run([sys.executable, "-m", "hf_scratch_transformer.cli.finetune", *map(str, arguments), "--resume"], tmp_path)
        assert (tmp_path / "cls/model/model.safetensors").is_file()


def test_a_tokenizer_the_main_process_cannot_train_stops_every_process_with_its_error(workspace, tmp_path):
    """The main process trains the tokenizer while the others wait; stopped by a --vocab-size below the text's
    alphabet, it left them in Accelerate's barrier, which gloo ended with a traceback in each."""
    arguments = [sys.executable, "-m", ENTRY_POINTS["accelerate"][0], "--train-files", str(workspace / "corpus.txt"),
                 "--vocab-size", "10", "--max-length", "32", "--max-steps", "2", "--output-dir", str(tmp_path / "out")]
    output = run_two_processes(arguments, workspace)
    assert output.count("is too small for a bpe tokenizer of this text") == 1, output[-3000:]


def test_a_run_into_a_folder_that_another_run_is_writing_is_refused(workspace, uninterrupted, tmp_path):
    """Two runs writing one folder would remove each other's checkpoints being written and interleave their logs."""
    fcntl = pytest.importorskip("fcntl")
    entry, full = uninterrupted
    output = tmp_path / "busy"
    shutil.copytree(full, output)
    with (output / output_folder.LOCK_FILE).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as the main process of the run writing it does
        before = {path: path.stat().st_mtime_ns for path in output.rglob("*")}
        stderr = run(command(entry, workspace, output, "--resume"), workspace, returncode=2)
        assert f"{output} is being written by another run" in stderr
        if entry == "accelerate":  # only the main process can tell: the others stop with it
            stdout = run_two_processes(command(entry, workspace, output, "--resume"), workspace)
            assert stdout.count("is being written by another run") == 1
        assert {path: path.stat().st_mtime_ns for path in output.rglob("*")} == before, "nothing was touched"


def test_an_output_folder_on_a_file_system_without_locks_is_written_unlocked(tmp_path, monkeypatch, capsys):
    """flock fails with ENOSYS where the file system has no locks (Lustre mounted without `flock`, some FUSE mounts):
    every training command into such a folder ended in that OSError's traceback. It runs unlocked, and says so."""
    fcntl = pytest.importorskip("fcntl")

    def flock(*args):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", flock)
    (tmp_path / "out").mkdir()
    assert output_folder.lock_output_dir(tmp_path / "out") is None
    assert f"note: {tmp_path / 'out'} cannot be locked (Function not implemented)" in capsys.readouterr().err


def test_a_run_started_as_another_makes_the_same_output_folder_takes_its_turn(tmp_path, monkeypatch):
    """Two commands started at the same instant both found the folder missing; the second to make it ended in a
    FileExistsError traceback. It takes the folder as made (the lock then decides which run writes there)."""
    output = tmp_path / "out"
    exists = Path.exists

    def made_meanwhile(path):  # missing when checked, made by the other run before this one makes it
        if path == output and not exists(path):
            path.mkdir()
            return False
        return exists(path)

    monkeypatch.setattr(Path, "exists", made_meanwhile)
    assert output_folder.lock_output_dir(output) is None
    assert (output / output_folder.LOCK_FILE).is_file()


def test_resume_with_no_checkpoint_of_its_own_leaves_the_earlier_run_alone(workspace, uninterrupted, tmp_path):
    """--resume that found no checkpoint of its own said "starting from step 0", rewrote the loss log at once and
    replaced the model at the end: over a run whose checkpoints the user removed, and over a run of the other command
    (train continues checkpoint-N, train-accelerate step-N). Refused, naming what the folder holds; nothing touched."""
    entry, full = uninterrupted
    other = next(name for name in ENTRY_POINTS if name != entry)
    removed, crossed = tmp_path / "removed", tmp_path / "crossed"
    shutil.copytree(full, removed)
    shutil.rmtree(removed / "checkpoints")
    shutil.copytree(full, crossed)
    for runner, output, held in ((entry, removed, "its model in"),
                                 (other, crossed, f"{ENTRY_POINTS[entry][2]}-N checkpoints")):
        before = {path: path.stat().st_mtime_ns for path in output.rglob("*")}
        stderr = run(command(runner, workspace, output, "--resume"), workspace, returncode=2)
        assert "holds an earlier run" in stderr and held in stderr and "--overwrite-output-dir" in stderr, stderr
        assert {path: path.stat().st_mtime_ns for path in output.rglob("*")} == before, "nothing was touched"


def test_a_checkpoint_of_the_other_command_under_this_ones_name_is_refused(workspace, uninterrupted, tmp_path):
    """An Accelerate step-N renamed checkpoint-N verified, and `train --resume` failed on it with a FileNotFoundError
    traceback (trainer_state.json), after naming "changed settings" read from the other loop's manifest."""
    entry, full = uninterrupted
    other = next(name for name in ENTRY_POINTS if name != entry)
    renamed = tmp_path / "renamed" / "checkpoints" / f"{ENTRY_POINTS[other][2]}-10"
    shutil.copytree(full / "checkpoints" / f"{ENTRY_POINTS[entry][2]}-10", renamed)
    before = {path: path.stat().st_mtime_ns for path in renamed.parent.rglob("*")}
    stderr = run(command(other, workspace, renamed.parent.parent, "--resume"), workspace, returncode=2)
    loop = "`hf-scratch train` (Trainer)" if entry == "trainer" else \
        "`hf-scratch train-accelerate` (the Accelerate loop)"
    assert f"Checkpoint {renamed} is one of {loop}, which continues it" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr and "changed settings" not in stderr
    assert {path: path.stat().st_mtime_ns for path in renamed.parent.rglob("*")} == before, "nothing was touched"


def test_a_checkpoint_the_user_removes_while_the_run_prunes_does_not_stop_the_run(tmp_path, monkeypatch):
    for step in (2, 4, 6):
        (tmp_path / f"step-{step}").mkdir()
        checkpointing.write_manifest(tmp_path / f"step-{step}", step)
    listed = checkpointing.complete_checkpoints(tmp_path)
    shutil.rmtree(tmp_path / "step-2")  # after the prune listed it, before it removes it
    monkeypatch.setattr(checkpointing, "complete_checkpoints", lambda *args: listed)
    checkpointing.prune_checkpoints(tmp_path, keep=1)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["step-6"]


def test_a_prune_that_fails_after_the_commit_says_the_new_checkpoint_is_complete(tmp_path, monkeypatch):
    """An older checkpoint that could not be removed (its files not the run's to delete) was reported as "Checkpoint
    step-6 could not be written ... what was written of this one is ignored", though step-6 was complete."""
    for step in (2, 4):
        (tmp_path / f"step-{step}").mkdir()
        checkpointing.write_manifest(tmp_path / f"step-{step}", step)
    (tmp_path / "step-6.tmp").mkdir()

    def refused(path):
        raise PermissionError(f"Permission denied: {path}")

    monkeypatch.setattr(checkpointing, "remove_checkpoint", refused)
    final = tmp_path / "step-6"
    with pytest.raises(checkpointing.CheckpointError) as error, checkpointing.reported_as_not_written(final):
        checkpointing.commit_checkpoint(tmp_path / "step-6.tmp", final, 6, keep=1)
    assert str(error.value).startswith(f"The older checkpoints could not be removed in {tmp_path}")
    assert "step-6 is complete and kept" in str(error.value) and "could not be written" not in str(error.value)
    assert checkpointing.verify_checkpoint(final)["step"] == 6


def test_a_checkpoint_whose_rename_cannot_be_flushed_is_said_to_be_complete(tmp_path, monkeypatch):
    """The folder is flushed after the rename, so that the rename is durable: an I/O error there was reported as
    "Checkpoint step-4 could not be written ... what was written of this one is ignored", though step-4 was complete
    under its name and `--resume` picks it."""
    (tmp_path / "step-2").mkdir()
    checkpointing.write_manifest(tmp_path / "step-2", 2)
    (tmp_path / "step-4.tmp").mkdir()
    fsync = checkpointing._fsync

    def failing(path):
        if path == tmp_path:
            raise OSError(errno.EIO, "Input/output error")
        fsync(path)

    monkeypatch.setattr(checkpointing, "_fsync", failing)
    final = tmp_path / "step-4"
    with pytest.raises(checkpointing.WriteError) as error, checkpointing.reported_as_not_written(final):
        checkpointing.commit_checkpoint(tmp_path / "step-4.tmp", final, 4)
    said = f"step-4/ is complete, but its rename could not be flushed to disk in {tmp_path} (OSError: [Errno 5]"
    assert str(error.value).startswith(said)
    assert "--resume continues from step-4" in str(error.value) and "could not be written" not in str(error.value)
    assert checkpointing.latest_checkpoint(tmp_path) == final


@pytest.mark.parametrize("fails", ["rename", "removal", "loss log"])
def test_an_earlier_run_that_cannot_be_removed_is_an_error_saying_so(tmp_path, monkeypatch, capsys, fails):
    """--overwrite-output-dir removes the earlier run's checkpoints (renamed aside, then removed) and loss log as
    training starts: on a file system gone read-only, or a file held open on NFS, that was an OSError traceback. It
    is one line now, and the same command run again removes the rest."""
    (tmp_path / "checkpoints/step-2").mkdir(parents=True)
    checkpointing.write_manifest(tmp_path / "checkpoints/step-2", 2)
    (tmp_path / "loss_curve.jsonl").write_text("{}\n")
    replace, rmtree, unlink = os.replace, shutil.rmtree, Path.unlink

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    if fails == "rename":
        monkeypatch.setattr(os, "replace", read_only)
    elif fails == "removal":
        monkeypatch.setattr(shutil, "rmtree", lambda path, *args, ignore_errors=False, **kwargs:
                            read_only() if not ignore_errors else rmtree(path, *args, ignore_errors=True, **kwargs))
    else:
        monkeypatch.setattr(Path, "unlink", read_only)
    parser = run_options.RunParser(prog="train")
    with pytest.raises(SystemExit) as stopped:
        output_folder.remove_the_earlier_run(parser, tmp_path, overwrite=True)
    name = "loss_curve.jsonl" if fails == "loss log" else "checkpoints"
    said = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in said
    assert f"error: --overwrite-output-dir: the earlier run's {name} could not be removed in {tmp_path} (OSError: " \
           "[Errno 30] Read-only file system" in said and "run the command again, which removes the rest" in said
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    monkeypatch.setattr(Path, "unlink", unlink)
    output_folder.claim_output_dir(parser, tmp_path, resume=False, overwrite=True)  # the same command, again
    output_folder.remove_the_earlier_run(parser, tmp_path, overwrite=True)
    assert sorted(path.name for path in tmp_path.iterdir()) == [output_folder.LOCK_FILE]


@pytest.mark.parametrize("fails", ["folder", "lock file"])
def test_an_output_folder_that_cannot_be_made_is_refused_before_any_work(tmp_path, monkeypatch, capsys, fails):
    """On a full disk (a new folder needs a block, the lock file an entry), over a quota, or on a file system gone
    read-only since the check of its permissions, making the output folder or its lock file was an OSError traceback
    before any work."""
    output = tmp_path / "run"
    owner, name, failing = (os, "mkdir", output) if fails == "folder" else (Path, "open", output / ".hf-scratch.lock")
    fail_as_on_a_full_disk(monkeypatch, owner, name, lambda path: path == failing)
    with pytest.raises(SystemExit) as stopped:
        output_folder.claim_output_dir(run_options.RunParser(prog="train"), output, resume=False, overwrite=False)
    said = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in said
    assert f"error: --output-dir {output} could not be made or locked in " in said
    assert "[Errno 28] No space left on device" in said and "Nothing of the run is done yet" in said


def test_a_trainer_checkpoint_folder_that_cannot_be_made_is_an_error_saying_so(tmp_path, monkeypatch):
    """On a full disk a new folder fails too (ext4 gives it a block), as it does over a quota: `checkpoint-N.tmp` was
    made before the checkpoint's write errors were named, and `hf-scratch train` ended in an OSError traceback. It is
    the checkpoint's error now, as every other write of it is, and the earlier checkpoint is the one to resume."""
    torch.manual_seed(0)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(3, 99, (8, 12))]
    arguments = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, save_steps=1,
                                  report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = trainer_checkpoints.CrashSafeTrainer(model=tiny_lm("decoder").train(), args=arguments, train_dataset=data)
    fail_as_on_a_full_disk(monkeypatch, os, "mkdir", lambda path: path.name == "checkpoint-2.tmp")
    message = r"Checkpoint checkpoint-2 could not be written in .* \(OSError: \[Errno 28\] No space left on device"
    with pytest.raises(checkpointing.WriteError, match=message):
        trainer.train()
    assert checkpointing.latest_checkpoint(tmp_path, checkpointing.TRAINER_PREFIX) == tmp_path / "checkpoint-1"


def test_an_earlier_model_folder_that_cannot_be_removed_leaves_the_new_one_in_place(tmp_path, monkeypatch):
    """A run's model folder replaced the earlier one by renaming it `model.deleted` and removing it, then renaming the
    new one in: a removal that failed (a file of it held open on NFS, a folder made read-only) left no `model/` at all,
    and the error said it was "as it was before" (the next command then removed `model.deleted`). The new folder now
    takes its place first; the error names the earlier one, left aside."""
    final = tmp_path / "model"
    for folder, weights in ((final, b"earlier"), (checkpointing.folder_aside(final), b"new")):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(weights)
    rmtree = shutil.rmtree

    def held_open(path, *args, **kwargs):  # NFS renames an open file it unlinks (.nfsNNNN): its folder stays
        if Path(path) == tmp_path / "model.deleted" and not kwargs.get("ignore_errors"):
            raise OSError(errno.ENOTEMPTY, "Directory not empty", str(path))
        return rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", held_open)
    with pytest.raises(checkpointing.WriteError) as error, checkpointing.model_folder_reported_as_not_written(final):
        checkpointing.replace_folder(tmp_path / "model.tmp", final)
    assert (final / "model.safetensors").read_bytes() == b"new"
    assert (tmp_path / "model.deleted/model.safetensors").read_bytes() == b"earlier"
    assert str(error.value).startswith(f"The earlier model/ could not be removed in {tmp_path} (OSError: [Errno 39]")
    assert f"{final} is complete, this run's" in str(error.value) and "as it was before" not in str(error.value)


def test_a_model_folder_that_cannot_take_its_place_leaves_the_earlier_one_in_place(tmp_path, monkeypatch):
    """The earlier model folder is renamed aside before the new one is renamed in: a second rename that failed left
    it in `model.deleted`, which the next command into the folder removes, under an error saying `model/` was as it
    was before. It is put back now."""
    final = tmp_path / "model"
    for folder, weights in ((final, b"earlier"), (checkpointing.folder_aside(final), b"new")):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(weights)
    replace = os.replace

    def read_only(source, target, *args, **kwargs):
        if Path(source).name == "model.tmp":
            raise OSError(errno.EROFS, "Read-only file system", str(target))
        return replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", read_only)
    with pytest.raises(checkpointing.WriteError) as error, checkpointing.model_folder_reported_as_not_written(final):
        checkpointing.replace_folder(tmp_path / "model.tmp", final)
    assert (final / "model.safetensors").read_bytes() == b"earlier"
    assert not (tmp_path / "model.deleted").exists()
    assert "Read-only file system" in str(error.value) and "model/ as it was before" in str(error.value)


def test_what_an_interrupted_removal_left_in_the_output_folder_is_cleared(tmp_path):
    """A kill while --overwrite-output-dir removed the earlier checkpoints, or while a model folder was replaced,
    leaves them renamed aside, which nothing reads: the next command into the folder removes them."""
    for leftover in ("checkpoints.deleted/step-2", "model.deleted"):
        (tmp_path / leftover).mkdir(parents=True)
        (tmp_path / leftover / "model.safetensors").write_bytes(b"0" * 64)
    (tmp_path / "loss_curve.jsonl").write_text("{}\n")
    output_folder.claim_output_dir(run_options.RunParser(prog="train"), tmp_path, resume=True, overwrite=False)
    assert sorted(path.name for path in tmp_path.iterdir()) == [output_folder.LOCK_FILE, "loss_curve.jsonl"]


@pytest.mark.parametrize("setting, value", [
    ("gradient_accumulation_steps", 2), ("per_device_train_batch_size", 2), ("max_grad_norm", 0.5),
    ("lr_scheduler_type", "constant"), ("warmup_steps", 1), ("seed", 3)])
def test_a_trainer_resumed_with_a_setting_that_shapes_the_steps_changed_names_it(tmp_path, capsys, setting, value):
    """Each of `STEP_SETTINGS` is recorded in the checkpoint's manifest and named when the resuming run's differs:
    Trainer takes the resuming command's, and the steps then differ from the uninterrupted run's without a word."""
    torch.manual_seed(0)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(3, 99, (8, 12))]
    settings = dict(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, save_steps=2, report_to=[],
                    use_cpu=True, disable_tqdm=True)

    def trainer(**changed) -> trainer_checkpoints.CrashSafeTrainer:
        return trainer_checkpoints.CrashSafeTrainer(model=tiny_lm("decoder").train(), train_dataset=data,
                                                    args=TrainingArguments(**settings | changed))

    trainer().train()
    capsys.readouterr()
    trainer(**{setting: value}).train(resume_from_checkpoint=True)  # at its last step: it trains nothing more
    stdout = capsys.readouterr().out
    assert f"changed settings {{'{setting}': (" in stdout and "make the steps differ" in stdout, stdout


def test_the_best_checkpoint_survives_pruning_and_resumes_under_its_final_name(tmp_path):
    """With `load_best_model_at_end`, Trainer keeps the best checkpoint past `save_total_limit` and loads it at the
    end. CrashSafeTrainer's pruning removed it (the run then failed at its end with a FileNotFoundError), and the
    best checkpoint's trainer_state.json named its staging folder (`checkpoint-1.tmp/checkpoint-1`), which a resumed
    run dropped as missing."""
    torch.manual_seed(0)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(3, 99, (8, 12))]
    scores = iter([3.0, 1.0, 2.0])  # step 1 is the best
    arguments = TrainingArguments(
        output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-2, eval_strategy="steps",
        eval_steps=1, save_steps=1, save_total_limit=1, load_best_model_at_end=True, metric_for_best_model="score",
        greater_is_better=True, report_to=[], use_cpu=True, disable_tqdm=True)
    trainer = trainer_checkpoints.CrashSafeTrainer(model=tiny_lm("decoder").train(), args=arguments, train_dataset=data,
                                             eval_dataset=data[:2], compute_metrics=lambda _: {"score": next(scores)})
    trainer.train()
    best = tmp_path / "checkpoint-1"
    assert trainer.state.best_model_checkpoint == str(best)
    # Pruned at each save to the newest and the best; at the end Trainer removes all but the best (limit 1).
    assert sorted(path.name for path in tmp_path.iterdir() if path.name.startswith("checkpoint")) == ["checkpoint-1"]
    weights = load_file(best / "model.safetensors")
    assert all(torch.equal(trainer.model.state_dict()[name], tensor) for name, tensor in weights.items())
    assert json.loads((best / "trainer_state.json").read_text())["best_model_checkpoint"] == str(best)
    checkpointing.verify_checkpoint(best)


def test_a_written_folder_flushes_its_nested_folders_entries(tmp_path, monkeypatch):
    """`write_manifest` (a checkpoint) and `replace_folder` (a model folder) flushed the files and one folder, not
    the folders inside (a model's `tokenizer/`): after a power loss their entries could be missing under a manifest
    saying complete. Every folder's entries are flushed, recorded as `os.fsync` on a folder's descriptor."""
    flushed = set()
    fsync = os.fsync

    def recording(descriptor):
        status = os.fstat(descriptor)
        if stat.S_ISDIR(status.st_mode):
            flushed.add(status.st_ino)
        fsync(descriptor)

    for name in ("checkpoint-1", "model.tmp"):
        (tmp_path / name / "tokenizer" / "extra").mkdir(parents=True)
        (tmp_path / name / "tokenizer" / "extra" / "vocab.txt").write_text("a")
        (tmp_path / name / "model.safetensors").write_bytes(b"1" * 64)
    monkeypatch.setattr(os, "fsync", recording)
    checkpointing.write_manifest(tmp_path / "checkpoint-1", 1)
    checkpointing.replace_folder(tmp_path / "model.tmp", tmp_path / "model")
    for written in (tmp_path / "checkpoint-1", tmp_path / "model"):
        for folder in (written, written / "tokenizer", written / "tokenizer" / "extra"):
            assert folder.stat().st_ino in flushed, folder


def test_resuming_reads_each_checkpoint_file_for_its_checksum_once(tmp_path, monkeypatch):
    """A resumed run finds the latest checkpoint that verifies, then verifies it again as it loads it (Trainer's
    resume, the accelerate loop's load): every file was read twice for its SHA-256, minutes on a large model."""
    checkpoint = tmp_path / "checkpoint-2"
    (checkpoint / "optimizer").mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"1" * 64)
    (checkpoint / "optimizer" / "state.bin").write_bytes(b"2" * 32)
    checkpointing.write_manifest(checkpoint, 2)
    hashed = []
    sha256 = checkpointing._sha256
    monkeypatch.setattr(checkpointing, "_sha256", lambda file: hashed.append(Path(file)) or sha256(file))
    assert checkpointing.latest_checkpoint(tmp_path, checkpointing.TRAINER_PREFIX, report=None) == checkpoint
    checkpointing.verify_checkpoint(checkpoint)
    assert sorted(hashed) == [checkpoint / "model.safetensors", checkpoint / "optimizer" / "state.bin"]


def test_a_checkpoint_that_cannot_be_read_stops_the_resume_naming_it(tmp_path, monkeypatch):
    """A checkpoint whose files this user may not read (another user's copy) was a PermissionError traceback. Named
    instead, and not skipped for the older one: the run resumed from that would save over it and prune around it."""
    for step in (1, 2):
        (tmp_path / f"step-{step}").mkdir()
        (tmp_path / f"step-{step}" / "model.safetensors").write_bytes(b"1" * 64)
        checkpointing.write_manifest(tmp_path / f"step-{step}", step)
    sha256 = checkpointing._sha256

    def unreadable_step_2(file):
        if Path(file).parent.name == "step-2":
            raise PermissionError(13, "Permission denied", str(file))
        return sha256(file)

    monkeypatch.setattr(checkpointing, "_sha256", unreadable_step_2)
    unreadable = f"step-2 cannot be read: Permission denied ({tmp_path / 'step-2' / 'model.safetensors'})"
    with pytest.raises(checkpointing.CheckpointUnreadable, match=re.escape(unreadable)):
        checkpointing.latest_checkpoint(tmp_path, report=None)


def test_a_checkpoint_under_another_steps_name_is_refused(tmp_path):
    """A checkpoint copied or renamed to another step's name (step-8 as step-10) verified, and the run resumed from
    it counted from the step its name said: its last steps were never trained, the model folder said they were."""
    for prefix in (checkpointing.ACCELERATE_PREFIX, checkpointing.TRAINER_PREFIX):
        checkpoint = tmp_path / f"{prefix}-8"
        checkpoint.mkdir()
        (checkpoint / "model.safetensors").write_bytes(b"1" * 64)
        checkpointing.write_manifest(checkpoint, 8)
        checkpoint.rename(tmp_path / f"{prefix}-10")
        with pytest.raises(checkpointing.CheckpointError, match=f"{prefix}-10 is not what its name says: its "
                                                                 "COMPLETE.json records step 8"):
            checkpointing.verify_checkpoint(tmp_path / f"{prefix}-10")
        with pytest.raises(checkpointing.CheckpointError, match="None of the 1 checkpoints"):
            checkpointing.latest_checkpoint(tmp_path, prefix, report=None)
        shutil.rmtree(tmp_path / f"{prefix}-10")


def test_a_file_changed_after_its_checkpoint_verified_is_read_again(tmp_path):
    """Verified checksums are remembered for the files as they were (size, modification time): a file overwritten
    since, of the same size, is read again and the corruption named."""
    checkpoint = tmp_path / "step-1"
    checkpoint.mkdir()
    (checkpoint / "model.safetensors").write_bytes(b"1" * 64)
    checkpointing.write_manifest(checkpoint, 1)
    checkpointing.verify_checkpoint(checkpoint)
    time.sleep(0.05)  # past the file system's timestamp granularity
    (checkpoint / "model.safetensors").write_bytes(b"2" * 64)
    with pytest.raises(checkpointing.CheckpointError, match="model.safetensors does not match its SHA-256"):
        checkpointing.verify_checkpoint(checkpoint)


def test_resuming_a_tied_model_does_not_warn_of_missing_weights(tmp_path):
    """Trainer said "There were missing keys in the checkpoint model loaded: ['lm_head.weight']" on every resume of
    a tied model (native GPT-2 alike): the file stores the tied matrix once. Said only of keys that are lost."""
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(3, 99, (8, 12))]

    def trainer(max_steps):
        arguments = TrainingArguments(output_dir=str(tmp_path), max_steps=max_steps, per_device_train_batch_size=4,
                                      save_steps=2, report_to=[], use_cpu=True, disable_tqdm=True)
        return trainer_checkpoints.CrashSafeTrainer(model=tiny_lm("decoder").train(), args=arguments,
                                                    train_dataset=data)

    trainer(2).train()
    resumed = trainer(4)
    with CaptureLogger(transformers_trainer_logger) as captured:
        resumed.train(resume_from_checkpoint=True)
    assert "missing keys" not in captured.out
    assert resumed.model.lm_head.weight is resumed.model.get_input_embeddings().weight
    with CaptureLogger(transformers_trainer_logger) as captured:
        resumed._issue_warnings_after_load(torch.nn.modules.module._IncompatibleKeys(["lm_head.weight", "x"], []))
    assert "There were missing keys in the checkpoint model loaded: ['x']" in captured.out


@pytest.mark.parametrize("use_cache", [True, False])
def test_saved_folders_keep_the_models_own_use_cache(tmp_path, use_cache):
    """Trainer sets `config.use_cache = False` for training (transformers 5), and its saves wrote that into the
    trained model's folder and checkpoints: the model then returned no cache. Training keeps Trainer's switch."""
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(3, 99, (8, 12))]
    arguments = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, save_steps=2,
                                  report_to=[], use_cpu=True, disable_tqdm=True)
    model = tiny_lm("decoder", use_cache=use_cache).train()
    trainer = trainer_checkpoints.CrashSafeTrainer(model=model, args=arguments, train_dataset=data)
    trainer.train()
    trainer.save_model(str(tmp_path / "model"))
    assert model.config.use_cache is False
    for folder in (tmp_path / "model", tmp_path / "checkpoint-2"):
        assert json.loads((folder / "config.json").read_text())["use_cache"] is use_cache


def test_a_checkpoint_of_another_head_is_refused_by_name(tmp_path):
    """A text classifier's checkpoint resumed by a token classification run (`finetune --task`) of as many labels
    has the same tensors: the run went on from it, its head of one vector per text taken as the head of every word."""
    from tiny_models import tiny_config

    from hf_scratch_transformer import ScratchEncoderForSequenceClassification, ScratchEncoderForTokenClassification

    torch.manual_seed(0)
    ids = torch.randint(3, 99, (8, 12))

    def trainer(head, max_steps, labels):
        arguments = TrainingArguments(output_dir=str(tmp_path), max_steps=max_steps, per_device_train_batch_size=4,
                                      save_steps=2, report_to=[], use_cpu=True, disable_tqdm=True)
        data = [{"input_ids": row, "labels": label} for row, label in zip(ids, labels, strict=True)]
        return trainer_checkpoints.CrashSafeTrainer(model=head(tiny_config("encoder", num_labels=2)).train(),
                                                    args=arguments, train_dataset=data)

    trainer(ScratchEncoderForSequenceClassification, 2, [i % 2 for i in range(8)]).train()
    resumed = trainer(ScratchEncoderForTokenClassification, 4, (ids % 2).tolist())
    with pytest.raises(checkpointing.CheckpointError, match="checkpoint-2 holds a ScratchEncoderForSequenceClassifi"
                                                            "cation; this run trains a ScratchEncoderForTokenClassi"):
        resumed.train(resume_from_checkpoint=True)
    trainer(ScratchEncoderForSequenceClassification, 4, [i % 2 for i in range(8)]).train(resume_from_checkpoint=True)


class ReachedTraining(Exception):
    pass


def test_finetune_records_its_epochs_among_the_settings_that_shape_the_steps(monkeypatch, tmp_path):
    """Without --max-steps, --epochs sets the steps and the learning-rate schedule; changed on --resume, it went
    unsaid (the checkpoint recorded max_steps -1 either way), where another --max-steps is named."""
    from hf_scratch_transformer.cli import main

    tokenizer = wordpiece()
    tiny_lm("encoder", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id).save_pretrained(tmp_path / "mlm")
    tokenizer.save_pretrained(tmp_path / "mlm")
    (tmp_path / "train.csv").write_text("\n".join(["text,label"] + [f"a dog runs {i},{i % 2}" for i in range(10)]))
    settings = []

    def train(self, *args, **kwargs):
        settings.append(self._step_settings())
        raise ReachedTraining

    monkeypatch.setattr(trainer_checkpoints.CrashSafeTrainer, "train", train)
    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    for run, budget in enumerate((["--epochs", "2"], ["--epochs", "2", "--max-steps", "3"])):
        with pytest.raises(ReachedTraining):
            main(["finetune", "--model", str(tmp_path / "mlm"), "--task", "text-classification", "--train-file",
                  str(tmp_path / "train.csv"), *budget, "--output-dir", str(tmp_path / f"out{run}")])
    assert settings[0]["epochs"] == 2.0 and settings[0]["max_steps"] == -1
    assert "epochs" not in settings[1] and settings[1]["max_steps"] == 3, "--max-steps sets the steps alone"
