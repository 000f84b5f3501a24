"""The three tokenizer kinds, built with the `tokenizers` library, and what each model family adds to them.

Kinds (the pipeline of the tokenizer each one imitates):
    bpe        byte-level BPE as in GPT-2: ByteLevel pre-tokenizer and decoder, all 256 bytes in the initial
               alphabet, so any text round-trips losslessly and `<unk>` is never produced.
    wordpiece  WordPiece as in BERT (cased): BertNormalizer(lowercase=False), BertPreTokenizer, `##` continuations.
               Whitespace is not kept, so decoding only approximates the input.
    unigram    Unigram as in SentencePiece: Metaspace (`▁`) pre-tokenizer and decoder, no normalizer (SentencePiece's
               NFKC would change the text), so text made of characters seen in training and line breaks round-trips,
               except for a space at the very start, which merges into the `▁` that marks the start of a text.

Families (special tokens first in the vocabulary, in this order, so their ids are fixed; templates for one text
and for a pair of texts):
    decoder    <pad>=0 <s>=1 </s>=2 <unk>=3   `<s> $A`, pair `<s> $A <s> $B` (as Llama); left padding.
    seq2seq    <pad>=0 <s>=1 </s>=2 <unk>=3   `$A </s>`, pair `$A </s> $B </s>` (as T5); right padding.
    encoder    [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4   `[CLS] $A [SEP]`, pair `[CLS] $A [SEP] $B [SEP]` (as BERT).

Where spaces are tokens (BPE, Unigram), the encoder's [MASK] takes in the space before it, as RoBERTa's <mask> does,
and the BPE encoder's offsets leave out the space a token carries, as RoBERTa's do.
The decoder template does not append `</s>`: a prompt must stay open for generation. Causal-LM training appends
`</s>` to each document itself when it packs documents into blocks.
"""

from collections.abc import Iterator

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

KINDS = ("bpe", "wordpiece", "unigram")
FAMILIES = ("decoder", "encoder", "seq2seq")

# Role -> token; dict order is vocabulary order, which fixes the ids.
_SENTENCE_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
SPECIAL_TOKENS = {
    "decoder": _SENTENCE_TOKENS,
    "seq2seq": _SENTENCE_TOKENS,
    "encoder": {
        "pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]",
    },
}
_TEMPLATES = {  # family -> (single, pair); `:1` marks the second text's token type
    "decoder": ("<s> $A", "<s> $A <s> $B:1"),
    "seq2seq": ("$A </s>", "$A </s> $B:1 </s>:1"),
    "encoder": ("[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1"),
}
# The encoder passes segment ids (its `type_vocab_size` may use them); the others have no such input.
_MODEL_INPUTS = {
    "decoder": ["input_ids", "attention_mask"],
    "seq2seq": ["input_ids", "attention_mask"],
    "encoder": ["input_ids", "token_type_ids", "attention_mask"],
}


def _pipeline(kind: str, specials: list[str], unk: str, vocab_size: int, min_frequency: int):
    """An untrained `Tokenizer` of `kind` and its trainer."""
    if kind == "bpe":
        # No unk_token on the model: every byte is in the alphabet, so nothing is ever unknown.
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
    elif kind == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token=unk))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials)
    else:  # unigram; its trainer prunes by likelihood and has no min_frequency
        tokenizer = Tokenizer(models.Unigram())
        # `▁` opens the text only, not each stretch after a special token, as T5's tokenizer without `legacy`: else
        # "[MASK], here" gave `[MASK] ▁ ,`, a lone `▁` training never puts there, and "a</s>b" decoded as "a b".
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tokenizer.decoder = decoders.Metaspace(prepend_scheme="first")
        # Text files are read one example per line, without its line break, yet the documents a model trains on hold
        # line breaks: "\n" is in the alphabet, else it would be unknown (BPE has all bytes; WordPiece drops it).
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token=unk,
                                          initial_alphabet=["\n"])
    return tokenizer, trainer


