"""The main job, end to end in a couple of minutes on a laptop CPU:

    python scripts/quickstart.py                      # what `make quickstart` runs
    python scripts/quickstart.py --max-steps 50       # a faster smoke run

Trains a small character-level causal LM (the `gpt-mini` preset, shrunk) with `Trainer` on the embedded Tiny
Shakespeare corpus, reports validation loss and perplexity, saves a Hub-ready folder (weights, config, model
code for `trust_remote_code`), reloads it through `AutoModelForCausalLM` and prints a generated sample.
Characters are the tokens here so that the job needs nothing but this repository.
"""

import argparse
import json
import math
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments, set_seed

import hf_scratch_transformer  # noqa: F401  (registers the Scratch families with the Auto classes)
from hf_scratch_transformer.presets import get_preset

ROOT = Path(__file__).resolve().parent.parent

# ----------------------------------------------------------------------------------------------- arguments
parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
parser.add_argument("--corpus", type=Path, default=ROOT / "data/tinyshakespeare/input.txt", help="text file")
parser.add_argument("--output-dir", type=Path, default=ROOT / "outputs/quickstart", help="where the model goes")
parser.add_argument("--max-steps", type=int, default=600, help="optimizer steps (default 600)")
parser.add_argument("--block-size", type=int, default=64, help="characters per training sequence (default 64)")
parser.add_argument("--batch-size", type=int, default=32, help="sequences per step (default 32)")
parser.add_argument("--seed", type=int, default=1337)
args = parser.parse_args()
set_seed(args.seed)


# ----------------------------------------------------------------------------------------------- data
class CharBlocks(torch.utils.data.Dataset):
    """Random windows of `block_size` characters; `labels` = inputs (the model shifts them)."""

    def __init__(self, ids: torch.Tensor, block_size: int, count: int):
        self.ids, self.block_size = ids, block_size
        self.starts = torch.randint(0, len(ids) - block_size, (count,))

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> dict:
        window = self.ids[self.starts[index] : self.starts[index] + self.block_size]
        return {"input_ids": window, "labels": window}


text = args.corpus.read_text(encoding="utf-8")
chars = sorted(set(text))
char_to_id = {c: i for i, c in enumerate(chars)}
ids = torch.tensor([char_to_id[c] for c in text])
split = int(0.9 * len(ids))
train_data = CharBlocks(ids[:split], args.block_size, args.max_steps * args.batch_size)
eval_data = CharBlocks(ids[split:], args.block_size, 200)

# ----------------------------------------------------------------------------------------------- model
vocab_size = 64 * math.ceil(len(chars) / 64)  # padded to a multiple of 64
config = get_preset(
    "gpt-mini", vocab_size=vocab_size, num_hidden_layers=4, hidden_size=128, num_attention_heads=4,
    intermediate_size=512, max_position_embeddings=args.block_size, dropout=0.0,
    bos_token_id=None, eos_token_id=None,
)
model = AutoModelForCausalLM.from_config(config)
print(f"model: {model.num_parameters() / 1e6:.2f}M parameters, vocabulary {len(chars)} characters -> {vocab_size}")

# ----------------------------------------------------------------------------------------------- training
training_args = TrainingArguments(
    output_dir=str(args.output_dir / "checkpoints"),
    max_steps=args.max_steps,
    per_device_train_batch_size=args.batch_size,
    per_device_eval_batch_size=args.batch_size,
    learning_rate=2e-3,
    lr_scheduler_type="cosine",
    warmup_steps=max(1, args.max_steps // 20),
    weight_decay=0.1,
    adam_beta2=0.99,
    max_grad_norm=1.0,
    logging_steps=max(1, args.max_steps // 10),
    save_strategy="no",
    report_to=[],
    use_cpu=True,
    seed=args.seed,
)
trainer = Trainer(model=model, args=training_args, train_dataset=train_data, eval_dataset=eval_data)
trainer.train()
val_loss = trainer.evaluate()["eval_loss"]
print(f"validation loss {val_loss:.4f}, perplexity {math.exp(val_loss):.2f} (per character)")

# ----------------------------------------------------------------------------------------------- save, reload, sample
folder = args.output_dir / "model"
trainer.save_model(str(folder))
(folder / "vocab.json").write_text(json.dumps(chars))
print(f"saved to {folder}: {', '.join(sorted(p.name for p in folder.iterdir()))}")

reloaded = AutoModelForCausalLM.from_pretrained(folder).eval()
prompt = "ROMEO:"
prompt_ids = torch.tensor([[char_to_id[c] for c in prompt]])
with torch.no_grad():
    generated = reloaded.generate(
        prompt_ids, max_new_tokens=args.block_size - len(prompt), do_sample=True, top_k=20, temperature=0.8
    )
print("sample from the reloaded model:\n" + "".join(chars[i] for i in generated[0].tolist() if i < len(chars)))
