"""nanoGPT's CPU recipe for character-level Tiny Shakespeare, trained by our entry point and by nanoGPT itself:

    python scripts/nanogpt_side_by_side.py                          # ours only
    python scripts/nanogpt_side_by_side.py --nanogpt ~/nanoGPT      # and nanoGPT's own train.py, same machine
    python scripts/nanogpt_side_by_side.py --nanogpt ~/nanoGPT --step-for-step   # the two models' training steps
    python scripts/nanogpt_side_by_side.py --nanogpt ~/nanoGPT --paired-steps 300  # the two programs' steps, paired

`--step-for-step` leaves both training loops out: it builds our model with the recipe's knobs, nanoGPT's `GPT`
(its model.py) with the same sizes and, for scale, transformers' own `GPT2LMHeadModel` (with its biases, which GPT-2
cannot leave out), and times one training step of each (forward, loss, backward, clipping, AdamW, the same random
batch), alternating step by step in one process; each round prints the median of its steps, and the end the median of
every step's time over nanoGPT's step beside it, with a bootstrap interval (pairs cancel the machine's drift).
`--paired-steps N` keeps both loops: our command runs in this process for N steps, and before each of its steps one
iteration of nanoGPT's own loop runs (its model, batches, AdamW, schedule and clipping); the end prints the median
of the pairs' ratios. Whole programs run back to back can differ by more than that on a busy machine, whose speed
drifts by a fifth within minutes.

The recipe is the one nanoGPT's README gives for CPU: 4 layers, 4 heads, 128 wide, block 64, batch 12, 2,000
iterations, dropout 0, learning rate 1e-3 with 100 warm-up steps and cosine decay, AdamW beta2 0.99, weight decay
0.1, gradient clipping 1.0, no bias in LayerNorm and Linear, tied embeddings, GELU. Both sides use nanoGPT's
split: the first 90% of the characters for training, the last 10% for validation. Ours runs `scripts/train.py`
(Trainer) with nanoGPT's vocabulary, the corpus's 65 characters (`tokenizer_training.character_tokenizer`), so its
loss is per character like nanoGPT's; our documents are paragraphs wrapped in <s> ... </s>, and we evaluate on the
whole validation split where nanoGPT estimates on 20 random batches. Results: docs/nanogpt.md.
nanoGPT is not vendored: pass a checkout of github.com/karpathy/nanoGPT.
"""

import argparse
import json
import math
import re
import runpy
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from tokenizer_training import character_tokenizer

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "data" / "tinyshakespeare" / "input.txt"

OURS = [
    "--preset", "gpt-mini",  # and run_ours's --tokenizer: nanoGPT's characters
    "--set", "num_hidden_layers=4", "num_attention_heads=4", "hidden_size=128", "intermediate_size=512",
    'hidden_act="gelu"', "dropout=0", "max_position_embeddings=64", "use_bias=false",
    "--max-length", "64", "--batch-size", "12", "--max-steps", "2000", "--learning-rate", "1e-3",
    "--warmup-steps", "100", "--adam-beta2", "0.99", "--weight-decay", "0.1", "--max-grad-norm", "1.0",
    "--eval-steps", "500", "--save-steps", "2000",
]  # fmt: skip
NANOGPT = [  # nanoGPT README, "I only have a macbook"
    "config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1",
    "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--max_iters=2000",
    "--lr_decay_iters=2000", "--dropout=0.0",
]  # fmt: skip


def timed(command: list[str], cwd: Path, log: Path) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command[:3])} failed, see {log}")
    return seconds, done.stdout + done.stderr


def corpus_split() -> dict[str, str]:
    """The files our run reads: nanoGPT's split (data/shakespeare_char/prepare.py), the first 90% for training."""
    text = CORPUS.read_text()
    split = int(len(text) * 0.9)
    return {"train.txt": text[:split], "val.txt": text[split:]}


# What this script writes into its work folder; anything else there is someone else's.
WORK_FILES = {"train.txt", "val.txt", "tokenizer", "ours", "ours.log"}


def work_folder_problem(work: Path) -> str | None:
    """Why `work` cannot be this script's work folder, or None: it holds other files (a user's own train.txt was
    written over with Tiny Shakespeare)."""
    if work.exists() and not work.is_dir():
        return f"--work-dir {work} is a file, not a folder"
    if not work.is_dir():
        return None
    if others := sorted(path.name for path in work.iterdir() if path.name not in WORK_FILES):
        return f"--work-dir {work} holds files this script did not write ({', '.join(others[:5])}): choose another"
    if changed := [name for name, text in corpus_split().items()
                   if (work / name).is_file() and (work / name).read_text() != text]:
        return f"--work-dir {work} holds a {', '.join(changed)} this script did not write: choose another"
    return None


