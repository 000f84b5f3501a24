"""Tokenizers trained in the tests with the `tokenizers` library on the embedded corpus (no download)."""

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

CORPUS = Path(__file__).resolve().parent.parent / "data/tinyshakespeare/input.txt"


def corpus_lines(count: int = 3000) -> list[str]:
    return CORPUS.read_text(encoding="utf-8").splitlines()[:count]


def byte_level_bpe(vocab_size: int = 300, family: str = "decoder") -> PreTrainedTokenizerFast:
    """GPT-2-style byte-level BPE. Decoder: <bos>/<eos> around nothing (prompts stay open-ended);
    seq2seq: <eos> appended to every source, as the encoder-decoder family expects."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<bos>", "<eos>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer)
    if family == "seq2seq":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="$A <eos>", special_tokens=[("<eos>", tokenizer.token_to_id("<eos>"))]
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        padding_side="left" if family == "decoder" else "right",  # decoder prompts are left-padded for generation
    )


def wordpiece(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """BERT-style WordPiece with [CLS] ... [SEP] and a [MASK] token."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials)
    tokenizer.train_from_iterator(corpus_lines(), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[(t, tokenizer.token_to_id(t)) for t in ("[CLS]", "[SEP]")],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]",
    )
