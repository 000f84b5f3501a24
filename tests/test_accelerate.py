"""The Accelerate loop (`scripts/train_accelerate.py`) end to end at tiny sizes, and its atomic checkpoints
(`hf_scratch_transformer/checkpointing.py`): exact resume, two CPU processes equal to one with the combined batch
(and the Trainer script under the same launcher), checkpoint integrity, mixed precision, and the saved model."""

import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import tiny_texts
import torch
import torch.distributed.checkpoint
import yaml
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.utils import DistributedType
from accelerate.utils.dataclasses import get_module_class_from_name
from forked_python import run_python, with_forked_processes
from full_disk import fail_as_on_a_full_disk
from huggingface_hub import ModelCard
from safetensors.torch import load_file, save_file
from tiny_models import tiny_config, tiny_lm
from tiny_texts import squad_rows, write_json_lines
from tiny_tokenizers import wordpiece, write_run_corpus
from torch.distributed.fsdp import StateDictType
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorForTokenClassification,
)

from hf_scratch_transformer import ScratchEncoderForMaskedLM, checkpointing, question_answering, training_data
from hf_scratch_transformer.checkpointing import CheckpointError
from hf_scratch_transformer.presets import get_preset

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts/train_accelerate.py"
CONFIGS = ROOT / "configs/accelerate"
TINY = ["--set", "num_hidden_layers=1", "hidden_size=32", "num_attention_heads=2", "intermediate_size=64"]
NO_DROPOUT = ["dropout=0", "attention_dropout=0", "embedding_dropout=0"]
TINY_SEQ2SEQ = ["--set", "encoder_layers=1", "decoder_layers=1", "hidden_size=32", "num_attention_heads=2",
                "intermediate_size=64"]
RUN = ["--max-length", "32", "--max-eval-samples", "8"]
# Exact resume: batch 4, accumulation 2, label smoothing, the preset's dropout on (so the RNG must be restored).
RESUME_RUN = [*RUN, "--batch-size", "4", "--gradient-accumulation-steps", "2", "--label-smoothing", "0.1",
              "--save-steps", "2", "--keep-checkpoints", "10", "--max-steps", "8"]
STOP = 4


# torch's warning each step of a DDP run told to search for unused parameters finds none (Trainer's default)
UNUSED_SEARCH = "find_unused_parameters=True was specified in DDP constructor"


def run(*arguments, cwd: Path, launcher: list[str] | None = None, env: dict | None = None,
        expect_failure: bool = False, limit_file_size: int | None = None, timeout: int = 600) -> str:
    """`limit_file_size` (bytes): a write past it fails as on a full disk (see forked_python); `timeout` (seconds):
    a run still going then fails the test (subprocess.TimeoutExpired)."""
    environment = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"} | (env or {})
    command = (launcher or [sys.executable]) + [str(argument) for argument in arguments]
    if launcher:  # it starts the processes of the run as fresh interpreters
        assert not limit_file_size
        result = run_launched(command, cwd=cwd, env=environment, timeout=timeout)
    else:
        result = run_python(command, cwd=cwd, env=environment, timeout=timeout, limit_file_size=limit_file_size)
    output = result.stdout + result.stderr
    if expect_failure:
        assert result.returncode != 0, output[-3000:]
    else:
        assert result.returncode == 0, output[-5000:]
    return output


def run_launched(command: list[str], cwd: Path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    """A launcher and the processes it starts: on a timeout all of them are killed (a hung run's processes, left
    behind, would wait in their collectives for the rest of the suite; torchrun starts them in sessions of their
    own)."""
    with subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_launched(process)
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def kill_launched(process: subprocess.Popen) -> None:
    """Kill a launcher that still runs and the processes it started."""
    if process.poll() is None:
        for launched in [*psutil.Process(process.pid).children(recursive=True), process]:
            launched.kill()


def losses(folder: Path) -> dict[int, float]:
    return {record["step"]: record["loss"] for record in map(json.loads, (folder / "loss_curve.jsonl").open())}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def two_cpu_processes(launcher: str, fresh: bool = False) -> tuple[list[str], dict]:
    """A launcher command for 2 gloo processes on this CPU; ACCELERATE_USE_CPU=1 makes Accelerate (and Trainer) join
    them on the CPU instead of running each alone. The processes are forked from forked_python's server, which has
    imported what they import; `fresh`: fresh interpreters, as users' runs start (a test per launcher)."""
    env = {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    if launcher == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    else:
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "cpu_2proc.yaml"),
                   "--main_process_port", str(free_port())]
    return (command if fresh else with_forked_processes(command)), env


