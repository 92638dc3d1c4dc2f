"""VCR v1.0 (rowanz/r2c, vcr1annots.zip and vcr1images.zip): {train,val,test}.jsonl and
vcr1images/{movie folder}/{image}.jpg with its metadata {image}.json beside it.

Movie folders are `lsmdc_{movie}` with movie `{number}_{TITLE}` and images named like LSMDC
clips, `{movie}_{hh.mm.ss.mmm}-{hh.mm.ss.mmm}@{shot}.jpg` (dots and '@' in the name, as real).
A split's movies are its own (VCR's splits share no movie); IMAGES_PER_MOVIE images a movie.

Each jsonl line, in the release's key order: movie, objects (the image's object names: the
shapes), interesting_scores, answer_likelihood, img_fn, metadata_fn (both relative to
vcr1images/), answer_orig, question_orig, rationale_orig (the untokenised right answer,
question and rationale, tags written as 1-based numbers as the annotators typed them: "Where is
1 compared to 2?"), question, answer_match_iter, answer_sources, answer_choices, answer_label,
rationale_choices, rationale_sources, rationale_match_iter, rationale_label, img_id ("{split}-{n}",
n the image's index in its split), question_number (the question's index on its image),
annot_id ("{split}-{n}", n the question's index in its split), match_fold ("{split}-0": a split
is one fold), match_index (the question's index in its fold). test.jsonl leaves out what would
give the labels away: answer_label, rationale_label, the *_orig strings, *_sources and
*_match_iter.

Metadata: {"boxes": [[x1, y1, x2, y2, score]] (pixels; the score a detector's confidence, here
drawn in [0.9, 1)), "segms": per object one polygon [[x, y], ...], its box's rectangle (the
world's COCO segmentation too), "names", "width", "height"}.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pipeline.world.language import VCRAnnotation
from pipeline.world.language.records import VCRToken
from pipeline.world.scene import Scene

SPLITS = ("train", "val", "test")
IMAGES_PER_MOVIE = 5
FIRST_MOVIE_NUMBER = 3001
# Invented titles in LSMDC's style (upper case, underscores).
TITLES = (
    "RED_BALL_RISING", "THE_WOODEN_BOX", "STAR_CROSSED", "A_RING_OF_METAL", "HEARTS_ON_SAND",
    "THE_DIAMOND_AFFAIR", "CROSSING_THE_CARPET", "TRIANGLE_SUMMER", "GRAY_AREA",
    "THE_LAST_HOOP", "PURPLE_TILES", "CONCRETE_JUNGLE_GYM",
)
LABEL_FIELDS = ("answer_orig", "question_orig", "rationale_orig", "answer_match_iter",
                "answer_sources", "answer_label", "rationale_sources", "rationale_match_iter",
                "rationale_label")


def movie_name(movie_index: int) -> str:
    """e.g. "3001_RED_BALL_RISING"."""
    return f"{FIRST_MOVIE_NUMBER + movie_index}_{TITLES[movie_index % len(TITLES)]}"


def _clock(ms: int) -> str:
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    seconds, ms = divmod(ms, 1000)
    return f"{hours:02d}.{minutes:02d}.{seconds:02d}.{ms:03d}"


def image_stem(movie: str, index_in_movie: int, image_id: int) -> str:
    """`lsmdc_{movie}/{movie}_{start}-{end}@{shot}`: the clip's times and the shot number are
    fixed functions of the image's place in its movie and its id."""
    start = 60_000 + index_in_movie * 83_417 + image_id % 997 * 13
    end = start + 2_000 + image_id % 7 * 311
    return f"lsmdc_{movie}/{movie}_{_clock(start)}-{_clock(end)}@{index_in_movie % 3}"


def metadata_json(scene: Scene, rng: random.Random) -> dict:
    boxes, segms = [], []
    for obj in scene.objects:
        x1, y1, x2, y2 = obj.box
        boxes.append([x1, y1, x2, y2, round(rng.uniform(0.9, 1.0), 6)])
        segms.append([[[x1, y1], [x2, y1], [x2, y2], [x1, y2]]])
    return {"boxes": boxes, "segms": segms, "names": [o.shape for o in scene.objects],
            "width": scene.width, "height": scene.height}


def _json_tokens(tokens: Sequence[VCRToken]) -> list:
    return [list(t) if isinstance(t, tuple) else t for t in tokens]


def typed(tokens: Sequence[VCRToken]) -> str:
    """The sentence as an annotator typed it: tags as 1-based numbers ("1 and 2"), punctuation
    glued on, no final full stop (VCR's *_orig strings)."""
    words = []
    for token in tokens:
        if isinstance(token, tuple):
            words.append(" and ".join(str(i + 1) for i in token))
        elif token in ".,?" and words:
            words[-1] += token
        else:
            words.append(token)
    text = " ".join(words)
    return text[:-1] if text.endswith(".") else text


def line(a: VCRAnnotation, split: str, movie: str, stem: str, objects: Sequence[str],
         img_index: int, annot_index: int) -> dict:
    """One jsonl row of question `annot_index` of the split (its match_index too)."""
    right_answer = a.answer_choices[a.answer_label]
    right_rationale = a.rationale_choices[a.rationale_label]
    row = {
        "movie": movie,
        "objects": list(objects),
        "interesting_scores": list(a.interesting_scores),
        "answer_likelihood": a.answer_likelihood,
        "img_fn": f"{stem}.jpg",
        "metadata_fn": f"{stem}.json",
        "answer_orig": typed(right_answer),
        "question_orig": typed(a.question),
        "rationale_orig": typed(right_rationale),
        "question": _json_tokens(a.question),
        "answer_match_iter": list(a.answer_match_iter),
        "answer_sources": list(a.answer_sources),
        "answer_choices": [_json_tokens(c) for c in a.answer_choices],
        "answer_label": a.answer_label,
        "rationale_choices": [_json_tokens(c) for c in a.rationale_choices],
        "rationale_sources": list(a.rationale_sources),
        "rationale_match_iter": list(a.rationale_match_iter),
        "rationale_label": a.rationale_label,
        "img_id": f"{split}-{img_index}",
        "question_number": a.question_number,
        "annot_id": f"{split}-{annot_index}",
        "match_fold": f"{split}-0",
        "match_index": annot_index,
    }
    if split == "test":
        row = {k: v for k, v in row.items() if k not in LABEL_FIELDS}
    return row
