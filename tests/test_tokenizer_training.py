"""tokenizer_training: every kind x family trains, saves and reloads with AutoTokenizer; fixed special ids;
per-family templates; lossless round trips; drawn text's round trips, templates, offsets and reloads
(hypothesis); files, Dataset and DatasetDict sources; bad input; the CLI."""

import copy
import errno
import os
import re
import sys
from functools import cache
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict
from forked_python import run_python
from hypothesis import example, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, BertTokenizer
from transformers.testing_utils import CaptureLogger
from transformers.tokenization_utils_base import logger as tokenization_logger

from tokenizer_training import character_tokenizer, load_data, padded_vocab_size, special_token_ids, train_tokenizer
from tokenizer_training.trainers import FAMILIES, KINDS, SPECIAL_TOKENS

ROOT = Path(__file__).resolve().parent.parent
LINES = (ROOT / "data/tinyshakespeare/input.txt").read_text(encoding="utf-8").splitlines()[:2000]
VOCAB = 300  # tiny: training takes well under a second per tokenizer
# Lines 10-15 hold "citizens, the", "Is't a verdict?", "Let us kill him, and we'll have corn at our own price."
SAMPLE = "\n".join(LINES[10:16])
SENTENCE_IDS = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
EXPECTED_IDS = {
    "decoder": SENTENCE_IDS,
    "seq2seq": SENTENCE_IDS,
    "encoder": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4},
}
COMBOS = [(kind, family) for kind in KINDS for family in FAMILIES]
# Drawn text: any characters, and pieces where tokenizers go wrong: runs of whitespace, line breaks, controls, NUL,
# combining marks, CJK, emoji, a word longer than WordPiece spells (100 characters), every family's special tokens.
PIECES = [" ", "   ", "\t", "\n", "\r\n", "\0", "\x85", "\u2028", "\ufeff", "e\u0301", "你好", "🌍", "x" * 120, "The",
          "citizen", "'s,", *sorted({token for roles in SPECIAL_TOKENS.values() for token in roles.values()})]
TEXTS = st.lists(st.text(max_size=8) | st.sampled_from(PIECES), max_size=10).map("".join)


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "shakespeare.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def trained(corpus_file):
    """`trained(kind, family)`: one tokenizer per combination, trained once for the whole module."""
    cache = {}

    def get(kind, family):
        if (kind, family) not in cache:
            cache[kind, family] = train_tokenizer(kind, family, files=[corpus_file], vocab_size=VOCAB)
        return cache[kind, family]

    return get


@pytest.mark.parametrize("kind,family", COMBOS)
def test_save_and_reload_give_identical_tokenizer(trained, kind, family, tmp_path):
    tok = trained(kind, family)
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded(SAMPLE).input_ids == tok(SAMPLE).input_ids
    assert loaded(LINES[0], LINES[1]).input_ids == tok(LINES[0], LINES[1]).input_ids
    assert loaded.special_tokens_map == tok.special_tokens_map
    assert loaded.all_special_ids == tok.all_special_ids
    assert loaded.padding_side == tok.padding_side == ("left" if family == "decoder" else "right")
    assert special_token_ids(loaded) == special_token_ids(tok)  # the family survives the round trip
    assert len(loaded) == len(tok) <= VOCAB


