"""`pipeline predict`: a fine-tuned run's submission file for a subset (pipeline/finetune/predict.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.finetune.examples import TASKS

HELP = "a fine-tuned run's submission file for a subset (VQA, GQA, NLVR2, VCR, RefCOCO+, ...)"
# What one row of each submission is, for the count printed at the end (flickr30k prints its
# matrix's captions x images).
UNITS = {"vqa": "questions", "gqa": "questions",
         "nlvr2": "examples (a sentence on an image pair each)",
         "vcr": "questions (answer and rationale scores each)",
         "refcoco+": "referring expressions (a box each)"}
DESCRIPTION = """\
Answer a subset with a fine-tuned run and write the benchmark's submission file:
  vqa        [{"question_id", "answer"}] JSON          gqa    [{"questionId", "prediction"}] JSON
  nlvr2      CSV lines `identifier,True|False`
  vcr        the leaderboard CSV: annot_id, answer_0..3 and rationale_conditioned_on_a{i}_{j}
             (each question is answered, then its rationales are scored given each answer)
  refcoco+   [{"sent_id", "box": [x1, y1, x2, y2]}] JSON, the top region's box in pixels
  flickr30k  .npz of every caption's score with every image of the subset (scores (C, I),
             sentids, imgids), with a progress bar: Flickr30K's test split is 5M pairs
The files, shards and model come from the run directory (its config.yaml, answers.json and
latest checkpoint) unless given. Score the file with `pipeline evaluate`.

Examples:
  pipeline predict vqa --run runs/vqa --subset val2014 --out vqa_val_predictions.json
  pipeline predict vcr --run runs/vcr --subset val --out vcr_val.csv
  pipeline predict refcoco+ --run runs/refcoco --subset testA --out refcoco_testA.json
  pipeline predict flickr30k --run runs/f30k --subset test --out f30k_test.npz
"""


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task", choices=TASKS)
    parser.add_argument("--run", required=True, help="a `pipeline finetune` run directory")
    parser.add_argument("--subset", required=True,
                        help="the subset to answer: VQA val2014 / test2015, GQA testdev, "
                        "NLVR2 dev / test1, VCR val / test, RefCOCO+ val / testA / testB, "
                        "Flickr30K val / test")
    parser.add_argument("--out", required=True, help="submission file to write")
    parser.add_argument("--root", help="folder of the released files (default: the run's)")
    parser.add_argument("--shards", nargs="+", help="feature shard directories (default: the run's)")
    parser.add_argument("--checkpoint", help="a checkpoint directory of the run (default: latest)")
    parser.add_argument("--holdout", metavar="CORPUS",
                        help="answer only the questions on a corpus's minival images (LXMERT's "
                        "held-out split); score with `pipeline evaluate ... --holdout CORPUS`")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="examples per forward (Flickr30K: caption-image pairs; default 64)")


def run(args: argparse.Namespace) -> int:
    from pipeline.finetune.predict import predict_retrieval, predict_subset, write_submission

    if args.task == "flickr30k":
        from pipeline.evaluate.flickr30k import write_retrieval_predictions

        scores, sentids, imgids = predict_retrieval(
            Path(args.run), args.subset, root=args.root, shards=args.shards,
            checkpoint=args.checkpoint, batch_size=args.batch_size)
        write_retrieval_predictions(scores, sentids, imgids, Path(args.out))
        print(f"{scores.shape[0]} captions x {scores.shape[1]} images -> {args.out}",
              file=sys.stderr)
        return 0
    predictions = predict_subset(
        args.task, Path(args.run), args.subset, root=args.root, shards=args.shards,
        checkpoint=args.checkpoint, batch_size=args.batch_size, holdout=args.holdout,
    )
    rows = write_submission(args.task, predictions, Path(args.out))
    print(f"{rows} {UNITS[args.task]} -> {args.out}", file=sys.stderr)
    return 0
