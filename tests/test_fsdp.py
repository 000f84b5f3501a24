"""FSDP (FSDP2, `ScratchBlock` as the wrap unit, sharded checkpoints) run, not only configured: both training scripts
in two CPU processes over gloo (`configs/accelerate/fsdp_cpu_2proc.yaml`, the sharding of `fsdp.yaml`), against one
process with the combined batch; a sharded checkpoint resumed; the final folder loaded in one process.

Accelerate alone runs an FSDP launch on CPU processes as DDP; the scripts switch it to FSDP (docs/distributed.md)."""

import json
import shutil

import pytest
import torch
import yaml
from accelerate.utils import merge_fsdp_weights
from safetensors.torch import load_file
from test_accelerate import CONFIGS, NO_DROPOUT, ROOT, RUN, SCRIPT, fsdp_launcher, losses, run, two_cpu_processes
from tiny_tokenizers import write_run_corpus
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

import hf_scratch_transformer  # noqa: F401  (registers the Scratch families with the Auto classes)
from hf_scratch_transformer import checkpointing

TRAINER_SCRIPT = ROOT / "scripts/train.py"
# Two ScratchBlocks, so that the model has two wrap units besides the embeddings' and the root's.
DECODER = ["--set", "num_hidden_layers=2", "hidden_size=32", "num_attention_heads=2", "intermediate_size=64",
           *NO_DROPOUT]  # no dropout: each process draws its own masks, which one process cannot reproduce
LLAMA = ["--preset", "llama-style", "--set", "num_hidden_layers=2", "hidden_size=32", "num_attention_heads=4",
         "num_key_value_heads=2", "intermediate_size=64"]
SEQ2SEQ = ["--set", "encoder_layers=1", "decoder_layers=1", "hidden_size=32", "num_attention_heads=2",
           "intermediate_size=64", "dropout=0", "attention_dropout=0", "activation_dropout=0", "embedding_dropout=0"]
STEPS = ["--gradient-accumulation-steps", 2, "--label-smoothing", 0.1]
CPU = {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}


def assert_same_weights(folder_a, folder_b, atol: float) -> None:
    a, b = load_file(folder_a / "model.safetensors"), load_file(folder_b / "model.safetensors")
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        torch.testing.assert_close(b[name], tensor, rtol=0, atol=atol, msg=name)


def assert_a_plain_model_folder(folder, module: str) -> None:
    """The folder names the model's own class, not torch's FSDP<Class>, and holds none of torch's FSDP sources."""
    config = json.loads((folder / "config.json").read_text())
    assert all(not name.startswith("FSDP") for name in config["architectures"])
    assert {value.split(".")[0] for value in config["auto_map"].values()} == {"configuration_scratch", module}
    assert (folder / f"{module}.py").is_file() and not list(folder.glob("_fsdp*"))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return write_run_corpus(tmp_path_factory.mktemp("fsdp"), ("decoder", "seq2seq"))


def causal(workspace) -> list:
    return ["--train-files", workspace / "corpus.txt", "--tokenizer", workspace / "decoder"]