def fsdp_launcher(fresh: bool = False) -> list[str]:
    """2 gloo processes sharded as configs/accelerate/fsdp.yaml shards on GPUs (needs the environment of
    `two_cpu_processes`), forked as there unless `fresh`."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(CONFIGS / "fsdp_cpu_2proc.yaml"), "--main_process_port", str(free_port())]
    return command if fresh else with_forked_processes(command)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """The tiny corpus and a tokenizer per family, trained once."""
    return write_run_corpus(tmp_path_factory.mktemp("accelerate"), ("decoder", "encoder", "seq2seq"))


def causal(workspace: Path) -> list:
    return ["--train-files", workspace / "corpus.txt", "--tokenizer", workspace / "decoder"]


@pytest.fixture(scope="module")
def uninterrupted(workspace):
    output = workspace / "full"
    run(SCRIPT, *causal(workspace), *RESUME_RUN, *TINY, "--output-dir", output, cwd=workspace)
    return output


# ----------------------------------------------------------------------------------------------- (a) exact resume


def test_resumed_run_repeats_the_uninterrupted_loss_curve_step_for_step(workspace, uninterrupted):
    # The resume point lies inside the second epoch, and the run crosses an epoch end inside a step.
    texts = training_data.load_texts([str(workspace / "corpus.txt")], seed=1337)["train"]
    blocks = training_data.pack_for_causal_lm(texts, AutoTokenizer.from_pretrained(workspace / "decoder"), 32)
    batches_per_epoch = len(blocks) // 4
    assert batches_per_epoch < STOP * 2 < 2 * batches_per_epoch and (STOP * 2) % batches_per_epoch != 0
    assert batches_per_epoch % 2 == 1

    output = workspace / "interrupted"
    arguments = [SCRIPT, *causal(workspace), *RESUME_RUN, *TINY, "--output-dir", output]
    stdout = run(*arguments, "--stop-at-step", STOP, cwd=workspace)
    assert f"stopped after step {STOP} of 8" in stdout and not (output / "model").exists()
    assert "Removed shared tensor" not in stdout  # Accelerate's warning at each checkpoint of the tied model
    assert max(losses(output)) == STOP
    # Leftovers of interrupted saves are never picked: a .tmp folder and a folder without its manifest.
    (output / "checkpoints/step-6.tmp").mkdir()
    (output / "checkpoints/step-7").mkdir()
    stdout = run(*arguments, "--resume", cwd=workspace)
    assert f"resumed from {output / 'checkpoints' / f'step-{STOP}'} at step {STOP}" in stdout
    assert "changed settings" not in stdout

    expected, resumed = losses(uninterrupted), losses(output)
    assert sorted(resumed) == list(range(1, 9)) == sorted(expected)
    for step in range(STOP + 1, 9):
        assert resumed[step] == pytest.approx(expected[step], abs=1e-6), step
    full_weights = load_file(uninterrupted / "model/model.safetensors")
    resumed_weights = load_file(output / "model/model.safetensors")
    for name, tensor in full_weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["masked-lm", "seq2seq"])
def test_exact_resume_for_masked_lm_and_seq2seq_in_bf16(workspace, task):
    data = (["--train-files", workspace / "corpus.txt", "--tokenizer", workspace / "encoder", *TINY]
            if task == "masked-lm" else
            ["--source-files", workspace / "train.src", "--target-files", workspace / "train.tgt", "--tokenizer",
             workspace / "seq2seq", *TINY_SEQ2SEQ, "--lr-scheduler", "inverse_sqrt"])
    arguments = [SCRIPT, "--task", task, *data, *RESUME_RUN, "--max-steps", "6", "--mixed-precision", "bf16",
                 "--force-bf16"]  # bf16's numerics on any CPU, however slow its products there
    run(*arguments, "--output-dir", workspace / f"{task}-full", cwd=workspace)
    run(*arguments, "--output-dir", workspace / f"{task}-part", "--stop-at-step", 3, cwd=workspace)
    run(*arguments, "--output-dir", workspace / f"{task}-part", "--resume", cwd=workspace)
    expected, resumed = losses(workspace / f"{task}-full"), losses(workspace / f"{task}-part")
    assert sorted(resumed) == list(range(1, 7))
    for step in range(4, 7):
        assert resumed[step] == pytest.approx(expected[step], abs=1e-6), step
    if task == "masked-lm":  # bert-prenorm has no token types: the folder's tokenizer gives a pair no segment ids
        assert "token_type_ids" not in AutoTokenizer.from_pretrained(workspace / f"{task}-part/model")("a", "b")


def card_hyperparameters(folder: Path) -> dict[str, str]:
    """The rows of the "Hyper-parameter | Value" table of the card in `folder`."""
    text = (folder / "README.md").read_text()
    table = text[text.index("| Hyper-parameter | Value |"):].split("\n\n")[0]
    return dict(re.findall(r"^\| (\w+) \| (.*) \|$", table, flags=re.MULTILINE))


def card_eval_loss(folder: Path) -> float:
    """The "Eval loss" of the card in `folder`."""
    return float(re.search(r"\| Eval loss \| \S+ \| ([\d.]+) \|", (folder / "README.md").read_text())[1])


@pytest.mark.parametrize("max_grad_norm", [0.5, 0])
def test_train_and_train_accelerate_take_the_same_steps(workspace, tmp_path, max_grad_norm):
    """Each step over the whole training set (batch 1 x as many micro-steps as blocks, the last one short: the data
    order cannot matter, the loss normalisation over the global batch's tokens does), no dropout, the same options:
    `train` (Trainer) and `train-accelerate` take the same steps, loss, learning rate (the step's, before the schedule
    steps) and gradient norm, and come to the same weights; their cards record the same settings. Without clipping the
    Accelerate loop logged no gradient norm (Trainer logs the norm anyway), and the cards left out the weight decay
    (both) and the Adam epsilon (train-accelerate's)."""
    paragraphs = (workspace / "corpus.txt").read_text().split("\n\n")
    (tmp_path / "train.txt").write_text("\n\n".join(paragraphs[:10]))
    (tmp_path / "valid.txt").write_text("\n\n".join(paragraphs[-10:]))
    texts = training_data.load_texts([str(tmp_path / "train.txt")], validation_files=[str(tmp_path / "valid.txt")])
    blocks = training_data.pack_for_causal_lm(texts["train"], AutoTokenizer.from_pretrained(workspace / "decoder"), 32)
    assert 1 < len(blocks) < 10 and -100 in blocks[-1]["labels"]  # the last block short: fewer labels than the others
    arguments = ["--train-files", tmp_path / "train.txt", "--validation-files", tmp_path / "valid.txt", "--tokenizer",
                 workspace / "decoder", *RUN, *TINY, *NO_DROPOUT, "--batch-size", 1, "--gradient-accumulation-steps",
                 len(blocks), "--max-steps", 6, "--learning-rate", 3e-3, "--lr-scheduler", "linear", "--warmup-steps",
                 2, "--weight-decay", 0.1, "--adam-epsilon", 1e-6, "--label-smoothing", 0.1, "--max-grad-norm",
                 max_grad_norm, "--model-name", "user/tiny"]
    run(ROOT / "scripts/train.py", *arguments, "--adam-beta2", 0.98, "--eval-steps", 6, "--output-dir",
        tmp_path / "trainer", cwd=workspace)
    run(SCRIPT, *arguments, "--adam-betas", 0.9, 0.98, "--output-dir", tmp_path / "accelerate", cwd=workspace)

    state = json.loads((tmp_path / "trainer/checkpoints/checkpoint-6/trainer_state.json").read_text())
    trainer_log = [entry for entry in state["log_history"] if "loss" in entry]
    loop_log = [json.loads(line) for line in (tmp_path / "accelerate/loss_curve.jsonl").open()]
    assert [entry["step"] for entry in trainer_log] == [record["step"] for record in loop_log] == list(range(1, 7))
    for logged, record in zip(trainer_log, loop_log, strict=True):
        assert record["loss"] == pytest.approx(logged["loss"], abs=1e-5), record
        assert record["lr"] == pytest.approx(logged["learning_rate"], rel=1e-9), record
        assert record["grad_norm"] == pytest.approx(logged["grad_norm"], rel=1e-5), record
    assert [record["lr"] for record in loop_log] == pytest.approx([0, 1.5e-3, 3e-3, 2.25e-3, 1.5e-3, 0.75e-3])
    if max_grad_norm:  # the clipping bites
        assert all(record["grad_norm"] > max_grad_norm for record in loop_log)
    assert_close_weights(tmp_path / "accelerate/model", tmp_path / "trainer/model")
    trainer_card, loop_card = (card_hyperparameters(tmp_path / f"{run_dir}/model") for run_dir in ("trainer",
                                                                                                   "accelerate"))
    assert trainer_card == loop_card
    assert {"weight_decay": "0.1", "adam_betas": "(0.9, 0.98)", "adam_epsilon": "1e-06"}.items() <= loop_card.items()
    # Smoothing is the training objective only: both validation losses are the model's own cross-entropy
    trainer_loss, loop_loss = (card_eval_loss(tmp_path / f"{run_dir}/model") for run_dir in ("trainer", "accelerate"))
    assert loop_loss == pytest.approx(trainer_loss, abs=1e-4)


def test_a_step_with_no_labelled_token_logs_none(workspace, tmp_path):
    """A masked LM's rows of one word each are mostly left unmasked: a step of such rows has no labelled token, and its
    loss is 0 (divided by 1, not 0). The log said `"tokens": 1` there, the divisor, not the count."""
    (tmp_path / "words.txt").write_text("\n\n".join("the man dog horse street".split() * 4))
    run(SCRIPT, "--task", "masked-lm", "--train-files", tmp_path / "words.txt", "--tokenizer", workspace / "encoder",
        *RUN, *TINY, "--batch-size", 1, "--max-steps", 6, "--output-dir", tmp_path / "out", cwd=workspace)
    records = [json.loads(line) for line in (tmp_path / "out/loss_curve.jsonl").open()]
    unmasked = [record for record in records if record["loss"] == 0]
    assert unmasked and all(record["tokens"] == 0 and record["grad_norm"] == 0 for record in unmasked), records
    assert all(record["tokens"] >= 1 for record in records if record["loss"] != 0), records


# ----------------------------------------------------------------------------------------------- (b) two processes


def assert_close_weights(folder: Path, expected: Path) -> None:
    weights, expected_weights = (load_file(path / "model.safetensors") for path in (folder, expected))
    assert weights.keys() == expected_weights.keys()
    for name, tensor in expected_weights.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-5)


def test_two_processes_equal_one_process_with_the_combined_batch(workspace):
    # No dropout: each process draws its own masks, which one process cannot reproduce.
    # 3 validation sequences: Accelerate fills the second process's last batch with a repeat of the first.
    arguments = [SCRIPT, *causal(workspace), *RUN, *TINY, *NO_DROPOUT, "--max-steps", 3,
                 "--gradient-accumulation-steps", 2, "--label-smoothing", 0.1, "--max-length", 16,
                 "--max-eval-samples", 3]
    launcher, env = two_cpu_processes("accelerate", fresh=True)
    stdout = run(*arguments, "--batch-size", 2, "--output-dir", workspace / "ddp", launcher=launcher, env=env,
                 cwd=workspace)
    assert "2 x MULTI_CPU" in stdout
    run(*arguments, "--batch-size", 4, "--output-dir", workspace / "single", cwd=workspace)

    two, one = losses(workspace / "ddp"), losses(workspace / "single")
    assert sorted(two) == sorted(one) == [1, 2, 3]
    for step in one:
        assert two[step] == pytest.approx(one[step], abs=1e-5), step
    assert_close_weights(workspace / "ddp/model", workspace / "single/model")
    # The final validation loss counts each sequence once (the repeat counted twice under two processes).
    two, one = (card_eval_loss(workspace / run_dir / "model") for run_dir in ("ddp", "single"))
    assert two == pytest.approx(one, abs=1e-5)
    # Both cards give the global batch: 2 processes x 2 sequences x 2 micro-steps, 1 process x 4 x 2
    assert card_hyperparameters(workspace / "ddp/model")["global_batch_size"] == \
        card_hyperparameters(workspace / "single/model")["global_batch_size"] == "8"
    # Two steps were checkpointed by both processes together: one RNG state each.
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in (workspace / "ddp/checkpoints/step-3")
                                                              .iterdir()}
    # Resumed in one process with the same global batch, it takes the same step 3. The script said the changed batch
    # size and process count "make the steps differ from an uninterrupted run".
    checkpoint, regrouped = workspace / "ddp/checkpoints/step-2", workspace / "ddp-in-one"
    stdout = run(*arguments, "--batch-size", 4, "--output-dir", regrouped, "--resume-from", checkpoint, cwd=workspace)
    assert "split over 2 processes, now over 1: the same batches and steps" in stdout
    assert "changed settings" not in stdout
    assert losses(regrouped) == pytest.approx(losses(workspace / "single"), abs=1e-5)
    assert_close_weights(regrouped / "model", workspace / "single/model")


def test_only_the_main_process_writes_the_model_folder(workspace):
    """The other processes called save_pretrained too (with is_main_process=False), which makes and lists
    `model.tmp` while the main process writes it and renames it to `model`: a process a little late failed with a
    FileNotFoundError (and the launcher then killed the main one). Here the other process lists such folders late."""
    launcher, env = two_cpu_processes("accelerate")
    output = workspace / "late"
    run(ROOT / "tests/crash_injection.py", "late", 3, "hf_scratch_transformer.cli.train_accelerate", *causal(workspace),
        *RUN, *TINY, "--max-steps", 1, "--batch-size", 2, "--output-dir", output, launcher=launcher, env=env,
        cwd=workspace)
    assert (output / "model/model.safetensors").is_file() and not (output / "model.tmp").exists()


@pytest.mark.parametrize(("command", "launcher", "saved"), [("train_accelerate", "accelerate", "saved"),
                                                            ("train", "torchrun", "saved a Hub-ready folder:")])
def test_a_process_that_dies_as_it_exits_does_not_cost_the_model(workspace, command, launcher, saved):
    """A run of two processes once ended with the other process aborting in its teardown ("terminate called without
    an active exception": SIGABRT) while the main one still wrote the model folder, which the launcher then killed:
    the run's model was lost. The other processes now wait for the main one to write it before they end."""
    launcher, env = two_cpu_processes(launcher)
    output = workspace / f"abort-at-exit-{command}"
    stdout = run(ROOT / "tests/crash_injection.py", "exit", 3, f"hf_scratch_transformer.cli.{command}",
                 *causal(workspace), *RUN, *TINY, "--max-steps", 1, "--batch-size", 2, "--output-dir", output,
                 launcher=launcher, env=env, cwd=workspace, expect_failure=True)
    assert "SIGABRT" in stdout and f"{saved} {output / 'model'}" in stdout
    assert {"model.safetensors", "README.md", "tokenizer.json"} <= {path.name for path in (output / "model").iterdir()}


def test_a_time_budget_stops_every_process_after_the_same_step(workspace):
    """Each process checked --max-minutes against its own clock: one whose budget ran out a step before the other's
    stopped, and the other waited for it in the next step's gradient exchange for good (the run hung). Here the other
    process's clock runs twice as fast."""
    launcher, env = two_cpu_processes("torchrun")
    output = workspace / "time-budget"
    stdout = run(ROOT / "tests/crash_injection.py", "clock", 2, "hf_scratch_transformer.cli.train", *causal(workspace),
                 *RUN, *TINY, "--max-steps", 100000, "--max-minutes", 0.05, "--batch-size", 2, "--output-dir", output,
                 launcher=launcher, env=env, cwd=workspace, timeout=180)
    stopped = re.findall(r"--max-minutes 0.05: stopped after step (\d+) of 100000", stdout)
    assert len(stopped) == 1, stdout[-3000:]
    assert (output / f"checkpoints/checkpoint-{stopped[0]}").is_dir()
    assert (output / "model/model.safetensors").is_file()


