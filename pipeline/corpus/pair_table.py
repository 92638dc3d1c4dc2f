"""The pretraining pairs of a corpus held as a few flat arrays, not one Python object per pair.

LXMERT's corpus is 9.18M pairs over 180K images: as `Pair` objects (a dataclass, its sentence
and, for a question, an answer dict) that is several GB in every process that reads it (the
driver and each training worker). Here every sentence of the splits read is one slice of a
single UTF-8 buffer, with its source, one byte of flags (kept by the source filter, a caption, a
question) and its answers beside it: a question's answers are a slice of one index array and one
array of score codes (a corpus has few distinct scores: VQA's are 0.3, 0.6, 0.9 and 1), 2 bytes
an answer instead of a float's 8. The arrays are appended in their final types, so reading holds
no second copy. An image's pairs are made when it is looked up (`table[image]`, a list of `Pair`s
equal to what a list of objects would hold).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping

import numpy as np

from pipeline.corpus.config import CAPTION_SOURCES, SOURCES, CorpusError
from pipeline.corpus.pairs import Pair

KEPT, CAPTION, QUESTION = 1, 2, 4  # a sentence's flags
MAX_SCORES = 1 << 16  # distinct answer scores (uint16 codes)


class _ScoreCodes(dict[float, int]):
    """score -> its code, a new score taking the next one."""

    def __missing__(self, score: float) -> int:
        if len(self) == MAX_SCORES:
            raise CorpusError(f"more than {MAX_SCORES:,} distinct answer scores")
        self[score] = len(self)
        return self[score]


class PairTableBuilder:
    """Sentences appended image by image (`add`), then `table()`."""

    def __init__(self, sources: tuple[str, ...] | None):
        # source -> (its index in SOURCES, its sentences' flags but QUESTION)
        self.of_source = {source: (i, (sources is None or source in sources) * KEPT
                                   | (source in CAPTION_SOURCES) * CAPTION)
                          for i, source in enumerate(SOURCES)}
        self.text = bytearray()
        self.ends = array("q")  # the end of each sentence in `text`
        self.source = array("B")  # index in SOURCES
        self.flags = array("B")
        self.answer_bounds = array("q", [0])  # sentence i's answers: [bounds[i], bounds[i + 1])
        self.answer_index, self.answer_code = array("i"), array("H")
        self.codes = _ScoreCodes()
        self.chunks: dict[str, list[tuple[int, int]]] = {}  # image -> [start, stop) sentences

    def add(self, image: str, sentences: list[tuple[str, str, dict[int, float] | None]]) -> None:
        start, codes = len(self.ends), self.codes
        for source, sentence, answers in sentences:
            self.text += sentence.encode()
            self.ends.append(len(self.text))
            index, flags = self.of_source[source]
            self.source.append(index)
            if answers is None:
                self.flags.append(flags)
            else:
                self.flags.append(flags | QUESTION)
                self.answer_index.extend(answers)
                self.answer_code.extend(map(codes.__getitem__, answers.values()))
            self.answer_bounds.append(len(self.answer_index))
        self.chunks.setdefault(image, []).append((start, len(self.ends)))

    def table(self) -> PairTable:
        return PairTable(self)


class PairTable(Mapping[str, list[Pair]]):
    """Image key -> its pairs (images with no kept pair left out), in the order they were added;
    each image's `image_sentences` are all its caption-source sentences, kept or not."""

    def __init__(self, built: PairTableBuilder):
        # The builder's buffers themselves, not copies.
        self.text = built.text
        self.ends = np.frombuffer(built.ends, np.int64)
        self.source = np.frombuffer(built.source, np.uint8)
        self.flags = np.frombuffer(built.flags, np.uint8)
        self.answer_bounds = np.frombuffer(built.answer_bounds, np.int64)
        self.answer_index = np.frombuffer(built.answer_index, np.int32)
        self.answer_code = np.frombuffer(built.answer_code, np.uint16)
        self.scores = np.array(list(built.codes), np.float64)  # code -> score
        self.chunks = {image: tuple(chunks) for image, chunks in built.chunks.items()
                       if any(self._kept(start, stop) for start, stop in chunks)}

    def __len__(self) -> int:
        return len(self.chunks)

    def __iter__(self) -> Iterator[str]:
        return iter(self.chunks)

    def __contains__(self, image: object) -> bool:
        return image in self.chunks

    def __getitem__(self, image: str) -> list[Pair]:
        rows = [i for start, stop in self.chunks[image] for i in range(start, stop)]
        flags = {i: int(self.flags[i]) for i in rows}
        sentences = {i: self._sentence(i) for i in rows}  # each decoded once
        shared = tuple(sentences[i] for i in rows if flags[i] & CAPTION)
        return [Pair(image=image, sentence=sentences[i], source=SOURCES[self.source[i]],
                     answers=self._answers(i) if flags[i] & QUESTION else None,
                     image_sentences=shared)
                for i in rows if flags[i] & KEPT]

    def count(self, image: str) -> int:
        """len(self[image]), without making the pairs (0 for an image not in the table)."""
        return sum(self._kept(start, stop) for start, stop in self.chunks.get(image, ()))

    def _kept(self, start: int, stop: int) -> int:
        return int(np.count_nonzero(self.flags[start:stop] & KEPT))

    @property
    def nbytes(self) -> int:
        """The arrays' bytes (the per-image index aside)."""
        return len(self.text) + sum(a.nbytes for a in (
            self.ends, self.source, self.flags, self.answer_bounds, self.answer_index,
            self.answer_code, self.scores))

    def _sentence(self, i: int) -> str:
        start = int(self.ends[i - 1]) if i else 0
        return self.text[start:int(self.ends[i])].decode()

    def _answers(self, i: int) -> dict[int, float]:
        start, end = int(self.answer_bounds[i]), int(self.answer_bounds[i + 1])
        return dict(zip(self.answer_index[start:end].tolist(),
                        self.scores[self.answer_code[start:end]].tolist()))
