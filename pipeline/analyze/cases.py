"""From a caption of Flickr30K Entities to the cases the heads are scored on (grounding.py).

Entity cases: every phrase whose chain has a box (the union of its boxes, entities.py); a phrase
of the picture itself (chain 0, "notvisual"), of the scene or without a box has no target.

Syntactic cases (Li et al. §3: "w1 -r-> w2 where w1 is an entity aligned to an image region: how
often does w2 attend to w1's region"): for each arc head -r-> dependent of the caption's parse,
the *target* is the end that lies in a phrase with a box, the head when both do (so `amod` and
`det` point from the modifier to its noun inside a phrase, `nsubj` and `pobj` from the verb or
preposition to its argument, `acl` from "wearing" to "man"), and the other end is the *source*
word; arcs whose ends are both outside boxed phrases have no target. The case's group is the
relation r (its subtype kept: `nmod:poss`).

Wordpieces: a word's attention row is the mean of its wordpieces' rows (Clark et al. 2019's rule
for a word split into pieces), a phrase's the mean of its words' rows; `weights` writes this as
one weight per text position. A case any of whose words the text length cut off is skipped and
counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from pipeline.analyze.entities import EntitySentence, ImageEntities
from pipeline.analyze.grounding import IOU_THRESHOLD, BatchCases, box_ious
from pipeline.analyze.parses import Parse
from shards.schema import Sample

ENTITY = "entity"


@dataclass(frozen=True)
class Case:
    """group: "entity" or the relation; words: the source words (indices into the caption's
    words); box: the target [x1, y1, x2, y2] in pixels; text: what the pictures write."""

    group: str
    words: tuple[int, ...]
    box: tuple[float, float, float, float]
    text: str


def sentence_cases(sentence: EntitySentence, entities: ImageEntities,
                   parse: Parse | None) -> list[Case]:
    """The entity cases of a caption, then its syntactic ones (none without a parse)."""
    cases, phrase_of = [], {}
    for phrase in sentence.phrases:
        box = entities.box(phrase.chain) if phrase.chain else None
        if box is None:
            continue
        words = tuple(range(phrase.first_word, phrase.end))
        cases.append(Case(ENTITY, words, tuple(box), " ".join(phrase.words)))
        for w in words:
            phrase_of.setdefault(w, (phrase, tuple(box)))
    if parse is None:
        return cases
    for dependent, (head, relation) in enumerate(zip(parse.heads, parse.deprels)):
        if head < 0:
            continue
        target, source = (head, dependent) if head in phrase_of else (dependent, head)
        if target not in phrase_of:
            continue
        phrase, box = phrase_of[target]
        text = (f"{sentence.words[source]} -{relation}-> {sentence.words[target]} "
                f"({' '.join(phrase.words)})")
        cases.append(Case(relation, (source,), box, text))
    return cases


def word_pieces(word_ids: Sequence[int | None], n_words: int) -> list[list[int]]:
    """The text positions of each word (a fast tokenizer's word_ids: None for [CLS], [SEP] and
    padding); a word cut off by the text length has none."""
    pieces: list[list[int]] = [[] for _ in range(n_words)]
    for position, word in enumerate(word_ids):
        if word is not None:
            pieces[word].append(position)
    return pieces


def weights(words: Sequence[int], pieces: Sequence[Sequence[int]], length: int
            ) -> np.ndarray | None:
    """(length,) pooling weights of a case's words: mean over words of the mean over each word's
    pieces; None when a word has no piece left."""
    row = np.zeros(length, dtype=np.float64)
    for w in words:
        if not pieces[w]:
            return None
        row[pieces[w]] += 1.0 / (len(words) * len(pieces[w]))
    return row


def encode_words(tokenizer, sentences: Sequence[Sequence[str]], max_length: int
                 ) -> tuple[dict[str, torch.Tensor], list[list[list[int]]]]:
    """The model's text inputs for pre-split captions and each caption's word -> positions.
    The inputs are what pipeline/common/text.py's encode_texts makes of the words joined by
    spaces (`[CLS] wordpieces [SEP]`, cut before [SEP], one segment): BERT's tokenizer splits at
    spaces first either way."""
    enc = tokenizer([list(words) for words in sentences], is_split_into_words=True,
                    truncation=True, max_length=max_length, padding="longest",
                    return_tensors="pt")
    text = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
            "token_type_ids": torch.zeros_like(enc["input_ids"])}
    pieces = [word_pieces(enc.word_ids(i), len(words)) for i, words in enumerate(sentences)]
    return text, pieces


@dataclass
class Skipped:
    """Cases left out, by reason."""

    counts: Counter = field(default_factory=Counter)

    def add(self, reason: str, n: int = 1) -> None:
        self.counts[reason] += n


def batch_cases(cases: Sequence[Sequence[Case]], pieces: Sequence[Sequence[Sequence[int]]],
                samples: Sequence[Sample], text_length: int, max_boxes: int, region_count: int,
                skipped: Skipped) -> tuple[BatchCases, list[list[Case]]]:
    """The tensors of a batch's cases (grounding.BatchCases) and the cases kept per sentence.
    region_count: N of the batch's regions (padded)."""
    kept, rows, hits = [], [], []
    for sentence_cases_, sentence_pieces, sample in zip(cases, pieces, samples):
        regions = sample.arrays["boxes"][:max_boxes]
        kept_here, rows_here, hits_here = [], [], []
        for case in sentence_cases_:
            row = weights(case.words, sentence_pieces, text_length)
            if row is None:
                skipped.add("words cut off by the text length")
                continue
            hit = np.zeros(region_count, dtype=bool)
            hit[:len(regions)] = box_ious(regions, np.asarray(case.box)) >= IOU_THRESHOLD
            kept_here.append(case)
            rows_here.append(row)
            hits_here.append(hit)
        kept.append(kept_here)
        rows.append(rows_here)
        hits.append(hits_here)
    C = max(1, max(len(k) for k in kept))
    B = len(kept)
    w = torch.zeros(B, C, text_length, dtype=torch.float64)
    h = torch.zeros(B, C, region_count, dtype=torch.bool)
    mask = torch.zeros(B, region_count, dtype=torch.bool)
    confident = torch.zeros(B, dtype=torch.long)
    for b, sample in enumerate(samples):
        if rows[b]:
            w[b, :len(rows[b])] = torch.from_numpy(np.stack(rows[b]))
            h[b, :len(hits[b])] = torch.from_numpy(np.stack(hits[b]))
        conf = sample.arrays["object_conf"][:max_boxes]
        mask[b, :len(conf)] = True
        confident[b] = int(np.argmax(conf)) if len(conf) else 0
    groups = tuple(tuple(c.group for c in k) for k in kept)
    return BatchCases(w, h, groups, mask, confident), kept