@pytest.mark.parametrize("module", ["hf_scratch_transformer.cli.train", "hf_scratch_transformer.cli.train_accelerate"])
def test_a_sigterm_to_one_process_stops_every_process_after_the_same_step(workspace, module):
    """A launcher's SIGTERM reaches its processes at different steps (here the other process alone gets one, during
    step 3): every process stops after the same step, the main one writing the checkpoint's manifest, rather than
    the others waiting for one that left in the next step's gradient exchange."""
    launcher, env = two_cpu_processes("torchrun")
    output = workspace / f"sigterm-{module.rsplit('.', 1)[1]}"
    stdout = run(ROOT / "tests/crash_injection.py", "term", 3, module, *causal(workspace), *RUN, *TINY, "--max-steps",
                 10, "--save-steps", 2, "--batch-size", 2, "--output-dir", output, launcher=launcher, env=env,
                 cwd=workspace, timeout=300, expect_failure=True)  # torchrun reports its processes' status 143
    prefix = "step" if module.endswith("accelerate") else "checkpoint"
    assert stdout.count(f"stopped by SIGTERM after step 3 of 10, checkpointed in {output}/checkpoints/{prefix}-3: "
                        "--resume continues") == 1, stdout[-3000:]
    manifest = checkpointing.verify_checkpoint(output / f"checkpoints/{prefix}-3")
    assert {"random_states_1.pkl", "rng_state_1.pth"} & set(manifest["files"]), "the other process's state is in it"
    assert not (output / "model").exists()


def test_a_sigterm_to_the_launcher_stops_the_run_with_a_checkpoint(workspace):
    """torchrun forwards a SIGTERM to every process (then kills them after --shutdown_timeout, 30 s): the run stops
    after the step under way with a checkpoint of it, its loss log ending at that step."""
    launcher, env = two_cpu_processes("torchrun")
    output = workspace / "sigterm-launcher"
    command = [*launcher, str(SCRIPT), *map(str, [*causal(workspace), *RUN, *TINY, "--max-steps", 100000,
                                                  "--batch-size", 2, "--output-dir", output, "--cpu"])]
    environment = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"} | env
    with subprocess.Popen(command, cwd=workspace, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
        deadline = time.monotonic() + 240
        while not ((output / "loss_curve.jsonl").is_file() and len(losses(output)) >= 2):  # training under way
            if process.poll() is not None or time.monotonic() > deadline:
                kill_launched(process)
                pytest.fail(process.communicate()[0][-3000:])
            time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        try:
            stdout = process.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            kill_launched(process)
            raise
    stopped = re.findall(r"stopped by SIGTERM after step (\d+) of 100000, checkpointed in (\S+): --resume continues",
                         stdout)
    assert len(stopped) == 1, stdout[-3000:]
    step, checkpoint = int(stopped[0][0]), Path(stopped[0][1])
    assert checkpoint == output / f"checkpoints/step-{step}"
    assert checkpointing.verify_checkpoint(checkpoint)["step"] == step
    assert max(losses(output)) == step and not (output / "model").exists()


@pytest.mark.parametrize("module", ["hf_scratch_transformer.cli.train", "hf_scratch_transformer.cli.train_accelerate"])
def test_a_checkpoint_that_another_process_cannot_write_is_named_by_it(workspace, module):
    """Errors were said by the main process alone: another process that could not write its own file of a checkpoint
    (its disk full) stopped without a word, and the run ended in gloo's "Connection closed by peer" traceback. The
    complete checkpoint before stays, for --resume."""
    launcher, env = two_cpu_processes("torchrun")
    output = workspace / f"full-{module.rsplit('.', 1)[1]}"
    stdout = run(ROOT / "tests/crash_injection.py", "full", 2, module, *causal(workspace), *RUN, *TINY,
                 "--max-steps", 4, "--save-steps", 2, "--batch-size", 2, "--output-dir", output, launcher=launcher,
                 env=env, cwd=workspace, timeout=300, expect_failure=True)
    assert re.search(r"error in process 1: Checkpoint (checkpoint|step)-4 could not be written in .*No space left on "
                     r"device", stdout), stdout[-3000:]
    assert {path.name for path in (output / "checkpoints").iterdir() if not path.name.endswith(".tmp")} in (
        {"checkpoint-2"}, {"step-2"})


def test_trainer_script_runs_under_torchrun_with_two_processes(workspace):
    """Its validation loss is the mean over every labelled token, also for the causal LM, whose last packed block is
    short (20 tokens of 32 here): Trainer's own loss, each process's divided by the labels of both, weighed it
    against the labels of the blocks Accelerate repeats to fill the other process's batch (5.886 where the loss
    over every token was 5.710; in one process it is the mean of the batches' means)."""
    validation = workspace / "validation.txt"  # 5 blocks: the other process gets the last one and 3 repeats
    validation.write_text("\n\n".join((workspace / "corpus.txt").read_text().split("\n\n")[:17]))
    launcher, env = two_cpu_processes("torchrun", fresh=True)
    stdout = run(ROOT / "scripts/train.py", *causal(workspace), *RUN, *TINY, "--max-steps", 2, "--batch-size", 4,
                 "--eval-steps", 2, "--validation-files", validation, "--output-dir", workspace / "trainer-ddp",
                 launcher=launcher, env=env, cwd=workspace)
    assert (workspace / "trainer-ddp/model/model.safetensors").is_file()
    # The card's global batch counts both processes' batches of 4
    assert card_hyperparameters(workspace / "trainer-ddp/model")["global_batch_size"] == "8"
    for line in ("data: ", "model: ScratchDecoderForCausalLM", "evaluation: loss"):  # once, not once a process
        assert stdout.count(line) == 1, line
    assert UNUSED_SEARCH not in stdout

    tokenizer = AutoTokenizer.from_pretrained(workspace / "decoder")
    texts = training_data.load_texts([str(workspace / "corpus.txt")], validation_files=[str(validation)])["validation"]
    blocks = training_data.pack_for_causal_lm(texts, tokenizer, 32).with_format("torch")[:]
    labels = blocks["labels"]
    assert len(labels) == 5 and (labels[:-1] != -100).all() and (labels[-1] == -100).any()  # the last one short
    model = AutoModelForCausalLM.from_pretrained(workspace / "trainer-ddp/model").eval()
    with torch.no_grad():
        every_token = model(input_ids=blocks["input_ids"], labels=labels).loss.item()
    results = json.loads((workspace / "trainer-ddp/model/eval_results.json").read_text())
    assert results["loss"] == pytest.approx(every_token, abs=1e-5)


@pytest.mark.parametrize("module", ["train", "train_accelerate"])
def test_masked_lm_in_two_processes_trains_and_scores_as_one_process_with_the_combined_batch(workspace, module):
    """Training masks were drawn per process (per micro-batch and process in train.py, from each process's RNG in
    train_accelerate.py): 2 processes x batch 2 masked other tokens than 1 x batch 4. Each row's come from the seed,
    the step and its tokens now: the same losses step for step. And each process masked its share of the validation
    sequences from its own stream: the same weights scored 4.8038 in one process and 4.8279 in two. Each sequence is
    masked once, from the seed and its place in the data: the loss of two processes (30 sequences, batches of 2:
    repeats fill the last one) is that of the saved model over every masked token of the validation set."""
    validation = workspace / "mlm-validation.txt"
    validation.write_text("\n\n".join((workspace / "corpus.txt").read_text().split("\n\n")[:30]))
    arguments = [ROOT / f"scripts/{module}.py", "--task", "masked-lm", "--train-files", workspace / "corpus.txt",
                 "--tokenizer", workspace / "encoder", *TINY, *NO_DROPOUT, *RUN, "--max-eval-samples", 30,
                 "--max-steps", 2, "--validation-files", validation]
    two, one = (workspace / f"mlm-{processes}-processes-{module}" for processes in ("two", "one"))
    launcher, env = two_cpu_processes("torchrun")
    run(*arguments, "--batch-size", 2, "--output-dir", two, launcher=launcher, env=env, cwd=workspace)
    run(*arguments, "--batch-size", 4, "--output-dir", one, cwd=workspace)

    def step_losses(output: Path) -> dict[int, float]:
        if module == "train_accelerate":
            return losses(output)
        state = json.loads((output / "checkpoints/checkpoint-2/trainer_state.json").read_text())
        return {entry["step"]: entry["loss"] for entry in state["log_history"] if "loss" in entry}

    assert sorted(step_losses(two)) == [1, 2]
    assert step_losses(two) == pytest.approx(step_losses(one), abs=1e-5)

    tokenizer = AutoTokenizer.from_pretrained(two / "model")
    texts = training_data.load_texts([str(workspace / "corpus.txt")], validation_files=[str(validation)])
    sequences = training_data.tokenize_for_mlm(texts["validation"], tokenizer, 32)
    masked = training_data.mask_once(sequences, DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15), 1337)
    assert len(masked) == 30
    model = AutoModelForMaskedLM.from_pretrained(two / "model").eval()
    with torch.no_grad():
        every_token = model(**DataCollatorForTokenClassification(tokenizer)(list(masked))).loss.item()
    for output in (two, one):
        card = ModelCard.load(output / "model/README.md").data.eval_results
        assert [result.metric_value for result in card if result.metric_type == "loss"] == [
            pytest.approx(every_token, abs=1e-5)]


