"""`pipeline evaluate`: the official metrics of a predictions file (pipeline/evaluate/command.py)
and, for Flickr30K, of a pretrained model with no fine-tuning (`--zero-shot`, zero_shot.py). The
verb lives here, above both: scoring a file needs no model, the zero-shot setting needs one."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from pipeline.evaluate import command as files
from pipeline.evaluate.inputs import EvaluationError

HELP = files.HELP
DESCRIPTION = files.DESCRIPTION + """
Zero-shot retrieval (ViLBERT Table 1): `pipeline evaluate flickr30k --zero-shot --run
PRETRAIN_RUN --shards FEATS --annotations dataset_flickr30k.json` scores every caption of the
split with every image by the pretrained model's own image-text head (LXMERT matching, ViLBERT
alignment, VisualBERT sentence-image prediction; VL-BERT has none), then prints the retrieval
metrics; with --predictions the score matrix is also kept there (.npz).
"""


def add_args(parser: argparse.ArgumentParser) -> None:
    files.add_args(parser)
    group = parser.add_argument_group("zero-shot retrieval (flickr30k)")
    group.add_argument("--zero-shot", action="store_true",
                       help="score with a pretrained model's image-text head, no fine-tuning")
    group.add_argument("--run", metavar="PRETRAIN_CKPT",
                       help="a `pipeline pretrain` run directory (its latest checkpoint) or one "
                       "of its checkpoints/step_N")
    group.add_argument("--shards", nargs="+", metavar="FEATS",
                       help="feature shard directories holding the split's images")
    group.add_argument("--batch-size", type=int, default=256,
                       help="caption-image pairs per forward (default 256)")


def run(args: argparse.Namespace) -> int:
    if not args.zero_shot:
        if args.run or args.shards:
            raise EvaluationError("--run and --shards are for --zero-shot")
        return files.run(args)
    if args.benchmark != "flickr30k":
        raise EvaluationError(f"--zero-shot is for flickr30k retrieval, not {args.benchmark}")
    if not args.run or not args.shards:
        raise EvaluationError("--zero-shot needs --run PRETRAIN_CKPT and --shards FEATS")
    from pipeline.evaluate.flickr30k import write_retrieval_predictions
    from pipeline.finetune.zero_shot import zero_shot_matrix

    split = args.split or "test"
    scores, sentids, imgids = zero_shot_matrix(Path(args.run), Path(args.annotations),
                                               args.shards, split, batch_size=args.batch_size)
    with tempfile.TemporaryDirectory(prefix="zero_shot_") as tmp:
        out = Path(args.predictions) if args.predictions else Path(tmp) / "scores.npz"
        write_retrieval_predictions(scores, sentids, imgids, out)
        print(f"zero-shot: {len(sentids)} captions x {len(imgids)} images scored by {args.run}",
              file=sys.stderr)
        return files.run(argparse.Namespace(**{**vars(args), "predictions": str(out),
                                               "split": split}))
