"""`pipeline evaluate`: official metrics of a predictions file; the table it prints, the --json
file it writes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.evaluate.gqa import evaluate_gqa
from pipeline.evaluate.inputs import EvaluationError
from pipeline.evaluate.nlvr2 import evaluate_nlvr2
from pipeline.evaluate.vqa import evaluate_vqa

HELP = "official metrics of VQA v2, GQA and NLVR2 for a predictions file"
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

Every score is a percentage. The predictions must answer every question of the annotations;
an error names the file at fault and exits with status 2.

Examples:
  pipeline evaluate vqa --predictions val_predict.json \\
      --annotations v2_mscoco_val2014_annotations.json \\
      --questions v2_OpenEnded_mscoco_val2014_questions.json --json vqa_val.json
  pipeline evaluate gqa --predictions testdev_predict.json \\
      --annotations testdev_balanced_questions.json
  pipeline evaluate nlvr2 --predictions dev_predict.csv --annotations dev.json
"""

BENCHMARKS = ("vqa", "gqa", "nlvr2")


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("benchmark", choices=BENCHMARKS, help="which benchmark's metric")
    parser.add_argument(
        "--predictions", required=True, metavar="FILE", help="predictions, in the submission format"
    )
    parser.add_argument(
        "--annotations", required=True, metavar="FILE",
        help="ground truth: VQA annotations, GQA questions or NLVR2 labels",
    )
    parser.add_argument("--questions", metavar="FILE", help="VQA questions file (vqa only)")
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


def _held_out(corpus: str) -> set[str]:
    """The image keys of a corpus's minival split."""
    from pipeline.corpus.read import split_images

    try:
        return split_images(corpus, "minival")
    except FileNotFoundError as err:
        raise EvaluationError(f"--holdout: {err}") from err


def run(args: argparse.Namespace) -> int:
    if args.benchmark == "nlvr2" and args.holdout is not None:
        raise EvaluationError("--holdout is for vqa and gqa; NLVR2's dev split is held out already")
    if args.benchmark != "vqa" and args.questions is not None:
        raise EvaluationError(
            f"--questions {args.questions} is for vqa only; {args.benchmark} reads its ground "
            "truth from --annotations"
        )
    metrics, table = {"vqa": _vqa, "gqa": _gqa, "nlvr2": _nlvr2}[args.benchmark](args)
    print(table)
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        print(f"metrics written to {out}")
    return 0
