"""`pipeline corpus build` configuration: where the official annotation files are, which sources
to take, how to hold out minival, how large the answer table is.

Every file path is optional: a source whose files are unset (null) is skipped, with a note. A path
that is set must exist, or the build stops and names it. Relative paths are read against `root`
(itself relative to the working directory); `--root DIR` on the command line replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.common.config import ConfigError



class CorpusError(ValueError):
    """A corpus input (an annotation file, or a built corpus directory) that is missing or not in
    the expected format; the message names the file (and the entry or line)."""


Source = Literal["mscoco", "vg", "vqa", "gqa", "vgqa", "cc3m"]
SOURCES: tuple[str, ...] = ("mscoco", "vg", "vqa", "gqa", "vgqa", "cc3m")
QA_SOURCES = ("vqa", "gqa", "vgqa")
CAPTION_SOURCES = ("mscoco", "vg", "cc3m")
SPLITS = ("train", "nominival", "minival", "vgnococo", "cc3m")
# Splits whose questions build the answer table and whose captions make the default text.txt.
TRAINING_SPLITS = ("train", "nominival", "vgnococo", "cc3m")


@dataclass(frozen=True)
class CocoFiles:
    """COCO 2014 captions: captions_train2014.json and captions_val2014.json. Their `images`
    lists also say which COCO images are train2014 and which val2014 (needed to place Visual
    Genome and GQA text of COCO images), so they are read even when "mscoco" is not a source.

    captions_train: captions_train2014.json (null: none).
    captions_val: captions_val2014.json (null: none); its images are split into minival and
        nominival.
    """

    captions_train: str | None = None
    captions_val: str | None = None


@dataclass(frozen=True)
class VqaFiles:
    """VQA v2: v2_OpenEnded_mscoco_{train,val}2014_questions.json and
    v2_mscoco_{train,val}2014_annotations.json (each subset: both files or neither). A subset's
    questions also say which COCO images it holds, so they are read even when "vqa" is not a
    source.

    questions_train / annotations_train: v2_OpenEnded_mscoco_train2014_questions.json and
        v2_mscoco_train2014_annotations.json (null: no train2014 questions).
    questions_val / annotations_val: v2_OpenEnded_mscoco_val2014_questions.json and
        v2_mscoco_val2014_annotations.json (null: no val2014 questions).
    """

    questions_train: str | None = None
    annotations_train: str | None = None
    questions_val: str | None = None
    annotations_val: str | None = None


@dataclass(frozen=True)
class VgFiles:
    """Visual Genome's annotation files.

    image_data: image_data.json, the coco_id of each Visual Genome image (needed by the sources
        vg, vgqa and gqa).
    region_descriptions: region_descriptions.json, the text of source "vg".
    question_answers: question_answers.json, the questions of source "vgqa".
    """

    image_data: str | None = None
    region_descriptions: str | None = None
    question_answers: str | None = None


@dataclass(frozen=True)
class GqaFiles:
    """GQA balanced questions.

    questions: the question files, such as [train_balanced_questions.json,
        val_balanced_questions.json]; the image, not the file, decides a question's corpus split.
    """

    questions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cc3mFiles:
    """CC3M as img2dataset writes it.

    shards: the folder holding {shard:05d}.tar (+ .parquet); only successful downloads'
        captions are taken (null: none).
    """

    shards: str | None = None


@dataclass(frozen=True)
class CorpusConfig:
    """What `pipeline corpus build` reads and how it splits it.

    root: folder the relative paths below are read against.
    coco, vqa, vg, gqa, cc3m: the annotation files (see each section).
    sources: the corpus sources to write (mscoco, vg, vqa, gqa, vgqa, cc3m).
    minival_images: COCO val2014 images held out as "minival": the first N by COCO id (all of
        them, with a note, if val2014 has fewer).
    minival_ids: the minival images as a text file instead (minival_images is then unused): one
        COCO id per line (blank lines and lines starting with '#' ignored), e.g. LXMERT's own
        minival list; every id must be a val2014 image.
    max_answers, min_answer_count: the answer table keeps the max_answers most frequent answers
        of the training questions seen at least min_answer_count times (LXMERT: 9500).
    text_files: plain-text files for VL-BERT's text-only corpus (text.txt), one passage per line;
        empty: the caption sentences of the training splits.
    """

    root: str = "."
    coco: CocoFiles = field(default_factory=CocoFiles)
    vqa: VqaFiles = field(default_factory=VqaFiles)
    vg: VgFiles = field(default_factory=VgFiles)
    gqa: GqaFiles = field(default_factory=GqaFiles)
    cc3m: Cc3mFiles = field(default_factory=Cc3mFiles)
    sources: tuple[Source, ...] = ("mscoco", "vg", "vqa", "gqa", "vgqa")
    minival_images: int = 5000
    minival_ids: str | None = None
    max_answers: int = 9500
    min_answer_count: int = 1
    text_files: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.sources:
            raise ConfigError("sources must name at least one of " + ", ".join(SOURCES))
        if len(set(self.sources)) != len(self.sources):
            raise ConfigError(f"sources lists a source twice: {list(self.sources)}")
        if self.minival_images < 0:
            raise ConfigError(f"minival_images must be >= 0, got {self.minival_images}")
        if self.max_answers < 1 or self.min_answer_count < 1:
            raise ConfigError("max_answers and min_answer_count must be >= 1")
        for subset in ("train", "val"):
            pair = (getattr(self.vqa, f"questions_{subset}"),
                    getattr(self.vqa, f"annotations_{subset}"))
            if (pair[0] is None) != (pair[1] is None):
                raise ConfigError(f"vqa.questions_{subset} and vqa.annotations_{subset} must be "
                                  "set together")

    def path(self, value: str) -> Path:
        """A configured path, read against root when relative."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else Path(self.root).expanduser() / path

    def optional_path(self, value: str | None) -> Path | None:
        return None if value is None else self.path(value)