def test_trainer_seq2seq_under_two_processes_equals_one_process_and_scores_each_pair_once(workspace):
    """2 processes x batch 2 train as 1 process x batch 4 (labels padded with -100, token counts that differ between
    the processes), and the final BLEU and chrF are those of one process: Accelerate fills the last evaluation batch
    of each process with repeats of the first pairs (5 pairs, 3 repeats), which Seq2SeqTrainer's `gather` kept and
    scored as translations of their own. The loss too: each labelled token counted once, whatever the batches."""
    arguments = [ROOT / "scripts/train.py", "--task", "seq2seq", "--source-files", workspace / "train.src",
                 "--target-files", workspace / "train.tgt", "--tokenizer", workspace / "seq2seq", *TINY_SEQ2SEQ,
                 *NO_DROPOUT, *RUN, "--max-eval-samples", 5, "--max-steps", 3, "--eval-steps", 3, "--num-beams", 1]
    launcher, env = two_cpu_processes("torchrun")
    run(*arguments, "--batch-size", 2, "--output-dir", workspace / "trainer-seq2seq-ddp", launcher=launcher, env=env,
        cwd=workspace)
    run(*arguments, "--batch-size", 4, "--output-dir", workspace / "trainer-seq2seq-single", cwd=workspace)

    def logged(folder: str) -> tuple[dict[int, float], dict]:
        state = json.loads((workspace / folder / "checkpoints/checkpoint-3/trainer_state.json").read_text())
        return ({entry["step"]: entry["loss"] for entry in state["log_history"] if "loss" in entry},
                json.loads((workspace / folder / "model/eval_results.json").read_text()))

    (two, two_results), (one, one_results) = logged("trainer-seq2seq-ddp"), logged("trainer-seq2seq-single")
    assert sorted(two) == sorted(one) == [1, 2, 3]
    for step in one:
        assert two[step] == pytest.approx(one[step], abs=1e-5), step
    for metric in ("loss", "bleu", "chrf"):  # the loss over every labelled token, not a mean of batch means
        assert two_results[metric] == pytest.approx(one_results[metric], abs=1e-6), metric