def our_command(work: Path, steps: int | None = None) -> list[str]:
    """scripts/train.py's arguments for the recipe (`steps` in place of its 2,000), after writing its data and
    tokenizer into `work` (this script's own folder: a second comparison replaces the first one's run)."""
    for name, text in corpus_split().items():
        (work / name).write_text(text)
    # nanoGPT's vocabulary: the corpus's characters (its prepare.py), here after our decoder's 4 special tokens, and a
    # model of exactly that many rows, not rounded up to 64 as a run's own tokenizer is.
    tokenizer = character_tokenizer("decoder", CORPUS.read_text())
    tokenizer.save_pretrained(work / "tokenizer")
    recipe = list(OURS)
    if steps is not None:  # the warm-up shortened below a short run's steps (the command refuses it otherwise)
        recipe[recipe.index("--max-steps") + 1] = str(steps)
        warmup = recipe.index("--warmup-steps") + 1
        recipe[warmup] = str(min(int(recipe[warmup]), steps - 1))
    return [str(ROOT / "scripts" / "train.py"), "--output-dir", str(work / "ours"), "--overwrite-output-dir",
            "--train-files", str(work / "train.txt"), "--validation-files", str(work / "val.txt"),
            "--tokenizer", str(work / "tokenizer"), *recipe, "--set", f"vocab_size={len(tokenizer)}"]


def run_ours(work: Path) -> dict:
    seconds, output = timed([sys.executable, *our_command(work)], ROOT, work / "ours.log")
    train_seconds = float(re.findall(r"'train_runtime': '([\d.]+)'", output)[-1])
    eval_seconds = sum(float(t) for t in re.findall(r"'eval_runtime': '([\d.]+)'", output))
    steps = int(OURS[OURS.index("--max-steps") + 1])
    return dict(val_loss=float(re.findall(r"evaluation: loss ([\d.]+)", output)[-1]), train_seconds=train_seconds,
                step_ms=1000 * (train_seconds - eval_seconds) / steps, wall_seconds=seconds)


def prepare_nanogpt_data(checkout: Path) -> Path:
    """nanoGPT's data/shakespeare_char folder with its train.bin and val.bin, made by its prepare.py from our copy
    of the corpus (the same file nanoGPT would download)."""
    data = checkout / "data" / "shakespeare_char"
    shutil.copy(CORPUS, data / "input.txt")
    subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True)
    return data


def run_nanogpt(checkout: Path) -> dict:
    prepare_nanogpt_data(checkout)
    seconds, output = timed([sys.executable, "train.py", *NANOGPT], checkout, checkout / "side_by_side.log")
    iterations = re.findall(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms", output, re.MULTILINE)
    iteration_ms = [float(ms) for _, ms in iterations]
    # An iteration's time includes the evaluation made at its start, every eval_interval (250) iterations.
    step_ms = [float(ms) for i, ms in iterations if int(i) % 250]
    return dict(val_loss=float(re.findall(r"val loss ([\d.]+)", output)[-1]), wall_seconds=seconds,
                train_seconds=sum(iteration_ms) / 1000,  # its iterations, evaluations included (as Trainer's)
                step_ms=sum(step_ms) / len(step_ms))


def nanogpt_optimizer(model: torch.nn.Module) -> torch.optim.AdamW:
    """nanoGPT's `configure_optimizers` on a CPU: AdamW (not fused), weight decay on matrices only (the rule
    `training.weight_decay_groups` shares with it)."""
    from hf_scratch_transformer.training import weight_decay_groups

    return torch.optim.AdamW(weight_decay_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.99))


