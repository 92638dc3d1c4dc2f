"""`pipeline detector train`: train the detector on Visual Genome-format data, measure it on the
held-out images and save a checkpoint `pipeline extract` loads.

Writes to `--out`: checkpoint.pt (the training state every `checkpoint_every` steps and at the
end: `--resume` continues from it exactly), detector.safetensors (our checkpoint format),
detector_config.yaml (the `detector` and `preprocess` sections, usable as `pipeline extract
--config`), train_config.yaml (the resolved training config) and metrics.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml

from pipeline.common.arguments import Actions
from pipeline.common.config import ConfigError, resolve, to_dict

HELP = "train the region detector (and measure it on held-out images)"
ON_INTERRUPT = ("run the same command with --resume to continue from the last checkpoint "
                "(from step 0 if none was written yet)")
DESCRIPTION = "Train the bottom-up-attention detector and measure it."


TRAIN_HELP = "train the bottom-up-attention detector on Visual Genome-format ground truth"
TRAIN_DESCRIPTION = (
    "Train the detector (RPN, box classifier/regressor, attribute head) on a Visual Genome-format "
    "dataset (e.g. a generated world), report mAP@0.5 and attribute accuracy on the held-out "
    "images, and save a checkpoint `pipeline extract` loads."
)


def add_args(parser: argparse.ArgumentParser) -> None:
    train = Actions(parser, "detector_verb").add("train", TRAIN_HELP, TRAIN_DESCRIPTION,
                                                   example="optim.steps=200")
    train.add_argument("--data", required=True, help="dataset root (a generated world)")
    train.add_argument("--out", required=True, help="output directory for the checkpoint and metrics")
    train.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    train.add_argument("--resume", action="store_true",
                       help="continue from --out's checkpoint.pt (the steps after it repeat what "
                       "the uninterrupted run would have done)")


def config(args: argparse.Namespace):
    from pipeline.detector.train import DetectorTrainConfig

    return resolve(DetectorTrainConfig(), args.config, args.sets)


def run(args: argparse.Namespace) -> int:
    import torch

    from extractor.weights import save_detector
    from pipeline.common.devices import pick_device
    from pipeline.detector.evaluation import evaluate_detector
    from pipeline.detector.train import (
        CHECKPOINT,
        checkpoint_step,
        load_visual_genome,
        train_detector,
    )

    cfg = config(args)
    device = pick_device(args.device or cfg.device)
    out = Path(args.out)
    found = checkpoint_step(out / CHECKPOINT)
    if found is not None and not args.resume:
        raise ConfigError(f"--out {out} holds the checkpoint of an earlier run (step {found}): "
                          "add --resume to continue it, or choose another --out")
    train, held_out = load_visual_genome(Path(args.data), cfg.scored_attributes)
    if not train or not held_out:
        raise ConfigError(
            f"{args.data}: {len(train)} training and {len(held_out)} held-out images; need both"
        )
    out.mkdir(parents=True, exist_ok=True)  # after the data's checks: a refused run leaves none
    print(f"{len(train)} training images, {len(held_out)} held out (COCO val2014), on {device}")
    (out / "train_config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))

    first = found if args.resume and found is not None else 0
    start = time.perf_counter()
    model, log = train_detector(train, cfg, device, checkpoint=out / CHECKPOINT,
                                resume=args.resume)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    metrics = evaluate_detector(model, held_out, cfg, device)
    eval_seconds = time.perf_counter() - start

    metrics.update(
        train_seconds=round(train_seconds, 1),
        eval_seconds=round(eval_seconds, 1),
        train_images=len(train),
        steps=cfg.optim.steps,
        # train_seconds is this command's: the steps after the checkpoint it resumed from
        resumed_from_step=first,
        torch_threads=torch.get_num_threads(),
        device=str(device),
        final_losses=log[-1] if log else {},
    )
    save_detector(
        model,
        out / "detector.safetensors",
        cfg.detector,
        {"trained_on": str(args.data), "map50": f"{metrics['map50']:.4f}",
         "color_accuracy": f"{metrics['color_accuracy']:.4f}"},
    )
    detector_yaml = {"detector": to_dict(cfg.detector), "preprocess": to_dict(cfg.preprocess)}
    (out / "detector_config.yaml").write_text(yaml.safe_dump(detector_yaml, sort_keys=False))
    (out / "metrics.json").write_text(json.dumps({**metrics, "loss_log": log}, indent=2) + "\n")
    print(
        f"mAP@0.5 {metrics['map50']:.4f}, colour accuracy {metrics['color_accuracy']:.4f} "
        f"({metrics['true_positives']} true positives) on {len(held_out)} held-out images; "
        f"training {train_seconds:.0f} s ({cfg.optim.steps - first} steps"
        f"{f', resumed at step {first}' if first else ''}), evaluation {eval_seconds:.0f} s"
    )
    for name, ap in sorted(metrics["ap50_per_class"].items()):
        print(f"  AP@0.5 {name:10s} {ap:.4f}")
    print(f"wrote {out / 'detector.safetensors'}, detector_config.yaml, metrics.json")
    return 0
