"""`pipeline predict`: a fine-tuned run's submission file for a subset (pipeline/finetune/predict.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.finetune.examples import TASKS

HELP = "a fine-tuned run's submission file for a subset (VQA / GQA JSON, NLVR2 CSV)"
DESCRIPTION = """\
Answer a subset with a fine-tuned run and write the benchmark's submission file: VQA
[{"question_id", "answer"}] JSON, GQA [{"questionId", "prediction"}] JSON, NLVR2 CSV lines
`identifier,True|False`. The files, shards and model come from the run directory (its
config.yaml, answers.json and latest checkpoint) unless given. Score the file with
`pipeline evaluate`.

Example:
  pipeline predict vqa --run runs/vqa --subset val2014 --out vqa_val_predictions.json
"""


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task", choices=TASKS)
    parser.add_argument("--run", required=True, help="a `pipeline finetune` run directory")
    parser.add_argument("--subset", required=True,
                        help="the subset to answer: VQA val2014 / test2015, GQA testdev, "
                        "NLVR2 dev / test1, ...")
    parser.add_argument("--out", required=True, help="submission file to write")
    parser.add_argument("--root", help="folder of the released files (default: the run's)")
    parser.add_argument("--shards", nargs="+", help="feature shard directories (default: the run's)")
    parser.add_argument("--checkpoint", help="a checkpoint directory of the run (default: latest)")
    parser.add_argument("--holdout", metavar="CORPUS",
                        help="answer only the questions on a corpus's minival images (LXMERT's "
                        "held-out split); score with `pipeline evaluate ... --holdout CORPUS`")
    parser.add_argument("--batch-size", type=int, default=64)


def run(args: argparse.Namespace) -> int:
    from pipeline.finetune.predict import predict_subset, write_submission

    predictions = predict_subset(
        args.task, Path(args.run), args.subset, root=args.root, shards=args.shards,
        checkpoint=args.checkpoint, batch_size=args.batch_size, holdout=args.holdout,
    )
    write_submission(args.task, predictions, Path(args.out))
    print(f"{len(predictions)} predictions -> {args.out}", file=sys.stderr)
    return 0
