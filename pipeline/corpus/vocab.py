"""A corpus's own vocabulary: every word of its sentences and answers, as a BERT tokenizer
directory (`data.tokenizer` of pretraining and fine-tuning).

The words are split as BERT's uncased tokenizer splits them (its normaliser and pre-tokenizer:
lower case, punctuation apart), so the vocabulary's tokenizer reads the same words as BERT's
and gives each one id; a word it has not seen becomes [UNK]. On the demo's corpus this is 122
words instead of BERT's 30,522: the tiny models' output layer then scores the words the text
can hold (docs/results.md, "Cross-modal influence").
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformers import BertTokenizerFast

from pipeline.common.text import load_tokenizer
from pipeline.corpus.config import CorpusError
from pipeline.corpus.read import load_split, split_names

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # [PAD] = 0, as every model reads


@dataclass(frozen=True)
class Vocabulary:
    """The words of the splits read, most frequent first (ties in alphabetical order), with
    their counts, and the share of the held-out split's words they cover."""

    words: tuple[str, ...]
    counts: dict[str, int]
    held_out: str
    held_out_words: int
    held_out_known: int

    @property
    def coverage(self) -> float:
        """The share of the held-out split's words in the vocabulary (1.0 if it has none)."""
        return self.held_out_known / self.held_out_words if self.held_out_words else 1.0


def record_texts(record: dict) -> Iterable[str]:
    """A corpus record's sentences of every source, then its answers."""
    for texts in record["sentences"].values():
        yield from texts
    for answers in record.get("answers", {}).values():
        for scores in answers:
            yield from scores


def corpus_vocabulary(corpus_dir: str | os.PathLike, splits: Sequence[str] | None = None,
                      held_out: str = "minival") -> Vocabulary:
    """The vocabulary of `splits` (None: every split but `held_out`) of a built corpus."""
    present = split_names(corpus_dir)
    if not present:
        raise CorpusError(f"{corpus_dir}: not a corpus (no {{split}}.jsonl; `pipeline corpus "
                          "build` writes them)")
    if splits is None:
        splits = [split for split in present if split != held_out]
    missing = [split for split in splits if split not in present]
    if missing or not splits:
        raise CorpusError(f"{corpus_dir}: no split {', '.join(missing) or '(none given)'}; "
                          f"it has {', '.join(present)}")
    words = _splitter()
    counts = Counter(word for split in splits for record in load_split(corpus_dir, split)
                     for text in record_texts(record) for word in words(text))
    seen = ([word for record in load_split(corpus_dir, held_out)
             for text in record_texts(record) for word in words(text)]
            if held_out in present and held_out not in splits else [])
    ordered = tuple(sorted(counts, key=lambda word: (-counts[word], word)))
    return Vocabulary(ordered, dict(counts), held_out if seen else "", len(seen),
                      sum(word in counts for word in seen))


def write_tokenizer(vocabulary: Vocabulary, out: str | os.PathLike) -> BertTokenizerFast:
    """`out` as a BERT tokenizer directory (vocab.txt, tokenizer.json, their configs) of the
    special tokens then the vocabulary's words; the tokenizer loaded back from it."""
    tokens = SPECIAL_TOKENS + vocabulary.words
    BertTokenizerFast(vocab={token: i for i, token in enumerate(tokens)},
                      do_lower_case=True).save_pretrained(str(out))
    (Path(out) / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return load_tokenizer(out)


def _splitter():
    """text -> its words as BERT's uncased tokenizer splits them before WordPiece."""
    backend = load_tokenizer().backend_tokenizer
    normalizer, pre_tokenizer = backend.normalizer, backend.pre_tokenizer

    def words(text: str) -> list[str]:
        return [word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]

    return words
