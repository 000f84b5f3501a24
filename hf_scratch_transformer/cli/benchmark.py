"""Speed and memory of each Scratch family next to its native `transformers` equivalent (SPEC section 9):

    hf-scratch benchmark --quick                        # smoke test, tiny sizes, prints the table
    hf-scratch benchmark --family gpt2 --repeats 3      # one family at the default size
    hf-scratch benchmark --family all --write           # the real run: docs/benchmarks/<machine class>.md + .json
    hf-scratch benchmark --family gpt2 --compiled       # also batch-1 decoding compiled over a static cache
    hf-scratch benchmark --device cuda --write          # both sides on the GPU: docs/benchmarks/<GPU>.md + .json

The native model (GPT2LMHeadModel, BertForMaskedLM, MarianMTModel; LlamaForCausalLM for the int8 rows) is built at
the chosen size from a fixed seed and ours is `conversion.from_hf(native)`: the same architecture and weights. Marian
splits --layers into encoder and decoder halves (6 -> 3 + 3). Every timing is A/B interleaved in one process after
--warmup runs of each side (the order alternates: native, ours, ours, native, ...) and reported as the median; the
ratio is ours / native of the medians (above 1 is faster for throughput; below 1 is smaller for memory), and
"paired" is the range of the per-repetition ratios of adjacent native/ours runs, then their median with a 95%
bootstrap interval (`paired_ratios.median_interval`; pairs cancel the machine's drift, which can move the ratio of
the two medians off it): this 2-core machine is noisy, and a row whose interval holds 1 is a tie, not a measured
difference. The line under the table sorts the tok/s rows so: faster, tied, slower. The next one sets batch-1
decoding, eager and (--compiled) compiled, against the native model's eager decoding, the reference of the 1.5x
target, and names what reaches it, or else the fastest decoding of either model measured: the compiled row times the
native model's eager decoding alongside its two sides (native, ours, native eager; then ours, native eager, native;
...), so that every figure of the line is a median of paired ratios, with its interval; the last sets bf16
training against its 1.1x target, where the run has bf16 rows.

- training tokens/s: forward + backward + AdamW step (dropout on, as configured) on a batch x seq batch with
  labels (causal LM on the inputs; MLM with 15% masked positions; seq2seq with seq-long targets), in fp32 and
  under torch.autocast("cpu", dtype=torch.bfloat16); the bf16 rows only where bf16 is native (below).
- prefill tokens/s: one no-grad eval forward over batch x seq (for BERT, the MLM forward).
- decode tokens/s: `generate()` as a user calls it, with the generation_config the model ships (from_hf copies
  the native one), at batch 1 and 8 from a --prompt-long random prompt, greedy, max_new_tokens=min_new_tokens=
  --new-tokens so both sides decode the same count; rate = batch x new tokens / wall time of the whole call
  (the short prompt's prefill included), over 3 x --repeats repetitions. Not for BERT.
- padded rows (prefill, decode batch 8): the same inputs padded as users' batches are (the other rows' masks are all
  ones): the sequences keep from a quarter of their length to all of it, evenly spread, the last unpadded; GPT-2's
  prompts padded on the left (as batched `generate()` wants them), BERT's texts and Marian's sources on the right,
  Marian's prefill targets on the right too, with lengths of their own and no decoder mask (as a seq2seq collator
  pads them). Prefill's tokens count the padding, which both sides compute.
- --compiled (GPT-2, Marian): also batch-1 decoding as transformers compiles it, `generate(...,
  cache_implementation="static", compile_config=cpu_compile_config())` on the CPU (inductor's default mode with its
  C++ wrapper), both sides; compilation (a C++ compiler, tens of seconds a side) happens in the first calls, before
  the timed ones. On a GPU, transformers' own compiled decoding: the static cache alone, its default CompileConfig
  (CUDA graphs).
- int8 decode (family llama): batch-1 decode tokens/s as above, in fp32 and after each side is saved and loaded
  back with `from_pretrained(folder, quantization_config=TorchAoConfig(Int8WeightOnlyConfig()))` (torchao; the LM
  head stays fp32, TorchAoConfig's default). Where torchao is not importable, too old or fails to quantize, the run
  says so and why, and has no int8 row.
- tokens are input positions: batch x seq, and batch x (source + target) for Marian.
- peak memory: after every timing, each side runs in a fresh subprocess (no allocator state shared with the other
  side; the two at once, each reading its own process's peak, with the kernels this process chose; the families
  one after another), with
  MALLOC_MMAP_THRESHOLD_ fixed so freed tensors go back to the OS; before each workload the kernel's peak-RSS
  mark is reset (/proc/self/clear_refs 5) and the result is VmHWM - VmRSS: the memory the workload needs above
  the loaded weights (training: grads, AdamW state, activations over 2 steps, after 2 unmeasured ones: the
  process's one-time costs count on neither side; prefill: the median of 3 forwards).
- activation memory: in the same subprocesses, one fp32 forward + backward in train mode with the gradients already
  allocated (zeroed, so they are part of the baseline) and no optimizer: the activations kept for backward plus
  backward's temporaries; the median of 3, without and then with `gradient_checkpointing_enable()` (transformers'
  default, non-reentrant: each block keeps only its input and recomputes the rest in backward).
- FLOP/s: the matmul FLOPs of one forward + backward of each side counted by torch.utils.flop_counter (linear
  layers whichever kernel computes them, lm head, attention at full non-causal cost; AdamW's elementwise work not
  counted): each side's own count, the same but for BERT, whose MLM head ours runs over the masked positions only
  (below), divided by its median step time, the paired ratios of FLOP/s; MFU = that / the machine's matmul
  FLOP/s measured here (best of 8 products of square --mm-size matrices after a warm-up, fp32 and bf16, through
  torch.mm, i.e. the default BLAS, and through oneDNN as ScratchLinear computes them; the faster of the two).
- the header names the CPU capability, whether bf16 is native (bf16 products on one core at least a quarter as
  fast as fp32, the test `--bf16` makes before training: below, they are emulated) and the fp32 kernels
  ScratchLinear chose in this process for decoding steps of one row and of several (batch 8: 8 rows; timed over 4),
  each for models whose weights fit in the CPU's largest cache and for larger ones (read from memory at every
  step), by weight shape (out x in), and for prefill (no gradients) and training (`kernel_choice.fp32_kernel`,
  HF_SCRATCH_CPU_KERNELS: "native" is F.linear, "transposed" the BLAS on the transposed product), with --compiled
  whether compiled one-row products are a row dot (`kernel_choice.blas_reads_rows_slowly`), and, where bf16
  is native, the kernel of bf16 products of many rows under autocast ("native": autocast's; "fp32": the operands
  widened to fp32 for the BLAS, the same sums; `kernel_choice.bf16_kernel`, HF_SCRATCH_CPU_BF16_PRODUCTS) and of
  bf16 training attention without dropout, by the keys each timed length covers (Marian's at the default 256
  tokens, 129-256; `scratch_attention_kernel.bf16_training_kernel`, HF_SCRATCH_CPU_ATTENTION); "none run" where the
  runs had no such product (--quick's products of up to 64 rows are all decoding steps') or sequence. Where
  ATEN_CPU_CAPABILITY holds ATen below the CPU's capability, the header says so and --write names the class
  "<cpu>-avx512-aten-limited-to-avx2", not the AVX2 host's, nor the hand-made "<cpu>-avx512-limited-to-avx2"
  records (MKL and oneDNN limited too); MKL_ENABLE_INSTRUCTIONS and ONEDNN_MAX_CPU_ISA, where set, are named in the
  header too. --write refuses a CPU run under those two or a forced kernel (HF_SCRATCH_CPU_KERNELS,
  HF_SCRATCH_CPU_BF16_PRODUCTS, HF_SCRATCH_CPU_ATTENTION): its record would stand for the class's own choices.
- BERT: ours runs with `sparse_prediction` (the MLM head projects only the masked positions; same loss).
- --device cuda: both sides on the GPU, each timing ended by `torch.cuda.synchronize()`; bf16 rows under
  torch.autocast("cuda") where the GPU has bf16 (`torch.cuda.is_bf16_supported()`); peak memory is allocated CUDA
  memory above what is allocated before the workload (`torch.cuda.max_memory_allocated`, in the same fresh
  subprocesses); the matmul rates are torch.mm's (cuBLAS, fp32 without TF32, PyTorch's default) on 8192 matrices
  unless --mm-size is given; there is no CPU kernel choice and no int8 row (torchao's CPU decoding is what that row
  measures).
"""

