"""One pretraining example before masking: a sentence and the image it belongs to."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pair:
    """A corpus sentence joined to its image.

    image: the shard key of the image's features (`shards.schema.make_key`).
    source: the corpus source of the sentence ("mscoco", "vg", "vqa", "gqa", "vgqa", "cc3m").
    answers: answer index (line of the corpus' answers.json) -> score, for QA sources; None for
        caption sources. May be empty: a question whose answers are all outside the table.
    image_sentences: every caption-source sentence of the image, this one included when it is a
        caption (one tuple shared by all the image's pairs).
    """

    image: str
    sentence: str
    source: str
    answers: dict[int, float] | None
    image_sentences: tuple[str, ...]