def paired_steps(checkout: Path, work: Path, steps: int, skipped: int = 10) -> None:
    """Our command (scripts/train.py, run in this process for `steps` steps) with one iteration of nanoGPT's own
    training loop before each of Trainer's steps: its model.py's `GPT` at the recipe's sizes, its `get_batch` (random
    windows of its prepared train.bin), AdamW groups, learning-rate schedule and clipping, as its train.py runs them.
    Each of our steps is timed from the end of nanoGPT's iteration to the start of our next step (Trainer's whole
    loop: data, forward, backward, clipping, AdamW, callbacks). Pairs cancel the machine's drift, which on a busy
    machine is larger than the two programs' difference (docs/nanogpt.md). Each of our steps after the first closes
    a pair; the first `skipped` pairs (kernel timing, first allocations) are left out."""
    import numpy as np
    from transformers import Trainer

    from hf_scratch_transformer.cli.paired_ratios import median_interval

    sys.path.insert(0, str(checkout))
    from model import GPT, GPTConfig  # nanoGPT's model.py

    train_bin = prepare_nanogpt_data(checkout) / "train.bin"
    torch.manual_seed(1337)  # nanoGPT's seed
    nanogpt = GPT(GPTConfig(block_size=64, vocab_size=len(set(CORPUS.read_text())), n_layer=4, n_head=4, n_embd=128,
                            dropout=0.0, bias=False)).train()
    optimizer = nanogpt_optimizer(nanogpt)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:  # nanoGPT's, on a CPU
        data = np.memmap(train_bin, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - 64, (12,))
        return (torch.stack([torch.from_numpy(data[i:i + 64].astype(np.int64)) for i in ix]),
                torch.stack([torch.from_numpy(data[i + 1:i + 65].astype(np.int64)) for i in ix]))

    batch, iteration, pairs, ours_began = get_batch(), 0, [], None

    def nanogpt_iteration() -> float:
        nonlocal batch, iteration
        start = time.perf_counter()
        # nanoGPT's get_lr: 100 warm-up iterations, cosine decay to 1e-4 at 2,000
        ratio = min(iteration, 2000 - 100) / (2000 - 100) if iteration >= 100 else None
        lr = 1e-3 * (iteration + 1) / 101 if ratio is None else 1e-4 + 0.5 * (1 + math.cos(math.pi * ratio)) * 9e-4
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = nanogpt(*batch)[1]
        batch = get_batch()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(nanogpt.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        iteration += 1
        return time.perf_counter() - start

    training_step = Trainer.training_step

    def paired_training_step(trainer, *args, **kwargs):
        nonlocal ours_began
        ours = None if ours_began is None else time.perf_counter() - ours_began
        theirs = nanogpt_iteration()
        if ours is not None:
            pairs.append((ours, theirs))
        ours_began = time.perf_counter()
        return training_step(trainer, *args, **kwargs)

    Trainer.training_step = paired_training_step
    try:
        sys.argv = our_command(work, steps)
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        Trainer.training_step = training_step
    kept = pairs[skipped:]
    if not kept:
        sys.exit(f"--paired-steps {steps}: no pair left after the first {skipped}; ask for more steps")
    ratios = [ours / theirs for ours, theirs in kept]
    low, high = median_interval(ratios)
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads; "
          f"{len(kept)} paired steps: ms per step ours {1e3 * statistics.median(o for o, _ in kept):.1f}, nanoGPT's "
          f"loop {1e3 * statistics.median(t for _, t in kept):.1f}; median of the pairs' ratios ours / nanoGPT "
          f"{statistics.median(ratios):.3f} [95% bootstrap interval {low:.3f}, {high:.3f}]")