@pytest.mark.parametrize("kind,family", COMBOS)
def test_special_tokens_have_fixed_ids(trained, kind, family):
    tok = trained(kind, family)
    expected = EXPECTED_IDS[family]
    assert tok.convert_tokens_to_ids(list(expected)) == list(expected.values())
    assert tok.unk_token_id == expected["<unk>" if family != "encoder" else "[UNK]"]
    if family == "encoder":
        assert (tok.pad_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == (0, 2, 3, 4)
        assert special_token_ids(tok) == {"pad_token_id": 0, "bos_token_id": None, "eos_token_id": None}
    else:
        ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
        if family == "seq2seq":
            ids["decoder_start_token_id"] = 1
        assert special_token_ids(tok) == ids


@pytest.mark.parametrize("kind,family", COMBOS)
def test_post_processing_per_family(trained, kind, family):
    tok = trained(kind, family)
    ids = tok(LINES[0]).input_ids
    if family == "decoder":  # BOS opens the prompt; no EOS, so generation can continue it
        assert ids[0] == tok.bos_token_id and tok.eos_token_id not in ids
    elif family == "seq2seq":
        assert ids[-1] == tok.eos_token_id and tok.bos_token_id not in ids
    else:
        a, b = tok(LINES[0]).input_ids[1:-1], tok(LINES[1]).input_ids[1:-1]
        assert ids == [tok.cls_token_id, *a, tok.sep_token_id]
        pair = tok(LINES[0], LINES[1])
        assert pair.input_ids == [tok.cls_token_id, *a, tok.sep_token_id, *b, tok.sep_token_id]
        assert pair.token_type_ids == [0] * (len(a) + 2) + [1] * (len(b) + 1)


@pytest.mark.parametrize("kind", KINDS)
def test_no_lone_space_token_stands_beside_a_mask_token(trained, kind, tmp_path):
    # "a [MASK]" gave `Ġ` (or `▁`) before [MASK] in the BPE and Unigram encoders: a token the MLM never trained on
    # there (masking replaces `Ġword` whole), in fill-mask inputs; RoBERTa's <mask> takes the space in (lstrip).
    tok = trained(kind, "encoder")
    tok.save_pretrained(tmp_path)
    for loaded in (tok, AutoTokenizer.from_pretrained(tmp_path)):
        tokens = loaded.convert_ids_to_tokens(loaded("The cat [MASK] here.").input_ids)
        assert tokens[tokens.index("[MASK]") - 1] not in ("Ġ", "▁")
        # Nor the start of the text after it: Unigram put a `▁` there, "[MASK], here" gave `[MASK] ▁ ,`.
        tokens = loaded.convert_ids_to_tokens(loaded("The cat [MASK], here.").input_ids)
        assert tokens[tokens.index("[MASK]") + 1] == ","
        assert loaded("The cat [MASK]").input_ids[:-2] == loaded("The cat").input_ids[:-1]


def test_byte_level_bpe_encoder_offsets_leave_out_the_space_a_token_carries(trained, tmp_path):
    # `Ġworld` spanned " world": token-classification entities began at the space before their word; RoBERTa's
    # byte-level BPE trims offsets to the word.
    tok = trained("bpe", "encoder")
    tok.save_pretrained(tmp_path)
    for loaded in (tok, AutoTokenizer.from_pretrained(tmp_path)):
        encoded = loaded("Hello world", "and more", return_offsets_mapping=True)
        texts = ["Hello world", "and more"]
        spans = [texts[kind][start:end] for (start, end), kind in zip(encoded.offset_mapping, encoded.token_type_ids,
                                                                      strict=True) if end > start]
        assert "".join(spans) == "Helloworldandmore" and not any(span.startswith(" ") for span in spans)


@pytest.mark.parametrize("family", FAMILIES)
def test_byte_level_bpe_round_trips_any_text(trained, family):
    tok = trained("bpe", family)
    for text in (SAMPLE, "  two  spaces,\ttab; \"quotes\" -- ünïcödé 你好 🌍\n\n"):
        assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text
    assert tok.unk_token_id not in tok(SAMPLE + "你好 🌍").input_ids


@pytest.mark.parametrize("family", FAMILIES)
def test_unigram_round_trips_training_text(trained, family):
    tok = trained("unigram", family)
    # Trained one line at a time, it never saw a line break: documents of several lines lost theirs to <unk>.
    for line in [*LINES[10:16], "Double  spaces, kept.", SAMPLE]:
        assert tok.decode(tok(line).input_ids, skip_special_tokens=True) == line


def _without_specials(tok, text: str) -> str:
    """`text` less the strings of the tokenizer's special tokens, which are those tokens (as in GPT-2's and BERT's
    tokenizers), with the whitespace an lstrip one takes in (`\\s` less \\x1c-\\x1f, no whitespace to `tokenizers`)."""
    added = sorted((token for token in tok.added_tokens_decoder.values() if token.special), key=lambda token:
                   -len(token.content))
    return re.sub("|".join(r"[^\S\x1c-\x1f]*" * token.lstrip + re.escape(token.content) for token in added), "", text)


@pytest.mark.parametrize("kind,family", [(kind, family) for kind in ("bpe", "unigram") for family in FAMILIES])
@settings(max_examples=60, deadline=None)
@given(text=TEXTS)
def test_drawn_text_round_trips_around_the_special_tokens(trained, kind, family, text):
    # Byte-level BPE loses nothing, as GPT-2's; Unigram the characters it never saw (<unk>) and a space opening what
    # it decodes. Unigram put a `▁` after each special token: "a</s>b" came back as "a b".
    tok = trained(kind, family)
    expected = _without_specials(tok, text)
    if kind == "unigram":
        alphabet = {token.replace("▁", " ") for token in tok.get_vocab() if len(token) == 1}
        expected = "".join(char for char in expected if char in alphabet)
    for ids in (tok(text).input_ids, tok(text, add_special_tokens=False).input_ids):
        decoded = tok.decode(ids, skip_special_tokens=True)
        assert decoded == expected or (kind == "unigram" and expected[:1] == " " and decoded == expected[1:])
        assert kind != "bpe" or ids.count(tok.unk_token_id) == text.count(tok.unk_token)  # its own string only


def _framed(tok, family: str, first: list[int], second: list[int] | None = None) -> list[int]:
    """The family's template around the ids of one text, or of a pair."""
    if family == "encoder":
        return [tok.cls_token_id, *first, tok.sep_token_id] + ([] if second is None else [*second, tok.sep_token_id])
    texts = [first] if second is None else [first, second]
    return [token for ids in texts for token in ([tok.bos_token_id, *ids] if family == "decoder" else
                                                 [*ids, tok.eos_token_id])]


@pytest.mark.parametrize("kind,family", COMBOS)
@settings(max_examples=25, deadline=None)
@given(first=TEXTS, second=st.none() | TEXTS.filter(bool), max_length=st.integers(4, 16))
def test_drawn_text_gets_its_familys_special_tokens_when_truncated_and_padded(trained, kind, family, first, second,
                                                                                max_length):
    tok = copy.deepcopy(trained(kind, family))  # a call's padding stays on its backend: keep it off the shared one
    parts = [tok(text, add_special_tokens=False).input_ids for text in (first, second) if text is not None]
    full = _framed(tok, family, *parts)
    encoded = tok(first, second)
    assert encoded.input_ids == full
    if family == "encoder":
        assert encoded.token_type_ids == [0] * (len(parts[0]) + 2) + [1] * (len(full) - len(parts[0]) - 2)
    # Truncated, the template stays whole around what is kept of each text; the padding is on the left for the
    # decoder (generation continues prompts at their right end), on the right for the others.
    padded = tok(first, second, truncation=True, max_length=max_length, padding="max_length")
    real = [token for token, kept in zip(padded.input_ids, padded.attention_mask, strict=True) if kept]
    pads = [tok.pad_token_id] * (max_length - len(real))
    assert padded.input_ids == (pads + real if family == "decoder" else real + pads)
    budget = min(max_length, len(full)) - (len(full) - sum(map(len, parts)))
    assert any(real == _framed(tok, family, parts[0][:kept], *[ids[:budget - kept] for ids in parts[1:]])
               for kept in range(budget + 1))


@pytest.mark.parametrize("kind,family", COMBOS)
@settings(max_examples=25, deadline=None)
@given(first=TEXTS, second=st.none() | TEXTS.filter(bool))
@example(first="0▁", second=None)  # a `▁` in the text (CI drew it)
def test_offsets_of_drawn_text_point_at_each_tokens_characters(trained, kind, family, first, second):
    tok = trained(kind, family)
    encoded = tok(first, second, return_offsets_mapping=True)
    backend = tok.backend_tokenizer
    for (start, end), sequence, id_, token in zip(encoded.offset_mapping, encoded.encodings[0].sequence_ids,
                                                  encoded.input_ids, tok.convert_ids_to_tokens(encoded.input_ids),
                                                  strict=True):
        if sequence is None:  # the template's
            assert (start, end) == (0, 0)
            continue
        span = (first, second)[sequence][start:end]
        if id_ == tok.unk_token_id:
            assert span
        elif id_ in tok.all_special_ids:  # a special token's string in the text, with the whitespace lstrip takes
            assert span.endswith(token)
        elif kind == "wordpiece":  # of the normalized text: controls gone, spaces around CJK characters
            assert backend.normalizer.normalize_str(span).strip() == token.removeprefix("##")
        elif kind == "unigram":  # the `▁` opening a text stands for no character; alone, it spans the first one
            opened = start == 0 and token.startswith("▁") and not span.startswith(" ")
            # A `▁` in the text is Metaspace's own character for a space: the same token as one
            assert span.replace("▁", " ") == token.replace("▁", " ")[opened:] or (opened and token == "▁")
        elif "\ufffd" not in (piece := backend.decoder.decode([token])):  # a token of whole characters
            assert span == (piece.strip(" ") if family == "encoder" else piece)  # RoBERTa's trimmed for the encoder


@cache
def _bert(vocabulary: tuple[str, ...]) -> BertTokenizer:
    return BertTokenizer(vocab={token: id_ for id_, token in enumerate(vocabulary)}, do_lower_case=False)


@settings(max_examples=60, deadline=None)
@given(first=TEXTS, second=st.none() | TEXTS.filter(bool))
def test_wordpiece_tokenizes_drawn_text_as_berts_own_does(trained, first, second):
    # Cased BERT's pipeline over this vocabulary: a word it cannot spell (or of over 100 characters) is one [UNK],
    # controls and whitespace go, CJK characters are words; the special tokens' strings are those tokens.
    tok = trained("wordpiece", "encoder")
    bert = _bert(tuple(sorted(tok.get_vocab(), key=tok.get_vocab().get)))
    ids = tok(first, second).input_ids
    assert ids == bert(first, second).input_ids
    assert tok.decode(ids, skip_special_tokens=True) == bert.decode(ids, skip_special_tokens=True)


@pytest.fixture(scope="module")
def reloaded(trained, tmp_path_factory):
    """`reloaded(kind, family)`: the trained tokenizer saved, and loaded back by AutoTokenizer."""
    cache = {}

    def get(kind, family):
        if (kind, family) not in cache:
            folder = tmp_path_factory.mktemp(f"{kind}-{family}")
            trained(kind, family).save_pretrained(folder)
            cache[kind, family] = AutoTokenizer.from_pretrained(folder)
        return cache[kind, family]

    return get


@pytest.mark.parametrize("kind,family", COMBOS)
@settings(max_examples=15, deadline=None)
@given(batch=st.lists(TEXTS, min_size=1, max_size=3), second=st.none() | TEXTS.filter(bool))
def test_a_reloaded_tokenizer_encodes_and_decodes_drawn_text_alike(trained, reloaded, kind, family, batch, second):
    tok, loaded = copy.deepcopy(trained(kind, family)), reloaded(kind, family)  # padded: as above
    pairs = None if second is None else [second] * len(batch)
    options = dict(padding=True, return_offsets_mapping=True, return_special_tokens_mask=True)
    encoded = tok(batch, pairs, **options)
    assert dict(loaded(batch, pairs, **options)) == dict(encoded)
    for ids in encoded.input_ids:
        for skip in (False, True):
            assert loaded.decode(ids, skip_special_tokens=skip) == tok.decode(ids, skip_special_tokens=skip)


def test_wordpiece_keeps_case(trained):
    tok = trained("wordpiece", "encoder")
    assert tok.decode(tok("First Citizen").input_ids, skip_special_tokens=True) == "First Citizen"


def test_dataset_and_dataset_dict_sources(trained):
    dataset = Dataset.from_dict({"text": LINES})
    from_dataset = train_tokenizer("bpe", "decoder", dataset=dataset, vocab_size=VOCAB)
    # Same lines, same vocabulary. (Only BPE training is deterministic: WordPiece and Unigram break ties by hash order.)
    assert from_dataset.get_vocab() == trained("bpe", "decoder").get_vocab()
    streamed = train_tokenizer("bpe", "encoder", dataset=dataset.to_iterable_dataset(), vocab_size=VOCAB)
    assert streamed.get_vocab() == trained("bpe", "encoder").get_vocab()

    with_gaps = train_tokenizer("bpe", "decoder", dataset=Dataset.from_dict({"text": [*LINES, None]}), vocab_size=VOCAB)
    assert with_gaps.get_vocab() == from_dataset.get_vocab()  # a missing value (an empty CSV cell) is an empty text

    splits = DatasetDict(
        train=Dataset.from_dict({"content": LINES[:1000]}), test=Dataset.from_dict({"content": LINES[1000:1010]})
    )
    tok = train_tokenizer("unigram", "seq2seq", dataset=splits, text_column="content", vocab_size=VOCAB)
    assert tok(LINES[0]).input_ids[-1] == tok.eos_token_id and len(tok) <= VOCAB


def test_a_dataset_dict_trains_on_its_train_split_wherever_it_stands(trained):
    """Of a DatasetDict the "train" split is read, not the first one (`load_dataset` orders splits as the data has
    them: a validation split may come first)."""
    splits = DatasetDict(validation=Dataset.from_dict({"text": ["zzz qqq"] * 50}),
                         train=Dataset.from_dict({"text": LINES}))
    assert train_tokenizer("bpe", "decoder", dataset=splits, vocab_size=VOCAB).get_vocab() == trained(
        "bpe", "decoder").get_vocab()


def test_a_text_files_lines_are_examples_without_their_line_break(tmp_path):
    """As the `datasets` text loader reads them: kept, the line break joined a line's trailing space into a `ĠĊ`
    merge that no text of the same lines as a dataset has."""
    lines = [f"{line} " for line in LINES]  # a space at the end of every line
    path = tmp_path / "spaced.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    from_file = train_tokenizer("bpe", "decoder", files=[path], vocab_size=VOCAB)
    from_dataset = train_tokenizer("bpe", "decoder", dataset=Dataset.from_dict({"text": lines}), vocab_size=VOCAB)
    assert from_file.get_vocab() == from_dataset.get_vocab()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(kind="bpe", family="decoder"), "neither"),
        (dict(kind="bpe", family="decoder", files=["x.txt"], dataset=Dataset.from_dict({"text": ["a"]})), "both"),
        (dict(kind="sentencepiece", family="decoder", files=["x.txt"]), "bpe, wordpiece, unigram"),
        (dict(kind="bpe", family="causal", files=["x.txt"]), "decoder, encoder, seq2seq"),
        (dict(kind="bpe", family="decoder", files=[]), "`files` is empty"),
        (dict(kind="bpe", family="decoder", files=["x.txt"], vocab_size=0), "vocab_size"),
        # a single path's characters were taken for file names: "Training text files not found: x, ., t, x, t"
        (dict(kind="bpe", family="decoder", files="x.txt"), r"got the single path 'x.txt': pass \['x.txt'\]"),
        # `hf-scratch tokenizer` refuses these; here they were the OverflowError of `tokenizers`, and a tokenizer
        # that truncates every text away
        (dict(kind="bpe", family="decoder", files=["x.txt"], min_frequency=-1), "`min_frequency` must be a non-negat"),
        (dict(kind="bpe", family="decoder", files=["x.txt"], model_max_length=0), "`model_max_length` must be a posi"),
        # ids are 32-bit in `tokenizers`: its OverflowError came after the data was read
        (dict(kind="unigram", family="decoder", files=["x.txt"], vocab_size=2**32 + 1), "below 2\\*\\*32"),
        (dict(kind="bpe", family="decoder", dataset=Dataset.from_dict({"content": ["a"]})), "no column 'text'"),
        (dict(kind="bpe", family="decoder", dataset=DatasetDict(test=Dataset.from_dict({"text": ["a"]}))), "'train'"),
        # `tokenizers` raised a bare TypeError for values that are not strings, and learnt nothing from blank ones
        (dict(kind="bpe", family="decoder", dataset=Dataset.from_dict({"text": [1, 2]})), "holds int values, not text"),
        (dict(kind="unigram", family="decoder", dataset=Dataset.from_dict({"text": ["", " \n"]})), "holds no text"),
    ],
)
def test_bad_input_raises_value_error_naming_it(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train_tokenizer(**kwargs)


def test_a_unigram_vocabulary_smaller_than_the_alphabet_is_named(corpus_file):
    # `tokenizers` raised a bare Exception, which the CLI showed as a traceback.
    with pytest.raises(ValueError, match="`vocab_size` 20 is too small for a Unigram tokenizer of this text"):
        train_tokenizer("unigram", "decoder", files=[corpus_file], vocab_size=20)


@pytest.mark.parametrize("below", [0, 3])
def test_a_unigram_vocabulary_at_its_alphabets_size_names_the_smallest_size_it_keeps_to(corpus_file, below):
    """At the size of its alphabet and specials (59 characters, `▁` and line breaks among them, + 4) or just below,
    the Unigram trainer overshot to 81-84 tokens, and the message called those its "alphabet and special tokens"."""
    alphabet = len(set(corpus_file.read_text(encoding="utf-8").replace(" ", "\u2581")))
    size = alphabet + 4 - below
    with pytest.raises(ValueError, match=rf"`vocab_size` {size} is too small for a unigram tokenizer of this text: its "
                                         rf"{alphabet} characters and 4 special tokens are {alphabet + 4} tokens.*"
                                         rf"choose at least {alphabet + 5}\."):
        train_tokenizer("unigram", "decoder", files=[corpus_file], vocab_size=size)
    assert len(train_tokenizer("unigram", "decoder", files=[corpus_file], vocab_size=alphabet + 5)) == alphabet + 5


@pytest.mark.parametrize("kind, size", [("bpe", 260), ("wordpiece", None)])
def test_a_vocabulary_smaller_than_the_alphabet_is_named_for_every_kind(corpus_file, kind, size):
    # BPE and WordPiece keep their whole alphabet: --vocab-size 100 gave a byte-level BPE of 260 tokens, without a word.
    with pytest.raises(ValueError, match=rf"`vocab_size` 20 is too small for a {kind} tokenizer of this text: "
                                         rf"its alphabet and special tokens alone are {size or '[0-9]+'} tokens"):
        train_tokenizer(kind, "decoder", files=[corpus_file], vocab_size=20)


def test_missing_file_is_reported_before_training(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        train_tokenizer("bpe", "decoder", files=[tmp_path / "nope.txt"])


@pytest.mark.parametrize("name", ["nope.jsonl", "data/nope.csv", "./nope", "/no/such/folder"])
def test_a_missing_local_data_file_is_named_not_looked_up_on_the_hub(name, tmp_path, monkeypatch):
    # `load_dataset` took a mistyped local path for a Hub name: a ConnectionError traceback offline, "doesn't exist on
    # the Hub" online. A name with a data file's suffix, or one that starts like a path, is local.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"^{name}: no such file or folder"):
        load_data(name)


@pytest.mark.parametrize("held", [[], ["notes.dat"]])
def test_a_folder_without_data_files_is_named(held, tmp_path):
    # `datasets`' EmptyDatasetError / DataFilesNotFoundError (FileNotFoundErrors) ended `hf-scratch tokenizer
    # --dataset FOLDER` and `finetune --dataset FOLDER` with a traceback.
    for name in held:
        (tmp_path / name).write_text("1 2 3\n")
    with pytest.raises(ValueError, match=f"^{tmp_path}: holds no data files that `datasets` reads"):
        load_data(tmp_path)


def test_a_byte_order_mark_is_not_read_as_text(tmp_path):
    # U+FEFF (a UTF-8 file saved by a Windows editor) began the first line: the Unigram alphabet took it in.
    path = tmp_path / "bom.txt"
    path.write_text("\n".join(LINES[:300]) + "\n", encoding="utf-8-sig")
    assert load_data(path)["train"][0]["text"] == LINES[0]
    tok = train_tokenizer("unigram", "decoder", files=[path], vocab_size=VOCAB)
    assert not any("\ufeff" in token for token in tok.get_vocab())


def test_a_data_file_of_a_datasets_format_is_not_read_as_plain_text(tmp_path):
    # `--files data.jsonl` trained on the JSON syntax, line by line: `{"`, `text`, `":` became tokens, silently.
    path = tmp_path / "data.jsonl"
    path.write_text("".join(f'{{"text": "{line}"}}\n' for line in LINES[:300] if '"' not in line))
    with pytest.raises(ValueError, match=r"data.jsonl is a JSON file, not plain text: .*as a dataset"):
        train_tokenizer("bpe", "decoder", files=[path], vocab_size=VOCAB)


def test_a_data_files_suffix_is_read_in_any_case(tmp_path):
    # DATA.CSV (as Windows tools name files) was refused as an "unknown file type '.CSV'", and DATA.JSONL given as
    # text was trained on as plain lines.
    (tmp_path / "DATA.CSV").write_text("text\n" + "".join(f"{line}\n" for line in LINES[:20] if "," not in line))
    assert load_data(tmp_path / "DATA.CSV")["train"].column_names == ["text"]
    (tmp_path / "DATA.JSONL").write_text('{"text": "a line"}\n')
    with pytest.raises(ValueError, match="is a JSON file, not plain text"):
        train_tokenizer("bpe", "decoder", files=[tmp_path / "DATA.JSONL"], vocab_size=VOCAB)


def test_special_token_ids_needs_a_family(trained):
    tok = trained("bpe", "decoder")
    foreign = type(tok)(tokenizer_object=tok.backend_tokenizer, bos_token="<s>")  # no `family` given
    with pytest.raises(ValueError, match="family"):
        special_token_ids(foreign)
    assert special_token_ids(foreign, "seq2seq") == dict(pad_token_id=None, bos_token_id=1, eos_token_id=None,
                                                         decoder_start_token_id=1)
    # One without <s> (T5's, Marian's) starts the decoder at pad, as theirs do: None stopped training at its first
    # batch ("`config.decoder_start_token_id` must be set").
    t5_like = type(tok)(tokenizer_object=tok.backend_tokenizer, eos_token="</s>", pad_token="<pad>")
    assert special_token_ids(t5_like, "seq2seq")["decoder_start_token_id"] == t5_like.pad_token_id == 0
    # The family a tokenizer records is the one it was trained for: a `family` given beside it changes nothing.
    assert special_token_ids(tok, "seq2seq") == special_token_ids(tok) == dict(pad_token_id=0, bos_token_id=1,
                                                                               eos_token_id=2)


@pytest.mark.parametrize("kind", KINDS)
def test_padded_vocab_size(trained, kind):
    tok = trained(kind, "encoder")
    size = padded_vocab_size(tok)
    assert size % 64 == 0 and len(tok) <= size < len(tok) + 64
    assert padded_vocab_size(tok, multiple=8) % 8 == 0
    with pytest.raises(ValueError, match="multiple"):
        padded_vocab_size(tok, multiple=0)


@given(length=st.integers(1, 10**6), multiple=st.integers(1, 512))
def test_padded_vocab_size_is_the_least_multiple_that_holds_every_token(length, multiple):
    size = padded_vocab_size(range(length), multiple)  # anything of that `len`, as a tokenizer
    assert size % multiple == 0 and size - multiple < length <= size


@pytest.mark.parametrize("source", ["--files", "--dataset"])
def test_cli_writes_a_folder_auto_tokenizer_loads(corpus_file, source, tmp_path):
    out = tmp_path / "tokenizer"
    # --dataset takes a local folder of text files through `datasets.load_dataset`.
    data = corpus_file if source == "--files" else corpus_file.parent
    command = [
        sys.executable, "-m", "tokenizer_training", "--kind", "bpe", "--family", "seq2seq", source, str(data),
        "--vocab-size", str(VOCAB), "--model-max-length", "128", "--output-dir", str(out),
    ]
    result = run_python(command, cwd=ROOT, timeout=120)  # as `python -m`, forked: no 10 s of imports
    assert result.returncode == 0, result.stderr
    assert "model vocab_size 320" in result.stdout and "round trip: exact" in result.stdout

    tok = AutoTokenizer.from_pretrained(out)
    assert tok.model_max_length == 128 and tok(LINES[0]).input_ids[-1] == tok.eos_token_id
    assert special_token_ids(tok)["decoder_start_token_id"] == 1


def test_cli_example_past_a_small_model_max_length_does_not_warn(corpus_file, tmp_path, monkeypatch, capsys):
    # The example the command tokenizes to show its tokens is run through no model: with --model-max-length 8, it
    # printed transformers' "Token indices sequence length is longer than ... will result in indexing errors".
    from hf_scratch_transformer.cli import main

    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    with CaptureLogger(tokenization_logger) as captured:
        main(["tokenizer", "--kind", "bpe", "--family", "decoder", "--files", str(corpus_file), "--vocab-size",
              str(VOCAB), "--model-max-length", "8", "--output-dir", str(tmp_path / "tokenizer")])
    assert "round trip: exact" in capsys.readouterr().out and "Token indices sequence length" not in captured.out


def test_cli_refuses_to_replace_a_tokenizer_unless_asked(corpus_file, trained, tmp_path, monkeypatch, capsys):
    # `--output-dir` of a trained model's folder replaced its tokenizer without a word: other ids under its weights.
    from hf_scratch_transformer.cli import main

    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    folder = tmp_path / "model"
    trained("wordpiece", "encoder").save_pretrained(folder)
    before = (folder / "tokenizer.json").read_bytes()
    command = ["tokenizer", "--kind", "bpe", "--family", "decoder", "--files", str(corpus_file), "--vocab-size",
               str(VOCAB), "--output-dir", str(folder)]
    with pytest.raises(SystemExit) as stopped:
        main(command)
    assert stopped.value.code == 2 and "holds a tokenizer (tokenizer_config.json, tokenizer.json" in \
        capsys.readouterr().err
    assert (folder / "tokenizer.json").read_bytes() == before
    # An older tokenizer's file beside it (transformers 4 wrote special_tokens_map.json) was kept, and overrode the
    # new tokenizer's special tokens: replaced means replaced whole.
    (folder / "special_tokens_map.json").write_text('{"bos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}')
    main([*command, "--overwrite-output-dir"])
    assert "removed the replaced tokenizer's special_tokens_map.json" in capsys.readouterr().out
    assert not (folder / "special_tokens_map.json").exists()
    replaced = AutoTokenizer.from_pretrained(folder)
    assert replaced.init_kwargs["family"] == "decoder" and replaced.bos_token == "<s>" and len(replaced) == VOCAB


def test_a_new_tokenizer_folder_that_cannot_take_its_place_is_a_write_error(trained, tmp_path, monkeypatch):
    """A new folder is saved beside its place and renamed into it. Any error of that rename (a file system gone
    read-only, a full disk or quota for the folder's entry) was taken for a folder made there meanwhile: the files were
    then moved into a folder that did not exist, in a FileNotFoundError traceback saying nothing of the cause, and the
    saved copy was left hidden beside it."""
    from hf_scratch_transformer.checkpointing import WriteError
    from tokenizer_training.saving import save_in_place

    folder = tmp_path / "tokenizer"
    replace = os.replace

    def read_only(source, target, *args, **kwargs):
        if Path(target) == folder:
            raise OSError(errno.EROFS, "Read-only file system", str(target))
        return replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", read_only)
    message = rf"The tokenizer could not be written in {tmp_path} \(OSError: \[Errno 30\] Read-only file system"
    with pytest.raises(WriteError, match=message):
        save_in_place(trained("bpe", "decoder"), folder, [])
    assert list(tmp_path.iterdir()) == [], "no copy left aside"


def test_a_replaced_tokenizer_stopped_midway_is_never_mixed_with_the_earlier_one(corpus_file, trained, tmp_path,
                                                                                 monkeypatch, capsys):
    """save_pretrained writes tokenizer_config.json, then tokenizer.json: killed between the two over an earlier
    tokenizer (--overwrite-output-dir), the new config loaded silently over the earlier vocabulary; a full disk there
    ended in a traceback, the earlier tokenizer.json cut short. Saved aside and moved in, tokenizer.json last."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    from hf_scratch_transformer.cli import main

    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    folder = tmp_path / "model"
    trained("bpe", "decoder").save_pretrained(folder)
    earlier = {path.name: path.read_bytes() for path in folder.iterdir()}
    command = ["tokenizer", "--kind", "wordpiece", "--family", "encoder", "--files", str(corpus_file), "--vocab-size",
               str(VOCAB), "--output-dir", str(folder), "--overwrite-output-dir"]

    def killed(*args, **kwargs):  # the process stops where a kill would stop it
        raise SystemExit(-9)

    def full_disk(self, save_directory, **kwargs):
        (Path(save_directory) / "tokenizer.json").write_text('{"cut short')
        raise OSError(28, "No space left on device")

    save = TokenizersBackend._save_pretrained
    for stop in (killed, full_disk):
        monkeypatch.setattr(TokenizersBackend, "_save_pretrained", stop)
        with pytest.raises(SystemExit) as stopped:
            main(command)
        assert {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()} == earlier
    assert stopped.value.code == 2 and "No space left on device" in capsys.readouterr().err
    assert sorted(earlier) == sorted(path.name for path in folder.iterdir()), "the partial copy was removed"
    monkeypatch.setattr(TokenizersBackend, "_save_pretrained", save)
    move = Path.replace
    monkeypatch.setattr(Path, "replace", lambda path, target: killed() if path.name == "tokenizer.json" and
                        path.parent.name == ".tokenizer.tmp" else move(path, target))  # as the new files are moved in
    with pytest.raises(SystemExit):
        main(command)
    with pytest.raises(ValueError):  # neither tokenizer whole: a folder that does not load, not a mix that does
        AutoTokenizer.from_pretrained(folder)
    monkeypatch.setattr(Path, "replace", move)
    main(command)
    assert sorted(path.name for path in folder.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    assert AutoTokenizer.from_pretrained(folder).init_kwargs["family"] == "encoder"
    # Killed while the earlier files are moved out (after the first): tokenizer.json goes first, else the earlier
    # vocabulary stayed, without its settings, in a folder that loads.
    removed = []

    def killed_at_the_second(path, target):
        if path.parent == folder:
            removed.append(path.name)
            if len(removed) == 2:
                killed()
        return move(path, target)

    monkeypatch.setattr(Path, "replace", killed_at_the_second)
    with pytest.raises(SystemExit):
        main(command)
    assert removed == ["tokenizer.json", "tokenizer_config.json"]
    with pytest.raises(ValueError):
        AutoTokenizer.from_pretrained(folder)


def test_a_replaced_tokenizer_that_cannot_be_moved_in_leaves_the_earlier_one_and_says_where_the_new_one_is(
        corpus_file, trained, tmp_path, monkeypatch, capsys):
    """Into a model's folder (--overwrite-output-dir) the new tokenizer is saved aside, then moved in: a move that
    failed (a file system gone read-only, a full disk for the folder's entry) ended in a traceback, the earlier
    tokenizer's files removed already and the new one left hidden in `.tokenizer.tmp`. The moves are undone now, and
    where undoing fails too, the error says where each tokenizer's files are; the same command then completes it."""
    from hf_scratch_transformer.cli import main

    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    folder, aside = tmp_path / "model", tmp_path / "model/.tokenizer.tmp"
    trained("bpe", "decoder").save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"the model's weights")
    earlier = {path.name: path.read_bytes() for path in folder.iterdir()}
    command = ["tokenizer", "--kind", "wordpiece", "--family", "encoder", "--files", str(corpus_file), "--vocab-size",
               str(VOCAB), "--output-dir", str(folder), "--overwrite-output-dir"]
    move, moved = Path.replace, []

    def failing(error: int, after: int, for_good: bool):
        """Path.replace failing with `error` once the earlier files are out and `after` new files are in: that move
        alone, or every one from then on."""
        def replace(path, target):
            if path.parent == aside:
                moved.append(path.name)
            if len(moved) > after and (for_good or path.parent == aside):
                raise OSError(error, os.strerror(error), str(target))
            return move(path, target)
        return replace

    monkeypatch.setattr(Path, "replace", failing(errno.ENOSPC, after=1, for_good=False))  # the undoing works
    with pytest.raises(SystemExit) as stopped:
        main(command)
    said = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in said and len(said.strip().splitlines()) == 1
    assert f"The new tokenizer could not take the earlier one's place in {folder} (OSError: [Errno 28]" in said
    assert f"{folder} is as it was, and the new tokenizer is whole in {aside}" in said
    assert "run the command again" in said
    assert {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()} == earlier
    assert AutoTokenizer.from_pretrained(folder).init_kwargs["family"] == "decoder"
    assert AutoTokenizer.from_pretrained(aside).init_kwargs["family"] == "encoder", "the new one, whole"
    moved.clear()
    monkeypatch.setattr(Path, "replace", failing(errno.EROFS, after=1, for_good=True))  # read-only: no undoing
    with pytest.raises(SystemExit) as stopped:
        main(command)
    said = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in said
    assert f"The tokenizer files moved could not be moved back in {folder} (OSError: [Errno 30]" in said
    assert f"the earlier one's files are in it or in {folder / '.tokenizer.deleted'}, the new one's in it or in " \
           f"{aside}" in said
    with pytest.raises(ValueError):  # neither tokenizer whole: a folder that does not load, not a mix that does
        AutoTokenizer.from_pretrained(folder)
    monkeypatch.setattr(Path, "replace", move)
    main(command)  # the same command, once the cause is gone
    assert AutoTokenizer.from_pretrained(folder).init_kwargs["family"] == "encoder"
    assert sorted(path.name for path in folder.iterdir()) == ["model.safetensors", "tokenizer.json",
                                                              "tokenizer_config.json"]
    assert (folder / "model.safetensors").read_bytes() == b"the model's weights"


class Killed(BaseException):
    """A kill, as far as the code under it can tell: nothing of it runs after."""


def killed_at_rename(kill: int, rename=os.replace):
    """`os.replace` (`rename`) that kills at its `kill`-th call, before renaming."""
    calls = []

    def replace(source, target):
        calls.append(target)
        if len(calls) == kill:
            raise Killed
        return rename(source, target)

    return replace


def test_a_new_tokenizer_folder_stopped_midway_is_whole_or_absent(corpus_file, tmp_path, monkeypatch, capsys):
    """A new --output-dir is saved whole beside it and renamed into place. Moved in file by file, a kill before
    tokenizer.json left tokenizer_config.json alone, which the same command then refused as "a tokenizer" without
    --overwrite-output-dir. Such a folder from elsewhere is refused, saying what it lacks and what to do."""
    from hf_scratch_transformer.cli import main
    from tokenizer_training.saving import tokenizer_files

    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    folder = tmp_path / "tokenizer"
    command = ["tokenizer", "--kind", "bpe", "--family", "decoder", "--files", str(corpus_file), "--vocab-size",
               str(VOCAB), "--output-dir", str(folder)]
    rename = os.replace
    for kill in range(1, 10):  # killed before the first rename, the second ..., until none is left to kill at
        monkeypatch.setattr(os, "replace", killed_at_rename(kill, rename))
        try:
            main(command)  # the same command each time, never refused
            break
        except Killed:
            assert tokenizer_files(folder) == [], f"killed before rename {kill}: nothing of the tokenizer in place"
    assert AutoTokenizer.from_pretrained(folder).init_kwargs["family"] == "decoder"
    assert [path.name for path in tmp_path.iterdir()] == ["tokenizer"], "what the kills left is cleared"
    monkeypatch.setattr(os, "replace", rename)
    (folder / "tokenizer.json").unlink()  # as a copy in part, or a save into an existing folder stopped midway
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main(command)
    assert stopped.value.code == 2 and (
        f"--output-dir {folder} holds part of a tokenizer (tokenizer_config.json) without its vocabulary "
        "(tokenizer.json, or a slow tokenizer's vocab.txt ...), which no tokenizer loads from: pass "
        "--overwrite-output-dir to replace it") in capsys.readouterr().err


@pytest.mark.parametrize("while_this_one", ["trained", "was saved aside"])
def test_a_tokenizer_saved_into_the_folder_while_this_one_trained_is_kept(corpus_file, trained, tmp_path,
                                                                          monkeypatch, capsys, while_this_one):
    """Two commands into one new folder, the second finishing while the first trained (or any tokenizer saved there
    meanwhile): the folder held none when checked, and the last to save replaced the other's tokenizer without
    --overwrite-output-dir, both saying "saved to". Saved there as this one was saved aside, the folder is no longer
    new, and this one's is not renamed into its place."""
    import tokenizer_training
    from hf_scratch_transformer import checkpointing
    from hf_scratch_transformer.cli import main

    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    folder = tmp_path / "tokenizer"
    owner, name = (tokenizer_training, "train_tokenizer") if while_this_one == "trained" else \
        (checkpointing, "place_folder")
    then = getattr(owner, name)

    def while_the_other_saved(*args, **kwargs):
        trained("wordpiece", "encoder").save_pretrained(folder)  # the other command's
        return then(*args, **kwargs)

    monkeypatch.setattr(owner, name, while_the_other_saved)
    with pytest.raises(SystemExit) as stopped:
        main(["tokenizer", "--kind", "bpe", "--family", "decoder", "--files", str(corpus_file), "--vocab-size",
              str(VOCAB), "--output-dir", str(folder)])
    assert stopped.value.code == 2
    assert (f"{folder} holds a tokenizer saved while this one was trained (tokenizer_config.json, tokenizer.json)"
            in capsys.readouterr().err)
    assert AutoTokenizer.from_pretrained(folder).init_kwargs["family"] == "encoder", "the other command's, kept"
    assert sorted(path.name for path in folder.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    assert [path.name for path in tmp_path.iterdir()] == ["tokenizer"], "nothing of this one's left beside it"


@pytest.mark.parametrize("held, message", [("vocab.txt", "holds a tokenizer (vocab.txt)"),
                                           ("tokenizer.json/", "tokenizer.json is a folder, where the tokenizer's")])
def test_cli_refuses_a_slow_tokenizer_and_a_folder_in_the_way(corpus_file, tmp_path, monkeypatch, capsys, held,
                                                              message):
    # A folder with a slow tokenizer (BERT's vocab.txt) had it replaced without a word; a folder named tokenizer.json
    # failed after training with "Is a directory", leaving a half-saved tokenizer.
    from hf_scratch_transformer.cli import main

    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    folder = tmp_path / "model"
    folder.mkdir()
    options = []
    if held.endswith("/"):
        (folder / held).mkdir()
        options = ["--overwrite-output-dir"]
    else:
        (folder / held).write_text("[PAD]\n[UNK]\n")
    with pytest.raises(SystemExit) as stopped:
        main(["tokenizer", "--kind", "bpe", "--family", "decoder", "--files", str(corpus_file), "--vocab-size",
              str(VOCAB), "--output-dir", str(folder), *options])
    assert stopped.value.code == 2 and message in capsys.readouterr().err
    assert sorted(path.name for path in folder.iterdir()) == [held.rstrip("/")]


def test_cli_reads_every_file_of_a_repeated_files_option(tmp_path, monkeypatch):
    # argparse kept the last `--files` only: the tokenizer learnt from b.txt alone.
    from hf_scratch_transformer.cli import main

    monkeypatch.setattr("sys.argv", ["hf-scratch"])
    (tmp_path / "a.txt").write_text("abab abab\n" * 50)
    (tmp_path / "b.txt").write_text("xyxy xyxy\n" * 50)
    main(["tokenizer", "--kind", "bpe", "--family", "decoder", "--files", str(tmp_path / "a.txt"), "--files",
          str(tmp_path / "b.txt"), "--vocab-size", "300", "--output-dir", str(tmp_path / "tokenizer")])
    vocabulary = AutoTokenizer.from_pretrained(tmp_path / "tokenizer").get_vocab()
    assert "abab" in vocabulary and "xyxy" in vocabulary


# ----------------------------------------------------------------------------------------------- character_tokenizer
CORPUS = (ROOT / "data/tinyshakespeare/input.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_character_tokenizer_has_nanogpts_ids_after_the_familys_special_tokens(family, tmp_path):
    """nanoGPT's shakespeare_char/prepare.py: `chars = sorted(list(set(data)))`, `stoi = {ch: i for i, ch in
    enumerate(chars)}`; ours are those ids after the family's special tokens, with the family's template, reloaded
    alike by AutoTokenizer."""
    tok = character_tokenizer(family, CORPUS, model_max_length=64)
    specials = EXPECTED_IDS[family]
    stoi = {char: i for i, char in enumerate(sorted(set(CORPUS)))}
    assert len(stoi) == 65 and len(tok) == len(specials) + 65
    assert tok.convert_tokens_to_ids(list(specials)) == list(specials.values())
    ids = tok(SAMPLE, add_special_tokens=False).input_ids
    assert ids == [len(specials) + stoi[char] for char in SAMPLE]
    assert tok(SAMPLE).input_ids == _framed(tok, family, ids)
    first, second = (tok(text, add_special_tokens=False).input_ids for text in LINES[:2])
    assert tok(LINES[0], LINES[1]).input_ids == _framed(tok, family, first, second)
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded(SAMPLE).input_ids == tok(SAMPLE).input_ids and loaded.model_max_length == 64
    assert special_token_ids(loaded) == special_token_ids(tok)
    assert loaded.padding_side == ("left" if family == "decoder" else "right")


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=40, deadline=None)
@given(text=TEXTS | st.text(alphabet=sorted(set(CORPUS)), max_size=40))
def test_a_character_tokenizer_gives_each_character_one_token_and_decodes_those_it_knows(family, text):
    """Each character outside the special tokens is one token (its own, or the unknown token); decoding gives back the
    known ones, spaces and line breaks as they were ("a [MASK]" keeps its space: a character is masked alone)."""
    tok = character_tokenizer(family, CORPUS)
    plain = _without_specials(tok, text)
    ids = tok(text, add_special_tokens=False).input_ids
    assert len([id_ for id_ in ids if id_ not in tok.all_special_ids or id_ == tok.unk_token_id]) == len(plain) + \
        text.count(tok.unk_token)
    known = set(CORPUS)
    assert tok.decode(ids, skip_special_tokens=True) == "".join(char for char in plain if char in known)


@pytest.mark.parametrize("args, message", [(("causal", "abc"), "decoder, encoder, seq2seq"),
                                           (("decoder", ""), "`text` must be a non-empty string"),
                                           (("decoder", ["a", "b"]), "`text` must be a non-empty string"),
                                           (("decoder", "abc", 0), "`model_max_length` must be a positive integer")])
def test_a_character_tokenizer_names_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        character_tokenizer(*args)
