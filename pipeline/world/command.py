"""`pipeline world generate`: a deterministic synthetic world in the real datasets' formats."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from pipeline.common.arguments import Actions
from pipeline.common.config import resolve

HELP = "the synthetic world: images and annotations in real formats"
ON_INTERRUPT = "nothing was written; run the same command again"
DESCRIPTION = "Generate the synthetic world the project tests, benchmarks and demonstrates on."


GENERATE_HELP = (
    "generate scenes and write them as COCO, Visual Genome, VQA, GQA, NLVR2, CC3M, VCR, "
    "RefCOCO+, Flickr30K and Flickr30K Entities files"
)
GENERATE_DESCRIPTION = (
    "Generate a deterministic world of rendered scenes with ground truth, captions and "
    "questions, written in the official layouts of COCO, Visual Genome, VQA v2, GQA, NLVR2, "
    "CC3M (img2dataset shards), VCR, RefCOCO+ (refer), Flickr30K (Karpathy's split) and "
    "Flickr30K Entities, with gold dependency parses of the Flickr30K captions."
)


def add_args(parser: argparse.ArgumentParser) -> None:
    generate = Actions(parser, "world_verb").add("generate", GENERATE_HELP, GENERATE_DESCRIPTION,
                                                example="min_objects=2")
    generate.add_argument("--out", required=True, help="output directory")
    generate.add_argument("--images", type=int, help="number of COCO/Visual Genome scenes")
    generate.add_argument("--seed", type=int, help="random seed (same seed, same bytes)")


def config(args: argparse.Namespace):
    """The world's settings: --config, --set, then --images and --seed."""
    from pipeline.world.generate import WorldConfig

    cfg = resolve(WorldConfig(), args.config, args.sets)
    overrides = {k: v for k, v in (("images", args.images), ("seed", args.seed)) if v is not None}
    return dataclasses.replace(cfg, **overrides)


def run(args: argparse.Namespace) -> int:
    from pipeline.world.generate import format_summary, generate_world

    cfg = config(args)
    out = Path(args.out)
    start = time.perf_counter()
    try:
        world = generate_world(cfg, out)
    except FileExistsError as err:
        print(f"pipeline world generate: {err}; choose a new --out", file=sys.stderr)
        return 2
    print(format_summary(world, time.perf_counter() - start, out))
    return 0