import argparse
import ctypes
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode
from transformers import (
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
    TorchAoConfig,
)

from hf_scratch_command import command_help
from hf_scratch_transformer import mixed_precision
from hf_scratch_transformer.checkpointing import WriteError
from hf_scratch_transformer.cli.benchmark_report import (
    LIBRARY_LIMITS,
    SIDES,
    capability_limited_from,
    markdown,
    take_a_record_here,
    write_record,
)
from hf_scratch_transformer.cli.paired_ratios import median_interval
from hf_scratch_transformer.cli.run_options import at_least
from hf_scratch_transformer.compiled_decoding import cpu_compile_config, inductor_cache_of_its_own_when_emulating
from hf_scratch_transformer.conversion import from_hf
from hf_scratch_transformer.kernel_choice import (
    BF16_PRODUCTS_VARIABLE,
    FEW_ROW_REGIMES,
    KERNEL_CHOICES,
    KERNELS_VARIABLE,
    PREFILL,
    REGIMES,
    TRAINING,
    bf16_kernel,
    blas_reads_rows_slowly,
    last_level_cache_bytes,
)
from hf_scratch_transformer.linear_kernels import ONEDNN_AVAILABLE, onednn_linear
from hf_scratch_transformer.scratch_attention_kernel import ATTENTION_VARIABLE, CHOSEN, TIMED_KEYS

FAMILIES = ("gpt2", "bert", "marian", "llama")  # llama: the fp32 and int8 batch-1 decode rows only
SIZES = {  # defaults, the "quick" ones under --quick; a flag given explicitly wins
    "full": dict(layers=6, hidden=384, heads=6, ffn=1536, vocab=8192, seq=256, batch=8, prompt=16, new_tokens=32,
                 warmup=1, repeats=7, mm_size=2048),
    "quick": dict(layers=2, hidden=64, heads=4, ffn=256, vocab=512, seq=32, batch=2, prompt=8, new_tokens=8,
                  warmup=1, repeats=2, mm_size=256),
}
CUDA_MM_SIZE = 8192  # a GPU's peak needs far larger products than a CPU's
TARGET_REFERENCE = "native eager"  # the batch-1 target's reference decoding, timed in the compiled row beside its sides
DECODE_REPEAT_FACTOR = 3  # a generate() call is short and batch-1 decoding the noisiest row: more repetitions

