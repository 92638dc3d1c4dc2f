"""Dependency parses of the Flickr30K Entities captions: read from CoNLL-U (our world's gold
parses.conllu) or made by a spaCy pipeline, and aligned onto the Entities words.

CoNLL-U (universaldependencies.org/format.html): blocks separated by a blank line, comments
`# key = value` before the words (`# sent_id = {image id}_{caption index}` names a block), then
one word a line in 10 tab-separated columns ID FORM LEMMA UPOS XPOS FEATS HEAD DEPREL DEPS MISC,
ID counting from 1 and HEAD 0 for the root. Multiword-token lines (ID `1-2`) and empty nodes
(ID `1.1`) are not words of the tree and are skipped.

A `Parse` is 0-based: heads[i] is the index of word i's head, -1 for the root. A malformed block
is a `ConlluError` ("{path}:{line}: ..."), appended to the `problems` list a caller passes and
skipped, so that it can be reported; without a list it raises.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# words -> (head index or -1 for the root, deprel) per word: a parser of pre-tokenised text.
WordParser = Callable[[Sequence[str]], Sequence[tuple[int, str]]]

SPACY_HINT = "pip install spacy && python -m spacy download en_core_web_sm"
_COMMENT = re.compile(r"#\s*([^=\s]+)\s*=\s*(.*)")


class ConlluError(ValueError):
    """A CoNLL-U file that is missing, or one malformed block of it; the message starts with the
    path and the block's first line."""


class ParserUnavailable(RuntimeError):
    """spaCy or its model is not installed; the message says how to install them."""


@dataclass(frozen=True)
class Parse:
    """A dependency tree over words: heads 0-based (-1 for the root), one deprel per word."""

    words: tuple[str, ...]
    heads: tuple[int, ...]
    deprels: tuple[str, ...]

    def __post_init__(self):
        n = len(self.words)
        if len(self.heads) != n or len(self.deprels) != n:
            raise ValueError(f"{n} words, {len(self.heads)} heads, {len(self.deprels)} deprels")
        bad = [h for i, h in enumerate(self.heads) if not -1 <= h < n or h == i]
        if bad:
            raise ValueError(f"heads out of range or pointing at themselves: {bad}")


def read_conllu(path: Path, problems: list[ConlluError] | None = None) -> dict[str, Parse]:
    """sent_id -> Parse of every well-formed block. A malformed block (no sent_id, a repeated
    sent_id, a row without 10 columns, non-consecutive IDs, a bad HEAD) is a ConlluError,
    appended to `problems` and left out when a list is given, raised otherwise."""
    if not path.is_file():
        raise ConlluError(f"{path}: file not found")
    parses: dict[str, Parse] = {}
    block: list[tuple[int, str]] = []
    for number, line in enumerate([*path.read_text(encoding="utf-8").splitlines(), ""], 1):
        if line.strip():
            block.append((number, line))
            continue
        if block:
            try:
                sent_id, parse = _block(path, block)
                if sent_id in parses:
                    raise ConlluError(f"{path}:{block[0][0]}: sent_id {sent_id} repeats an "
                                      f"earlier block")
                parses[sent_id] = parse
            except ConlluError as err:
                if problems is None:
                    raise
                problems.append(err)
            block = []
    return parses


def _block(path: Path, lines: list[tuple[int, str]]) -> tuple[str, Parse]:
    """One block's sent_id and Parse; ConlluError at the line that is wrong."""
    comments = dict(m.groups() for _, line in lines if line.startswith("#")
                    if (m := _COMMENT.fullmatch(line.strip())))
    sent_id = comments.get("sent_id", "").strip()
    if not sent_id:
        raise ConlluError(f"{path}:{lines[0][0]}: block without a # sent_id")
    rows = []
    for number, line in lines:
        if line.startswith("#"):
            continue
        columns = line.split("\t")
        where = f"{path}:{number}: sent_id {sent_id}"
        if len(columns) != 10:
            raise ConlluError(f"{where}: {len(columns)} columns, CoNLL-U has 10")
        if "-" in columns[0] or "." in columns[0]:  # multiword token, empty node
            continue
        if columns[0] != str(len(rows) + 1):
            raise ConlluError(f"{where}: ID {columns[0]!r}, expected {len(rows) + 1}")
        if not columns[6].isdigit():
            raise ConlluError(f"{where}: HEAD {columns[6]!r} is not a word index")
        rows.append((number, columns))
    if not rows:
        raise ConlluError(f"{path}:{lines[0][0]}: sent_id {sent_id}: no words")
    for number, columns in rows:
        if int(columns[6]) > len(rows) or columns[6] == columns[0]:
            raise ConlluError(f"{path}:{number}: sent_id {sent_id}: HEAD {columns[6]} is not "
                              f"another word of the sentence")
    return sent_id, Parse(tuple(c[1] for _, c in rows), tuple(int(c[6]) - 1 for _, c in rows),
                          tuple(c[7] for _, c in rows))


def align(parse: Parse, words: Sequence[str]) -> Parse | None:
    """The parse over the Entities words when its forms are the same words (case-insensitively,
    one for one); None when the tokenisations differ."""
    if len(parse.words) != len(words) or any(
            a.lower() != b.lower() for a, b in zip(parse.words, words)):
        return None
    return Parse(tuple(words), parse.heads, parse.deprels)


def run_parser(parse_words: WordParser, words: Sequence[str]) -> Parse:
    """Parse pre-tokenised words with a WordParser (e.g. load_spacy's); ValueError when it
    returns another number of words or heads outside the sentence."""
    out = list(parse_words(list(words)))
    if len(out) != len(words):
        raise ValueError(f"the parser returned {len(out)} words for {len(words)}: {list(words)}")
    return Parse(tuple(words), tuple(h for h, _ in out), tuple(d for _, d in out))


def load_spacy(model_name: str = "en_core_web_sm") -> WordParser:
    """A WordParser running the spaCy pipeline `model_name` on the given words as they are
    (no re-tokenisation). deprels as the model labels them (ClearNLP style for English), its
    "ROOT" written "root" as in UD. ParserUnavailable when spaCy or the model is missing."""
    try:
        import spacy
        from spacy.tokens import Doc
    except ImportError as err:
        raise ParserUnavailable(f"spaCy is not installed: {SPACY_HINT}") from err
    try:
        nlp = spacy.load(model_name)
    except OSError as err:
        raise ParserUnavailable(f"spaCy model {model_name!r} is not installed: {SPACY_HINT} "
                                f"(or download {model_name})") from err

    def parse_words(words: Sequence[str]) -> list[tuple[int, str]]:
        doc = Doc(nlp.vocab, words=list(words))
        for _, proc in nlp.pipeline:
            doc = proc(doc)
        return [(-1 if t.head.i == t.i else t.head.i, "root" if t.dep_ == "ROOT" else t.dep_)
                for t in doc]

    return parse_words