def train(
    kind: str, family: str, texts: Iterator, length: int | None, vocab_size: int, min_frequency: int,
    model_max_length: int | None,
) -> PreTrainedTokenizerFast:
    """Train a `kind` tokenizer for `family` on `texts` (strings or lists of strings; `length` counts them for the
    progress bar). `kind` and `family` are assumed valid: `train_tokenizer` checks them."""
    roles = SPECIAL_TOKENS[family]
    specials = list(roles.values())
    tokenizer, trainer = _pipeline(kind, specials, roles["unk_token"], vocab_size, min_frequency)
    try:
        tokenizer.train_from_iterator(texts, trainer, length=length)
    except Exception as error:  # `tokenizers` raises a bare Exception
        if "not large enough to contain all chars" not in str(error):
            raise
        raise ValueError(
            f"`vocab_size` {vocab_size} is too small for a Unigram tokenizer of this text: its vocabulary holds every "
            f"character the text uses besides the {len(specials)} special tokens; choose a larger one."
        ) from error
    if tokenizer.get_vocab_size() > vocab_size:
        if kind == "unigram":
            # Its trainer keeps to the size only above the alphabet and the specials; at or below it overshoots
            # (Tiny Shakespeare: 65 characters, 4 specials, `vocab_size` 69 gave 85 tokens, 70 gave 70).
            alphabet = sum(len(token) == 1 for token in tokenizer.get_vocab())
            raise ValueError(
                f"`vocab_size` {vocab_size} is too small for a unigram tokenizer of this text: its {alphabet} "
                f"characters and {len(specials)} special tokens are {alphabet + len(specials)} tokens, and the Unigram "
                f"trainer keeps to the size asked only above that (it gave {tokenizer.get_vocab_size()}); choose at "
                f"least {alphabet + len(specials) + 1}."
            )
        # BPE and WordPiece keep their whole alphabet, over the size asked
        raise ValueError(
            f"`vocab_size` {vocab_size} is too small for a {kind} tokenizer of this text: its alphabet and special "
            f"tokens alone are {tokenizer.get_vocab_size()} tokens; choose a larger one."
        )
    return _for_family(tokenizer, kind, family, model_max_length)


def characters(text: str, family: str, model_max_length: int | None) -> PreTrainedTokenizerFast:
    """One token per character of `text`, after `family`'s special tokens: nanoGPT's character vocabulary (the 65 of
    Tiny Shakespeare). A BPE model without merges and without a pre-tokenizer: every character of a text is its own
    token, spaces and line breaks included, so text of those characters round-trips; others are `unk_token`."""
    roles = SPECIAL_TOKENS[family]
    specials = list(roles.values())
    vocab = {token: id_ for id_, token in enumerate([*specials, *sorted(set(text))])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=roles["unk_token"]))
    tokenizer.decoder = decoders.Fuse()  # characters joined as they are (without a decoder: joined by spaces)
    tokenizer.add_special_tokens(specials)
    return _for_family(tokenizer, "characters", family, model_max_length)


def _for_family(tokenizer: Tokenizer, kind: str, family: str, model_max_length: int | None) -> PreTrainedTokenizerFast:
    """`tokenizer` (of `kind`, its specials in it) with `family`'s templates, as a `PreTrainedTokenizerFast`."""
    roles = SPECIAL_TOKENS[family]
    specials = list(roles.values())
    if "mask_token" in roles and kind in ("bpe", "unigram"):
        # As RoBERTa's <mask>: the space before it belongs to it, else "a [MASK]" holds a lone `Ġ` / `▁` token that
        # training never puts there (masking replaces `Ġword` whole). WordPiece drops spaces anyway, as BERT's does;
        # characters mask one character, a space as any other.
        tokenizer.add_special_tokens([AddedToken(roles["mask_token"], lstrip=True, special=True, normalized=False)])
    single, pair = _TEMPLATES[family]
    template = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(token, tokenizer.token_to_id(token)) for token in specials]
    )
    if kind == "bpe" and family == "encoder":
        # As RoBERTa's: a token's offsets leave out the space it carries (`Ġworld` spans "world"), so that the
        # token-classification pipeline's entities start at their word. (GPT-2's, for the decoder, keep it.)
        template = processors.Sequence([processors.ByteLevel(add_prefix_space=False, trim_offsets=True), template])
    tokenizer.post_processor = template
    optional = {} if model_max_length is None else {"model_max_length": model_max_length}
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        padding_side="left" if family == "decoder" else "right",  # batched generation needs prompts flush right
        model_input_names=_MODEL_INPUTS[family],
        family=family,  # kept in init_kwargs and tokenizer_config.json; `special_token_ids` reads it back
        **roles,
        **optional,
    )
