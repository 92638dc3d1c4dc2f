"""Text records derived from scenes, one dataclass per dataset's unit of annotation.

They carry what the official files need and nothing of their layout: the writers in
pipeline/world turn them into COCO, VQA v2, GQA, NLVR2, Visual Genome, VCR, RefCOCO+ and
Flickr30K (Entities) files. Image ids are the world's integer `Scene.image_id`s.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.world.language.grammar import PUNCTUATION, GroundedPhrase, ParsedWord, raw_text

# A VCR token: a word, or the indices of the objects a detection tag names ([0, 1] is "0 and 1").
VCRToken = str | tuple[int, ...]


@dataclass(frozen=True)
class Caption:
    """One COCO-style caption, a full sentence that is true of the image."""

    image_id: int
    text: str


@dataclass(frozen=True)
class VQAQuestion:
    """One VQA v2 question with its ten simulated annotator answers.

    question_type: a prefix from VQA's mscoco_question_types list ("what color is the", "how many"...).
    answer_type: "yes/no", "number" or "other". answers: ten raw strings (some differ only after the
    official normalisation, e.g. "two" / "2"); multiple_choice_answer is their normalised majority.
    """

    question_id: int
    image_id: int
    question: str
    question_type: str
    answer_type: str
    answers: tuple[str, ...]
    multiple_choice_answer: str


@dataclass(frozen=True)
class GQAQuestion:
    """One GQA balanced question.

    structural: "verify", "logical" or "compare" (answered yes/no), "query" or "choose" (answered
    with a word; choose offers two). semantic: "obj", "attr", "rel", "cat" or "global". detailed:
    a GQA-style detailed type, e.g. "queryAttr", "existAttr", "relVerify". entailed: ids of the
    questions whose answers follow from this one's (symmetric, never the question itself);
    equivalent: ids of the questions that ask the same (the question itself included).
    """

    question_id: str
    image_id: int
    question: str
    answer: str
    full_answer: str
    structural: str
    semantic: str
    detailed: str
    entailed: tuple[str, ...]
    equivalent: tuple[str, ...]

    @property
    def is_binary(self) -> bool:
        """GQA eval.py's split: every structural type but "query" counts as binary."""
        return self.structural != "query"


@dataclass(frozen=True)
class NLVR2Item:
    """One NLVR2 example: a statement about a (left, right) image pair and whether it holds.

    identifier: "{split}-{set}-{pair}-{sentence}"; the same sentence goes with several pairs of
    its set, so `group_id` (the identifier with the pair field blanked) names a consistency group.
    """

    identifier: str
    left_image_id: int
    right_image_id: int
    sentence: str
    label: bool

    @property
    def group_id(self) -> str:
        split, set_id, _, sentence_id = self.identifier.split("-")
        return f"{split}-{set_id}--{sentence_id}"

    @property
    def pair_stem(self) -> str:
        """The images' file stem: "{split}-{set}-{pair}" (files are "{stem}-img0.png", "-img1.png")."""
        return self.identifier.rsplit("-", 1)[0]


@dataclass(frozen=True)
class RegionDescription:
    """One Visual Genome region: a phrase and its box in pixels (x, y top-left, width, height)."""

    region_id: int
    image_id: int
    phrase: str
    x: int
    y: int
    width: int
    height: int


@dataclass(frozen=True)
class VGQuestionAnswer:
    """One Visual Genome free-form question-answer pair."""

    qa_id: int
    image_id: int
    question: str
    answer: str


@dataclass(frozen=True)
class VCRAnnotation:
    """One VCR question with its four answers and four rationales.

    Tokens as VCR writes them: a tag is a tuple of indices into the scene's objects (VCR's
    `objects` list is the scene's objects in order). kind: "color" or "relation".
    *_match_iter: per choice, 0 for the right one, k for the k-th distractor picked.
    *_sources: per choice, the index (within the returned list, i.e. the fold's `match_index`)
    of the question whose right answer (rationale) it is; -1 for a distractor drawn from the
    palette because no question of the fold could supply one (only in tiny worlds).
    """

    image_id: int
    question_number: int
    kind: str
    question: tuple[VCRToken, ...]
    answer_choices: tuple[tuple[VCRToken, ...], ...]
    answer_label: int
    answer_match_iter: tuple[int, ...]
    answer_sources: tuple[int, ...]
    rationale_choices: tuple[tuple[VCRToken, ...], ...]
    rationale_label: int
    rationale_match_iter: tuple[int, ...]
    rationale_sources: tuple[int, ...]
    interesting_scores: tuple[int, ...]
    answer_likelihood: str


@dataclass(frozen=True)
class ReferringExpression:
    """One RefCOCO+-style expression for one object (`object_index` into Scene.objects): `raw`
    as typed ("The red metal one"); `sent` its lower-cased, punctuation-free form."""

    image_id: int
    object_index: int
    raw: str

    @property
    def sent(self) -> str:
        return " ".join(self.tokens)

    @property
    def tokens(self) -> list[str]:
        words = ("".join(c for c in w if c not in PUNCTUATION) for w in self.raw.lower().split())
        return [w for w in words if w]


@dataclass(frozen=True)
class GroundedCaption:
    """A Flickr30K caption with its noun phrases grounded in the scene and its dependency parse
    (see grammar.py): words in order, phrases as word spans."""

    image_id: int
    words: tuple[ParsedWord, ...]
    phrases: tuple[GroundedPhrase, ...]

    @property
    def forms(self) -> tuple[str, ...]:
        return tuple(w.form for w in self.words)

    @property
    def raw(self) -> str:
        """As Karpathy's dataset_flickr30k.json writes it: "A red ball next to a box." """
        return raw_text(self.forms)
