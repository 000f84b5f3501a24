"""nanoGPT's CPU recipe for character-level Tiny Shakespeare, trained by our entry point and by nanoGPT itself:

    python scripts/nanogpt_side_by_side.py                          # ours only
    python scripts/nanogpt_side_by_side.py --nanogpt ~/nanoGPT      # and nanoGPT's own train.py, same machine
    python scripts/nanogpt_side_by_side.py --nanogpt ~/nanoGPT --step-for-step   # the two models' training steps

`--step-for-step` leaves both training loops out: it builds our model with the recipe's knobs, nanoGPT's `GPT`
(its model.py) with the same sizes and, for scale, transformers' own `GPT2LMHeadModel` (with its biases, which GPT-2
cannot leave out), and times one training step of each (forward, loss, backward, clipping, AdamW, the same random
batch), alternating step by step in one process; each round prints the median of its steps, and the end the median of
every step's time over nanoGPT's step beside it, with a bootstrap interval (pairs cancel the machine's drift).

The recipe is the one nanoGPT's README gives for CPU: 4 layers, 4 heads, 128 wide, block 64, batch 12, 2,000
iterations, dropout 0, learning rate 1e-3 with 100 warm-up steps and cosine decay, AdamW beta2 0.99, weight decay
0.1, gradient clipping 1.0, no bias in LayerNorm and Linear, tied embeddings, GELU. Both sides use nanoGPT's
split: the first 90% of the characters for training, the last 10% for validation. Ours runs `scripts/train.py`
(Trainer) with nanoGPT's vocabulary, the corpus's 65 characters (`tokenizer_training.character_tokenizer`), so its
loss is per character like nanoGPT's; our documents are paragraphs wrapped in <s> ... </s>, and we
evaluate on the whole validation split where nanoGPT estimates on 20 random batches. Results: docs/nanogpt.md.
nanoGPT is not vendored: pass a checkout of github.com/karpathy/nanoGPT.
"""

import argparse
import json
import re
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


def run_ours(work: Path) -> dict:
    for name, text in corpus_split().items():
        (work / name).write_text(text)
    # nanoGPT's vocabulary: the corpus's characters (its prepare.py), here after our decoder's 4 special tokens, and a
    # model of exactly that many rows, not rounded up to 64 as a run's own tokenizer is.
    tokenizer = character_tokenizer("decoder", CORPUS.read_text())
    tokenizer.save_pretrained(work / "tokenizer")
    # The work folder is this script's own: a second comparison replaces the first one's run.
    command = [sys.executable, str(ROOT / "scripts" / "train.py"), "--output-dir", str(work / "ours"),
               "--overwrite-output-dir", "--train-files", str(work / "train.txt"),
               "--validation-files", str(work / "val.txt"), "--tokenizer", str(work / "tokenizer"), *OURS,
               "--set", f"vocab_size={len(tokenizer)}"]
    seconds, output = timed(command, ROOT, work / "ours.log")
    train_seconds = float(re.findall(r"'train_runtime': '([\d.]+)'", output)[-1])
    eval_seconds = sum(float(t) for t in re.findall(r"'eval_runtime': '([\d.]+)'", output))
    steps = int(OURS[OURS.index("--max-steps") + 1])
    return dict(val_loss=float(re.findall(r"evaluation: loss ([\d.]+)", output)[-1]), train_seconds=train_seconds,
                step_ms=1000 * (train_seconds - eval_seconds) / steps, wall_seconds=seconds)


def run_nanogpt(checkout: Path) -> dict:
    data = checkout / "data" / "shakespeare_char"
    shutil.copy(CORPUS, data / "input.txt")  # the same file nanoGPT would download
    subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True)
    seconds, output = timed([sys.executable, "train.py", *NANOGPT], checkout, checkout / "side_by_side.log")
    iterations = re.findall(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms", output, re.MULTILINE)
    iteration_ms = [float(ms) for _, ms in iterations]
    # An iteration's time includes the evaluation made at its start, every eval_interval (250) iterations.
    step_ms = [float(ms) for i, ms in iterations if int(i) % 250]
    return dict(val_loss=float(re.findall(r"val loss ([\d.]+)", output)[-1]), wall_seconds=seconds,
                train_seconds=sum(iteration_ms) / 1000,  # its iterations, evaluations included (as Trainer's)
                step_ms=sum(step_ms) / len(step_ms))


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
    optimizers = {name: torch.optim.AdamW(  # nanoGPT's configure_optimizers: decay on matrices only
        [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
         {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.99))
        for name, model in models.items()}
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
    work = args.work_dir.expanduser().resolve()  # scripts/train.py runs from the checkout's root
    if problem := work_folder_problem(work):
        parser.error(problem)
    work.mkdir(parents=True, exist_ok=True)
    rows = {"hf-scratch-transformer (scripts/train.py)": run_ours(work)}
    if args.nanogpt:
        rows["nanoGPT (train.py)"] = run_nanogpt(args.nanogpt.expanduser())
    print("| run | validation loss | training s | ms per step | whole run s |\n|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['val_loss']:.4f} | {r['train_seconds']:.1f} | {r['step_ms']:.1f} "
              f"| {r['wall_seconds']:.1f} |")


if __name__ == "__main__":
    main()
