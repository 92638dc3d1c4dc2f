"""A task's examples joined with their images' features, batched for the trainer.

`task_examples` reads the configured subsets (LXMERT's VQA recipe: with `holdout`, the val
subset keeps only the corpus minival images' questions and the rest of it is trained on). The
streams look samples up by key in FeatureStores (random access: NLVR2 needs two images per row):
- TaskStream (training): each epoch a permutation drawn from (seed, epoch); rank r takes every
  world-th example from position r; every rank runs floor(examples / (world x batch)) steps, so
  ranks stay in step (the last partial batch is dropped, as LXMERT's loader does).
- EvalStream (validation, prediction): every example once, in file order, rank-strided.
Rows are (Example, samples) with samples a tuple of one Sample (VQA, GQA) or two (NLVR2).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

import numpy as np

from pipeline.finetune.config import TaskDataConfig
from pipeline.finetune.examples import Example, TaskDataError, read_gqa, read_nlvr2, read_vqa
from pipeline.finetune.refcoco import read_ref_examples
from pipeline.finetune.retrieval import KARPATHY_FILE, read_caption_examples
from pipeline.finetune.vcr import read_vcr_examples
from shards.schema import Sample
from shards.store import FeatureStore
from shards.storage import as_path

Row = tuple[Example, tuple[Sample, ...]]


def subset_examples(task: str, root: Path, subset: str, *, labelled: bool = False) -> list:
    """One subset's examples from the released files under `root` (Example for VQA, GQA and
    NLVR2; the other tasks' own kinds: vcr.ChoiceExample, refcoco.RefExample,
    retrieval.CaptionExample). labelled: the subset must have its answers (training and
    validation): VQA's annotations file is then required, where a test subset has none."""
    if task == "vqa":
        questions = root / f"v2_OpenEnded_mscoco_{subset}_questions.json"
        annotations = root / f"v2_mscoco_{subset}_annotations.json"
        if labelled and questions.exists() and not annotations.exists():
            raise TaskDataError(f"{annotations}: file not found (VQA annotations: training and "
                                f"validation on {subset} need its answers)")
        return read_vqa(questions, annotations if annotations.exists() else None)
    if task == "gqa":
        return read_gqa(root / f"{subset}_balanced_questions.json")
    if task == "nlvr2":
        return read_nlvr2(root / f"{subset}.json")
    if task == "vcr":
        return read_vcr_examples(root / f"{subset}.jsonl")
    if task == "refcoco+":
        return read_ref_examples(root, subset)
    if task == "flickr30k":
        return read_caption_examples(root / KARPATHY_FILE, subset)
    raise ValueError(f"unknown task {task!r}")


def holdout_images(corpus: Path) -> set[str]:
    """The image keys of a corpus's minival split (LXMERT's held-out images)."""
    from pipeline.corpus.read import split_images

    try:
        return split_images(corpus, "minival")
    except FileNotFoundError as err:
        raise TaskDataError(f"{err} (data.holdout must be a `pipeline corpus build` directory)") \
            from err


def fraction_of(examples: list[Example], fraction: float) -> list[Example]:
    """The first round(fraction * n) examples of one fixed permutation, in their order: the same
    subset every time, and a smaller fraction's examples among every larger one's."""
    order = np.random.default_rng(0).permutation(len(examples))
    kept = np.sort(order[:round(fraction * len(examples))])
    return [examples[i] for i in kept]


def task_examples(task: str, data: TaskDataConfig) -> tuple[list[Example], list[Example]]:
    """(training examples, validation examples) of the config."""
    root = as_path(data.root)
    train = [e for subset in data.train
             for e in subset_examples(task, root, subset, labelled=True)]
    val = subset_examples(task, root, data.val, labelled=True)
    if data.holdout:
        held = holdout_images(as_path(data.holdout))
        train = [e for e in train if not set(e.images) & held]
        if data.val not in data.train:  # LXMERT's nominival: the val subset outside minival
            train += [e for e in val if not set(e.images) & held]
        val = [e for e in val if set(e.images) <= held]
    if data.train_fraction < 1:
        train = fraction_of(train, data.train_fraction)
    if not train or not val:
        raise TaskDataError(
            f"{root}: {len(train)} training and {len(val)} validation examples for {task} "
            f"(train {list(data.train)}, val {data.val!r}, holdout {data.holdout or 'none'})"
        )
    return train, val


