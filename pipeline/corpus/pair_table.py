"""The pretraining pairs of a corpus held as a few flat arrays, not one Python object per pair.

LXMERT's corpus is 9.18M pairs over 180K images: as `Pair` objects (a dataclass, its sentence
and, for a question, an answer dict) that is several GB in every process that reads it (the
driver and each training worker). Here every sentence of the splits read is one slice of a
single UTF-8 buffer, with its source, whether the source filter keeps it and its answers (index
and score arrays) beside it; an image's pairs are made when it is looked up (`table[image]`, a
list of `Pair`s equal to what a list of objects would hold).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping

import numpy as np

from pipeline.corpus.config import CAPTION_SOURCES, SOURCES
from pipeline.corpus.pairs import Pair


class PairTableBuilder:
    """Sentences appended image by image (`add`), then `table()`."""

    def __init__(self, sources: tuple[str, ...] | None):
        self.kept_sources = None if sources is None else set(sources)
        self.text = bytearray()
        self.ends = array("q")  # the end of each sentence in `text`
        self.source = array("B")  # index in SOURCES
        self.kept = array("B")
        self.answer_starts = array("q")  # each sentence's first answer; -1: not a question
        self.answer_index, self.answer_score = array("i"), array("d")
        self.chunks: dict[str, list[tuple[int, int]]] = {}  # image -> [start, stop) sentences

    def add(self, image: str, sentences: list[tuple[str, str, dict[int, float] | None]]) -> None:
        start = len(self.ends)
        for source, sentence, answers in sentences:
            self.text += sentence.encode()
            self.ends.append(len(self.text))
            self.source.append(SOURCES.index(source))
            self.kept.append(self.kept_sources is None or source in self.kept_sources)
            self.answer_starts.append(-1 if answers is None else len(self.answer_index))
            if answers is not None:
                self.answer_index.extend(answers)
                self.answer_score.extend(answers.values())
        self.chunks.setdefault(image, []).append((start, len(self.ends)))

    def table(self) -> PairTable:
        return PairTable(self)


class PairTable(Mapping[str, list[Pair]]):
    """Image key -> its pairs (images with no kept pair left out), in the order they were added;
    each image's `image_sentences` are all its caption-source sentences, kept or not."""

    def __init__(self, built: PairTableBuilder):
        self.text = built.text  # the buffer itself: no copy at the peak
        self.ends = np.frombuffer(built.ends, np.int64)
        self.source = np.frombuffer(built.source, np.uint8)
        self.kept = np.frombuffer(built.kept, np.uint8)
        # A question's answers end where the next question's start (the last's at the end).
        starts = np.frombuffer(built.answer_starts, np.int64)
        questions = np.flatnonzero(starts >= 0)
        self.answer_starts = starts
        self.answer_ends = np.full(len(starts), -1, np.int64)
        self.answer_ends[questions] = np.append(starts[questions][1:], len(built.answer_index))
        self.answer_index = np.frombuffer(built.answer_index, np.int32)
        self.answer_score = np.frombuffer(built.answer_score, np.float64)
        self.chunks = {image: tuple(chunks) for image, chunks in built.chunks.items()
                       if any(self.kept[start:stop].any() for start, stop in chunks)}
        self._captions = np.isin(self.source, [SOURCES.index(s) for s in CAPTION_SOURCES])

    def __len__(self) -> int:
        return len(self.chunks)

    def __iter__(self) -> Iterator[str]:
        return iter(self.chunks)

    def __contains__(self, image: object) -> bool:
        return image in self.chunks

    def __getitem__(self, image: str) -> list[Pair]:
        rows = [i for start, stop in self.chunks[image] for i in range(start, stop)]
        sentences = {i: self._sentence(i) for i in rows}  # each decoded once
        shared = tuple(sentences[i] for i in rows if self._captions[i])
        return [Pair(image=image, sentence=sentences[i], source=SOURCES[self.source[i]],
                     answers=self._answers(i), image_sentences=shared)
                for i in rows if self.kept[i]]

    def count(self, image: str) -> int:
        """len(self[image]), without making the pairs (0 for an image not in the table)."""
        return sum(int(self.kept[start:stop].sum()) for start, stop in self.chunks.get(image, ()))

    @property
    def nbytes(self) -> int:
        """The arrays' bytes (the per-image index aside)."""
        return len(self.text) + sum(a.nbytes for a in (
            self.ends, self.source, self.kept, self.answer_starts, self.answer_ends,
            self.answer_index, self.answer_score, self._captions))

    def _sentence(self, i: int) -> str:
        start = int(self.ends[i - 1]) if i else 0
        return self.text[start:int(self.ends[i])].decode()

    def _answers(self, i: int) -> dict[int, float] | None:
        start, end = int(self.answer_starts[i]), int(self.answer_ends[i])
        if start < 0:
            return None
        return dict(zip(self.answer_index[start:end].tolist(),
                        self.answer_score[start:end].tolist()))
