"""`pipeline show`: one extracted sample's regions drawn on its image (pipeline/extract/show.py)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from pipeline.common.arguments import add_config_args
from pipeline.common.config import resolve

HELP = "draw one extracted sample's boxes and labels on its image"
DESCRIPTION = (
    "Draw the regions of one sample of a shard set on its image and save the picture, to check "
    "an extraction by eye: each box in its own colour, labelled with its top attribute (named "
    "above --set min_attr_conf=X, default 0.1), object name and confidence, most confident "
    "first. The image is the one stored in the sample (output.keep_images), else the dataset's "
    "file: the dataset and root recorded in DIR/extract_config.yaml, or the root given by --root."
)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shards", required=True, metavar="DIR", help="shard directory")
    parser.add_argument(
        "--key",
        required=True,
        help="sample key, {dataset}-{escaped image id}, e.g. folder-cat_01 (an unknown key "
        "lists the closest ones)",
    )
    parser.add_argument(
        "--out", required=True, metavar="FILE", help="picture to write, e.g. look.png"
    )
    parser.add_argument(
        "--root", metavar="DIR", help="dataset root, replacing the recorded one (images moved)"
    )
    parser.add_argument(
        "--max-boxes",
        type=int,
        metavar="N",
        help="draw at most N boxes, the most confident (default: 36)",
    )
    parser.add_argument(
        "--min-conf",
        type=float,
        metavar="X",
        help="leave out boxes with object confidence below X (default: 0)",
    )
    parser.add_argument(
        "--labelmap", metavar="FILE", help="the label map naming the ids of shards extracted "
        "with --preset vinvl: VinVL's VG-SGG-dicts-vgoi6-clipped.json"
    )
    add_config_args(parser, "max_boxes=10")


def config(args: argparse.Namespace):
    """The drawing settings: --config, --set, then --max-boxes and --min-conf."""
    from pipeline.extract.show import ShowConfig

    cfg = resolve(ShowConfig(), args.config, args.sets)
    flags = {"max_boxes": args.max_boxes, "min_conf": args.min_conf}
    return dataclasses.replace(cfg, **{k: v for k, v in flags.items() if v is not None})


def run(args: argparse.Namespace) -> int:
    from pipeline.extract.show import ShowError, show_sample

    cfg = config(args)
    try:
        names = None
        if args.labelmap:
            from extractor.labels import labelmap_names

            try:
                names = labelmap_names(args.labelmap)
            except ValueError as err:
                raise ShowError(str(err)) from None
        print(show_sample(Path(args.shards), args.key, Path(args.out), args.root, cfg, names))
    except ShowError as err:
        print(f"pipeline show: {err}", file=sys.stderr)
        return 2
    return 0
