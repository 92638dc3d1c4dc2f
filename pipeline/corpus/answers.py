"""Answers: LXMERT's normalisation, VQA soft scores, and the answer table (answers.json).

answers.json is LXMERT's `all_ans.json` format, one entry per answer in index order:

    [{"ans": "yes", "dsets": ["gqa", "vgqa", "vqa"]}, {"ans": "no", "dsets": [...]}, ...]

The answer index is the list position. `dsets` lists (sorted) the corpus sources whose training
questions have the answer; LXMERT names VG-QA "visual7w", we name it "vgqa".
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from shards.storage import as_path

# LXMERT's AnswerTable.ANS_CONVERT (src/pretrain/qa_answer_table.py), verbatim. "a man" and
# "the man" can never match after the leading articles are dropped; kept to mirror the original.
ANS_CONVERT = {
    "a man": "man",
    "the man": "man",
    "a woman": "woman",
    "the woman": "woman",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
    "grey": "gray",
}
# VQA's soft score for n of the 10 annotators giving an answer: min(1, 0.3 n), written as the
# exact decimals of the bottom-up-attention / LXMERT preprocessing (0.3 * 3 is 0.8999... in floats).
VQA_SCORES = {1: 0.3, 2: 0.6, 3: 0.9}
FULL_SCORE = 1.0


def normalize_answer(answer: str) -> str:
    """LXMERT's `AnswerTable.convert_ans`: lowercase; drop one trailing '.'; strip; drop a leading
    "a ", then "an ", then "the " (each checked once, in that order); map ANS_CONVERT.

    One difference from the original: surrounding whitespace is always stripped (the original
    strips only after removing a '.'), so "0 " and "0" are one answer.
    """
    answer = answer.lower().removesuffix(".").strip()
    for article in ("a ", "an ", "the "):
        if answer.startswith(article):
            answer = answer[len(article):].strip()
    return ANS_CONVERT.get(answer, answer)


def vqa_scores(annotator_answers: Iterable[str]) -> dict[str, float]:
    """Normalised answer -> VQA soft score, from the annotators' raw answers (VQA v2 has 10).

    Annotators are counted after normalisation ("Two" and "2." are the same answer); n of them
    give 0.3, 0.6, 0.9 for n = 1, 2, 3 and 1.0 for n >= 4. Answers that normalise to "" are left
    out. Keys in order of first appearance.
    """
    counts = Counter(a for a in map(normalize_answer, annotator_answers) if a)
    return {answer: VQA_SCORES.get(n, FULL_SCORE) for answer, n in counts.items()}


class AnswerTable:
    """The pretraining answer vocabulary: answer string <-> index, with the sources using each."""

    def __init__(self, answers: Sequence[str], dsets: Sequence[Sequence[str]] | None = None):
        self.answers: tuple[str, ...] = tuple(answers)
        self.dsets: tuple[tuple[str, ...], ...] = (
            tuple(tuple(d) for d in dsets) if dsets is not None else tuple(() for _ in answers)
        )
        if len(self.dsets) != len(self.answers):
            raise ValueError(f"{len(self.answers)} answers but {len(self.dsets)} dsets entries")
        self._index = {answer: i for i, answer in enumerate(self.answers)}
        if len(self._index) != len(self.answers):
            duplicate = next(a for a, n in Counter(self.answers).items() if n > 1)
            raise ValueError(f"answer {duplicate!r} appears twice in the table")

    normalize = staticmethod(normalize_answer)

    @classmethod
    def from_counts(
        cls,
        counts: Mapping[str, int],
        dsets: Mapping[str, Iterable[str]],
        *,
        max_answers: int,
        min_count: int = 1,
    ) -> AnswerTable:
        """The `max_answers` most frequent answers with count >= min_count, most frequent first;
        equal counts in answer-string order, so the table is a pure function of the counts."""
        ranked = sorted((a for a, n in counts.items() if n >= min_count),
                        key=lambda a: (-counts[a], a))[:max_answers]
        return cls(ranked, [sorted(set(dsets.get(a, ()))) for a in ranked])

    @classmethod
    def load(cls, path: str | Path, dsets: Iterable[str] | None = None) -> AnswerTable:
        """Read answers.json (LXMERT all_ans.json format). With `dsets`, keep only the answers
        used by at least one of those sources, re-indexed (LXMERT's AnswerTable(dsets))."""
        path = as_path(path)
        try:
            entries = json.loads(path.read_bytes())
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: cannot read it as an answer table: {err}") from err
        if not isinstance(entries, list):
            raise ValueError(f"{path}: expected a JSON list of {{'ans', 'dsets'}} entries, found "
                             f"{type(entries).__name__}")
        for i, entry in enumerate(entries):
            if not (isinstance(entry, dict) and isinstance(entry.get("ans"), str)):
                raise ValueError(f"{path}: entry {i} has no string 'ans': {entry!r:.200}")
        if dsets is not None:
            wanted = set(dsets)
            entries = [e for e in entries if wanted & set(e.get("dsets", ()))]
        return cls([e["ans"] for e in entries], [e.get("dsets", []) for e in entries])

    def to_json(self) -> str:
        """answers.json text: one entry per line, so diffs and `head` stay readable."""
        rows = [json.dumps({"ans": a, "dsets": list(d)}, ensure_ascii=False)
                for a, d in zip(self.answers, self.dsets)]
        return "[\n" + ",\n".join(rows) + "\n]\n" if rows else "[]\n"

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    def index(self, answer: str) -> int:
        """Index of a normalised answer; KeyError if it is not in the table."""
        return self._index[answer]

    def get(self, answer: str, default: int | None = None) -> int | None:
        return self._index.get(answer, default)

    def __contains__(self, answer: object) -> bool:
        return answer in self._index

    def __getitem__(self, index: int) -> str:
        return self.answers[index]

    def __len__(self) -> int:
        return len(self.answers)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, AnswerTable) and self.answers == other.answers
                and self.dsets == other.dsets)

    def __repr__(self) -> str:
        return f"AnswerTable({len(self)} answers)"


class AnswerCounter:
    """Counts of normalised answers over training questions, and the sources using each.

    Each question counts each of its answers once, whatever its score (a VQA answer given by one
    annotator counts like the majority one), so the table ranks answers by how many questions
    have them.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.dsets: dict[str, set[str]] = {}

    def add(self, source: str, answers: Mapping[str, float]) -> None:
        for answer in answers:
            self.counts[answer] += 1
            self.dsets.setdefault(answer, set()).add(source)

    def table(self, max_answers: int, min_count: int = 1) -> AnswerTable:
        return AnswerTable.from_counts(self.counts, self.dsets, max_answers=max_answers,
                                       min_count=min_count)
