"""`pipeline corpus vocab`: a hand-written corpus's words, counted by hand, as a tokenizer that
reads them back to the same ids, and the held-out split's coverage."""

from __future__ import annotations

import json

import pytest

from pipeline.cli import main
from pipeline.common.text import encode_texts, load_tokenizer
from pipeline.corpus.vocab import SPECIAL_TOKENS, corpus_vocabulary

TRAIN = [
    {"image": "coco-1", "sentences": {"mscoco": ["A red Ball, on sand."],
                                      "vqa": ["Is the ball red?"]},
     "answers": {"vqa": [{"yes": 1.0, "no": 0.3}]}},
    {"image": "coco-2", "sentences": {"vg": ["red star"]}},
]
MINIVAL = [{"image": "coco-3", "sentences": {"mscoco": ["A blue ball on grass."]}}]


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for split, records in (("train", TRAIN), ("minival", MINIVAL)):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_words_are_bert_split_and_counted_most_frequent_first(corpus):
    vocabulary = corpus_vocabulary(corpus)
    # train's words, lower-cased and split at punctuation: red x3, ball x2, "." x1, ...
    assert vocabulary.counts == {"a": 1, "red": 3, "ball": 2, ",": 1, "on": 1, "sand": 1, ".": 1,
                                 "is": 1, "the": 1, "?": 1, "star": 1, "yes": 1, "no": 1}
    assert vocabulary.words[:2] == ("red", "ball")
    assert vocabulary.words[2:] == tuple(sorted(vocabulary.words[2:]))  # ties: alphabetical
    # minival's 6 words: a, ball, on, "." known; blue, grass not
    assert (vocabulary.held_out, vocabulary.held_out_words, vocabulary.held_out_known) == \
        ("minival", 6, 4)


def test_the_cli_writes_a_tokenizer_of_exactly_those_ids(corpus, tmp_path, capsys):
    out = tmp_path / "vocab"
    assert main(["corpus", "vocab", str(corpus), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "13 words" in printed and "minival: 66.67% of its 6 words" in printed
    assert f"--set data.tokenizer={out}" in printed
    lines = (out / "vocab.txt").read_text().splitlines()
    assert tuple(lines[:5]) == SPECIAL_TOKENS and lines[5:7] == ["red", "ball"]
    tokenizer = load_tokenizer(out)
    assert tokenizer.vocab_size == 18 and tokenizer.pad_token_id == 0
    ids = encode_texts(tokenizer, ["The RED ball, on grass!"], 10)["input_ids"][0].tolist()
    assert ids == [2] + [lines.index(w) for w in ("the", "red", "ball", ",", "on")] + [1, 1, 3]


def test_splits_can_be_chosen_and_an_absent_one_is_named(corpus, tmp_path, capsys):
    vocabulary = corpus_vocabulary(corpus, ["minival"])
    assert set(vocabulary.words) == {"a", "blue", "ball", "on", "grass", "."}
    assert vocabulary.held_out == ""  # the held-out split was read: no coverage to give
    assert main(["corpus", "vocab", str(corpus), "--out", str(tmp_path / "v"),
                 "--splits", "train,vgnococo"]) == 2
    err = capsys.readouterr().err
    assert "no split vgnococo" in err and "it has train, minival" in err
    assert not (tmp_path / "v").exists()
    assert main(["corpus", "vocab", str(tmp_path / "nothing"), "--out", str(tmp_path / "v")]) == 2
    assert "nothing: not a corpus (no {split}.jsonl" in capsys.readouterr().err