def test_fsdp_equals_one_process_resumes_its_sharded_checkpoint_and_saves_a_plain_folder(workspace):
    arguments = [SCRIPT, *causal(workspace), *RUN, *DECODER, *STEPS, "--max-steps", 4, "--save-steps", 2,
                 "--keep-checkpoints", 5]
    sharded, single, resumed = workspace / "fsdp", workspace / "single", workspace / "fsdp-resumed"
    stdout = run(*arguments, "--batch-size", 2, "--output-dir", sharded, launcher=fsdp_launcher(), env=CPU,
                 cwd=workspace)
    assert "2 x FSDP" in stdout  # not Accelerate's CPU default, DDP
    run(*arguments, "--batch-size", 4, "--output-dir", single, cwd=workspace)

    # 2 processes x batch 2 = 1 process x batch 4: the same loss curve and weights, to fp32 rounding.
    two, one = losses(sharded), losses(single)
    assert sorted(two) == sorted(one) == [1, 2, 3, 4]
    for step in one:
        assert two[step] == pytest.approx(one[step], abs=1e-5), step
    assert_same_weights(single / "model", sharded / "model", atol=1e-5)

    # The checkpoint is sharded (one file per process, model and optimizer) and listed in the manifest.
    checkpoint = sharded / "checkpoints/step-2"
    files = set(checkpointing.verify_checkpoint(checkpoint)["files"])
    assert {f"{state}/__{rank}_0.distcp" for state in ("pytorch_model_fsdp_0", "optimizer_0") for rank in (0, 1)} \
        | {"random_states_0.pkl", "random_states_1.pkl"} <= files
    assert "model.safetensors" not in files
    # Resumed from it, the run repeats steps 3-4 exactly.
    stdout = run(*arguments, "--batch-size", 2, "--output-dir", resumed, "--resume-from", checkpoint,
                 launcher=fsdp_launcher(), env=CPU, cwd=workspace)
    assert f"resumed from {checkpoint} at step 2" in stdout and "changed settings" not in stdout
    assert losses(resumed) == losses(sharded)
    # Without FSDP, the sharded checkpoint is refused naming why (Accelerate failed on a missing pytorch_model.bin);
    # a whole one under FSDP likewise.
    refused = run(*arguments, "--batch-size", 4, "--output-dir", workspace / "unsharded", "--resume-from", checkpoint,
                  cwd=workspace, expect_failure=True)
    assert f"Checkpoint {checkpoint} was saved sharded by FSDP, and this run does not use FSDP" in refused
    assert "Traceback" not in refused
    refused = run(*arguments, "--batch-size", 2, "--output-dir", workspace / "sharded-from-whole", "--resume-from",
                  single / "checkpoints/step-2", launcher=fsdp_launcher(), env=CPU, cwd=workspace, expect_failure=True)
    assert "was saved without FSDP, and this run shards the model with FSDP" in refused
    assert_same_weights(sharded / "model", resumed / "model", atol=0)

    # The final folder: the model's own class, the tied head stored once and tied again on loading, in one process.
    folder = sharded / "model"
    assert_a_plain_model_folder(folder, "modeling_scratch_decoder")
    assert "lm_head.weight" not in load_file(folder / "model.safetensors")
    reloaded = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert reloaded.get_output_embeddings().weight is reloaded.get_input_embeddings().weight
    # The same logits as the last sharded checkpoint merged in one process, and as the one-process run's model.
    merge_fsdp_weights(str(sharded / "checkpoints/step-4/pytorch_model_fsdp_0"), str(workspace / "merged"))
    merged = AutoModelForCausalLM.from_config(reloaded.config).eval()
    merged.load_state_dict(load_file(workspace / "merged/model.safetensors"))
    input_ids = torch.randint(0, reloaded.config.vocab_size, (2, 16))
    with torch.no_grad():
        logits = reloaded(input_ids).logits
        torch.testing.assert_close(merged(input_ids).logits, logits, rtol=0, atol=0)
        one_process = AutoModelForCausalLM.from_pretrained(single / "model").eval()
        torch.testing.assert_close(one_process(input_ids).logits, logits, rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama-style", "seq2seq"])
def test_fsdp_equals_one_process_for_llama_style_and_seq2seq(workspace, family):
    """llama-style: RoPE, RMSNorm, SwiGLU, GQA, an untied head. seq2seq: the encoder's and decoder's embeddings and
    the head are one matrix, which FSDP2 refuses unless it lies in one unit (the script shares the module)."""
    if family == "seq2seq":
        data = ["--task", "seq2seq", "--source-files", workspace / "train.src", "--target-files",
                workspace / "train.tgt", "--tokenizer", workspace / "seq2seq", *SEQ2SEQ]
        auto, module = AutoModelForSeq2SeqLM, "modeling_scratch_seq2seq"
    else:
        data, auto, module = [*causal(workspace), *LLAMA], AutoModelForCausalLM, "modeling_scratch_decoder"
    arguments = [SCRIPT, *data, *RUN, *STEPS, "--max-steps", 3]
    sharded, single = workspace / f"{family}-fsdp", workspace / f"{family}-single"
    assert "2 x FSDP" in run(*arguments, "--batch-size", 2, "--output-dir", sharded, launcher=fsdp_launcher(),
                             env=CPU, cwd=workspace)
    run(*arguments, "--batch-size", 4, "--output-dir", single, cwd=workspace)
    two, one = losses(sharded), losses(single)
    for step in (1, 2, 3):
        assert two[step] == pytest.approx(one[step], abs=1e-5), step
    assert_same_weights(single / "model", sharded / "model", atol=1e-5)  # the same keys: tied matrices once
    assert_a_plain_model_folder(sharded / "model", module)
    reloaded = auto.from_pretrained(sharded / "model")
    if family == "seq2seq":
        embeddings = reloaded.get_encoder().get_input_embeddings().weight
        assert embeddings is reloaded.get_decoder().get_input_embeddings().weight
        assert embeddings is reloaded.get_output_embeddings().weight


@pytest.mark.slow
def test_trainer_fsdp_equals_one_process_and_resumes_its_sharded_checkpoint(workspace):
    """scripts/train.py: `--fsdp` (TrainingArguments' fsdp) under torchrun, and the FSDP launch config."""
    arguments = [TRAINER_SCRIPT, *causal(workspace), *RUN, *DECODER, "--label-smoothing", 0.1, "--max-steps", 3,
                 "--eval-steps", 2]  # 3 steps: within the first epoch, whose last batch is split unevenly
    sharded, single = workspace / "trainer-fsdp", workspace / "trainer-single"
    torchrun, _ = two_cpu_processes("torchrun")
    run(*arguments, "--fsdp", "--batch-size", 4, "--output-dir", sharded, launcher=torchrun, env=CPU, cwd=workspace)
    run(*arguments, "--batch-size", 8, "--output-dir", single, cwd=workspace)

    def logged_losses(folder) -> dict[int, float]:
        state = json.loads((folder / "checkpoints/checkpoint-3/trainer_state.json").read_text())
        return {entry["step"]: entry["loss"] for entry in state["log_history"] if "loss" in entry}

    two, one = logged_losses(sharded), logged_losses(single)
    assert sorted(two) == [1, 2, 3]
    for step in one:
        assert two[step] == pytest.approx(one[step], abs=1e-5), step
    assert_same_weights(single / "model", sharded / "model", atol=1e-5)
    assert_a_plain_model_folder(sharded / "model", "modeling_scratch_decoder")
    files = set(checkpointing.verify_checkpoint(sharded / "checkpoints/checkpoint-2")["files"])
    assert {"pytorch_model_fsdp_0/__0_0.distcp", "pytorch_model_fsdp_0/__1_0.distcp"} <= files

    # The sharded checkpoint of step 2, resumed under the FSDP launch config: the same final weights.
    resumed = workspace / "trainer-resumed"
    shutil.copytree(sharded / "checkpoints/checkpoint-2", resumed / "checkpoints/checkpoint-2")
    stdout = run(*arguments, "--batch-size", 4, "--output-dir", resumed, "--resume", launcher=fsdp_launcher(),
                 env=CPU, cwd=workspace)
    assert "resuming from" in stdout and "checkpoint-2" in stdout
    assert logged_losses(resumed) == two
    assert_same_weights(sharded / "model", resumed / "model", atol=0)
    # Killed after its last checkpoint, before its model folder: --resume trains nothing and writes the folder (FSDP2
    # refused to shard the model alone for the evaluation, with a traceback).
    shutil.rmtree(resumed / "model")
    stdout = run(*arguments, "--batch-size", 4, "--output-dir", resumed, "--resume", launcher=fsdp_launcher(),
                 env=CPU, cwd=workspace)
    assert "nothing left to train" in stdout
    assert_same_weights(sharded / "model", resumed / "model", atol=0)
    # Without --fsdp it is refused naming why (transformers raised a ValueError with a traceback).
    refused = run(*arguments, "--batch-size", 8, "--output-dir", resumed, "--resume", cwd=workspace,
                  expect_failure=True)
    assert "was saved sharded by FSDP, and this run does not use FSDP" in refused and "Traceback" not in refused


@pytest.mark.slow
def test_trainer_fsdp_seq2seq_evaluates_as_one_process_and_once_more_when_resumed_finished(workspace):
    """`--task seq2seq --fsdp`: the evaluation (loss over every labelled token, BLEU, chrF; 5 pairs in batches of 4,
    3 repeats) is one process's. Resumed when finished (no model folder), it trains nothing and evaluates the same:
    its first forward was `generate`'s encoder, which FSDP2 refused without a root ("requires a single root
    module"), with a traceback."""
    arguments = [TRAINER_SCRIPT, "--task", "seq2seq", "--source-files", workspace / "train.src", "--target-files",
                 workspace / "train.tgt", "--tokenizer", workspace / "seq2seq", *SEQ2SEQ, *RUN, "--max-eval-samples", 5,
                 "--max-steps", 2, "--eval-steps", 2, "--num-beams", 1]
    sharded, single = workspace / "trainer-seq2seq-fsdp", workspace / "trainer-seq2seq-single"
    torchrun, _ = two_cpu_processes("torchrun")
    run(*arguments, "--fsdp", "--batch-size", 2, "--output-dir", sharded, launcher=torchrun, env=CPU, cwd=workspace)
    run(*arguments, "--batch-size", 4, "--output-dir", single, cwd=workspace)

    def results(folder) -> dict:
        return json.loads((folder / "model/eval_results.json").read_text())

    two, one = results(sharded), results(single)
    for metric in ("loss", "bleu", "chrf"):
        assert two[metric] == pytest.approx(one[metric], abs=1e-5), metric
    shutil.rmtree(sharded / "model")
    stdout = run(*arguments, "--fsdp", "--batch-size", 2, "--output-dir", sharded, "--resume", launcher=torchrun,
                 env=CPU, cwd=workspace)
    assert "nothing left to train" in stdout
    assert results(sharded) == two


def test_the_cpu_fsdp_config_shards_as_the_gpu_one():
    """What the CPU tests run is what users launch on GPUs, but for the device and mixed precision."""
    cpu, gpu = (yaml.safe_load((CONFIGS / name).read_text()) for name in ("fsdp_cpu_2proc.yaml", "fsdp.yaml"))
    assert cpu["fsdp_config"] == gpu["fsdp_config"] and cpu["distributed_type"] == gpu["distributed_type"] == "FSDP"
    assert {key for key in cpu.keys() ^ gpu.keys()} == {"gpu_ids"} and cpu["mixed_precision"] == "no"
