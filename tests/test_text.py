"""pipeline.common.text against the bundled BERT vocabulary, read here independently of transformers:
ids are vocab.txt line numbers, words split by greedy longest-match WordPiece."""

import string

import pytest
import torch

from pipeline.common.text import LXMERT_MAX_TEXT_LENGTH, bundled_bert_dir, encode_texts, load_tokenizer


@pytest.fixture(scope="module")
def vocab():
    lines = (bundled_bert_dir() / "vocab.txt").read_text(encoding="utf-8").split("\n")
    return {token: i for i, token in enumerate(lines) if token}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def _wordpiece_ids(text, vocab):
    """BERT uncased on ASCII text: lower case, split at spaces and around punctuation, then each
    word into the longest vocabulary prefixes, continuations written '##piece'."""
    for p in string.punctuation:
        text = text.replace(p, f" {p} ")
    ids = []
    for word in text.lower().split():
        start = 0
        while start < len(word):
            end = len(word)
            while (word[start:end] if start == 0 else "##" + word[start:end]) not in vocab:
                end -= 1
                assert end > start, f"{word!r} has no WordPiece split"
            ids.append(vocab[word[start:end] if start == 0 else "##" + word[start:end]])
            start = end
    return ids


def test_special_tokens_are_bert_uncased(vocab, tokenizer):
    assert len(vocab) == 30522
    assert (vocab["[PAD]"], vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"]) == (0, 101, 102, 103)
    assert tokenizer.pad_token_id == 0 and tokenizer.cls_token_id == 101
    assert tokenizer.sep_token_id == 102 and tokenizer.mask_token_id == 103


def test_known_sentences_get_the_vocabulary_ids(vocab, tokenizer):
    texts = ["Two giraffes watch a Snowboarder, skateboarding past zebras!", "What is it?"]
    expected = [[101, *_wordpiece_ids(t, vocab), 102] for t in texts]
    # The sentence exercises the WordPiece split, not only whole words.
    assert len(expected[0]) > len(texts[0].split()) + 4
    assert expected[0][:4] == [101, vocab["two"], vocab["gi"], vocab["##raf"]]
    batch = encode_texts(tokenizer, texts, max_length=64)
    length = len(expected[0])
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids"}
    assert all(t.dtype == torch.long and t.shape == (2, length) for t in batch.values())
    assert batch["input_ids"][0].tolist() == expected[0]
    short = len(expected[1])
    assert batch["input_ids"][1].tolist() == expected[1] + [0] * (length - short)
    assert batch["attention_mask"].tolist() == [[1] * length, [1] * short + [0] * (length - short)]
    assert batch["token_type_ids"].eq(0).all()


def test_pad_to_max_gives_max_length_columns_and_the_same_tokens(tokenizer):
    texts = ["a dog on a red mat", "what is it?"]
    longest = encode_texts(tokenizer, texts, max_length=16)
    fixed = encode_texts(tokenizer, texts, max_length=16, pad_to_max=True)
    T = longest["input_ids"].shape[1]
    assert T == 8 and all(t.shape == (2, 16) for t in fixed.values())
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(fixed[name][:, :T], longest[name]), name
        assert not fixed[name][:, T:].any(), name  # [PAD] = 0, attention 0, type 0


def test_truncation_keeps_sep_last(vocab, tokenizer):
    long_text = "a man on a horse rides past a red barn " * 4
    ids = _wordpiece_ids(long_text, vocab)
    assert len(ids) + 2 > LXMERT_MAX_TEXT_LENGTH
    batch = encode_texts(tokenizer, [long_text, "a dog"], max_length=LXMERT_MAX_TEXT_LENGTH)
    assert batch["input_ids"].shape == (2, LXMERT_MAX_TEXT_LENGTH)
    assert batch["input_ids"][0].tolist() == [101, *ids[: LXMERT_MAX_TEXT_LENGTH - 2], 102]
    assert batch["attention_mask"][0].eq(1).all()
    assert batch["input_ids"][1, :4].tolist() == [101, vocab["a"], vocab["dog"], 102]
    assert batch["attention_mask"][1].sum() == 4


def test_bad_arguments_are_refused(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="non-empty sequence"):
        encode_texts(tokenizer, "a single string", max_length=8)
    with pytest.raises(ValueError, match="non-empty sequence"):
        encode_texts(tokenizer, [], max_length=8)
    with pytest.raises(ValueError, match=r"room for \[CLS\] and \[SEP\]"):
        encode_texts(tokenizer, ["a"], max_length=1)
    with pytest.raises(FileNotFoundError, match="no BERT checkpoint directory"):
        load_tokenizer(tmp_path / "missing")


def _tokenizers_own(tokenizer, texts, max_length, pad_to_max=False):
    encoded = tokenizer(list(texts), padding="max_length" if pad_to_max else "longest",
                        truncation=True, max_length=max_length, return_tensors="pt",
                        return_attention_mask=True, return_token_type_ids=True)
    return {name: encoded[name].long() for name in ("input_ids", "attention_mask",
                                                     "token_type_ids")}


def test_kept_ids_equal_the_tokenizers_own_batches_every_time(tokenizer, monkeypatch):
    """Each text is tokenized once and its ids kept: the batches of a second epoch, other
    lengths, repeated texts and a store that fills and starts again give the tokenizer's own."""
    import pipeline.common.text as text

    monkeypatch.setattr(text, "KEPT_TEXTS", 6)
    words = "is the red ball left of the small blue cube ? how many stars are there".split()
    texts = [" ".join(words[i % 7: i % 7 + 2 + i % 13]) for i in range(40)]
    for epoch in range(2):
        for start in range(0, 40, 4):
            batch = texts[start: start + 4] + [texts[start]]  # a text twice in a batch
            for max_length, pad in ((20, False), (6, False), (8, True)):
                ours = encode_texts(tokenizer, batch, max_length, pad_to_max=pad)
                theirs = _tokenizers_own(tokenizer, batch, max_length, pad)
                for name in theirs:
                    assert torch.equal(ours[name], theirs[name]), (epoch, start, max_length, name)
            assert len(text._kept[tokenizer]) <= 6
    ours = encode_texts(tokenizer, texts[:10], 20)  # more new texts than the store holds
    assert torch.equal(ours["input_ids"], _tokenizers_own(tokenizer, texts[:10], 20)["input_ids"])
