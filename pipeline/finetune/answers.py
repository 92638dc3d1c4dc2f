"""The answer vocabularies of VQA and GQA, their training targets, and the transfer of LXMERT's
pretrained QA head onto a task's answers.

A vocabulary file is JSON `{"answers": [answer, ...]}`, an answer's index its position. `load`
also reads LXMERT's released `trainval_label2ans.json`, the same list without the dict around it.

Reference: bottom-up-attention-vqa's tools/compute_softscore.py (`get_score`, `filter_answers`,
`create_ans2label`, `compute_target`), and LXMERT's `load_lxmert_qa`
(src/pretrain/qa_answer_table.py).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.corpus.answers import FULL_SCORE, VQA_SCORES, normalize_answer
from pipeline.finetune.examples import Example, ExamplesError
from shards.storage import as_path

VQA_MIN_COUNT = 9  # compute_softscore.py's min_occurence: 3129 answers on train2014 + val2014


def soft_score(count: int) -> float:
    """VQA's target for an answer `count` of the ten annotators gave: 0, 0.3, 0.6, 0.9 for
    0..3, 1.0 from 4 (get_score), as exact decimals."""
    if count < 0:
        raise ValueError(f"an answer count cannot be negative, got {count}")
    return 0.0 if count == 0 else VQA_SCORES.get(count, FULL_SCORE)


@dataclass(frozen=True)
class AnswerVocab:
    """A task's answers; an answer's index (the classifier's output row) is its position."""

    answers: tuple[str, ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index = {answer: i for i, answer in enumerate(self.answers)}
        if len(index) != len(self.answers):
            repeated = sorted(a for a, n in Counter(self.answers).items() if n > 1)
            raise ValueError(f"answers listed twice in the vocabulary: {repeated[:5]}")
        object.__setattr__(self, "_index", index)

    def index(self, answer: str) -> int:
        """The answer's position; KeyError if it is not in the vocabulary."""
        return self._index[answer]

    def __contains__(self, answer: object) -> bool:
        return answer in self._index

    def __len__(self) -> int:
        return len(self.answers)

    def to_json(self) -> str:
        """`{"answers": [...]}`, one answer per line so diffs stay readable."""
        rows = ",\n".join("  " + json.dumps(a, ensure_ascii=False) for a in self.answers)
        return '{"answers": [\n' + rows + "\n]}\n" if rows else '{"answers": []}\n'

    def save(self, path: Path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> AnswerVocab:
        """Read our `{"answers": [...]}` or LXMERT's plain list (trainval_label2ans.json)."""
        path = as_path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as err:
            raise ExamplesError(f"{path}: file not found (answer vocabulary)") from err
        except (OSError, ValueError) as err:
            raise ExamplesError(f"{path}: cannot read it as JSON (answer vocabulary): {err}") \
                from err
        answers = data.get("answers") if isinstance(data, dict) else data
        if not (isinstance(answers, list) and all(isinstance(a, str) for a in answers)):
            raise ExamplesError(f'{path}: expected {{"answers": [str, ...]}} or a JSON list of '
                                f"answers (LXMERT's trainval_label2ans.json)")
        try:
            return cls(tuple(answers))
        except ValueError as err:
            raise ExamplesError(f"{path}: {err}") from err


def _ranked(counts: Mapping[str, int], min_count: int) -> AnswerVocab:
    # compute_softscore.py orders the table by iterating a Python 2 dict (hash order, which no
    # one can reproduce); most frequent first, ties by text, makes it a function of the counts.
    kept = [a for a, n in counts.items() if n >= min_count]
    return AnswerVocab(tuple(sorted(kept, key=lambda a: (-counts[a], a))))


def _labelled(examples: Iterable[Example], task: str) -> Iterable[Example]:
    for example in examples:
        if example.task != task or example.top_answer is None:
            raise ValueError(f"{task} answer vocabulary: example {example.id} is not a labelled "
                             f"{task} example (task {example.task!r}; a test file?)")
        yield example


def build_vqa_vocab(examples: Iterable[Example], min_count: int = VQA_MIN_COUNT) -> AnswerVocab:
    """compute_softscore.py's `filter_answers`: the processed `multiple_choice_answer`s (each
    example's `top_answer`) that at least `min_count` distinct questions have. The official table
    counts train2014 + val2014. Order: most questions first, ties by answer text."""
    questions: dict[str, set[str]] = {}
    for example in _labelled(examples, "vqa"):
        questions.setdefault(example.top_answer, set()).add(example.id)
    return _ranked({a: len(ids) for a, ids in questions.items()}, min_count)


def build_gqa_vocab(examples: Iterable[Example]) -> AnswerVocab:
    """Every answer of the given GQA examples (LXMERT's table: train + val balanced, 1842
    answers). Order: most questions first, ties by answer text."""
    counts = Counter(example.top_answer for example in _labelled(examples, "gqa"))
    return _ranked(counts, 1)


def targets(example: Example, vocab: AnswerVocab) -> dict[int, float]:
    """Vocabulary index -> target score of a labelled VQA or GQA example, as compute_target
    gives them: VQA: `soft_score` of each answer's annotator count; GQA: 1.0 for its answer.
    Answers outside the vocabulary are dropped, so the dict may be empty. Order: the example's."""
    if example.answers is None or example.task not in ("vqa", "gqa"):
        raise ValueError(f"example {example.id} ({example.task}) has no answers to score")
    if example.task == "gqa":
        return {vocab.index(a): 1.0 for a in example.answers if a in vocab}
    return {vocab.index(a): soft_score(n) for a, n in example.answers.items() if a in vocab}


def lxmert_head_rows(
    task_vocab: AnswerVocab, pretrain_answers: Sequence[str]
) -> tuple[list[int], list[int]]:
    """Rows of LXMERT's pretrained QA classifier to copy into a task's classifier.

    pretrain_answers: the pretraining answer table in index order (answers.json / LXMERT's
    all_ans.json "ans" strings; `pipeline.corpus.read.load_answers`). As `load_lxmert_qa` does,
    each task answer goes through LXMERT's own normalisation (`AnswerTable.convert_ans`:
    "the dog" -> "dog", "grey" -> "gray"; there is no GQA-specific alias table) and is looked up
    in the whole table (not filtered by dataset). Returns (task_rows, pretrain_rows), aligned,
    task rows ascending: `new.weight[task_rows] = old.weight[pretrain_rows]`, likewise the bias.
    The official code sets every other task row's weight and bias to zero. Lists, not tuples,
    because a tuple indexes a tensor's dimensions.
    """
    pretrain_index = {answer: i for i, answer in enumerate(pretrain_answers)}
    task_rows, pretrain_rows = [], []
    for row, answer in enumerate(task_vocab.answers):
        source = pretrain_index.get(normalize_answer(answer))
        if source is not None:
            task_rows.append(row)
            pretrain_rows.append(source)
    return task_rows, pretrain_rows