# ----------------------------------------------------------------------------------------------- arguments
parser = argparse.ArgumentParser(description=command_help(__doc__),
                                 formatter_class=argparse.RawTextHelpFormatter)
parser.add_argument("--family", choices=[*FAMILIES, "all"], default="all", help="default all")
parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 warm-up, 2 repetitions: a smoke test")
parser.add_argument("--write", action="store_true",
                    help="write docs/benchmarks/<machine class>.md and .json (in this folder), e.g. intel-xeon-avx512")
# Sizes a run can take: 0 or a vocabulary without room for the ids drawn (3 to vocab - 2) ended in tracebacks, some
# after minutes of timing; --heads is checked against --hidden below. At least one warm-up: without it ours' first
# timed run also timed the process's kernel choices (`kernel_choice`, once per process), where the native model has
# nothing alike to pay: --quick's first prefill pair read 0.02.
SIZE_TYPES = dict.fromkeys(SIZES["full"], at_least(1)) | {"vocab": at_least(6)}
# The sizes of the models and their inputs: a record of docs/benchmarks is made at the default ones (the targets'
# figures are set there); the repetitions, warm-up and --mm-size only make its measurement longer or shorter.
RECORD_SIZES = ("layers", "hidden", "heads", "ffn", "vocab", "seq", "batch", "prompt", "new_tokens")
for name, value in SIZES["full"].items():
    parser.add_argument(f"--{name.replace('_', '-')}", type=SIZE_TYPES[name], default=None, help=f"default {value}")
parser.add_argument("--seed", type=int, default=0, help="default 0")
parser.add_argument("--compiled", action="store_true",
                    help="also batch-1 generate() compiled over a static cache, both sides (inductor: a C++ compiler)")
parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where both sides run (default cpu); cuda: the GPU, timings synchronized")
parser.add_argument("--memory-worker", nargs="+", metavar="SIDE FAMILY", help=argparse.SUPPRESS)  # then families
parser.add_argument("--no-bf16", action="store_true", help=argparse.SUPPRESS)  # set for the memory workers
args = parser.parse_args()
partial_run = ["--quick"] * args.quick + ["--family"] * (args.family != "all") + [
    f"--{name.replace('_', '-')}" for name in RECORD_SIZES if getattr(args, name) not in (None, SIZES["full"][name])]
if args.write and partial_run:  # a smoke test, one family or other sizes would replace a full record
    parser.error("--write records a full run of every family at the default sizes (docs/benchmarks keeps one per "
                 f"machine class): leave out {', '.join(partial_run)}")
# A CPU run under a forced kernel (the header names the setting) or with MKL or oneDNN held to fewer instructions
# measures that setting, not the class's own choices, under the class's name.
forced = [name for name in (KERNELS_VARIABLE, BF16_PRODUCTS_VARIABLE, ATTENTION_VARIABLE, *LIBRARY_LIMITS)
          if os.environ.get(name, "").strip().lower() not in ("", "auto")]
if args.write and args.device == "cpu" and forced:
    parser.error("--write records the kernels and instruction sets this machine class chooses by itself "
                 f"(docs/benchmarks keeps one record per machine class): unset {', '.join(forced)}")
if args.device == "cuda" and not torch.cuda.is_available():
    parser.error("--device cuda needs a CUDA GPU and a CUDA build of torch (torch.cuda.is_available() is False)")
if args.device == "cuda" and args.mm_size is None and not args.quick:
    args.mm_size = CUDA_MM_SIZE
for name, value in SIZES["quick" if args.quick else "full"].items():
    if getattr(args, name) is None:
        setattr(args, name, value)