def test_launched_processes_that_cannot_join_fail_clearly(workspace):
    """Under torchrun on a machine without GPU, Accelerate runs each process alone unless told to use the CPU."""
    launcher, _ = two_cpu_processes("torchrun")
    stdout = run(SCRIPT, *causal(workspace), *RUN, *TINY, "--max-steps", 1, "--output-dir", workspace / "alone",
                 launcher=launcher, env={"OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "0"}, cwd=workspace,
                 expect_failure=True)
    assert "launched as 2 processes" in stdout and "--cpu" in stdout


@pytest.fixture(scope="module")
def classification_run(tmp_path_factory) -> tuple[Path, list]:
    """A tiny masked LM of ours and a labelled CSV: a folder to work in and `hf-scratch finetune`'s arguments."""
    folder = tmp_path_factory.mktemp("finetune")
    tokenizer = wordpiece()
    torch.manual_seed(0)
    ScratchEncoderForMaskedLM(tiny_config("encoder", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
                              ).save_pretrained(folder / "mlm")
    tokenizer.save_pretrained(folder / "mlm")
    texts = ["a dog runs", "the man walks", "a big horse", "the red house"]
    (folder / "train.csv").write_text("\n".join(["text,label"] + [
        f"{texts[i % 4]} {i},{'animal' if i % 4 in (0, 2) else 'other'}" for i in range(40)]))
    return folder, [ROOT / "scripts/finetune.py", "--model", folder / "mlm", "--task", "text-classification",
                    "--train-file", folder / "train.csv", "--max-steps", 2, "--batch-size", 4]


def test_finetune_runs_under_torchrun_with_two_processes(classification_run):
    """Every process wrote the model folder (each put its own folder aside in place of `model`): a run ended with a
    folder holding only README.md. The main process writes it; the others wait for it, then end. Its evaluation loss
    is the mean over the 5 validation texts: Accelerate fills the second process's last batch with repeats, and
    Trainer's loss took the mean of a batch of one text and one repeat for that text's."""
    folder, finetune = classification_run
    texts = ["a dog runs far", "the man walks home", "a big horse", "the red house stands", "a dog sleeps"]
    labels = ["animal", "other", "animal", "other", "other"]
    (folder / "valid.csv").write_text("\n".join(["text,label", *map(",".join, zip(texts, labels, strict=True))]))
    launcher, env = two_cpu_processes("torchrun")
    stdout = run(*finetune, "--validation-file", folder / "valid.csv", "--batch-size", 2, "--output-dir",
                 folder / "ddp", launcher=launcher, env=env, cwd=folder)
    assert stdout.count("saved a Hub-ready folder:") == 1
    assert stdout.count("model: ScratchEncoderForSequenceClassification") == stdout.count("evaluation: ") == 1
    assert UNUSED_SEARCH not in stdout
    assert {"model.safetensors", "config.json", "tokenizer.json", "eval_results.json", "README.md"} <= {
        path.name for path in (folder / "ddp/model").iterdir()}
    assert not (folder / "ddp/model.tmp").exists()
    config = json.loads((folder / "ddp/model/config.json").read_text())
    assert config["id2label"] == {"0": "animal", "1": "other"}
    model = AutoModelForSequenceClassification.from_pretrained(folder / "ddp/model").eval()
    inputs = AutoTokenizer.from_pretrained(folder / "ddp/model")(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        every_text = model(**inputs, labels=torch.tensor([config["label2id"][label] for label in labels])).loss
    results = json.loads((folder / "ddp/model/eval_results.json").read_text())
    assert results["loss"] == pytest.approx(every_text.item(), abs=1e-5)


def test_finetune_question_answering_under_two_processes_scores_every_window_once(classification_run):
    """Contexts cut into windows, evaluated by two processes in batches of 2, the last one padded by Accelerate with a
    repeated window: the exact match and F1 are those of every window's logits read back in order, and the loss the
    mean over the windows, as the saved model gives them here in one batch. (Trainer's own loss kept the mean of the
    padded batch for its real window.)"""
    folder, _ = classification_run
    validation = squad_rows(9, seed=2)
    tokenizer = AutoTokenizer.from_pretrained(folder / "mlm")
    encode = question_answering.span_encoder(tokenizer, max_length=24, stride=6)
    windows = encode({key: [row[key] for row in validation] for key in validation[0]}, list(range(len(validation))))
    assert len(windows["input_ids"]) % 4 == 1  # two processes of batch 2: the second pads its last batch
    launcher, env = two_cpu_processes("torchrun")
    stdout = run(ROOT / "scripts/finetune.py", "--model", folder / "mlm", "--task", "question-answering",
                 "--train-file", write_json_lines(folder / "squad.json", squad_rows(24, seed=8)), "--validation-file",
                 write_json_lines(folder / "squad_validation.json", validation), "--max-length", 24, "--doc-stride", 6,
                 "--max-steps", 3, "--batch-size", 2, "--output-dir", folder / "qa", launcher=launcher, env=env,
                 cwd=folder)
    assert stdout.count("saved a Hub-ready folder:") == 1
    model = AutoModelForQuestionAnswering.from_pretrained(folder / "qa/model").eval()
    # the tiny model has no token types, which the command leaves out as here
    assert not model.config.type_vocab_size
    inputs = tokenizer.pad({key: windows[key] for key in ("input_ids", "attention_mask")}, return_tensors="pt")
    with torch.no_grad():
        outputs = model(**inputs, start_positions=torch.tensor(windows["start_positions"]),
                        end_positions=torch.tensor(windows["end_positions"]))
    answers = question_answering.predicted_answers(
        outputs.start_logits.numpy(), outputs.end_logits.numpy(), windows, [row["context"] for row in validation],
        may_answer_none=True)
    assert any(answers)  # spans read back, not only "no answer"
    expected = question_answering.squad_scores(answers, [row["answers"] for row in validation])
    results = json.loads((folder / "qa/model/eval_results.json").read_text())
    assert {name: results[name] for name in expected} == pytest.approx(expected)
    assert results["loss"] == pytest.approx(outputs.loss.item(), abs=1e-5)


def _results_in_two_processes_and_in_one(folder: Path, finetune: list, name: str) -> tuple[dict, dict]:
    """The eval_results.json of `finetune` run by two processes of batch 2 and by one of batch 4 (the same combined
    batch), in FOLDER/NAME-ddp and FOLDER/NAME-one."""
    launcher, env = two_cpu_processes("torchrun")
    run(*finetune, "--batch-size", 2, "--output-dir", folder / f"{name}-ddp", launcher=launcher, env=env, cwd=folder)
    run(*finetune, "--batch-size", 4, "--output-dir", folder / f"{name}-one", cwd=folder, env={"OMP_NUM_THREADS": "1"})
    return tuple(json.loads((folder / f"{name}-{run_dir}" / "model/eval_results.json").read_text())
                 for run_dir in ("ddp", "one"))


def test_finetune_token_classification_under_two_processes_scores_as_one_process(classification_run):
    """Entity tags, sentences of different lengths evaluated by two processes in batches of 2 (the last padded with a
    repeated sentence, the predictions padded to the longest across processes): the word accuracy, macro-F1, entity
    scores and loss are those of one process with the combined batch, as its training steps are."""
    folder, _ = classification_run
    tagged = [{"tokens": words, "tags": ["B-ANIMAL" if word in ("dog", "horse") else "O" for word in words]}
              for words in (sentence.split()[: 2 + i % 4] for i, sentence in enumerate(tiny_texts.words(30, 4)))]
    finetune = [ROOT / "scripts/finetune.py", "--model", folder / "mlm", "--task", "token-classification",
                "--train-file", write_json_lines(folder / "tags.json", tagged[:23]), "--validation-file",
                write_json_lines(folder / "tags_validation.json", tagged[23:]), "--label-column", "tags",
                "--max-steps", 3]
    assert len(tagged[23:]) % 4 == 3  # two processes of batch 2: the second pads its last batch
    two, one = _results_in_two_processes_and_in_one(folder, finetune, "ner")
    assert set(two) == {"loss", "accuracy", "f1", "entity_precision", "entity_recall", "entity_f1"} == set(one)
    assert two == pytest.approx(one, abs=1e-5)


def test_finetune_multiple_choice_under_two_processes_scores_as_one_process(classification_run):
    """Rows of three choices evaluated by two processes in batches of 2, the last padded with a repeated row: the
    accuracy and loss are those of one process with the combined batch, as its training steps are."""
    folder, _ = classification_run
    rows = tiny_texts.choice_rows(30, seed=4)
    finetune = [ROOT / "scripts/finetune.py", "--model", folder / "mlm", "--task", "multiple-choice", "--train-file",
                write_json_lines(folder / "choices.json", rows[:23]), "--validation-file",
                write_json_lines(folder / "choices_validation.json", rows[23:]), "--max-steps", 3]
    assert len(rows[23:]) % 4 == 3  # two processes of batch 2: the second pads its last batch
    two, one = _results_in_two_processes_and_in_one(folder, finetune, "mc")
    assert set(two) == {"loss", "accuracy"} == set(one)
    assert two == pytest.approx(one, abs=1e-5)


def test_finetune_regression_under_two_processes_scores_as_one_process(classification_run):
    """A score per text, evaluated by two processes in batches of 2, the last padded with a repeated text: the MSE,
    correlations and loss are those of one process with the combined batch."""
    folder, _ = classification_run
    rows = [{"text": text, "label": text.count("dog") + text.count("horse") / 2} for text in tiny_texts.words(30, 5)]
    finetune = [ROOT / "scripts/finetune.py", "--model", folder / "mlm", "--task", "text-classification",
                "--regression", "--train-file", write_json_lines(folder / "scores.json", rows[:23]),
                "--validation-file", write_json_lines(folder / "scores_validation.json", rows[23:]), "--max-steps", 3]
    two, one = _results_in_two_processes_and_in_one(folder, finetune, "sts")
    assert set(two) == {"loss", "mse", "pearson", "spearman"} == set(one)
    assert two == pytest.approx(one, abs=1e-5) and two["loss"] == pytest.approx(two["mse"], rel=1e-5)


def test_finetune_under_an_fsdp_launch_shards_and_saves_every_weight(classification_run):
    """Accelerate ran finetune's FSDP launch on CPU processes as DDP without a word (whole checkpoints), and
    Trainer's `save_model` writes no weights under the sharded state dict: its trainers shard and save as train's.
    (2 x batch 2 against 1 x batch 4, by hand: weights within 5e-7, the same evaluation.)"""
    folder, finetune = classification_run
    sharded = folder / "fsdp"
    _, env = two_cpu_processes("torchrun")
    stdout = run(*finetune, "--batch-size", 2, "--output-dir", sharded, launcher=fsdp_launcher(fresh=True), env=env,
                 cwd=folder)
    assert stdout.count("saved a Hub-ready folder:") == 1
    checkpoint = sharded / "checkpoints/checkpoint-2"
    assert (checkpoint / "pytorch_model_fsdp_0").is_dir() and not (checkpoint / "model.safetensors").exists()
    config = json.loads((sharded / "model/config.json").read_text())  # the model's class, not torch's FSDP<Class>
    assert config["architectures"] == ["ScratchEncoderForSequenceClassification"]
    reloaded = AutoModelForSequenceClassification.from_pretrained(sharded / "model")
    assert reloaded.config.id2label == {0: "animal", 1: "other"}
    assert load_file(sharded / "model/model.safetensors").keys() == reloaded.state_dict().keys()


def test_finetune_refuses_launched_processes_that_cannot_join(classification_run):
    """Each would fine-tune alone, on all the data, and write the same folders."""
    folder, finetune = classification_run
    launcher, _ = two_cpu_processes("torchrun")
    stdout = run(*finetune, "--output-dir", folder / "alone", launcher=launcher,
                 env={"OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "0"}, cwd=folder, expect_failure=True)
    assert "launched as 2 processes" in stdout and "ACCELERATE_USE_CPU=1" in stdout
    assert not (folder / "alone/model").exists()


def test_accelerate_configs_load_and_fsdp_wraps_the_block_of_every_family():
    for name, kind in (("ddp", "MULTI_GPU"), ("fsdp", "FSDP"), ("cpu_2proc", "MULTI_GPU")):
        config = load_config_from_file(str(CONFIGS / f"{name}.yaml"))
        assert config.distributed_type == kind and config.num_processes == 2
    fsdp = yaml.safe_load((CONFIGS / "fsdp.yaml").read_text())["fsdp_config"]
    assert fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    block = fsdp["fsdp_transformer_layer_cls_to_wrap"]
    sizes = dict(hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=64)
    for model in (AutoModelForCausalLM.from_config(get_preset("gpt-mini", num_hidden_layers=1, **sizes)),
                  AutoModelForMaskedLM.from_config(get_preset("bert-prenorm", num_hidden_layers=1, **sizes)),
                  AutoModelForSeq2SeqLM.from_config(get_preset("transformer-base", encoder_layers=1,
                                                               decoder_layers=1, **sizes))):
        assert set(model._no_split_modules) == {block}
        layer_class = get_module_class_from_name(model, block)
        assert layer_class is not None and sum(isinstance(m, layer_class) for m in model.modules()) >= 1


# ----------------------------------------------------------------------------------------------- (c) integrity


class FakeAccelerator:
    """What `save_checkpoint` / `load_checkpoint` use of an Accelerator; `fail_after` files simulates a kill."""

    is_main_process, process_index, num_processes = True, 0, 1

    def __init__(self, fail_after: int | None = None, distributed_type: DistributedType = DistributedType.NO,
                 state_dict_type: str = "SHARDED_STATE_DICT"):
        self.fail_after, self.loaded, self.distributed_type = fail_after, None, distributed_type
        self.state = SimpleNamespace(fsdp_plugin=SimpleNamespace(state_dict_type=StateDictType[state_dict_type])
                                     if distributed_type == DistributedType.FSDP else None)

    def wait_for_everyone(self):
        pass

    def unwrap_model(self, model):
        return model

    def save_state(self, output_dir):
        for index, name in enumerate(["model.safetensors", "optimizer.bin", "random_states_0.pkl"]):
            if index == self.fail_after:
                raise KeyboardInterrupt("killed while saving")
            if name.startswith("random_states"):  # what load_checkpoint checks was restored
                torch.save({"torch_manual_seed": torch.get_rng_state()}, Path(output_dir) / name)
            else:
                (Path(output_dir) / name).write_bytes(bytes(range(256)) * (index + 1))

    def load_state(self, input_dir):
        self.loaded = input_dir
        torch.set_rng_state(torch.load(Path(input_dir) / "random_states_0.pkl")["torch_manual_seed"])


def test_checkpoints_are_written_atomically_with_a_manifest(tmp_path):
    for step in (2, 4, 6):
        path = checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, step, metadata={"seed": 1},
                                             extra_files={"loss_curve.jsonl": "{}\n"}, keep=2)
        assert path == tmp_path / f"step-{step}" and not (tmp_path / f"step-{step}.tmp").exists()
    assert [p.name for p in checkpointing.complete_checkpoints(tmp_path)] == ["step-4", "step-6"]
    manifest = checkpointing.verify_checkpoint(tmp_path / "step-6")
    assert manifest["step"] == 6 and manifest["metadata"] == {"seed": 1}
    assert manifest["files"]["optimizer.bin"]["size"] == 512 and "loss_curve.jsonl" in manifest["files"]
    accelerator = FakeAccelerator()
    assert checkpointing.load_checkpoint(accelerator, tmp_path / "step-6")["step"] == 6
    assert accelerator.loaded == str(tmp_path / "step-6")


def test_resume_from_what_is_not_one_checkpoint_of_this_loop_says_what_it_is(tmp_path):
    """A file was "a folder that does not exist", the run's folder of checkpoints "interrupted while being written",
    and a `hf-scratch train` checkpoint "saved by fewer processes than this run has"."""
    checkpoints = tmp_path / "checkpoints"
    checkpointing.save_checkpoint(FakeAccelerator(), checkpoints, 2)
    (tmp_path / "notes.txt").write_text("a file")
    with pytest.raises(CheckpointError, match="notes.txt: it is a file, not a checkpoint folder"):
        checkpointing.verify_checkpoint(tmp_path / "notes.txt")
    with pytest.raises(CheckpointError, match="is a folder of checkpoints, not one: pass one of them .*step-2"):
        checkpointing.verify_checkpoint(checkpoints)
    trainers = checkpoints / "checkpoint-4"
    trainers.mkdir()
    (trainers / "trainer_state.json").write_text("{}")
    (trainers / "rng_state.pth").write_bytes(b"state")
    checkpointing.write_manifest(trainers, 4)
    accelerator = FakeAccelerator()
    with pytest.raises(CheckpointError, match="is one of `hf-scratch train` \\(Trainer\\), which continues it"):
        checkpointing.load_checkpoint(accelerator, trainers)
    assert accelerator.loaded is None


def test_a_checkpoint_resumes_only_under_the_sharding_it_was_saved_with(tmp_path):
    whole = checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, 2)
    with pytest.raises(checkpointing.CheckpointError, match="saved without FSDP, and this run shards the model"):
        checkpointing.load_checkpoint(FakeAccelerator(distributed_type=DistributedType.FSDP), whole)
    sharded = tmp_path / "sharded"
    shutil.copytree(whole, sharded)
    (sharded / "model.safetensors").rename(sharded / "pytorch_model_fsdp_0.bin")  # FSDP's name for the model
    checkpointing.write_manifest(sharded, 2)
    with pytest.raises(checkpointing.CheckpointError, match="saved sharded by FSDP, and this run does not use FSDP"):
        checkpointing.load_checkpoint(FakeAccelerator(), sharded)
    checkpointing.load_checkpoint(FakeAccelerator(distributed_type=DistributedType.FSDP), sharded)


def test_an_fsdp_checkpoint_resumes_only_under_the_state_dict_type_it_was_saved_with(tmp_path):
    """FSDP's sharded and full checkpoints hold the model under other names (a folder `pytorch_model_fsdp_0`, a file
    `pytorch_model_fsdp.bin`): Accelerate's loader for the other kind failed with a traceback over a missing file."""
    whole = checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, 2)
    kinds = {"SHARDED_STATE_DICT": "pytorch_model_fsdp_0/__0_0.distcp", "FULL_STATE_DICT": "pytorch_model_fsdp.bin"}
    for saved, model_file in kinds.items():
        checkpoint = tmp_path / saved
        shutil.copytree(whole, checkpoint)
        (checkpoint / "model.safetensors").unlink()
        (checkpoint / model_file).parent.mkdir(exist_ok=True)
        (checkpoint / model_file).write_bytes(b"weights")
        checkpointing.write_manifest(checkpoint, 2)
        other = next(kind for kind in kinds if kind != saved)
        accelerator = FakeAccelerator(distributed_type=DistributedType.FSDP, state_dict_type=other)
        with pytest.raises(CheckpointError, match=f"saved by FSDP as {saved}, and this run's FSDP config has "
                                                  f"fsdp_state_dict_type {other}"):
            checkpointing.load_checkpoint(accelerator, checkpoint)
        assert accelerator.loaded is None
        checkpointing.load_checkpoint(FakeAccelerator(distributed_type=DistributedType.FSDP, state_dict_type=saved),
                                      checkpoint)


def test_a_checkpoint_of_another_model_is_refused_naming_the_tensors(tmp_path):
    """A resume with another model (a changed --set or --task) failed inside Accelerate's loader with a traceback of
    size mismatches; it now stops before loading, naming the tensors, as `hf-scratch train` does."""
    path = checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, 2)
    model = tiny_lm("decoder")
    save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()  # as save_state: tied once
               if name not in model.all_tied_weights_keys}, path / "model.safetensors")
    checkpointing.write_manifest(path, 2)
    accelerator = FakeAccelerator()
    wider = r"holds another model than this run builds .*`model.embeddings.embed_tokens.weight` \(99, 32\) there"
    with pytest.raises(CheckpointError, match=wider):
        checkpointing.load_checkpoint(accelerator, path, model=tiny_lm("decoder", hidden_size=64))
    assert accelerator.loaded is None
    checkpointing.load_checkpoint(accelerator, path, model=tiny_lm("decoder"))
    assert accelerator.loaded == str(path)
    # A tied matrix is stored once, under whichever of its names the writer kept (Accelerate: the encoder's, of the
    # seq2seq model's three): any of them is the same tensor.
    seq2seq = tiny_lm("seq2seq")
    names = {}
    for name, parameter in seq2seq.named_parameters(remove_duplicate=False):
        names[id(parameter)] = name  # the last name of each parameter
    save_file({name: parameter.contiguous() for name, parameter in seq2seq.state_dict().items()
               if name in names.values() or name not in dict(seq2seq.named_parameters(remove_duplicate=False))},
              path / "model.safetensors")
    checkpointing.write_manifest(path, 2)
    checkpointing.load_checkpoint(accelerator, path, model=tiny_lm("seq2seq"))
    # FSDP's sharded checkpoint likewise (torch.distributed.checkpoint failed with a traceback on every process):
    # the shapes come from its metadata, where Accelerate files the model under `model.`, tied names included.
    sharded = tmp_path / "sharded"
    shutil.copytree(path, sharded)
    (sharded / "model.safetensors").unlink()
    torch.distributed.checkpoint.save({"model": model.state_dict()}, checkpoint_id=sharded / "pytorch_model_fsdp_0")
    checkpointing.write_manifest(sharded, 2)
    accelerator = FakeAccelerator(distributed_type=DistributedType.FSDP)
    with pytest.raises(CheckpointError, match=wider):
        checkpointing.load_checkpoint(accelerator, sharded, model=tiny_lm("decoder", hidden_size=64))
    assert accelerator.loaded is None
    checkpointing.load_checkpoint(accelerator, sharded, model=tiny_lm("decoder"))


