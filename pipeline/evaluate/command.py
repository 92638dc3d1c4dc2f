"""`pipeline evaluate`: official metrics of a predictions file; the table it prints, the --json
file it writes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.evaluate.flickr30k import evaluate_flickr30k
from pipeline.evaluate.gqa import evaluate_gqa
from pipeline.evaluate.inputs import EvaluationError
from pipeline.evaluate.nlvr2 import evaluate_nlvr2
from pipeline.evaluate.refcoco import evaluate_refcoco
from pipeline.evaluate.vcr import evaluate_vcr
from pipeline.evaluate.vqa import evaluate_vqa

HELP = ("official metrics of VQA v2, GQA, NLVR2, VCR, RefCOCO+ and Flickr30K retrieval for a "
        "predictions file")
DESCRIPTION = """\
Score a predictions file with a benchmark's official metric, computed as the official
evaluation script does (pipeline/evaluate/<benchmark>.py says how, and where it differs):

  vqa    VQA v2 accuracy after the official answer normalisation: overall, per answer type and
         per question type. --predictions: [{"question_id": int, "answer": str}];
         --annotations: v2_mscoco_<subset>_annotations.json;
         --questions: v2_OpenEnded_mscoco_<subset>_questions.json (required).
  gqa    GQA accuracy, binary / open accuracy and consistency over entailed questions.
         --predictions: [{"questionId": str, "prediction": str}];
         --annotations: <split>_balanced_questions.json (or <split>_all_questions.json).
  nlvr2  NLVR2 accuracy and consistency (a sentence counts when all its pairs are right).
         --predictions: CSV lines identifier,True|False; --annotations: dev.json / test1.json.
  vcr    VCR Q->A, QA->R (rationales given the right answer) and Q->AR (both right); the
         first of tied scores is the choice. --predictions: the leaderboard CSV (annot_id,
         answer_0..3, rationale_conditioned_on_a<i>_<j>); --annotations: val.jsonl.
  refcoco+
         RefCOCO+ accuracy: a predicted box is right when its IoU with the referred object's
         box is >= 0.5 (pixels counted inclusively, as ViLBERT and VL-BERT do).
         --predictions: [{"sent_id": int, "box": [x1, y1, x2, y2]}] (pixels; our format, there
         is no official one); --annotations: refs(unc).p (read without running any code);
         --instances: the dataset's instances.json (required); --split: val, testA or testB
         (required).
  flickr30k
         Flickr30K retrieval, caption->image and image->caption: R@1, R@5, R@10, median and
         mean rank (tied scores rank against the true item). --predictions: an .npz with
         scores (captions x images), sentids and imgids (our format); --annotations:
         Karpathy's dataset_flickr30k.json; --split: default test. A split too small for
         R@k (no rank can exceed k, e.g. 10 or fewer images) gets a warning, also in --json's
         "warnings".

Accuracies and recalls are percentages; ranks start at 1. The predictions must answer every
question (expression, caption, image) of the annotations; an error names the file at fault and
exits with status 2.

Examples:
  pipeline evaluate vqa --predictions val_predict.json \\
      --annotations v2_mscoco_val2014_annotations.json \\
      --questions v2_OpenEnded_mscoco_val2014_questions.json --json vqa_val.json
  pipeline evaluate gqa --predictions testdev_predict.json \\
      --annotations testdev_balanced_questions.json
  pipeline evaluate nlvr2 --predictions dev_predict.csv --annotations dev.json
  pipeline evaluate vcr --predictions val_predict.csv --annotations vcr1/val.jsonl
  pipeline evaluate refcoco+ --predictions testA_boxes.json \\
      --annotations "refcoco+/refs(unc).p" --instances refcoco+/instances.json --split testA
  pipeline evaluate flickr30k --predictions test_scores.npz \\
      --annotations dataset_flickr30k.json
