"""`pipeline bench extract | pretrain | model | step | scale | end-to-end`: the benchmarks (each
module says what it measures)."""

from __future__ import annotations

import argparse

from pipeline.bench import model, pretrain, scale, step
from pipeline.common.arguments import Actions
from pipeline.extract.command import add_weights_args

HELP = "benchmarks"
DESCRIPTION = ("Measure extraction, pretraining, model training and end-to-end (detector and "
               "transformer) training speed on this machine.")


EXTRACT_DESCRIPTION = (
    "Time the extractor stage by stage (decode, preprocess, backbone, RPN, RoI head, selection, "
    "write) for each batch size and precision, with host syncs, ops and FLOPs per image, the "
    "share of images the first batched selection pass left to the dense second pass, and the "
    "fallback (the share neither settled, selected one at a time with host syncs); with --ray, "
    "also the Ray engine on the same images, and its overhead against the in-process engine."
)
MODEL_DESCRIPTION = (
    "Time training steps (forward, backward, AdamW) of our model and of the transformers "
    "implementation with the same weights, batch and loss, alternating rounds, and print "
    "samples/s, ms/step, peak GPU memory and the ratio ours / transformers. Also runs as "
    "`python -m pipeline.bench.model` with only torch and transformers installed."
)
STEP_DESCRIPTION = (
    "Time the training step as the trainer runs it (forward, the objective's losses, backward, "
    "clipping, AdamW) for each architecture with its pretraining objective, in variants side by "
    "side: eager float32, autocast or bf16 weights with float32 master weights, captured as a "
    "CUDA graph, compiled layers, and transformers' LXMERT. Prints samples/s, ms and CPU ms per "
    "step, ops, casts and host syncs per step, GFLOP and MFU, and the ratios. Also runs as "
    "`python -m pipeline.bench.step` with only torch and transformers installed."
)
END_TO_END_DESCRIPTION = (
    "Time one training step of VL-BERT with the detector trained end to end (visual.trainable): "
    "the front end's trunk, pooling and res5 on each image's boxes, VL-BERT's pretraining "
    "objective, backward and AdamW over the transformer and res3-res5, on a batch kept on the "
    "device. Prints images/s (median and spread of rounds), ms/step, peak GPU memory (CPU: CPU "
    "ms/step), the front end's share of the step (timed alone on the same batch, and by FLOPs) "
    "and which trunk stages the steps changed. Defaults: on CUDA the real R101 (random weights) "
    "with VL-BERT-base, batches 8 and 16 of 600x800 photos in bf16; on a CPU the bundled world "
    "detector with the tiny VL-BERT, batches 2 and 4."
)


def add_end_to_end_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", choices=["tiny", "paper"],
                        help="tiny: the bundled world detector and VL-BERT tiny; paper: the R101 "
                        "with random weights and VL-BERT-base (default: paper on CUDA, else tiny)")
    parser.add_argument("--batch-sizes", help="comma-separated images per step (default: 8,16 "
                        "paper, 2,4 tiny)")
    parser.add_argument("--image-size", metavar="HxW", help="the synthetic photos' size, resized "
                        "by the detector's preprocessing (default: 600x800 paper, 384x512 tiny)")
    parser.add_argument("--regions", type=int, default=36, help="boxes per image, the whole "
                        "image first (default: 36)")
    parser.add_argument("--tokens", type=int, default=20,
                        help="wordpieces per caption (default: 20)")
    parser.add_argument("--steps", type=int,
                        help="timed steps per round (default: 5 paper, 2 tiny)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default: 5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (default: 2)")
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available)")
    parser.add_argument("--dtype", choices=["float32", "bf16"],
                        help="bf16: autocast on CUDA, as run.bf16 (default: bf16 on CUDA)")
    parser.add_argument("--checkpoint-res5", action="store_true",
                        help="recompute res5 in the backward (visual.checkpoint_res5: memory)")
    parser.add_argument("--pooler", choices=["roi_pool", "roi_align"], default="roi_pool",
                        help="visual.pooler (default: roi_pool, the detector's)")
    parser.add_argument("--seed", type=int, default=0, help="weights and batch seed (default: 0)")
    parser.add_argument("--json", metavar="OUT", help="also write every number to this JSON file")


def add_args(parser: argparse.ArgumentParser) -> None:
    actions = Actions(parser, "bench_verb", metavar="WHAT")
    extract = actions.add("extract", "images/s and time per stage of the extractor",
                          EXTRACT_DESCRIPTION, example="detector.depth=18")
    extract.add_argument("--images", help="folder of images (default: the bundled samples)")
    extract.add_argument("--num-images", type=int, default=16, help="images per setting")
    extract.add_argument("--batch-sizes", default="1,4", help="comma-separated batch sizes")
    extract.add_argument(
        "--precisions", default="fp32", help="comma-separated: fp32, bf16, fp16 (GPU only)"
    )
    add_weights_args(extract)
    extract.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    extract.add_argument(
        "--scores", choices=["random", "peaked", "sparse"], default="random",
        help="with --random-weights: random (near-uniform class scores: selection's slowest path), "
        "peaked (class logits scaled until scores are as confident as a trained detector's) or "
        "sparse (until about 3 in 100 RoIs are: a trained detector on a photo of a few objects)"
    )
    extract.add_argument("--json", metavar="OUT", help="also write every number to this JSON file")
    extract.add_argument(
        "--ray", action="store_true", help="also run the Ray engine (a local Ray; actors, "
        "decoders via --set run.actors=N ...) and report its overhead"
    )
    # pretrain takes --config and --set of its own (a pretraining config, defaulted)
    pretrain.add_args(actions.add("pretrain", "pretraining samples/s and its scaling from 1 to N "
                                  "workers", pretrain.__doc__))
    model.add_args(actions.add("model", "training samples/s of our model against transformers' "
                               "(same weights and work)", MODEL_DESCRIPTION))
    step.add_args(actions.add("step", "training samples/s of the four architectures' step in "
                              "each variant (precision, CUDA graph, compile)", STEP_DESCRIPTION))
    scale.add_args(actions.add("scale", "what listing, planning, extracting and resuming a "
                               "CC3M download cost at growing sizes, on a disk and on S3",
                               scale.DESCRIPTION))
    add_end_to_end_args(actions.add("end-to-end", "images/s of one training step with the "
                                    "detector trained end to end (VL-BERT)",
                                    END_TO_END_DESCRIPTION))


def config(args: argparse.Namespace):
    """`bench extract`'s extraction config (the other benchmarks take flags)."""
    from pipeline.extract.config import resolve_job

    return resolve_job(args.config, args.sets, device=args.device)


def run(args: argparse.Namespace) -> int:
    if args.bench_verb == "extract":
        from pipeline.bench import extract

        return extract.run(args)
    if args.bench_verb == "end-to-end":
        from pipeline.bench import end_to_end

        return end_to_end.run(args)
    return {"pretrain": pretrain.run, "model": model.run, "step": step.run,
            "scale": scale.run}[args.bench_verb](args)
