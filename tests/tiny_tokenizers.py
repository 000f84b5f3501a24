"""Small tokenizers for the tests, trained here with `tokenizer_training` on the embedded corpus (no download)."""

from functools import cache
from pathlib import Path

from tiny_texts import words

from tokenizer_training import train_tokenizer

CORPUS = Path(__file__).resolve().parent.parent / "data/tinyshakespeare/input.txt"


@cache
def _trained(kind: str, family: str, vocab_size: int):
    return train_tokenizer(kind, family, files=[CORPUS], vocab_size=vocab_size)


def byte_level_bpe(vocab_size: int = 300, family: str = "decoder"):
    """Byte-level BPE: `<s>` prepended for the decoder, `</s>` appended for seq2seq."""
    return _trained("bpe", family, vocab_size)


def wordpiece(vocab_size: int = 300):
    """BERT-style WordPiece: [CLS] ... [SEP], with [MASK]."""
    return _trained("wordpiece", "encoder", vocab_size)


TOKENIZER_KINDS = {"decoder": "bpe", "encoder": "wordpiece", "seq2seq": "bpe"}


def write_run_corpus(folder: Path, families: tuple[str, ...] = ("decoder",)) -> Path:
    """The training scripts' tiny data in `folder`: 110 five-word sentences as paragraphs (corpus.txt, a few epochs
    of 4-sequence batches in 8 steps), the same sentences as translation pairs into their reversal (train.src /
    train.tgt), and a 300-token tokenizer per family in folder/<family>."""
    sentences = words(110, seed=0)
    (folder / "corpus.txt").write_text("\n\n".join(sentences))
    (folder / "train.src").write_text("\n".join(sentences))
    (folder / "train.tgt").write_text("\n".join(" ".join(reversed(s.split())) for s in sentences))
    for family in families:
        train_tokenizer(TOKENIZER_KINDS[family], family, files=[folder / "corpus.txt"], vocab_size=300).save_pretrained(
            folder / family)
    return folder