"""

BENCHMARKS = ("vqa", "gqa", "nlvr2", "vcr", "refcoco+", "flickr30k")
SPLIT_BENCHMARKS = ("refcoco+", "flickr30k")


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("benchmark", choices=BENCHMARKS, help="which benchmark's metric")
    parser.add_argument(
        "--predictions", metavar="FILE",
        help="predictions, in the benchmark's submission format (ours where it has none); "
        "required",
    )
    parser.add_argument(
        "--annotations", required=True, metavar="FILE",
        help="ground truth: VQA annotations, GQA questions, NLVR2 labels, VCR .jsonl, RefCOCO+ "
        "refs(unc).p or the Karpathy split file",
    )
    parser.add_argument("--questions", metavar="FILE", help="VQA questions file (vqa only)")
    parser.add_argument(
        "--instances", metavar="FILE",
        help="the refs' COCO instances.json, which holds the target boxes (refcoco+ only)",
    )
    parser.add_argument(
        "--split", metavar="SPLIT",
        help="which split to score: refcoco+ val / testA / testB (required); flickr30k "
        "(default test)",
    )
    parser.add_argument(
        "--holdout", metavar="CORPUS",
        help="score only the questions on a corpus's minival images (LXMERT's held-out split; "
        "vqa, gqa), e.g. after `pipeline predict --holdout CORPUS`",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the metrics to this JSON file")


def _table(title: str, rows: list[tuple[str, float]]) -> str:
    width = max(len(name) for name, _ in rows) + 2
    return "\n".join([title] + [f"  {name:<{width}}{value:7.2f}" for name, value in rows])


def _vqa(args: argparse.Namespace) -> tuple[dict, str]:
    if args.questions is None:
        raise EvaluationError(
            "vqa needs --questions FILE, the questions file of the annotations' subset "
            "(v2_OpenEnded_mscoco_<subset>_questions.json)"
        )
    images = None if args.holdout is None else {
        int(key.removeprefix("coco-")) for key in _held_out(args.holdout) if key.startswith("coco-")
    }
    scores = evaluate_vqa(Path(args.predictions), Path(args.annotations), Path(args.questions),
                          images)
    rows = [("overall", scores.overall)]
    rows += [(f"answer type: {k}", v) for k, v in sorted(scores.per_answer_type.items())]
    rows += [(f"question type: {k}", v) for k, v in sorted(scores.per_question_type.items())]
    return scores.as_dict(), _table(f"VQA v2 accuracy (%), {scores.questions} questions", rows)


def _gqa(args: argparse.Namespace) -> tuple[dict, str]:
    images = None if args.holdout is None else {
        key.removeprefix("vg-") for key in _held_out(args.holdout) if key.startswith("vg-")
    }
    scores = evaluate_gqa(Path(args.predictions), Path(args.annotations), images)
    metrics = scores.as_dict()
    return metrics, _table(f"GQA (%), {scores.questions} balanced questions", list(metrics.items()))


def _nlvr2(args: argparse.Namespace) -> tuple[dict, str]:
    scores = evaluate_nlvr2(Path(args.predictions), Path(args.annotations))
    metrics = scores.as_dict()
    title = f"NLVR2 (%), {scores.rows} rows, {scores.sentences} sentences"
    return metrics, _table(title, list(metrics.items()))


def _vcr(args: argparse.Namespace) -> tuple[dict, str]:
    scores = evaluate_vcr(Path(args.predictions), Path(args.annotations))
    rows = [("Q->A", scores.q_a), ("QA->R", scores.qa_r), ("Q->AR", scores.q_ar)]
    return scores.as_dict(), _table(f"VCR accuracy (%), {scores.questions} questions", rows)


def _refcoco(args: argparse.Namespace) -> tuple[dict, str]:
    if args.instances is None or args.split is None:
        raise EvaluationError(
            "refcoco+ needs --instances FILE (the dataset's instances.json, which holds the "
            "target boxes) and --split (val, testA or testB)"
        )
    scores = evaluate_refcoco(Path(args.predictions), Path(args.annotations),
                              Path(args.instances), args.split)
    title = f"RefCOCO+ {args.split} (%), {scores.questions} expressions"
    return scores.as_dict(), _table(title, [("accuracy at IoU >= 0.5", scores.accuracy)])


def _flickr30k(args: argparse.Namespace) -> tuple[dict, str]:
    split = args.split or "test"
    scores = evaluate_flickr30k(Path(args.predictions), Path(args.annotations), split)
    rows = []
    for direction, ranks in (("caption->image", scores.caption_to_image),
                             ("image->caption", scores.image_to_caption)):
        rows += [(f"{direction} R@1 (%)", ranks.r1), (f"{direction} R@5 (%)", ranks.r5),
                 (f"{direction} R@10 (%)", ranks.r10), (f"{direction} median rank", ranks.medr),
                 (f"{direction} mean rank", ranks.meanr)]
    title = f"Flickr30K {split} retrieval, {scores.captions} captions, {scores.images} images"
    return {**scores.as_dict(), "warnings": list(scores.warnings)}, _table(title, rows)


def _held_out(corpus: str) -> set[str]:
    """The image keys of a corpus's minival split."""
    from pipeline.corpus.read import split_images

    try:
        return split_images(corpus, "minival")
    except FileNotFoundError as err:
        raise EvaluationError(f"--holdout: {err}") from err


HANDLERS = {"vqa": _vqa, "gqa": _gqa, "nlvr2": _nlvr2, "vcr": _vcr, "refcoco+": _refcoco,
            "flickr30k": _flickr30k}


def run(args: argparse.Namespace) -> int:
    if args.predictions is None:
        raise EvaluationError("--predictions FILE is required: the file to score")
    if args.benchmark not in ("vqa", "gqa") and args.holdout is not None:
        raise EvaluationError(
            f"--holdout is for vqa and gqa (LXMERT's minival); {args.benchmark} has its own "
            "held-out splits"
        )
    if args.benchmark != "vqa" and args.questions is not None:
        raise EvaluationError(
            f"--questions {args.questions} is for vqa only; {args.benchmark} reads its ground "
            "truth from --annotations"
        )
    if args.benchmark != "refcoco+" and args.instances is not None:
        raise EvaluationError(f"--instances {args.instances} is for refcoco+ only")
    if args.benchmark not in SPLIT_BENCHMARKS and args.split is not None:
        raise EvaluationError(
            f"--split is for {' and '.join(SPLIT_BENCHMARKS)}; {args.benchmark}'s split is the "
            "--annotations file"
        )
    metrics, table = HANDLERS[args.benchmark](args)
    print(table)
    for warning in metrics.get("warnings", []):
        print(f"pipeline evaluate: warning: {warning}", file=sys.stderr)
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        print(f"metrics written to {out}")
    return 0
