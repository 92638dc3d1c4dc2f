"""The analysis loop: captions in batches -> the model's text -> region attention -> the tally.

Each caption of the split is one row: its words (tokenised as the model was trained), the regions
of its image from the shards (the first max_boxes, as in training), its cases (cases.py). A batch
is reduced to counts as soon as the model has run (grounding.py); the first `examples` entity
cases keep their every head's choice for the pictures. A caption whose image is not in the shards,
or whose parse is missing or tokenised differently, is counted and skipped (its entity cases
still count when only the parse is wrong).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from model.region_attention import text_to_regions
from pipeline.analyze.cases import ENTITY, Case, Skipped, batch_cases, encode_words, sentence_cases
from pipeline.analyze.entities import EntitySentence, ImageEntities
from pipeline.analyze.grounding import HeadTally, score_batch
from pipeline.analyze.errors import AnalysisError
from pipeline.analyze.model import AnalysedModel
from pipeline.analyze.parses import Parse, WordParser, align, run_parser
from pipeline.common.progress import progress_bar
from pipeline.common.text import load_tokenizer
from pipeline.finetune.retrieval import image_key
from shards.batch import collate_regions

Parser = Callable[[EntitySentence], "Parse | None"]


@dataclass(frozen=True)
class GroundingExample:
    """One entity case for the pictures: its image, caption and phrase, the target box, the
    regions (N, 4) pixels and every head's chosen region (L, heads)."""

    image_key: str
    caption: str
    case: Case
    regions: np.ndarray
    choices: np.ndarray


@dataclass
class Analysis:
    tally: HeadTally
    skipped: Skipped
    examples: list[GroundingExample]
    captions: int
    images: int


def conllu_parser(parses: dict[str, Parse], skipped: Skipped) -> Parser:
    """Parses looked up by the CoNLL-U sent_id `{image id}_{caption index}`, aligned to the
    caption's words; a missing or misaligned parse is counted."""
    def parse(sentence: EntitySentence) -> Parse | None:
        found = parses.get(f"{sentence.image_id}_{sentence.index}")
        if found is None:
            skipped.add("captions without a parse")
            return None
        aligned = align(found, sentence.words)
        if aligned is None:
            skipped.add("captions whose parse has other words")
        return aligned
    return parse


def spacy_parser(parse_words: WordParser, skipped: Skipped) -> Parser:
    """Each caption's words parsed by a dependency parser (parses.load_spacy); a caption it
    fails on is counted."""
    def parse(sentence: EntitySentence) -> Parse | None:
        try:
            return run_parser(parse_words, sentence.words)
        except ValueError:
            skipped.add("captions the parser failed on")
            return None
    return parse


def caption_rows(data: Sequence[tuple[ImageEntities, Sequence[EntitySentence]]], features,
                 skipped: Skipped) -> list[tuple[str, ImageEntities, EntitySentence]]:
    """(image key, its entities, caption) of every caption whose image is in `features`; the
    others counted in `skipped`. AnalysisError when no image of the split is there."""
    rows = []
    for entities, sentences in data:
        key = image_key(f"{entities.image_id}.jpg")
        if key not in features:
            skipped.add("captions whose image is not in the shards", len(sentences))
            continue
        rows += [(key, entities, s) for s in sentences]
    if not rows:
        first = image_key(f"{data[0][0].image_id}.jpg") if data else "-"
        raise AnalysisError(f"none of the {len(data)} images of the split is in the shards "
                            f"(first wants {first})")
    return rows


def analyze(model: AnalysedModel, data: Sequence[tuple[ImageEntities, Sequence[EntitySentence]]],
            features, *, parser: Parser | None, skipped: Skipped, batch_size: int = 32,
            examples: int = 6, device: torch.device = torch.device("cpu")) -> Analysis:
    """The tally of every head over the captions of `data` (entities.read_entities) whose images
    are in `features` (pipeline/finetune/data.py Features)."""
    rows = caption_rows(data, features, skipped)
    tokenizer = load_tokenizer(model.tokenizer or None)
    encoder = model.encoder.to(device)
    tally, kept_examples, seen = None, [], set()
    with torch.no_grad(), progress_bar(total=len(rows), desc="analyze", unit="caption") as bar:
        for start in range(0, len(rows), batch_size):
            batch = rows[start:start + batch_size]
            samples = [features[key] for key, _, _ in batch]
            cases = [sentence_cases(s, e, parser(s) if parser else None) for _, e, s in batch]
            text, pieces = encode_words(tokenizer, [s.words for _, _, s in batch],
                                        model.max_text_length)
            regions = collate_regions(samples, max_boxes=model.max_boxes)
            inputs = {**text, **regions.model_inputs()}
            attention = text_to_regions(model.arch, encoder,
                                        {k: v.to(device) for k, v in inputs.items()})
            maps = attention.maps.cpu()
            if tally is None:
                tally = HeadTally(attention.layers, maps.shape[2])
            found, kept = batch_cases(cases, pieces, samples, maps.shape[3], model.max_boxes,
                                      maps.shape[4], skipped)
            choices = score_batch(tally, maps, found)
            for b, (key, _, sentence) in enumerate(batch):
                entity = next((c for c, case in enumerate(kept[b]) if case.group == ENTITY), None)
                if len(kept_examples) < examples and key not in seen and entity is not None:
                    seen.add(key)
                    kept_examples.append(GroundingExample(
                        key, " ".join(sentence.words), kept[b][entity],
                        samples[b].arrays["boxes"][:model.max_boxes].copy(),
                        choices[b, entity].numpy()))
            bar.update(len(batch))
    return Analysis(tally, skipped, kept_examples, len(rows), len({key for key, _, _ in rows}))

