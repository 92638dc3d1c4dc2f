"""Reading a built corpus directory (its files are documented in pipeline/corpus/build.py): the
one reader of the corpus format, used by pretraining, fine-tuning's held-out split, evaluation
and the tests.

    {split}.jsonl   one image per line, sorted by key: {"image": shard key, "sentences": {source:
                    [str]}, "answers": {source: [{answer: score}, one per sentence]}} (answers
                    only for QA sources)
    answers.json    the answer table (LXMERT's all_ans.json format; pipeline/corpus/answers.py)
    text.txt        text-only passages, one per line; stats.json   counts per split and source

Every problem is a CorpusError naming the file, and the line of a split file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence

from pipeline.corpus.answers import AnswerTable
from pipeline.corpus.config import SOURCES, SPLITS, CorpusError
from pipeline.corpus.pair_table import PairTable, PairTableBuilder
from shards.storage import Location, as_path

ANSWERS_FILE = "answers.json"


def load_stats(corpus_dir: str | os.PathLike) -> dict:
    """stats.json: {"splits": {split: {"images", "sentences", "images_by_source"}}, "answers"}."""
    return json.loads((as_path(corpus_dir) / "stats.json").read_text(encoding="utf-8"))


def split_names(corpus_dir: str | os.PathLike) -> list[str]:
    """The splits this corpus has files for, in SPLITS order."""
    return [s for s in SPLITS if (as_path(corpus_dir) / f"{s}.jsonl").is_file()]


def load_answers(corpus_dir: str | os.PathLike) -> AnswerTable:
    """The answer table of a corpus (an answer's index is its position); `corpus_dir` may also
    name the file itself, e.g. LXMERT's all_ans.json."""
    path = as_path(corpus_dir)
    path = path / ANSWERS_FILE if path.is_dir() else path
    if not path.is_file():
        raise CorpusError(f"{path}: no answer table (`pipeline corpus build` writes it)")
    try:
        return AnswerTable.load(path)
    except ValueError as err:
        message = str(err) if str(path) in str(err) else f"{path}: {err}"
        raise CorpusError(message) from err


def load_split(corpus_dir: str | os.PathLike, split: str) -> Iterator[dict]:
    """The image records of one split, in file (key) order, each checked: a record that is not
    JSON, lacks its image, has a sentence that is not a string, or answers that are not one
    {answer: score} per sentence raises CorpusError naming the file and line."""
    for _, _, record in _numbered_records(as_path(corpus_dir), split):
        yield record


def _numbered_records(corpus_dir: Location, split: str) -> Iterator[tuple[Location, int, dict]]:
    path = corpus_dir / f"{split}.jsonl"
    if not path.is_file():
        present = sorted(p.stem for p in corpus_dir.glob("*.jsonl"))
        raise CorpusError(f"{path}: no such split file (splits in {corpus_dir}: {present})")
    seen: set[str] = set()
    number = 0
    try:
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = _checked_record(line)
                except CorpusError as err:
                    raise CorpusError(f"{path}:{number}: {err}") from err
                if record["image"] in seen:
                    raise CorpusError(f"{path}:{number}: image {record['image']!r} has a second line")
                seen.add(record["image"])
                yield path, number, record
    except UnicodeDecodeError as err:
        raise CorpusError(f"{path}: not UTF-8 after line {number} ({err})") from err


def split_images(corpus_dir: str | os.PathLike, split: str) -> set[str]:
    """The image keys of one split (e.g. LXMERT's held-out "minival")."""
    return {record["image"] for record in load_split(corpus_dir, split)}


def load_text(corpus_dir: str | os.PathLike) -> Iterator[str]:
    """The text-only corpus (text.txt), one passage per item."""
    with (as_path(corpus_dir) / "text.txt").open(encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\n")


def load_pairs(
    corpus_dir: str | os.PathLike,
    splits: Sequence[str],
    sources: Sequence[str] | None = None,
) -> PairTable:
    """Image key -> its pretraining pairs, from `{split}.jsonl` of each split (a PairTable: a
    mapping of the image keys to lists of Pair, held as flat arrays).

    Images in order of first appearance (the files are sorted by key), each image's pairs in split
    order, then in the line's source order, then sentence order. `sources` keeps only those
    sources' sentences (None: all); images left with no pair are omitted. QA answers are mapped to
    their index in answers.json (an answer missing from it is an error). `image_sentences` holds
    every caption-source sentence (CAPTION_SOURCES) of the image in the splits read, whatever
    `sources` keeps (so a sentence drawn from another image can be checked against all of this
    image's captions); one tuple is shared by the pairs of one lookup. An image listed in two
    splits gets the pairs of both.
    """
    corpus_dir = as_path(corpus_dir)
    splits = (splits,) if isinstance(splits, str) else tuple(splits)
    if not splits:
        raise CorpusError(f"{corpus_dir}: no splits given")
    if sources is not None:
        sources = (sources,) if isinstance(sources, str) else tuple(sources)
        unknown = sorted(set(sources) - set(SOURCES))
        if unknown:
            raise CorpusError(f"unknown sources {unknown}; the corpus sources are {list(SOURCES)}")
    answers = _AnswerIndex(corpus_dir)
    table = PairTableBuilder(sources)
    for split in splits:
        for path, number, record in _numbered_records(corpus_dir, split):
            try:
                sentences = _sentences(record, answers)
            except CorpusError as err:
                raise CorpusError(f"{path}:{number}: {err}") from err
            table.add(record["image"], sentences)
    return table.table()


def _checked_record(line: str) -> dict:
    try:
        record = json.loads(line)
    except ValueError as err:
        raise CorpusError(f"not JSON ({err})") from err
    if not isinstance(record, dict) or not isinstance(record.get("image"), str):
        raise CorpusError("expected an object with a string 'image'")
    image = record["image"]
    sentences, qa = record.get("sentences"), record.get("answers", {})
    if not isinstance(sentences, dict) or not isinstance(qa, dict):
        raise CorpusError(f"{image}: 'sentences' and 'answers' must be objects")
    for source in qa:
        if source not in sentences:
            raise CorpusError(f"{image}: answers for {source!r}, which has no sentences")
    for source, texts in sentences.items():
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise CorpusError(f"{image}: sentences[{source!r}] must be a list of strings")
        if source not in qa:
            continue
        scores = qa[source]
        if not isinstance(scores, list) or len(scores) != len(texts):
            raise CorpusError(f"{image}: answers[{source!r}] must be a list, one per sentence")
        for entry in scores:
            if not isinstance(entry, dict):
                raise CorpusError(f"{image}: answers[{source!r}] entries must be {{answer: score}}")
            for answer, score in entry.items():
                if isinstance(score, bool) or not isinstance(score, (int, float)):
                    raise CorpusError(f"{image}: {source} answer {answer!r} has score {score!r}")
    return record


class _AnswerIndex:
    """answer string -> index, read from answers.json when a QA sentence first needs it."""

    def __init__(self, corpus_dir: Location):
        self.corpus_dir = corpus_dir
        self._table: AnswerTable | None = None

    def __getitem__(self, answer: str) -> int:
        if self._table is None:
            self._table = load_answers(self.corpus_dir)
        return self._table.index(answer)


def _sentences(
    record: dict, answers: _AnswerIndex
) -> list[tuple[str, str, dict[int, float] | None]]:
    """(source, sentence, {answer index: score} or None) of a checked record, in record order."""
    image, qa = record["image"], record.get("answers", {})
    out = []
    for source, texts in record["sentences"].items():
        if source not in qa:
            out += [(source, text, None) for text in texts]
            continue
        for text, scores in zip(texts, qa[source]):
            mapped = {}
            for answer, score in scores.items():
                try:
                    mapped[answers[answer]] = float(score)
                except KeyError:
                    where = answers.corpus_dir / ANSWERS_FILE
                    raise CorpusError(
                        f"{image}: {source} answer {answer!r} is not in {where}"
                    ) from None
            out.append((source, text, mapped))
    return out