if args.hidden % args.heads or (args.hidden // args.heads) % 2:  # Llama's rotary positions need an even head size
    parser.error(f"--hidden {args.hidden} must split into --heads {args.heads} heads of an even size")


def or_stop(write, *arguments) -> None:
    """`write(*arguments)`, a folder that cannot be written said in one line with exit status 2, not a traceback."""
    try:
        write(*arguments)
    except WriteError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")


if args.write:  # after the other refusals, which write nothing; before the run's half hour, not after it
    or_stop(take_a_record_here)
DEVICE = torch.device(args.device)
inductor_cache_of_its_own_when_emulating()  # --compiled with AVX2 emulated (docs/benchmarks' runs)


# ----------------------------------------------------------------------------------------------- models, inputs
def build_native(family: str):
    torch.manual_seed(args.seed)  # the weights are drawn on the CPU, so both devices get the same model
    return _native_on_cpu(family).to(DEVICE)


def _native_on_cpu(family: str):
    a = args
    if family == "gpt2":
        return GPT2LMHeadModel(GPT2Config(n_layer=a.layers, n_embd=a.hidden, n_head=a.heads, n_inner=a.ffn,
                                          vocab_size=a.vocab, n_positions=max(1024, a.seq + a.prompt + a.new_tokens),
                                          bos_token_id=1, eos_token_id=2, pad_token_id=0))
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(num_hidden_layers=a.layers, hidden_size=a.hidden,
                                            num_attention_heads=a.heads, intermediate_size=a.ffn, vocab_size=a.vocab,
                                            max_position_embeddings=max(1024, a.prompt + a.new_tokens),
                                            bos_token_id=1, eos_token_id=2, pad_token_id=0))
    if family == "bert":
        return BertForMaskedLM(BertConfig(num_hidden_layers=a.layers, hidden_size=a.hidden, num_attention_heads=a.heads,
                                          intermediate_size=a.ffn, vocab_size=a.vocab,
                                          max_position_embeddings=max(512, a.seq), pad_token_id=0))
    half = max(1, a.layers // 2)
    return MarianMTModel(MarianConfig(encoder_layers=half, decoder_layers=half, d_model=a.hidden,
                                      encoder_attention_heads=a.heads, decoder_attention_heads=a.heads,
                                      encoder_ffn_dim=a.ffn, decoder_ffn_dim=a.ffn, vocab_size=a.vocab,
                                      max_position_embeddings=max(512, a.seq + a.new_tokens), pad_token_id=a.vocab - 1,
                                      decoder_start_token_id=a.vocab - 1, eos_token_id=0))


def build_ours(native):
    """`from_hf(native)`; for BERT with `sparse_prediction`, our MLM fast path: with labels, only the masked
    positions go through the head (the same loss and gradients, tests/test_modeling.py)."""
    ours = from_hf(native)
    if ours.config.model_type == "scratch_encoder":
        ours.config.sparse_prediction = True
    return ours


def build_pair(family: str) -> dict:
    native = build_native(family)
    return {"native": native, "ours": build_ours(native)}


def random_ids(batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(3, args.vocab - 2, (batch, length), generator=generator)


def padding_mask(batch: int, length: int, left: bool) -> torch.Tensor:
    """(batch, length) 1 / 0, as a collator pads texts of mixed lengths: the rows keep from a quarter of `length` to
    all of it, evenly spread (the last row unpadded), the padding on the left or the right."""
    kept = torch.linspace(length / 4, length, batch).round().long().clamp(min=1)
    positions = torch.arange(length)
    return (positions >= length - kept[:, None] if left else positions < kept[:, None]).long()


def with_padding(family: str, inputs: dict, pad: int) -> dict:
    """Prefill or generate() inputs of `make_inputs` (every position real) padded with the id `pad` as users' batches
    are: GPT-2's prompts on the left (as generate() wants them), BERT's texts and Marian's sources on the right;
    Marian's targets on the right too, with lengths of their own (the longest source has the shortest target), and
    without a decoder mask, as a seq2seq collator's (causal attention keeps every real target position from the
    padding after it)."""
    ids = inputs["input_ids"]
    mask = padding_mask(*ids.shape, left=family == "gpt2").to(ids.device)
    padded = inputs | {"input_ids": ids.masked_fill(mask == 0, pad), "attention_mask": mask}
    if "decoder_input_ids" in inputs:
        targets = inputs["decoder_input_ids"]
        kept = padding_mask(*targets.shape, left=False).flip(0).to(targets.device)
        padded["decoder_input_ids"] = targets.masked_fill(kept == 0, pad)
    return padded


def make_inputs(family: str, batch: int, length: int, labels: bool) -> dict:
    """A training batch (labels=True), or prefill / generate() inputs."""
    generator = torch.Generator().manual_seed(args.seed + 1)
    ids = random_ids(batch, length, generator)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if family == "marian":
        target = random_ids(batch, length, generator)
        inputs["labels" if labels else "decoder_input_ids"] = target
    elif labels and family == "gpt2":
        inputs["labels"] = ids
    elif labels:  # MLM: 15% of the positions masked (id 3 plays [MASK]), loss on those only
        masked = torch.rand(ids.shape, generator=generator) < 0.15
        inputs["input_ids"] = ids.masked_fill(masked, 3)
        inputs["labels"] = ids.masked_fill(~masked, -100)
    return {name: tensor.to(DEVICE) for name, tensor in inputs.items()}


def tokens_per_example(family: str) -> int:
    return args.seq * (2 if family == "marian" else 1)


def training_dtypes() -> tuple[str, ...]:
    """fp32, and bf16 where the CPU has native bf16: without it a bf16 step takes up to a hundred times longer, and
    `--bf16` refuses to train (docs/training.md)."""
    return ("fp32",) if args.no_bf16 else ("fp32", "bf16")


def train_step(model, optimizer, inputs: dict, bf16: bool) -> None:
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=bf16):
        loss = model(**inputs).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def train_steps(model, inputs: dict, bf16: bool, steps: int = 2) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(steps):
        train_step(model, optimizer, inputs, bf16)


def compiled_decoding() -> dict:
    """`generate()` options of transformers' compiled decoding: a static cache, its forward compiled, on the CPU too.
    On a GPU transformers compiles by itself, in "reduce-overhead" mode (CUDA graphs): what a user gets there."""
    if args.device == "cuda":
        return dict(cache_implementation="static")
    return dict(cache_implementation="static", compile_config=cpu_compile_config())


def generate(model, inputs: dict, options: dict | None = None) -> torch.Tensor:
    return model.generate(**inputs, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, **(options or {}))


def forward_backward(model, inputs: dict) -> None:
    model(**inputs).loss.backward()


def load_int8(models: dict) -> dict | str:
    """Each side saved and loaded back with TorchAoConfig(Int8WeightOnlyConfig()), as a user quantizes a folder; or,
    where torchao is not importable, older than transformers needs or fails to quantize, why not."""
    if DEVICE.type != "cpu":
        return "the int8 rows measure torchao's CPU decoding"
    try:
        from torchao.quantization import Int8WeightOnlyConfig

        config = TorchAoConfig(Int8WeightOnlyConfig())
    except ImportError as error:
        return f"torchao is not importable ({error})"
    except Exception as error:  # TorchAoConfig: ValueError where transformers finds torchao too old
        return f"torchao is not usable ({type(error).__name__}: {error})"
    with tempfile.TemporaryDirectory() as folder:
        for side, model in models.items():
            model.save_pretrained(Path(folder) / side)
        loaded = {}
        for side, model in models.items():
            try:  # an older or broken torchao fails while quantizing (RuntimeError, ...): no int8 rows, not a dead run
                loaded[side] = type(model).from_pretrained(Path(folder) / side, quantization_config=config).eval()
            except Exception as error:
                return f"torchao could not quantize the {side} model ({type(error).__name__}: {error})"
        return loaded


# ----------------------------------------------------------------------------------------------- memory worker
def _status() -> dict:
    lines = Path("/proc/self/status").read_text().splitlines()
    return {k: int(v.split()[0]) / 1024 for k, v in (line.split(":", 1) for line in lines) if k in ("VmRSS", "VmHWM")}


def peak_above_baseline(workload) -> float:
    """MiB of resident memory (on a GPU: allocated CUDA memory) `workload()` needs above what is there before it."""
    gc.collect()
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        workload()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before = _status()["VmRSS"]
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS mark (VmHWM) to the current RSS
    workload()
    return _status()["VmHWM"] - before


def memory_worker(side: str, *families: str) -> None:
    """Prints one JSON line: each family's memory rows for one side, the families one after another. The kernels
    are the parent's choices (`measure_memory` forces them), so none is timed here."""
    # The imports' 460k objects are never garbage: frozen, the `gc.collect()` before each measurement leaves them
    # unscanned (0.3 s each, 33 times a worker: a third of a quick run on a 2-core AVX2 host).
    gc.freeze()
    print(json.dumps({family: family_memory(family, side) for family in families}))


def family_memory(family: str, side: str) -> dict:
    native = build_native(family)
    model = native if side == "native" else build_ours(native)
    del native
    train, prefill = make_inputs(family, args.batch, args.seq, True), make_inputs(family, args.batch, args.seq, False)
    result = {}
    model.train()
    # Unmeasured first: a process's first training at this size also pays one-time costs (library buffers, thread
    # arenas: 20-27 MiB more at the benchmark's size, AVX2 AMD EPYC), which would count for the first family only.
    train_steps(model, train, False)
    for dtype in training_dtypes():  # a fresh AdamW inside the workload: its state is counted, then freed
        result[f"train {dtype}"] = peak_above_baseline(partial(train_steps, model, train, dtype == "bf16"))
    model.eval()
    with torch.no_grad():
        # The median of 3: the first no-grad forward after training also settles allocator and oneDNN state.
        result["prefill"] = statistics.median(peak_above_baseline(lambda: model(**prefill)) for _ in range(3))
    model.train()
    forward_backward(model, train)  # allocates the gradients, kept (zeroed) in the baseline of what follows
    for name in ("activation memory train fp32", "activation memory train fp32 checkpointed"):
        if name.endswith("checkpointed"):
            model.gradient_checkpointing_enable()
        samples = []
        for _ in range(3):
            model.zero_grad(set_to_none=False)
            samples.append(peak_above_baseline(partial(forward_backward, model, train)))
        result[name] = statistics.median(samples)
    return result


def measure_memory(families: list[str]) -> dict:
    """{side: {family: memory rows}}, from one worker per side, the two run at once (each reads its own process's
    peaks; a worker costs about 10 s of imports). The workers take this process's kernel choices for training and
    prefill (they do not decode), not timings of their own: timed while the other worker loads the cores, a choice
    could differ from the timed rows' (training's memory differs by kernel on an AVX-512 AMD EPYC). Only the choices
    the timed runs made (`choices_made`): the workers run the same workloads, so they ask no other; asking one here
    timed it for nothing (bf16 training attention at the default 256 tokens, about 50 ms)."""
    env = os.environ | {"MALLOC_MMAP_THRESHOLD_": "65536", "HF_HUB_OFFLINE": "1"}
    if DEVICE.type == "cpu":
        made = choices_made()
        if fp32 := [f"{regime}={made[regime]}" for regime in (PREFILL, TRAINING) if regime in made]:
            env[KERNELS_VARIABLE] = ",".join(fp32)
        env |= {name: kernel for name, kernel in made.items() if name in (BF16_PRODUCTS_VARIABLE, ATTENTION_VARIABLE)}
    sizes = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in SIZES["full"]] + [f"--device={args.device}"]
    workers = {
        side: subprocess.Popen(
            [sys.executable, "-m", __spec__.name, "--memory-worker", side, *families, f"--seed={args.seed}", *sizes,
             *(["--no-bf16"] if args.no_bf16 else [])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for side in SIDES
    }
    outputs = {side: worker.communicate() for side, worker in workers.items()}  # (stdout, stderr), both finished
    for side, worker in workers.items():
        if worker.returncode != 0:
            sys.exit(f"memory worker {side} ({', '.join(families)}) failed:\n{outputs[side][1][-3000:]}")
    return {side: json.loads(stdout.strip().splitlines()[-1]) for side, (stdout, _) in outputs.items()}


# ----------------------------------------------------------------------------------------------- timing
def synchronize() -> None:
    """Wait for the GPU's queued work (a CUDA call returns before its kernels finish); nothing to wait for on CPU."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def interleaved(run, warmup: int, repeats: int, sides: tuple[str, ...] = SIDES) -> dict:
    """Median seconds of `run(side)` per side: warm-up, then the sides in rotating order (native, ours; ours,
    native; ... and for three, a, b, c; b, c, a; c, a, b): every side starts and ends rounds equally often, and
    none runs right after itself where there are more than two (a reversed order would give the two outer sides
    their own warm caches at every other round: 1-3% on a 2-core Xeon, 2026-11-28)."""
    for _ in range(warmup):
        for side in sides:
            run(side)
    samples = {side: [] for side in sides}
    for repeat in range(repeats):
        for side in sides[repeat % len(sides):] + sides[:repeat % len(sides)]:
            synchronize()
            start = time.perf_counter()
            run(side)
            synchronize()
            samples[side].append(time.perf_counter() - start)
    return {side: statistics.median(times) for side, times in samples.items()} | {"samples": samples}


def matmul_flops(product, dtype: torch.dtype) -> float:
    """FLOP/s of `product` on two square matrices; 0 where the kernel does not exist for `dtype` on this CPU (oneDNN
    has no bf16 inner product without AVX-512 bf16 or AMX)."""
    try:
        return 1e9 * mixed_precision.matmul_gflops(dtype, args.mm_size, product, runs=8, device=DEVICE)  # the best of 8
    except RuntimeError:
        return 0.0


def machine_matmul_flops() -> dict:
    """FLOP/s of torch.mm and of the same product through oneDNN (what ScratchLinear uses for fp32 on CPU);
    the machine's rate per dtype is the faster of the two."""
    products = {"torch.mm": torch.mm}
    if DEVICE.type == "cpu":
        products["oneDNN"] = partial(onednn_linear, bias=None)  # a @ b.T: the same FLOPs as a @ b
    measured = {f"{name} {kind}": matmul_flops(product, dtype)
                for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))
                for kind, product in products.items()}
    return measured | {name: max(measured[f"{name} {kind}"] for kind in products) for name in ("fp32", "bf16")}