class Features:
    """Samples by key over several shard directories, validated as pretraining's are (a corrupt
    sample raises SchemaError naming its shard and key: FeatureStore). The most recently used
    samples stay decoded in memory up to `cache_bytes` of arrays (least recently used dropped
    first)."""

    def __init__(self, stores: list[FeatureStore], cache_bytes: int = 0) -> None:
        self.stores, self.cache_bytes = stores, cache_bytes
        self._cache: OrderedDict[str, Sample] = OrderedDict()
        self._cached_bytes = 0

    @classmethod
    def open(cls, directories: Sequence[str], cache_mb: int = 0) -> Features:
        if not directories:
            raise TaskDataError("data.shards is empty: name the feature shard directories")
        return cls([FeatureStore(d) for d in directories], cache_mb * 2**20)

    def __contains__(self, key: str) -> bool:
        return any(key in store for store in self.stores)

    def __getitem__(self, key: str) -> Sample:
        sample = self._cache.get(key)
        if sample is not None:
            self._cache.move_to_end(key)
            return sample
        sample = self._read(key)
        size = _nbytes(sample)
        if size <= self.cache_bytes:
            self._cache[key] = sample
            self._cached_bytes += size
            while self._cached_bytes > self.cache_bytes:
                _, dropped = self._cache.popitem(last=False)
                self._cached_bytes -= _nbytes(dropped)
        return sample

    def _read(self, key: str) -> Sample:
        for store in self.stores:
            if key in store:
                return store[key]
        raise KeyError(key)

    def keep_present(self, examples: list[Example], what: str) -> list[Example]:
        """The examples whose images are all in the shards; an error when none is."""
        kept = [e for e in examples if all(key in self for key in e.images)]
        if not kept:
            missing = examples[0].images if examples else ()
            dirs = ", ".join(str(s.directory) for s in self.stores)
            raise TaskDataError(
                f"none of the {len(examples)} {what} examples has its images in {dirs} "
                f"(first wants {list(missing)})"
            )
        return kept


def _nbytes(sample: Sample) -> int:
    return sum(a.nbytes for a in sample.arrays.values())


class TaskStream:
    """Training batches; see the module docstring."""

    def __init__(self, examples: list[Example], features: Features, *, batch_size: int,
                 rank: int, world_size: int, seed: int) -> None:
        self.examples, self.features = examples, features
        self.batch_size, self.rank, self.world, self.seed = batch_size, rank, world_size, seed

    def steps_in_epoch(self, epoch: int) -> int:
        return len(self.examples) // (self.world * self.batch_size)

    def batches(self, epoch: int, start_step: int = 0,
                keep: Collection[int] | None = None) -> Iterator[list[Row]]:
        """Steps start_step.. of `epoch` (only those in `keep`, when given: a data worker's)."""
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))
        mine = order[self.rank :: self.world]
        for step in range(start_step, self.steps_in_epoch(epoch)):
            if keep is not None and step not in keep:
                continue
            chosen = mine[step * self.batch_size : (step + 1) * self.batch_size]
            yield [self._row(self.examples[i]) for i in chosen]

    def _row(self, example: Example) -> Row:
        return example, tuple(self.features[key] for key in example.images)


class EvalStream(TaskStream):
    """Every example once, in order; rank r takes examples r, r + world, ..."""

    def __init__(self, examples: list[Example], features: Features, *, batch_size: int,
                 rank: int = 0, world_size: int = 1) -> None:
        super().__init__(examples, features, batch_size=batch_size, rank=rank,
                         world_size=world_size, seed=0)

    def batches(self, epoch: int = 0, start_step: int = 0) -> Iterator[list[Row]]:
        mine = self.examples[self.rank :: self.world]
        for start in range(0, len(mine), self.batch_size):
            yield [self._row(e) for e in mine[start : start + self.batch_size]]
