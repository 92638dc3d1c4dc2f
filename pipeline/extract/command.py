"""`pipeline extract`: a dataset's images -> feature shards (pipeline/extract/job.py does the work)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.common.arguments import add_config_args
from pipeline.datasets import READERS

HELP = "detect regions and write feature shards"
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
        "--root", required=True, help="dataset root directory (for --dataset list: the list file)"
    )
    parser.add_argument("--out", required=True, help="output directory for the shards")
    parser.add_argument(
        "--weights",
        help="detector checkpoint: detectron2 .pkl, Hugging Face pytorch_model.bin or our "
        ".safetensors (default: random initialisation, for testing only)",
    )
    parser.add_argument(
        "--preset",
        choices=["caffe", "lxmert", "pb-demo", "hf-demo"],
        help="feature convention: caffe (10-100 boxes, default), lxmert (36), pb-demo "
        "(py-bottom-up-attention demo), hf-demo (Hugging Face frcnn-vg-finetuned demo)",
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
        "--strict", action="store_true", help="exit non-zero if any image fails"
    )
    group = parser.add_argument_group("engine (may change when a run is resumed)")
    group.add_argument(
        "--engine",
        choices=["ray", "local"],
        help="ray: Ray Data decode tasks and detector actors (default); local: one process",
    )
    group.add_argument(
        "--address", help="Ray cluster to join, e.g. auto or HEAD_IP:6379 (default: start a "
        "local Ray for this run)"
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
    add_config_args(parser)


def run(args: argparse.Namespace) -> int:
    from pipeline.extract.config import load_given_boxes, resolve_job
    from pipeline.extract.job import extract_dataset
    from pipeline.extract.output import format_summary

    job = resolve_job(
        args.config, args.sets, args.preset, args.boxes, args.device, engine=args.engine,
        batch_size=args.batch_size, actors=args.actors, gpus_per_actor=args.gpus_per_actor,
        decoders=args.decoders,
    )
    given = load_given_boxes(args.given_boxes) if args.given_boxes else None
    tally = extract_dataset(
        job, args.dataset, args.root, args.out, args.weights, given, address=args.address
    )
    print(format_summary(tally, Path(args.out)))
    failures = sum(tally.failed.values())
    if failures:
        print(f"  each image's outcome and error is in its shard's *_status.json under {args.out}")
    return 1 if (args.strict and failures) else 0