def onednn_linear_flops(input_shape, weight_shape, *args, **kwargs) -> int:
    """FLOPs of `onednn_linear` (ScratchLinear's oneDNN products, forward and gradients), an op torch's counter does
    not know: (..., in) rows by an (out, in) weight."""
    return 2 * math.prod(input_shape) * weight_shape[0]


def train_flops(model, inputs: dict) -> int:
    """The matmul FLOPs of one forward + backward of `model`, whichever kernels its products take."""
    products = {torch.ops.mkldnn._linear_pointwise: onednn_linear_flops} if ONEDNN_AVAILABLE else {}
    with FlopCounterMode(display=False, custom_mapping=products) as counter:
        model(**inputs).loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def row(family, measurement, unit, better, native, ours, samples=None, work=None) -> dict:
    """One line of the table; `samples` (seconds per side, interleaved) for a timed row: its paired ratios are
    native / ours times, ours / native in throughput; `work` per side (FLOPs) where a rate of each side's own work is
    measured: the ratios are of work per second."""
    scale = work["ours"] / work["native"] if work else 1.0
    paired = [scale * n / o for n, o in zip(samples["native"], samples["ours"], strict=True)] if samples else None
    return dict(family=family, measurement=measurement, unit=unit, better=better, native=native, ours=ours,
                ratio=ours / native if native else float("nan"), paired_ratios=paired,
                paired_interval=median_interval(paired) if paired else None, samples=samples)


