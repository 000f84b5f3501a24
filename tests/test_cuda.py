"""The CUDA test set, for a machine with an NVIDIA GPU: `pytest -m cuda` (docs/distributed.md). Everywhere else every
test here is collected and skipped; CI has no GPU and never needs one.

- Every family on the GPU in fp32, and under bf16 and fp16 autocast: the same logits as the native `transformers`
  model with the same weights (`conversion.to_hf`), and a few training steps through Accelerate (fp16 with its
  GradScaler) without inf or NaN, the loss going down and the weights staying float32.
- SDPA's flash and memory-efficient kernels (forced with `torch.nn.attention.sdpa_kernel`, so that a kernel which
  cannot run fails instead of falling back) give eager attention's logits, loss and gradients.
- `generate()` with a static cache compiles the forward (`torch.compile`, fullgraph) and gives eager decoding's
  tokens.
- The scripts on one GPU: `train_accelerate.py` in fp16 (the GradScaler checkpointed) and under
  `configs/accelerate/fsdp.yaml` as one process (FSDP2 equal to the plain run, its sharded checkpoint resumed, the
  final folder loaded), and `train.py --fsdp`.
"""

import contextlib
import json
import sys

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import merge_fsdp_weights
from safetensors.torch import load_file
from test_accelerate import CONFIGS, ROOT, RUN, SCRIPT, free_port, losses, run
from test_export_native import BERT_KNOBS, GPT2_KNOBS, LLAMA_KNOBS, MARIAN_KNOBS, perturbed
from test_fsdp import DECODER, assert_a_plain_model_folder
from tiny_models import FAMILIES, PAD, VOCAB, lm_inputs, tiny_lm
from tiny_tokenizers import write_run_corpus
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForCausalLM, CompileConfig

from hf_scratch_transformer import checkpointing
from hf_scratch_transformer.conversion import from_hf, to_hf

DEVICE = "cuda"
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# Ours against the native model, logits of size ~1 (absolute): fp32 as on CPU. Under autocast the two round at other
# places (fused QKV, GPT-2's Conv1D): on CPU autocast they differ by up to 8e-3 (bf16) and 8e-4 (fp16), as much as
# each differs from its fp32 logits; the bounds leave about 6 times that for the GPU's kernels.
LOGITS_TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2, "fp16": 5e-3}
# id: (family, our knobs that equal the native architecture)
PAIRS = {
    "gpt2": ("decoder", GPT2_KNOBS),
    "llama-gqa": ("decoder", {**LLAMA_KNOBS, "num_key_value_heads": 2, "tie_word_embeddings": False}),
    "bert": ("encoder", BERT_KNOBS),
    "marian": ("seq2seq", MARIAN_KNOBS),
}


def needs(precision: str) -> None:
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16 (Ampere or newer has)")


def autocast(precision: str):
    if DTYPES[precision] is None:
        return contextlib.nullcontext()
    return torch.autocast(DEVICE, dtype=DTYPES[precision])


def padded_inputs(family: str, length: int = 12) -> tuple[dict, torch.Tensor]:
    """Inputs with one padded row (left padding for the decoder, right padding of the source otherwise), on the GPU,
    and the (batch, positions) of the logits that belong to real tokens."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, length), generator=generator)
    mask = torch.ones_like(ids)
    if family == "decoder":
        mask[1, :3], ids[1, :3] = 0, PAD
    else:
        mask[1, -3:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask}
    real = mask.bool()
    if family == "seq2seq":
        inputs["decoder_input_ids"] = torch.cat([torch.ones(2, 1, dtype=torch.long), ids[:, :5]], dim=1)
        real = torch.ones(2, 6, dtype=torch.bool)  # the decoder's positions are all real
    return {key: value.to(DEVICE) for key, value in inputs.items()}, real.to(DEVICE)


@pytest.fixture
def fresh_accelerate():
    """Accelerate's state is one per process: each test sets its own mixed precision."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


# ----------------------------------------------------------------------------------------------- every family


@pytest.mark.parametrize("precision", DTYPES)
@pytest.mark.parametrize("name", PAIRS)
def test_the_same_logits_as_the_native_model_on_the_gpu(name, precision):
    needs(precision)
    family, knobs = PAIRS[name]
    ours = perturbed(tiny_lm(family, **knobs))
    native = to_hf(ours)  # the same weights
    ours, native = ours.to(DEVICE), native.to(DEVICE)
    inputs, real = padded_inputs(family)
    with torch.no_grad(), autocast(precision):
        ours_logits, native_logits = ours(**inputs).logits, native(**inputs).logits
    tolerance = LOGITS_TOLERANCE[precision]
    torch.testing.assert_close(ours_logits[real].float(), native_logits[real].float(), atol=tolerance, rtol=0)