def test_every_process_stops_on_a_checkpoint_saved_by_fewer_processes(tmp_path):
    """Process 0 has its random state, but stops too: else it would wait for process 1 in its next collective."""
    path = checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, 2)
    first_of_two = FakeAccelerator()
    first_of_two.num_processes = 2
    with pytest.raises(CheckpointError, match="no random state for process 1 .random_states_1.pkl.: it was saved by"):
        checkpointing.load_checkpoint(first_of_two, path)
    assert first_of_two.loaded is None, "stopped before loading"


def test_a_random_state_that_loading_left_unrestored_is_an_error_naming_it(tmp_path):
    """Accelerate's `load_state` swallows a failure to restore the random state (it logs it at INFO): the resumed run
    then drew other dropout masks and batches than the uninterrupted one without a word. Compared with the file."""

    class NotRestoring(FakeAccelerator):
        def load_state(self, input_dir):
            self.loaded = input_dir  # as Accelerate after a swallowed failure: the global stream left as it was

    path = checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, 2)
    torch.rand(3)  # the stream moves on past the state saved
    with pytest.raises(CheckpointError, match=r"the random state random_states_0\.pkl was not restored"):
        checkpointing.load_checkpoint(NotRestoring(), path)
    accelerator = FakeAccelerator()
    assert checkpointing.load_checkpoint(accelerator, path)["step"] == 2 and accelerator.loaded == str(path)


def test_saving_an_earlier_step_drops_the_abandoned_later_checkpoints(tmp_path):
    for step in (2, 4, 6):
        checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, step)
    checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, 4)  # a run resumed from step 2 reaches step 4 again
    assert [p.name for p in checkpointing.complete_checkpoints(tmp_path)] == ["step-2", "step-4"]


def test_a_save_that_fails_to_write_is_an_error_saying_so_and_keeps_the_earlier_checkpoints(workspace, tmp_path):
    """A full disk (or any write error) while a checkpoint is saved: torch reports it as "unexpected pos 64 vs 0" or
    "iostream error", in a traceback on every process. It is a CheckpointError naming the checkpoint, the error and
    the free space, and the earlier checkpoints stay, the newest one for --resume."""
    checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, 2)

    def disk_full(output_dir):
        raise RuntimeError("unexpected pos 64 vs 0")

    full = FakeAccelerator()
    full.save_state = disk_full
    message = r"Checkpoint step-4 could not be written in .* \(RuntimeError: unexpected pos 64 vs 0; \d+ MiB free"
    with pytest.raises(CheckpointError, match=message):
        checkpointing.save_checkpoint(full, tmp_path, 4)
    assert checkpointing.latest_checkpoint(tmp_path) == tmp_path / "step-2"
    # The script says so in one line, without a traceback (each file is limited to 40 kB: the weights do not fit).
    output = run(SCRIPT, *causal(workspace), *RUN, *TINY, "--max-steps", 1, "--output-dir", tmp_path / "out",
                 cwd=workspace, expect_failure=True, limit_file_size=40_000)
    assert "error: Checkpoint step-1 could not be written" in output and "File too large" in output
    assert "Traceback" not in output


def test_a_checkpoint_folder_that_cannot_be_made_is_an_error_saying_so(tmp_path, monkeypatch):
    """On a full disk a new folder fails too (ext4 gives it a block), as it does over a quota: `step-N.tmp` was made
    before the checkpoint's write errors were named, and the command ended in an OSError traceback at a training step.
    It is the checkpoint's error now, as every other write of it is, and the earlier checkpoints stay."""
    checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, 2)
    fail_as_on_a_full_disk(monkeypatch, os, "mkdir", lambda path: path.name == "step-4.tmp")
    message = r"Checkpoint step-4 could not be written in .* \(OSError: \[Errno 28\] No space left on device"
    with pytest.raises(checkpointing.WriteError, match=message):
        checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, 4)
    assert checkpointing.latest_checkpoint(tmp_path) == tmp_path / "step-2"


def test_a_save_interrupted_midway_never_looks_complete(tmp_path):
    checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, 2)
    with pytest.raises(KeyboardInterrupt):
        checkpointing.save_checkpoint(FakeAccelerator(fail_after=2), tmp_path, 4)
    assert (tmp_path / "step-4.tmp").is_dir() and not (tmp_path / "step-4").exists()
    assert checkpointing.latest_checkpoint(tmp_path) == tmp_path / "step-2"
    with pytest.raises(CheckpointError, match="incomplete.*interrupted"):
        checkpointing.load_checkpoint(FakeAccelerator(), tmp_path / "step-4.tmp")
    # A folder with the final name but no manifest (not written by save_checkpoint) is not complete either.
    (tmp_path / "step-9").mkdir()
    (tmp_path / "step-9/model.safetensors").write_bytes(b"x")
    assert checkpointing.latest_checkpoint(tmp_path) == tmp_path / "step-2"
    with pytest.raises(CheckpointError, match="no COMPLETE.json"):
        checkpointing.verify_checkpoint(tmp_path / "step-9")
    # The next save of that step clears the leftover.
    checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, 4)
    assert checkpointing.latest_checkpoint(tmp_path) == tmp_path / "step-4"
    assert not (tmp_path / "step-4.tmp").exists() and checkpointing.verify_checkpoint(tmp_path / "step-4")


def edit_manifest(path: Path, edit) -> None:
    manifest = json.loads((path / "COMPLETE.json").read_text())
    edit(manifest)
    (path / "COMPLETE.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage, message", [
    (lambda p: (p / "optimizer.bin").write_bytes(b"\0" * 10), r"optimizer\.bin has 10 bytes, 512 were written"),
    (lambda p: (p / "optimizer.bin").write_bytes(b"\1" * 512), r"optimizer\.bin does not match its SHA-256"),
    (lambda p: (p / "random_states_0.pkl").unlink(), r"random_states_0\.pkl is missing"),
    (lambda p: (p / "COMPLETE.json").write_text("{not json"), r"COMPLETE\.json cannot be read"),
    # Edited by hand: the resume read the settings there with a traceback (KeyError, TypeError)
    (lambda p: edit_manifest(p, lambda manifest: manifest.pop("metadata")), r"cannot be read \('metadata'\)"),
    (lambda p: edit_manifest(p, lambda manifest: manifest.update(metadata=5)),
     r"cannot be read \(its metadata is 5, not an object\)"),
])
def test_a_corrupt_checkpoint_fails_naming_the_problem(tmp_path, damage, message):
    path = checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, 3)
    damage(path)
    accelerator = FakeAccelerator()
    with pytest.raises(CheckpointError, match=message):
        checkpointing.load_checkpoint(accelerator, path)
    assert accelerator.loaded is None, "nothing is loaded from a corrupt checkpoint"