def decode_row(family: str, models: dict, batch: int, extra: dict, variant: str = "", options: dict | None = None,
               padded: bool = False) -> dict:
    """`generate(**options)` tokens/s of both sides at `batch`, `padded` from prompts of other lengths
    (`with_padding`); whether they generate the same tokens goes into `extra`. With `options` (compiled decoding),
    the native model's eager decoding is timed alongside, the batch-1 target's reference: `reference` holds its rate
    and each side's paired ratios against it."""
    prompt = make_inputs(family, batch, args.prompt, labels=False)
    prompt.pop("decoder_input_ids", None)
    if padded:
        prompt = with_padding(family, prompt, models["native"].config.pad_token_id)
        variant = f" padded{variant}"
    outputs = {side: generate(models[side], prompt, options) for side in SIDES}
    extra[f"same_generate_output_batch{batch}{variant.replace(' ', '_')}"] = torch.equal(*outputs.values())

    def run(side: str) -> torch.Tensor:
        if side == TARGET_REFERENCE:
            return generate(models["native"], prompt)
        return generate(models[side], prompt, options)

    sides = SIDES + (TARGET_REFERENCE,) if options else SIDES
    t = interleaved(run, args.warmup, DECODE_REPEAT_FACTOR * args.repeats, sides)
    tokens = batch * args.new_tokens
    result = row(family, f"decode batch {batch}{variant}", "tok/s", "higher", tokens / t["native"],
                 tokens / t["ours"], {side: t["samples"][side] for side in SIDES})
    if options:
        result["reference"] = against_reference(t["samples"], tokens)
    return result


def against_reference(samples: dict, tokens: int) -> dict:
    """The batch-1 target's reference timed in a row (seconds in `samples`, beside each side's): its rate, each
    side's paired throughput ratios against it (`paired_ratios`) and their interval (under the side's name)."""
    reference = samples[TARGET_REFERENCE]
    paired = {side: [r / s for r, s in zip(reference, samples[side], strict=True)] for side in SIDES}
    return dict(name=TARGET_REFERENCE, rate=tokens / statistics.median(reference), samples=reference,
                paired_ratios=paired) | {side: median_interval(ratios) for side, ratios in paired.items()}