@pytest.mark.parametrize("name", PAIRS)
def test_converting_a_model_on_the_gpu_keeps_it_there(name):
    """`from_hf` of a native model on the GPU (as `hf-scratch benchmark --device cuda` builds them) and `to_hf` of
    ours there: the converted models stay on the GPU, with the same logits (Marian's sinusoid check once compared
    the GPU's table with one made on the CPU and failed)."""
    family, knobs = PAIRS[name]
    native = to_hf(perturbed(tiny_lm(family, **knobs))).to(DEVICE)
    ours = from_hf(native)
    back = to_hf(ours)
    assert {tensor.device.type for model in (ours, back) for tensor in model.state_dict().values()} == {"cuda"}
    inputs, real = padded_inputs(family)
    with torch.no_grad():
        logits = [model(**inputs).logits[real] for model in (native, ours, back)]
    torch.testing.assert_close(logits[1], logits[0], atol=LOGITS_TOLERANCE["fp32"], rtol=0)
    torch.testing.assert_close(logits[2], logits[0], atol=LOGITS_TOLERANCE["fp32"], rtol=0)


@pytest.mark.parametrize("precision", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_few_training_steps_through_accelerate(family, precision, fresh_accelerate):
    needs(precision)
    accelerator = Accelerator(mixed_precision="no" if precision == "fp32" else precision)
    assert accelerator.device.type == "cuda"
    assert (accelerator.scaler is not None) == (precision == "fp16"), "fp16 goes with a GradScaler, only fp16"
    model = tiny_lm(family, dropout=0.1, attention_dropout=0.1).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    batch = {key: value.to(DEVICE) for key, value in lm_inputs(family, batch=4, length=12).items()}
    history, skipped = [], 0
    for _ in range(10):
        loss = model(**batch).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)  # unscales first under fp16
        optimizer.step()
        skipped += accelerator.optimizer_step_was_skipped  # fp16: a step with inf/nan gradients is skipped
        optimizer.zero_grad()
        history.append(loss.item())
    assert all(torch.isfinite(torch.tensor(history))), history
    assert skipped < 5 and history[-1] < history[0], (history, skipped)
    for name, parameter in accelerator.unwrap_model(model).named_parameters():
        assert parameter.dtype == torch.float32 and torch.isfinite(parameter).all(), name


# ----------------------------------------------------------------------------------------------- SDPA kernels

SDPA_KERNELS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
# decoder: causal (is_causal fast path), RoPE, GQA; encoder: bidirectional; seq2seq: causal self + cross attention
SDPA_VARIANTS = {"decoder": dict(position_embedding_type="rope", num_key_value_heads=2), "encoder": {}, "seq2seq": {}}


