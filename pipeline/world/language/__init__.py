"""Language from the world's scenes: captions, VQA, GQA, NLVR2, Visual Genome, VCR, RefCOCO+ and
Flickr30K text.

Pure functions from `Scene`s to records; every statement is true of (or, for labelled
statements, decided by) the scene's ground truth. No file I/O here.
"""

from pipeline.world.language.captions import captions, cc3m_caption
from pipeline.world.language.flickr30k import flickr30k_captions
from pipeline.world.language.gqa import gqa_questions
from pipeline.world.language.nlvr2 import nlvr2_items
from pipeline.world.language.records import (
    Caption,
    GQAQuestion,
    GroundedCaption,
    NLVR2Item,
    ReferringExpression,
    RegionDescription,
    VCRAnnotation,
    VGQuestionAnswer,
    VQAQuestion,
)
from pipeline.world.language.refcoco import referring_expressions
from pipeline.world.language.vcr import vcr_annotations
from pipeline.world.language.visual_genome import region_descriptions, vg_question_answers
from pipeline.world.language.vqa import question_type, vqa_questions

__all__ = [
    "Caption",
    "GQAQuestion",
    "GroundedCaption",
    "NLVR2Item",
    "ReferringExpression",
    "RegionDescription",
    "VCRAnnotation",
    "VGQuestionAnswer",
    "VQAQuestion",
    "captions",
    "cc3m_caption",
    "flickr30k_captions",
    "gqa_questions",
    "nlvr2_items",
    "question_type",
    "referring_expressions",
    "region_descriptions",
    "vcr_annotations",
    "vg_question_answers",
    "vqa_questions",
]
