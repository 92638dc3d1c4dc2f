"""`pipeline bench extract | pretrain | model`: the benchmarks (each module says what it measures)."""

from __future__ import annotations

import argparse

from pipeline.bench import model, pretrain
from pipeline.common.arguments import Actions
from pipeline.extract.command import add_weights_args

HELP = "benchmarks"
DESCRIPTION = "Measure extraction, pretraining and model training speed on this machine."


EXTRACT_DESCRIPTION = (
    "Time the extractor stage by stage (decode, preprocess, backbone, RPN, RoI head, selection, "
    "write) for each batch size and precision; with --ray, also the Ray engine on the same "
    "images, and its overhead against the in-process engine."
)
MODEL_DESCRIPTION = (
    "Time training steps (forward, backward, AdamW) of our model and of the transformers "
    "implementation with the same weights, batch and loss, alternating rounds, and print "
    "samples/s, ms/step, peak GPU memory and the ratio ours / transformers. Also runs as "
    "`python -m pipeline.bench.model` with only torch and transformers installed."
)


def add_args(parser: argparse.ArgumentParser) -> None:
    actions = Actions(parser, "bench_verb", metavar="WHAT")
    extract = actions.add("extract", "images/s and time per stage of the extractor",
                          EXTRACT_DESCRIPTION)
    extract.add_argument("--images", help="folder of images (default: the bundled samples)")
    extract.add_argument("--num-images", type=int, default=16, help="images per setting")
    extract.add_argument("--batch-sizes", default="1,4", help="comma-separated batch sizes")
    extract.add_argument(
        "--precisions", default="fp32", help="comma-separated: fp32, bf16, fp16 (GPU only)"
    )
    add_weights_args(extract)
    extract.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    extract.add_argument(
        "--scores", choices=["random", "peaked"], default="random",
        help="with --random-weights: random (near-uniform class scores: selection's slowest path) "
        "or peaked (class logits scaled until scores are as confident as a trained detector's)"
    )
    extract.add_argument("--json", metavar="OUT", help="also write every number to this JSON file")
    extract.add_argument(
        "--ray", action="store_true", help="also run the Ray engine (a local Ray; actors, "
        "decoders via --set run.actors=N ...) and report its overhead"
    )
    # pretrain takes --config and --set of its own (a pretraining config, defaulted)
    pretrain.add_args(actions.add("pretrain", "pretraining samples/s and its scaling from 1 to N "
                                  "workers", pretrain.__doc__, config=False))
    model.add_args(actions.add("model", "training samples/s of our model against transformers' "
                               "(same weights and work)", MODEL_DESCRIPTION, config=False))


def run(args: argparse.Namespace) -> int:
    if args.bench_verb == "extract":
        from pipeline.bench import extract

        return extract.run(args)
    return {"pretrain": pretrain.run, "model": model.run}[args.bench_verb](args)
