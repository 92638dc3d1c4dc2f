"""`pipeline extract`: a dataset's images -> feature shards (pipeline/extract/job.py does the work)."""

from __future__ import annotations

import argparse

from pipeline.common.arguments import add_config_args
from pipeline.common.ray_session import ADDRESS_HELP
from pipeline.common.config import ConfigError
from pipeline.datasets import READERS, DatasetError
from shards.storage import as_path

HELP = "detect regions and write feature shards"
ON_INTERRUPT = "run the same command again to resume: finished shards are kept"
DESCRIPTION = (
    "Run the bottom-up-attention detector over a dataset's images and write WebDataset shards of "
    "boxes, labels, attributes and region features. Re-running the same command resumes: "
    "finished shards are kept."
)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dataset",
        default="folder",
        choices=sorted(READERS),
        help="dataset reader (default: folder); the layout each expects under --root is in its "
        "reader's docstring (pipeline/datasets/)",
    )
    parser.add_argument(
        "--root", required=True, help="dataset root directory (for --dataset list: the list "
        "file); a path or a URL such as s3://bucket/coco"
    )
    parser.add_argument(
        "--out", required=True, help="output directory for the shards (new, empty, or an earlier "
        "extraction's to resume); a path or a URL such as s3://bucket/feats/coco"
    )
    add_weights_args(parser)
    parser.add_argument(
        "--preset",
        choices=["caffe", "lxmert", "pb-demo", "hf-demo", "vinvl"],
        help="feature convention: caffe (10-100 boxes, default), lxmert (36), pb-demo "
        "(py-bottom-up-attention demo), hf-demo (Hugging Face frcnn-vg-finetuned demo), vinvl "
        "(VinVL's X152-C4, vinvl_vg_x152c4.pth: 10-100 boxes, float32 features)",
    )
    parser.add_argument(
        "--boxes",
        choices=["adaptive", "fixed", "given"],
        help="box selection mode, overriding the preset's",
    )
    parser.add_argument(
        "--given-boxes",
        metavar="FILE",
        help="JSON {image_id: [[x1, y1, x2, y2], ...]} in original pixels, for --boxes given",
    )
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available)")
    parser.add_argument(
        "--strict", action="store_true",
        help="exit non-zero if any image of the output folder failed (this run's or an earlier "
        "one's)"
    )
    group = parser.add_argument_group("engine (may change when a run is resumed)")
    group.add_argument(
        "--engine",
        choices=["ray", "local"],
        help="ray: Ray Data decode tasks and detector actors (default); local: one process",
    )
    group.add_argument(
        "--address", help="Ray cluster to join, e.g. auto or HEAD_IP:6379 (default: start a "
        f"local Ray for this run) {ADDRESS_HELP}"
    )
    group.add_argument(
        "--batch-size", type=int, help="images per detector batch (default 4; features agree "
        "across batch sizes to ~1e-4, bitwise only for the same batch size)"
    )
    group.add_argument(
        "--actors", type=int, help="detector actors (default: one per GPU, else one on the CPUs)"
    )
    group.add_argument(
        "--gpus-per-actor", type=float, help="GPUs per actor, e.g. 0.5 (default: 1 if the "
        "cluster has GPUs, else 0)"
    )
    group.add_argument(
        "--decoders", type=int, help="decode tasks running at once (default: the CPUs the "
        "actors leave)"
    )
    add_config_args(parser, "preprocess.min_size=800")


def add_weights_args(parser: argparse.ArgumentParser) -> None:
    """--weights FILE or --random-weights: a detector is never random unless asked for."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--weights",
        help="detector checkpoint: detectron2 .pkl, Hugging Face pytorch_model.bin or our "
        ".safetensors",
    )
    group.add_argument(
        "--random-weights", action="store_true",
        help="instead, a randomly initialised detector (from run.seed): features that mean "
        "nothing, for tests and timing",
    )


def chosen_weights(args: argparse.Namespace) -> str | None:
    """The --weights file, or None for --random-weights; ConfigError when neither is given."""
    if args.weights is None and not args.random_weights:
        raise ConfigError(
            "no detector weights: pass --weights FILE (a detector checkpoint), or "
            "--random-weights for a random detector whose features mean nothing (tests, timing)"
        )
    return args.weights


def config(args: argparse.Namespace):
    """The extraction config: the preset's, --config, --set, then the flags."""
    from pipeline.extract.config import resolve_job

    return resolve_job(
        args.config, args.sets, args.preset, args.boxes, args.device, engine=args.engine,
        batch_size=args.batch_size, actors=args.actors, gpus_per_actor=args.gpus_per_actor,
        decoders=args.decoders,
    )


def run(args: argparse.Namespace) -> int:
    from pipeline.extract.config import load_given_boxes
    from pipeline.extract.job import extract_dataset
    from pipeline.extract.output import check_output_dir, format_summary

    weights = chosen_weights(args)
    job = config(args)
    given = load_given_boxes(args.given_boxes) if args.given_boxes else None
    check_output_dir(as_path(args.out))
    tally = extract_dataset(
        job, args.dataset, args.root, args.out, weights, given, address=args.address
    )
    # The folder's totals, every run's: --strict fails a re-run of a run that had failures.
    totals = tally.folder
    print(format_summary(tally, as_path(args.out)))
    if totals.failures and not totals.ok:
        raise DatasetError(
            f"no image of {args.root} was extracted: all {totals.failures} failed (the reasons "
            "above)"
        )
    return 1 if (args.strict and totals.failures) else 0