def step_for_step(checkout: Path, rounds: int, steps: int, vocab_size: int = 65) -> None:
    """Training steps of our model and of nanoGPT's, alternating, at the recipe's sizes (vocabulary: the 65
    characters of Tiny Shakespeare on both sides), and transformers' GPT-2 of the same sizes. Prints ms per step and
    the ratios to nanoGPT for every round."""
    sys.path.insert(0, str(checkout))
    from model import GPT, GPTConfig  # nanoGPT's model.py
    from transformers import GPT2Config, GPT2LMHeadModel

    from hf_scratch_transformer import ScratchDecoderForCausalLM, kernel_choice
    from hf_scratch_transformer.cli.paired_ratios import median_interval
    from hf_scratch_transformer.presets import get_preset

    torch.manual_seed(0)
    settings = dict(arg.split("=", 1) for arg in OURS[OURS.index("--set") + 1:OURS.index("--max-length")])
    config = get_preset("gpt-mini", vocab_size=vocab_size, **{k: json.loads(v) for k, v in settings.items()})
    models = {"ours": ScratchDecoderForCausalLM(config).train(),
              "nanoGPT": GPT(GPTConfig(block_size=64, vocab_size=vocab_size, n_layer=4, n_head=4, n_embd=128,
                                       dropout=0.0, bias=False)).train(),
              "GPT-2": GPT2LMHeadModel(GPT2Config(n_layer=4, n_head=4, n_embd=128, n_inner=512, vocab_size=vocab_size,
                                                 n_positions=64, activation_function="gelu", resid_pdrop=0.0,
                                                 embd_pdrop=0.0, attn_pdrop=0.0)).train()}
    optimizers = {name: nanogpt_optimizer(model) for name, model in models.items()}
    ids = torch.randint(0, vocab_size, (12, 65))
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()  # as nanoGPT's get_batch

    def step(name: str) -> float:
        start = time.perf_counter()
        if name == "ours":
            loss = models[name](input_ids=inputs, labels=inputs).loss  # shifted inside
        elif name == "GPT-2":
            loss = models[name](input_ids=inputs, labels=inputs, use_cache=False).loss  # ours makes no cache either
        else:
            loss = models[name](inputs, targets)[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(models[name].parameters(), 1.0)
        optimizers[name].step()
        optimizers[name].zero_grad(set_to_none=True)
        return time.perf_counter() - start

    for name in models:  # warm-up: the kernel choice, first allocations
        for _ in range(5):
            step(name)
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads, "
          f"fp32 kernel {kernel_choice.fp32_kernel(kernel_choice.TRAINING)}")
    ratios = {"ours": [], "GPT-2": []}  # each step's time over nanoGPT's step next to it: the machine's drift cancels
    for round_ in range(rounds):
        times = {name: [] for name in models}
        for i in range(steps):
            for name in (list(models) if i % 2 == 0 else list(models)[::-1]):
                times[name].append(step(name))
        for name in ratios:
            ratios[name] += [a / b for a, b in zip(times[name], times["nanoGPT"], strict=True)]
        ours, nanogpt, gpt2 = (statistics.median(times[name]) * 1e3 for name in models)
        print(f"round {round_ + 1}: ms per step ours {ours:.1f}, nanoGPT {nanogpt:.1f}, transformers' GPT-2 "
              f"{gpt2:.1f}; ours / nanoGPT {ours / nanogpt:.3f}, GPT-2 / nanoGPT {gpt2 / nanogpt:.3f}")
    print("all rounds, median of the paired steps' ratios [95% bootstrap interval]: " + ", ".join(
        f"{name} / nanoGPT {statistics.median(values):.3f} [{', '.join(f'{x:.3f}' for x in median_interval(values))}]"
        for name, values in ratios.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout to run beside ours")
    parser.add_argument("--work-dir", type=Path, default=ROOT / "outputs" / "nanogpt-side-by-side",
                        help="this script's folder for our run's data, run and log (a second comparison replaces "
                        "the first one's; a folder holding other files is refused)")
    parser.add_argument("--step-for-step", action="store_true", help="time the two models' training steps only")
    parser.add_argument("--paired-steps", type=int, metavar="N", help="with --nanogpt: our command for N steps, each "
                        "paired with an iteration of nanoGPT's own loop in the same process (drift cancels)")
    parser.add_argument("--rounds", type=int, default=6, help="with --step-for-step")
    parser.add_argument("--steps", type=int, default=20, help="steps of each model per round, with --step-for-step")
    parser.add_argument("--threads", type=int, help="with --step-for-step: PyTorch's threads (1 is steadier on a "
                        "busy machine, whose other load stalls a parallel product)")
    args = parser.parse_args()
    if args.nanogpt and not (args.nanogpt.expanduser() / "model.py").is_file():
        parser.error(f"--nanogpt {args.nanogpt}: no model.py there; pass a checkout of github.com/karpathy/nanoGPT")
    if args.step_for_step:
        if not args.nanogpt:
            parser.error("--step-for-step needs --nanogpt (its model.py)")
        if args.threads:
            torch.set_num_threads(args.threads)
        return step_for_step(args.nanogpt.expanduser(), args.rounds, args.steps)
    if args.paired_steps is not None and (not args.nanogpt or args.paired_steps < 1):
        parser.error("--paired-steps needs --nanogpt (its model.py, data/shakespeare_char/prepare.py) and a step count "
                     f">= 1, got {args.paired_steps}")
    work = args.work_dir.expanduser().resolve()  # scripts/train.py runs from the checkout's root
    if problem := work_folder_problem(work):
        parser.error(problem)
    work.mkdir(parents=True, exist_ok=True)
    if args.paired_steps is not None:
        return paired_steps(args.nanogpt.expanduser(), work, args.paired_steps)
    rows = {"hf-scratch-transformer (scripts/train.py)": run_ours(work)}
    if args.nanogpt:
        rows["nanoGPT (train.py)"] = run_nanogpt(args.nanogpt.expanduser())
    print("| run | validation loss | training s | ms per step | whole run s |\n|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['val_loss']:.4f} | {r['train_seconds']:.1f} | {r['step_ms']:.1f} "
              f"| {r['wall_seconds']:.1f} |")


if __name__ == "__main__":
    main()