def bench_int8_decode() -> tuple[list, dict]:
    """Batch-1 decoding of a Llama and ours with its weights, in fp32 and int8 weight-only (torchao)."""
    models = {side: model.eval() for side, model in build_pair("llama").items()}
    extra = {}
    rows = [decode_row("llama", models, 1, extra)]
    int8 = load_int8(models)
    if isinstance(int8, str):
        print(f"{int8}: no int8 decode rows.")
        extra["int8"] = f"skipped: {int8}"
    else:
        import torchao

        extra["int8"] = f"torchao {torchao.__version__}, TorchAoConfig(Int8WeightOnlyConfig()), LM head fp32"
        rows.append(decode_row("llama", int8, 1, extra, " int8 weight-only"))
    return rows, extra


def bench_family(family: str, peaks: dict) -> tuple[list, dict]:
    if family == "llama":
        return bench_int8_decode()
    models = build_pair(family)
    rows, extra = [], {}

    def add(*values, samples=None, work=None):
        rows.append(row(family, *values, samples=samples, work=work))

    for model in models.values():
        model.eval()
    prefill = make_inputs(family, args.batch, args.seq, labels=False)
    padded = with_padding(family, prefill, models["native"].config.pad_token_id)
    tokens = args.batch * tokens_per_example(family)
    for name, inputs in (("prefill", prefill), ("prefill padded", padded)):
        with torch.no_grad():
            t = interleaved(lambda side: models[side](**inputs), args.warmup, args.repeats)  # noqa: B023
        add(name, "tok/s", "higher", tokens / t["native"], tokens / t["ours"], samples=t["samples"])

    if family != "bert":
        extra["generation_config"] = models["ours"].generation_config.to_diff_dict()
        rows.extend(decode_row(family, models, batch, extra) for batch in (1, 8))
        rows.append(decode_row(family, models, 8, extra, padded=True))
        if args.compiled:
            rows.append(decode_row(family, models, 1, extra, " compiled", compiled_decoding()))

    train = make_inputs(family, args.batch, args.seq, labels=True)
    for model in models.values():
        model.train()
    flops = {side: train_flops(models[side], train) for side in SIDES}  # BERT: ours projects the masked positions
    extra["train_flops_per_step"] = flops
    tokens = args.batch * tokens_per_example(family)
    for dtype in training_dtypes():
        optimizers = {side: torch.optim.AdamW(models[side].parameters(), lr=1e-4) for side in SIDES}
        t = interleaved(lambda side: train_step(models[side], optimizers[side], train, dtype == "bf16"),  # noqa: B023
                        args.warmup, args.repeats)
        add(f"train {dtype}", "tok/s", "higher", tokens / t["native"], tokens / t["ours"], samples=t["samples"])
        gflops = {side: flops[side] / t[side] / 1e9 for side in SIDES}
        add(f"train {dtype} achieved", "GFLOP/s", "higher", gflops["native"], gflops["ours"], samples=t["samples"],
            work=flops)
        add(f"train {dtype} MFU", "% of mm", "higher", *(100 * gflops[side] * 1e9 / peaks[dtype] for side in SIDES),
            samples=t["samples"], work=flops)
    return rows, extra


def memory_rows(family: str, memory: dict) -> list[dict]:
    """The rows of one family's entry of `measure_memory`: peak memory train fp32, train bf16, prefill; activation
    memory."""
    names = {workload: workload if workload.startswith("activation") else f"peak memory {workload}"
             for workload in memory["ours"]}
    return [row(family, name, "MiB", "lower", memory["native"][workload], memory["ours"][workload])
            for workload, name in names.items()]


# ----------------------------------------------------------------------------------------------- machine, kernels
def machine(peaks: dict) -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
               platform.processor())
    flags = next((set(line.split(":", 1)[1].split()) for line in cpuinfo if line.startswith("flags")), set())
    # A GPU says whether it has bf16 (Ampere and newer); its rates at --quick's tiny products are launch overhead.
    # A CPU is tested as `--bf16` tests it, on one core.
    if DEVICE.type == "cuda":
        bf16_native, bf16_speed = torch.cuda.is_bf16_supported(), peaks["bf16"] / peaks["fp32"]
    else:
        bf16, fp32 = mixed_precision.one_core_product_rates()
        bf16_native, bf16_speed = mixed_precision.bf16_is_native(bf16, fp32), bf16 / fp32
    return dict(cpu=cpu, cpu_capability=torch.backends.cpu.get_cpu_capability(),
                cpu_capability_limited_from=capability_limited_from(flags),
                cpu_library_limits={name: os.environ[name] for name in LIBRARY_LIMITS if os.environ.get(name)},
                bf16_native=bf16_native, bf16_speed=bf16_speed,
                cores=os.cpu_count(), cache_mib=last_level_cache_bytes() >> 20,
                torch_threads=torch.get_num_threads(), torch=torch.__version__,
                transformers=transformers.__version__, python=platform.python_version(),
                gpu=torch.cuda.get_device_name() if DEVICE.type == "cuda" else None, cuda=torch.version.cuda,
                date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), load_average=os.getloadavg())


