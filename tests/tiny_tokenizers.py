"""Small tokenizers for the tests, trained here with `tokenizer_training` on the embedded corpus (no download)."""

from functools import cache
from pathlib import Path

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