@pytest.mark.parametrize("kernel", SDPA_KERNELS)
@pytest.mark.parametrize("family", FAMILIES)
def test_sdpa_flash_and_memory_efficient_kernels_agree_with_eager(family, kernel):
    """flash: fp16 and no mask (it takes none: no padding, causal through `is_causal`); memory-efficient: fp32 with a
    padded row, so that the boolean masks reach the kernel."""
    if kernel == "flash" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("PyTorch's flash attention needs sm80 or newer")
    dtype = torch.float16 if kernel == "flash" else torch.float32
    eager = tiny_lm(family, attn_implementation="eager", **SDPA_VARIANTS[family]).to(DEVICE, dtype)
    sdpa = tiny_lm(family, attn_implementation="sdpa", **SDPA_VARIANTS[family]).to(DEVICE, dtype)
    inputs = {key: value.to(DEVICE) for key, value in lm_inputs(family, batch=2, length=16).items()}
    real = torch.ones(inputs["labels"].shape, dtype=torch.bool, device=DEVICE)  # positions compared
    if kernel == "efficient":
        mask = torch.ones_like(inputs["input_ids"])
        if family == "decoder":
            mask[1, :3] = 0  # left padding
            inputs["labels"][1, :4] = -100  # the first real token would be predicted from padding
            real = mask.bool()
        else:
            mask[1, -3:] = 0  # right padding of the (source) sequence; the seq2seq decoder's positions are all real
            if family == "encoder":
                inputs["labels"][1, -3:] = -100
                real = mask.bool()
        inputs["attention_mask"] = mask
    expected = eager(**inputs)
    with sdpa_kernel(SDPA_KERNELS[kernel]):  # only this kernel: one that cannot run raises
        actual = sdpa(**inputs)
        actual.loss.backward()
    expected.loss.backward()
    tolerance = 1e-2 if dtype == torch.float16 else 1e-4
    torch.testing.assert_close(actual.logits[real], expected.logits[real], atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(actual.loss, expected.loss, atol=tolerance, rtol=tolerance)
    for (name, a), (_, b) in zip(eager.named_parameters(), sdpa.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, atol=tolerance, rtol=10 * tolerance, msg=name)


# ----------------------------------------------------------------------------------------------- compiled decoding


@pytest.mark.parametrize("family", ["decoder", "seq2seq"])
def test_generate_with_a_static_cache_under_torch_compile(family):
    torch._dynamo.reset()
    model = tiny_lm(family, position_embedding_type="rope").to(DEVICE)
    generator = torch.Generator().manual_seed(0)
    for prompt in (torch.randint(3, VOCAB, (2, 5), generator=generator) for _ in range(2)):  # the second reuses
        prompt = prompt.to(DEVICE)
        reference = model.generate(input_ids=prompt, max_new_tokens=8, do_sample=False)
        compiled = model.generate(input_ids=prompt, max_new_tokens=8, do_sample=False, cache_implementation="static",
                                  compile_config=CompileConfig(fullgraph=True))
        assert hasattr(model, "_compiled_call"), "generate() did not compile the forward"
        assert torch.equal(compiled, reference)
    torch._dynamo.reset()


# ----------------------------------------------------------------------------------------------- the scripts on a GPU


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return write_run_corpus(tmp_path_factory.mktemp("cuda"), ("decoder", "seq2seq"))


def causal(workspace) -> list:
    return ["--train-files", workspace / "corpus.txt", "--tokenizer", workspace / "decoder"]


def test_train_accelerate_in_fp16_with_its_grad_scaler(workspace):
    output = workspace / "fp16"
    stdout = run(SCRIPT, *causal(workspace), *RUN, *DECODER, "--max-steps", 4, "--batch-size", 4, "--mixed-precision",
                 "fp16", "--output-dir", output, cwd=workspace)
    assert "1 x NO, fp16" in stdout
    assert all(torch.isfinite(torch.tensor(loss)) for loss in losses(output).values())
    assert "scaler.pt" in checkpointing.verify_checkpoint(output / "checkpoints/step-4")["files"]
    assert {tensor.dtype for tensor in load_file(output / "model/model.safetensors").values()} == {torch.float32}


def test_fsdp_on_one_gpu(workspace):
    """configs/accelerate/fsdp.yaml as users launch it, with one process: in fp32 the plain run's loss curve, its
    sharded checkpoint resumed, its folder equal to the merged checkpoint; in the config's bf16, finite losses."""
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "fsdp.yaml"),
                "--num_processes", "1"]
    arguments = [SCRIPT, *causal(workspace), *RUN, *DECODER, "--max-steps", 4, "--batch-size", 4, "--save-steps", 2,
                 "--keep-checkpoints", 5, "--gradient-accumulation-steps", 2]
    sharded, plain, resumed = workspace / "fsdp-gpu", workspace / "plain-gpu", workspace / "fsdp-gpu-resumed"
    stdout = run(*arguments, "--mixed-precision", "no", "--output-dir", sharded,
                 launcher=[*launcher, "--main_process_port", str(free_port())], cwd=workspace)
    assert "1 x FSDP, no" in stdout
    run(*arguments, "--mixed-precision", "no", "--output-dir", plain, cwd=workspace)
    one, fsdp = losses(plain), losses(sharded)
    for step in one:
        assert fsdp[step] == pytest.approx(one[step], abs=1e-4), step
    checkpoint = sharded / "checkpoints/step-2"
    assert "pytorch_model_fsdp_0/__0_0.distcp" in checkpointing.verify_checkpoint(checkpoint)["files"]
    run(*arguments, "--mixed-precision", "no", "--output-dir", resumed, "--resume-from", checkpoint,
        launcher=[*launcher, "--main_process_port", str(free_port())], cwd=workspace)
    for step, loss in losses(resumed).items():
        assert loss == pytest.approx(fsdp[step], abs=1e-4), step

    folder = sharded / "model"
    assert_a_plain_model_folder(folder, "modeling_scratch_decoder")
    reloaded = AutoModelForCausalLM.from_pretrained(folder).eval()
    merge_fsdp_weights(str(sharded / "checkpoints/step-4/pytorch_model_fsdp_0"), str(workspace / "merged-gpu"))
    merged = AutoModelForCausalLM.from_config(reloaded.config).eval()
    merged.load_state_dict(load_file(workspace / "merged-gpu/model.safetensors"))
    input_ids = torch.randint(0, reloaded.config.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids).logits, reloaded(input_ids).logits, rtol=0, atol=0)

    if torch.cuda.is_bf16_supported():  # the config's own mixed precision
        output = workspace / "fsdp-gpu-bf16"
        stdout = run(*arguments, "--output-dir", output, launcher=[*launcher, "--main_process_port", str(free_port())],
                     cwd=workspace)
        assert "1 x FSDP, bf16" in stdout
        assert all(torch.isfinite(torch.tensor(loss)) for loss in losses(output).values())
        config = json.loads((output / "model/config.json").read_text())
        assert config.get("dtype", "float32") == "float32"


def test_trainer_fsdp_on_one_gpu(workspace):
    output = workspace / "trainer-fsdp-gpu"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    run(ROOT / "scripts/train.py", *causal(workspace), *RUN, *DECODER, "--fsdp", "--max-steps", 4, "--eval-steps", 2,
        "--batch-size", 4, "--output-dir", output, launcher=torchrun, cwd=workspace)
    assert "pytorch_model_fsdp_0/__0_0.distcp" in checkpointing.verify_checkpoint(
        output / "checkpoints/checkpoint-4")["files"]
    assert_a_plain_model_folder(output / "model", "modeling_scratch_decoder")
    AutoModelForCausalLM.from_pretrained(output / "model")