def kernel_choices(bf16_native: bool, compiled: bool) -> dict:
    """The kernels this process chose where the choice depends on the machine (`kernel_choice.fp32_kernel`,
    `kernel_choice.bf16_kernel` and `scratch_attention_kernel.bf16_training_kernel`, the last two only where bf16 is
    native: they time bf16 kernels; with `compiled` rows, `kernel_choice.blas_reads_rows_slowly`); for decoding
    steps, those its products took by weight shape; "none run" for products the runs had none of (a product of up to
    kernel_choice.FEW_ROWS rows is a decoding step's, --quick's training and prefill too) and for bf16 training
    attention where no run attended over as few as EAGER_MAX_KEYS keys without dropout; that choice by the length it
    was timed for (`attention_choices`). Call it after the timed runs and before the memory workers, which ask for
    the choices they are given."""
    if DEVICE.type == "cuda":  # PyTorch's own CUDA kernels on both sides: the choices above are CPU-only
        return {"setting": "-", **{f"fp32 {regime.replace('_', ' ')}": "F.linear" for regime in REGIMES},
                "fp32 compiled decoding": "-", "CPU cross-entropy": "-", "bf16 training attention": "-",
                "bf16 products": "-"}
    attention = f"{ATTENTION_VARIABLE}={os.environ.get(ATTENTION_VARIABLE) or 'auto'}"
    bf16_products = f"{BF16_PRODUCTS_VARIABLE}={os.environ.get(BF16_PRODUCTS_VARIABLE) or 'auto'}"
    made = choices_made()
    many_rows = {regime: made.get(regime, "none run") for regime in (PREFILL, TRAINING)}
    row_dot = "a row dot" if compiled and blas_reads_rows_slowly() else "F.linear" if compiled else "none run"
    bf16 = made.get(BF16_PRODUCTS_VARIABLE, "none run")
    return {"setting": f"{KERNELS_VARIABLE}={os.environ.get(KERNELS_VARIABLE) or 'auto'}",
            **{f"fp32 {regime.replace('_', ' ')}": few_row_kernels(regime) for regime in FEW_ROW_REGIMES},
            **{f"fp32 {regime}": kernel for regime, kernel in many_rows.items()}, "fp32 compiled decoding": row_dot,
            "CPU cross-entropy": "ours (scratch_loss; the faster on AVX2 and AVX-512, no choice)",
            "bf16 training attention": f"{attention_choices()} ({attention})" if bf16_native else "-",
            "bf16 products": f"{bf16} ({bf16_products})" if bf16_native else "-"}


def choices_made() -> dict[str, str]:
    """The choices this process's runs made for products of many rows and for bf16 training attention: the fp32
    kernel by regime (PREFILL, TRAINING: one choice for every weight shape), the bf16 ones by the variable that forces
    each (attention's where its runs took one kernel at every length they timed, as the benchmark's do: the variable
    forces every length). It times nothing: a choice no run asked for is absent."""
    threads = torch.get_num_threads()
    made = {regime: kernel for (regime, _, with_threads), kernel in KERNEL_CHOICES.items()
            if regime in (PREFILL, TRAINING) and with_threads == threads}
    if bf16_kernel.cache_info().currsize:  # cached once asked
        made[BF16_PRODUCTS_VARIABLE] = bf16_kernel()
    if len(set(CHOSEN.values())) == 1:
        made[ATTENTION_VARIABLE] = next(iter(CHOSEN.values()))
    return made


def attention_choices() -> str:
    """bf16 training attention's kernels this process chose, by the keys each timed length covers:
    "eager (1-128 keys), sdpa (129-256 keys)"; "none run" where no run asked."""
    first_keys = dict(zip(TIMED_KEYS, (1, *(length + 1 for length in TIMED_KEYS[:-1])), strict=True))
    return ", ".join(f"{kernel} ({first_keys[length]}-{length} keys)"
                     for length, kernel in sorted(CHOSEN.items())) or "none run"


def few_row_kernels(regime: str) -> str:
    """The kernels this process's products of a decoding regime took, by weight shape (out x in): "native (384x384,
    1536x384), onednn (8192x384)"; "none run" where the runs had no such product."""
    shapes = {}
    for (name, (out_features, in_features), threads), kernel in KERNEL_CHOICES.items():
        if name == regime and threads == torch.get_num_threads():
            shapes.setdefault(kernel, []).append(f"{out_features}x{in_features}")
    return ", ".join(f"{kernel} ({', '.join(sorted(names))})" for kernel, names in sorted(shapes.items())) or "none run"


# ----------------------------------------------------------------------------------------------- the run
def main() -> None:
    if args.memory_worker:
        memory_worker(*args.memory_worker)
        return
    transformers.logging.set_verbosity_error()
    peaks = machine_matmul_flops()
    this_machine = machine(peaks)
    if not this_machine["bf16_native"]:
        args.no_bf16 = True
        print(f"bf16 is not native on this {args.device.upper()} (bf16 products at "
              f"{this_machine['bf16_speed']:.3f}x the fp32 rate on one core): no bf16 training rows.")
    report = dict(machine=this_machine, settings={k: getattr(args, k) for k in SIZES["full"]},
                  matmul_gflops={k: v / 1e9 for k, v in peaks.items()}, results=[], details={})
    families = FAMILIES if args.family == "all" else (args.family,)
    rows = {}
    for family in families:
        rows[family], report["details"][family] = bench_family(family, peaks)
    compiled = any(r["measurement"].endswith("compiled") for family_rows in rows.values() for r in family_rows)
    report["kernels"] = kernel_choices(this_machine["bf16_native"], compiled)
    # After every timing: the memory workers would load the cores the timed rows run on.
    with_memory = [family for family in families if family != "llama"]  # llama: decode rows only
    memory = measure_memory(with_memory) if with_memory else {}
    for family in families:
        report["results"] += rows[family]
        if family in with_memory:  # its memory rows after its timed ones
            report["results"] += memory_rows(family, {side: memory[side][family] for side in SIDES})
    text = markdown(report, method=__doc__[__doc__.index("Every timing"):].strip())
    print(text)
    if args.write:
        or_stop(write_record, report, text)


if __name__ == "__main__":
    main()
