"""A short `Trainer` run lowers the loss of each family on a small synthetic task."""

import pytest
import torch
from tiny_models import VOCAB, tiny_lm
from transformers import Trainer, TrainingArguments


def _examples(family: str, count: int = 64, length: int = 12) -> list[dict]:
    """Learnable patterns: arithmetic sequences (LM and MLM), reversal (seq2seq)."""
    generator = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(count):
        start, step = torch.randint(3, VOCAB, (1,), generator=generator).item(), 1 + torch.randint(0, 3, (1,)).item()
        ids = 3 + (start + step * torch.arange(length)) % (VOCAB - 3)
        if family == "decoder":
            examples.append({"input_ids": ids, "labels": ids.clone()})
        elif family == "encoder":
            masked = torch.rand(length, generator=generator) < 0.25
            masked[length // 2] = True
            examples.append({"input_ids": ids.masked_fill(masked, 3), "labels": ids.masked_fill(~masked, -100)})
        else:
            examples.append({"input_ids": ids, "labels": ids.flip(0)})
    return examples


@pytest.mark.parametrize("family", ["decoder", "encoder", "seq2seq"])
def test_trainer_lowers_the_loss(family, tmp_path):
    model = tiny_lm(family, hidden_size=64, intermediate_size=128).train()
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=40,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        warmup_steps=4,
        logging_steps=5,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=_examples(family))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 8
    assert losses[-1] < 0.8 * losses[0], losses