def test_a_missing_checkpoint_fails_clearly(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpointing.verify_checkpoint(tmp_path / "step-5")
    assert checkpointing.latest_checkpoint(tmp_path / "nothing-here") is None
    assert issubclass(CheckpointError, ValueError)


def test_the_script_refuses_missing_interrupted_and_corrupt_checkpoints(workspace, uninterrupted, tmp_path):
    complete = tmp_path / "step-8"
    subprocess.run(["cp", "-r", str(uninterrupted / "checkpoints/step-8"), str(complete)], check=True)
    weights = complete / "model.safetensors"
    with weights.open("r+b") as stream:  # truncated, as by a full disk
        stream.truncate(weights.stat().st_size // 2)
    partial = tmp_path / "step-9.tmp"
    partial.mkdir()
    arguments = [SCRIPT, *causal(workspace), *RUN, *TINY, "--output-dir", tmp_path / "out"]
    for path, message in ((tmp_path / "step-1", "does not exist"), (partial, "is incomplete"),
                          (complete, "model.safetensors has")):
        output = run(*arguments, "--resume-from", path, cwd=workspace, expect_failure=True)
        assert message in output and "Traceback" not in output, output[-2000:]


# ----------------------------------------------------------------------------------------------- (d) mixed precision


@pytest.mark.parametrize("task", ["causal-lm", "masked-lm"])
def test_bf16_mixed_precision_trains_on_cpu(workspace, task):
    tokenizer = workspace / ("decoder" if task == "causal-lm" else "encoder")
    output = workspace / f"bf16-{task}"
    stdout = run(SCRIPT, "--task", task, "--train-files", workspace / "corpus.txt", "--tokenizer", tokenizer, *RUN,
                 *TINY, "--max-steps", 2, "--batch-size", 4, "--mixed-precision", "bf16", "--force-bf16",
                 "--output-dir", output, cwd=workspace)
    assert "bf16" in stdout
    assert all(torch.isfinite(torch.tensor(loss)) for loss in losses(output).values())
    config = json.loads((output / "model/config.json").read_text())
    assert config.get("dtype", "float32") == "float32", "bf16 autocast keeps float32 weights"


# oneDNN limited to AVX2 leaves bf16 products to PyTorch's scalar code, as on a CPU without AVX-512; an AVX2-only host
# is one already, and there the commands run in a fork of the suite's server, not a fresh interpreter (8 s each).
SLOW_BF16 = {} if torch.backends.cpu.get_cpu_capability() == "AVX2" else {"ONEDNN_MAX_CPU_ISA": "AVX2"}


@pytest.mark.skipif(torch.cuda.is_available() or platform.machine() not in ("x86_64", "AMD64"),
                    reason="the CPU's bf16 is made slow by limiting oneDNN to AVX2 (x86), and GPUs are not checked")
@pytest.mark.parametrize("script, bf16", [(SCRIPT, ["--mixed-precision", "bf16"]),
                                          (ROOT / "scripts/train.py", ["--bf16"])])
def test_bf16_where_it_is_slow_is_refused_with_the_rates(workspace, script, bf16):
    output = run(script, *causal(workspace), *RUN, *TINY, *bf16, "--output-dir", workspace / "slow-bf16",
                 cwd=workspace, env=SLOW_BF16, expect_failure=True)
    assert "bf16 mixed precision would slow training down" in output and "Traceback" not in output, output[-2000:]
    assert "GFLOP/s" in output and f"without {' '.join(bf16)}" in output and "--force-bf16" in output
    assert not (workspace / "slow-bf16").exists(), "a refused run leaves no output folder behind"


@pytest.mark.skipif(torch.cuda.is_available() or platform.machine() not in ("x86_64", "AMD64"),
                    reason="the CPU's bf16 is made slow by limiting oneDNN to AVX2 (x86), and GPUs are not checked")
def test_finetune_refuses_a_launch_configs_bf16_where_it_is_slow(classification_run):
    """`finetune` has bf16 from the launch config only (Trainer follows it): on a CPU without native bf16 it trained
    a hundred times slower than fp32 without a word, where train and train-accelerate refuse."""
    folder, finetune = classification_run
    output = folder / "slow-bf16"
    stdout = run(*finetune, "--output-dir", output, cwd=folder, expect_failure=True,
                 env=SLOW_BF16 | {"ACCELERATE_MIXED_PRECISION": "bf16"})
    assert "bf16 mixed precision would slow training down" in stdout and "Traceback" not in stdout, stdout[-2000:]
    assert "without the launch config's mixed_precision bf16" in stdout and "--force-bf16" in stdout
    assert not output.exists(), "a refused run leaves no output folder behind"


@pytest.mark.parametrize(("main_bf16", "force"), [(900, []), (70, ["--force-bf16"])])
def test_the_main_process_times_bf16_for_every_process(workspace, main_bf16, force):
    """Each process timed bf16 on its own: where another process's timing alone said slow, it refused alone, without
    a word (only the main process prints errors), and the run stopped with exit status 2 and no message; a
    --force-bf16 warning came once a process. The main process's rates now decide for all."""
    launcher, env = two_cpu_processes("torchrun")
    stdout = run(ROOT / "tests/crash_injection.py", "bf16", main_bf16, "hf_scratch_transformer.cli.train_accelerate",
                 *causal(workspace), *RUN, *TINY, "--max-steps", 1, "--batch-size", 2, "--mixed-precision", "bf16",
                 *force, "--output-dir", workspace / f"bf16-timed-{main_bf16}", launcher=launcher, env=env,
                 cwd=workspace, timeout=300)
    assert stdout.count("GFLOP/s") == len(force), stdout[-3000:]  # the forced run's warning, once


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 is refused only without a GPU")
def test_fp16_without_a_gpu_fails_clearly(workspace):
    output = run(SCRIPT, *causal(workspace), *RUN, "--mixed-precision", "fp16", "--output-dir", workspace / "fp16",
                 cwd=workspace, expect_failure=True)
    assert "fp16 mixed precision needs a GPU" in output and "use bf16 on CPU" in output


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 is refused only without a GPU")
def test_the_trainer_commands_refuse_a_launch_configs_fp16_without_a_gpu(workspace, classification_run):
    """Trainer follows the launch config's mixed_precision (ACCELERATE_MIXED_PRECISION), and with fp16 on a CPU
    Accelerate leaves autocast off: `train` and `finetune` trained in fp32 without a word, where train-accelerate
    refused fp16."""
    folder, finetune = classification_run
    for command, output in (((ROOT / "scripts/train.py", *causal(workspace), *RUN, *TINY), workspace / "fp16-train"),
                            (finetune, folder / "fp16-finetune")):
        stdout = run(*command, "--output-dir", output, cwd=workspace, env={"ACCELERATE_MIXED_PRECISION": "fp16"},
                     expect_failure=True)
        assert "fp16 mixed precision needs a GPU" in stdout and "use bf16 on CPU" in stdout, stdout[-2000:]
        assert "Traceback" not in stdout and not output.exists()


def test_the_trainer_commands_card_names_the_launch_configs_bf16(workspace):
    """`train` under a launch config's bf16 trains in bf16 autocast (the run's check says the launch config asked,
    not --bf16); its card said `bf16: False`, the option's value, not the run's."""
    output = workspace / "bf16-launch"
    run(ROOT / "scripts/train.py", *causal(workspace), *RUN, *TINY, "--max-steps", 1, "--batch-size", 4,
        "--force-bf16", "--output-dir", output, cwd=workspace, env={"ACCELERATE_MIXED_PRECISION": "bf16"})
    card = (output / "model/README.md").read_text()
    assert "| mixed_precision | bf16 |" in card and "\n| bf16 |" not in card, card
    assert json.loads((output / "model/config.json").read_text())["dtype"] == "float32"  # autocast, fp32 weights


# ----------------------------------------------------------------------------------------------- (e) the saved model


def test_the_saved_model_reloads_tied_with_the_trained_weights(uninterrupted):
    folder = uninterrupted / "model"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "loss_curve.png", "README.md",
                 "modeling_scratch_decoder.py"):
        assert (folder / name).is_file(), name
    reloaded = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert reloaded.get_output_embeddings().weight is reloaded.get_input_embeddings().weight
    assert "lm_head.weight" not in load_file(folder / "model.safetensors"), "the tied head is stored once"
    # The unwrapped model at the last step, as the last checkpoint (save_state of the prepared model) holds it.
    trained = AutoModelForCausalLM.from_config(reloaded.config).eval()
    missing, unexpected = trained.load_state_dict(load_file(uninterrupted / "checkpoints/step-8/model.safetensors"),
                                                  strict=False)
    assert missing == ["lm_head.weight"] and unexpected == []
    trained.tie_weights()
    input_ids = torch.randint(0, reloaded.config.vocab_size, (2, 16))
    torch.testing.assert_close(reloaded(input_ids).logits, trained(input_ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_checkpoints_leave_out_the_names_a_model_ties_and_no_other(family):
    """Accelerate's save_state dropped them itself, warning "Removed shared tensor {'lm_head.weight'} while saving.
    This should be OK, but check by verifying that you don't receive any warning while reloading" at every
    checkpoint of a tied model (the loop's hook leaves them out first). Another tensor under two names stays, for
    Accelerate to warn of; so does a head whose tie was broken."""
    model = tiny_lm(family)
    state_dict = model.state_dict()
    state_dict["shared.copy"] = state_dict["model.final_norm.weight" if family == "decoder" else "lm_head.weight"]
    checkpointing.leave_out_tied_copies([model], [state_dict], "unused")
    assert set(model.state_dict()) - set(state_dict) == set(model.all_tied_weights_keys) and "shared.copy" in state_dict
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    state_dict = model.state_dict()
    checkpointing.leave_out_tied_copies([model], [state_dict], "unused")
    assert "lm_head.weight" in state_dict


# ----------------------------------------------------------------------------------------------- (f) branches


def files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes ({} where there is no such folder)."""
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file()}


def refused(*arguments, cwd: Path) -> str:
    """The output of a command that must stop as the project's refusals do: exit status 2, no traceback."""
    environment = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = run_python([sys.executable, *map(str, arguments)], cwd=cwd, env=environment, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output, output[-3000:]
    return output


def masked_lm(workspace: Path) -> list:
    # No --tokenizer: the run trains its WordPiece tokenizer, which training again need not reproduce.
    return [SCRIPT, "--task", "masked-lm", "--train-files", workspace / "corpus.txt", "--vocab-size", 300, *RUN, *TINY,
            "--batch-size", 4, "--max-steps", 4, "--save-steps", 2]


@pytest.fixture(scope="module")
def masked_lm_run(workspace):
    run(*masked_lm(workspace), "--output-dir", workspace / "am1", cwd=workspace)
    return workspace / "am1"


def test_extra_files_in_subfolders_are_checked_by_the_manifest(tmp_path):
    path = checkpointing.save_checkpoint(FakeAccelerator(), tmp_path, 2, extra_files={
        "tokenizer/tokenizer.json": b'{"version": "1.0"}', "loss_curve.jsonl": "{}\n"})
    assert (path / "tokenizer/tokenizer.json").read_bytes() == b'{"version": "1.0"}'
    (path / "tokenizer/tokenizer.json").write_bytes(b'{"version": "2.0"}')
    with pytest.raises(CheckpointError, match=r"tokenizer/tokenizer\.json does not match its SHA-256"):
        checkpointing.verify_checkpoint(path)


def test_checkpoints_carry_the_runs_tokenizer(workspace, masked_lm_run, uninterrupted):
    for step in (2, 4):  # the tokenizer the run trained, byte for byte, checked by the manifest
        checkpoint = masked_lm_run / f"checkpoints/step-{step}"
        assert "tokenizer/tokenizer.json" in checkpointing.verify_checkpoint(checkpoint)["files"]
        assert files(checkpoint / "tokenizer") == files(masked_lm_run / "tokenizer") != {}
    given = AutoTokenizer.from_pretrained(workspace / "decoder")  # or the one it was given
    assert AutoTokenizer.from_pretrained(uninterrupted / "checkpoints/step-8/tokenizer").get_vocab() == \
        given.get_vocab()


@pytest.mark.parametrize("script", [SCRIPT, ROOT / "scripts/train.py"])
def test_a_checkpoint_trains_on_as_model_with_the_tokenizer_it_carries(workspace, uninterrupted, script, tmp_path):
    """A new run from a checkpoint's weights (`--model .../step-N`, as the divergence error advises) takes the tokenizer
    the checkpoint carries in its tokenizer/ folder: it failed with "Couldn't instantiate the backend tokenizer"."""
    checkpoint = uninterrupted / "checkpoints/step-8"
    run(script, "--train-files", workspace / "corpus.txt", "--model", checkpoint, *RUN, "--max-steps", "2",
        "--output-dir", tmp_path / "next", cwd=workspace)
    assert files(tmp_path / "next/model") and (AutoTokenizer.from_pretrained(tmp_path / "next/model").get_vocab()
                                                 == AutoTokenizer.from_pretrained(checkpoint / "tokenizer").get_vocab())


def test_finetune_takes_an_accelerate_checkpoint_with_its_tokenizer(masked_lm_run, classification_run, tmp_path):
    checkpoint, (folder, arguments) = masked_lm_run / "checkpoints/step-4", classification_run
    run(*arguments, "--model", checkpoint, "--output-dir", tmp_path / "classifier", cwd=folder)
    assert AutoTokenizer.from_pretrained(tmp_path / "classifier/model").get_vocab() == \
        AutoTokenizer.from_pretrained(checkpoint / "tokenizer").get_vocab()


def test_a_branch_of_another_run_keeps_its_tokenizer_and_leaves_its_folder_untouched(workspace, masked_lm_run):
    before, checkpoint, branch = files(masked_lm_run), masked_lm_run / "checkpoints/step-2", workspace / "am2"
    stdout = run(*masked_lm(workspace), "--output-dir", branch, "--resume-from", checkpoint, cwd=workspace)
    assert f"resumed from {checkpoint} at step 2" in stdout and "changed settings" not in stdout
    assert files(masked_lm_run) == before, "the other run's folder is untouched, byte for byte"
    tokenizer = files(masked_lm_run / "tokenizer")
    assert files(checkpoint / "tokenizer") == tokenizer
    assert files(branch / "tokenizer") == tokenizer, "the branch trained no tokenizer of its own"
    assert files(branch / "checkpoints/step-4/tokenizer") == tokenizer
    # The saved model's tokenizer also records the truncation set while tokenizing: as the run it branched from.
    assert (branch / "model/tokenizer.json").read_bytes() == (masked_lm_run / "model/tokenizer.json").read_bytes()
    expected, branched = losses(masked_lm_run), losses(branch)  # the same steps as the run it branched from
    assert sorted(branched) == [1, 2, 3, 4]
    for step in branched:
        assert branched[step] == pytest.approx(expected[step], abs=1e-6), step


def test_a_branch_that_stops_before_its_first_step_leaves_the_folder_to_the_corrected_command(workspace, masked_lm_run,
                                                                                             tmp_path):
    """A branch wrote the checkpoint's tokenizer into its --output-dir before loading the checkpoint: one stopped by
    the load (another model here; a launch the checkpoint refuses) left a folder that the corrected command was then
    refused over, as an earlier run."""
    checkpoint, branch = masked_lm_run / "checkpoints/step-4", tmp_path / "branch"
    output = refused(*masked_lm(workspace), "--output-dir", branch, "--resume-from", checkpoint,
                     "--set", "num_hidden_layers=2", "hidden_size=32", "num_attention_heads=2", "intermediate_size=64",
                     cwd=workspace)
    assert "holds another model than this run builds" in output
    assert not (branch / "tokenizer").exists()
    run(*masked_lm(workspace), "--output-dir", branch, "--resume-from", checkpoint, cwd=workspace)
    assert files(branch / "tokenizer") == files(masked_lm_run / "tokenizer")


def test_a_stop_before_the_resumed_step_is_refused(workspace, uninterrupted, tmp_path):
    """--stop-at-step 2 resuming step 4 trained nothing and said "stopped after step 2 of 8"."""
    checkpoint = uninterrupted / "checkpoints/step-4"
    output = refused(SCRIPT, *causal(workspace), *RESUME_RUN, *TINY, "--output-dir", tmp_path / "out", "--resume-from",
                     checkpoint, "--stop-at-step", 2, cwd=workspace)
    assert f"--stop-at-step 2 is before step 4, where {checkpoint} is" in output and "stopped after" not in output


def test_a_branch_over_an_earlier_run_is_refused_unless_overwriting(workspace, masked_lm_run, uninterrupted,
                                                                     tmp_path):
    earlier, checkpoint = tmp_path / "earlier", masked_lm_run / "checkpoints/step-2"
    shutil.copytree(uninterrupted, earlier)  # a causal-LM run of its own
    before = {folder: files(folder) for folder in (earlier, masked_lm_run)}
    arguments = [*masked_lm(workspace), "--output-dir", earlier, "--resume-from", checkpoint]
    output = refused(*arguments, cwd=workspace)
    assert f"{earlier} holds an earlier run" in output, output[-2000:]
    assert f"--resume-from {checkpoint} is a checkpoint of another run" in output and "--overwrite-output-dir" in output
    assert {folder: files(folder) for folder in before} == before, "neither run was touched"
    # A tokenizer other than the checkpoint's is refused, not used on its weights.
    given_tokenizer = [option for option in masked_lm(workspace) if option not in ("--vocab-size", 300)]
    output = refused(*given_tokenizer, "--output-dir", tmp_path / "new", "--resume-from", checkpoint,
                     "--tokenizer", workspace / "decoder", cwd=workspace)
    assert f"the tokenizer of {workspace / 'decoder'} differs from the one {checkpoint} was trained with" in output
    # --overwrite-output-dir replaces the earlier run by the branch, and still leaves the other run as it was.
    run(*arguments, "--overwrite-output-dir", cwd=workspace)
    assert files(masked_lm_run) == before[masked_lm_run]
    assert [path.name for path in checkpointing.checkpoints(earlier / "checkpoints")] == ["step-4"]
    assert files(earlier / "tokenizer") == files(earlier / "checkpoints/step-4/tokenizer") == files(
        checkpoint / "tokenizer")
    assert losses(earlier) == pytest.approx(losses(masked_lm_run), abs=1e-6)


def test_a_checkpoint_written_without_a_tokenizer_resumes_with_its_runs(workspace, masked_lm_run, tmp_path):
    """Checkpoints written before they carried the tokenizer: the run folder's (RUN/tokenizer) is taken, with a
    note; where there is none either, the run stops and asks for --tokenizer rather than train one."""
    old = tmp_path / "old-run"
    shutil.copytree(masked_lm_run, old)
    checkpoint = old / "checkpoints/step-2"
    metadata = checkpointing.verify_checkpoint(checkpoint)["metadata"]
    shutil.rmtree(checkpoint / "tokenizer")
    checkpointing.write_manifest(checkpoint, 2, metadata)
    stdout = run(*masked_lm(workspace), "--output-dir", tmp_path / "branch", "--resume-from", checkpoint,
                 cwd=workspace)
    assert f"note: {checkpoint} carries no tokenizer" in stdout and f"using its run's, {old / 'tokenizer'}" in stdout
    assert files(tmp_path / "branch/checkpoints/step-4/tokenizer") == files(masked_lm_run / "tokenizer")
    assert losses(tmp_path / "branch") == pytest.approx(losses(masked_lm_run), abs=1e-6)
    shutil.rmtree(old / "tokenizer")
    output = refused(*masked_lm(workspace), "--output-dir", tmp_path / "branch2", "--resume-from", checkpoint,
                     cwd=workspace)
    assert "pass the tokenizer it was trained with as --tokenizer" in output
