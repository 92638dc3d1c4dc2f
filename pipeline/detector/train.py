"""Training the bottom-up-attention detector on Visual Genome-format data.

Reads `DATA/vg/image_data.json`, `attributes.json` and the images in `VG_100K*/`; the held-out
split is the Visual Genome images whose `coco_id` is a COCO val2014 image
(`DATA/coco/annotations/instances_val2014.json`), everything else trains. Object and attribute
names become ids of the VG vocabulary (`extractor/labels.py`: id = line index). The losses and
the batch layout are the library's (extractor/training.py); this module reads the data, cuts the
batches and runs the optimiser.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from extractor.config import DetectorConfig, PreprocessConfig, SelectionConfig
from extractor.detector import BUTDDetector
from extractor.labels import attribute_names, object_names
from extractor.preprocess import PreparedImage, decode_image, resize_image
from extractor.training import (
    LOSS_NAMES,
    DetectorLossConfig,
    detector_losses,
    freeze_batchnorm,
    init_detector,
    make_batch,
    unfreeze_batchnorm,
)
from pipeline.common.config import ConfigError
from pipeline.common.progress import progress_bar
from pipeline.world.scene import COLORS

# The world's objects are 20-94 px in 180-340 px images, and the ground the whole image: images
# upscaled to a 384 px short side (about 1.1-2.1x; at 256 px, colour accuracy was 0.44 and mAP
# 0.52), anchors 24-384 px on the stride-16 grid, a narrow ResNet-18 for CPU training, RoI
# samples half foreground. Measured (docs/results.md): mAP@0.5 0.87 over shapes and grounds, colour 0.90.
WORLD_DETECTOR = DetectorConfig(
    depth=18,
    width=8,
    rpn_hidden=64,
    anchor_sizes=(24, 48, 96, 192, 384),
    rpn_pre_nms_topk=600,
    rpn_post_nms_topk=200,
    rpn_min_size=8.0,
    pooler_resolution=7,
    res5_dilation=1,
    attr_embed_dim=32,
    attr_hidden=128,
)
WORLD_PREPROCESS = PreprocessConfig(min_size=384, max_size=768)
WORLD_LOSSES = DetectorLossConfig(rois_per_image=32, roi_positive_fraction=0.5)
EVAL_SELECTION = SelectionConfig(
    mode="adaptive",
    min_boxes=0,
    max_boxes=100,
    score_thresh=0.05,
    nms_thresh=0.5,
    saved_boxes="regressed",
    rank="detection",
)


@dataclass(frozen=True)
class DetectorOptimConfig:
    """AdamW with linear warmup then cosine decay to zero over `steps` steps of `batch_size`
    images. Weight decay applies to conv and linear weights, not to norms or biases.

    steps: optimiser steps of the whole run. batch_size: images per step, of similar aspect
    ratios. lr: the peak learning rate, reached at the end of the warmup. weight_decay: AdamW's
    decoupled weight decay of the conv and linear weights. warmup_steps: steps of the linear
    warmup from 0 to lr. grad_clip: max global L2 norm of the gradients, clipped at every step.
    hflip: flip each training image horizontally with its boxes, with probability 0.5.
    """

    steps: int = 2000
    batch_size: int = 4
    lr: float = 5e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 50
    grad_clip: float = 10.0
    hflip: bool = True


@dataclass(frozen=True)
class DetectorTrainConfig:
    """detector / preprocess: the trained model and its input (saved with the checkpoint).
    losses: sampling and loss settings. optim: the optimiser and schedule. eval_selection: the
    box selection used for evaluation. eval_batch_size: images per extractor call. log_every:
    steps between loss lines. checkpoint_every: steps between checkpoints (`--resume` continues
    from the latest exactly). seed: model initialisation, data order, flips and sampling.
    device: "auto", "cpu", "cuda" (overridden by --device). scored_attributes: the attribute
    group that attribute accuracy scores (the argmax over these only; each ground-truth object's
    first attribute among them is its label): by default the ten colours the world paints with."""

    detector: DetectorConfig = WORLD_DETECTOR
    preprocess: PreprocessConfig = WORLD_PREPROCESS
    losses: DetectorLossConfig = WORLD_LOSSES
    optim: DetectorOptimConfig = field(default_factory=DetectorOptimConfig)
    eval_selection: SelectionConfig = EVAL_SELECTION
    eval_batch_size: int = 8
    log_every: int = 50
    checkpoint_every: int = 50
    seed: int = 0
    device: str = "auto"
    scored_attributes: tuple[str, ...] = COLORS

    def __post_init__(self) -> None:
        for name in ("eval_batch_size", "log_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)}: must be positive")


@dataclass
class AnnotatedImage:
    """One Visual Genome image: file, boxes (G, 4) xyxy pixels, object ids (G,), attribute ids
    (G, K) padded with -1, and the scored attribute id of each object (-1 if none)."""

    image_id: int
    path: Path
    height: int
    width: int
    boxes_xyxy: np.ndarray
    classes: np.ndarray
    attributes: np.ndarray
    colors: np.ndarray


def _vocabulary(names: tuple[str, ...]) -> dict[str, int]:
    return {name: i for i, name in enumerate(names)}


def _image_path(vg_dir: Path, entry: dict) -> Path:
    """The image file: the folder named in the url (VG_100K or VG_100K_2), else whichever has it."""
    name = f"{entry['image_id']}.jpg"
    folders = [entry.get("url", "").rstrip("/").split("/")[-2:-1], ["VG_100K"], ["VG_100K_2"]]
    for folder in folders:
        if folder and (vg_dir / folder[0] / name).is_file():
            return vg_dir / folder[0] / name
    raise ConfigError(f"image {entry['image_id']} not found in {vg_dir}/VG_100K*/")


def load_visual_genome(
    data: Path, scored_attributes: tuple[str, ...] = COLORS
) -> tuple[list[AnnotatedImage], list[AnnotatedImage]]:
    """(train, held-out) images of a Visual Genome-format root; held out = coco_id in val2014.
    An object's `colors` entry is its first attribute among `scored_attributes` (-1: none)."""
    vg_dir = data / "vg"
    for name in ("image_data.json", "attributes.json"):
        if not (vg_dir / name).is_file():
            raise ConfigError(f"{vg_dir / name} not found: --data must hold vg/ (e.g. a world)")
    val_file = data / "coco" / "annotations" / "instances_val2014.json"
    if not val_file.is_file():
        raise ConfigError(f"{val_file} not found: it defines the held-out images")
    val_ids = {im["id"] for im in json.loads(val_file.read_text())["images"]}
    entries = json.loads((vg_dir / "image_data.json").read_text())
    annotations = json.loads((vg_dir / "attributes.json").read_text())
    objects = {a["image_id"]: a["attributes"] for a in annotations}
    object_ids, attr_ids = _vocabulary(object_names()), _vocabulary(attribute_names())
    colors = {attr_ids[c] for c in scored_attributes}
    train, held_out = [], []
    for entry in entries:
        objs = objects.get(entry["image_id"], [])
        unknown = [o["names"][0] for o in objs if o["names"][0] not in object_ids]
        unknown += [a for o in objs for a in o.get("attributes", []) if a not in attr_ids]
        if unknown:
            raise ConfigError(
                f"image {entry['image_id']}: names not in the VG vocabulary: {unknown}"
            )
        width = max([len(o.get("attributes", [])) for o in objs] + [1])
        attributes = np.full((len(objs), width), -1, dtype=np.int64)
        for i, o in enumerate(objs):
            ids = [attr_ids[a] for a in o.get("attributes", [])]
            attributes[i, : len(ids)] = ids
        image = AnnotatedImage(
            image_id=entry["image_id"],
            path=_image_path(vg_dir, entry),
            height=int(entry["height"]),
            width=int(entry["width"]),
            boxes_xyxy=np.array(
                [[o["x"], o["y"], o["x"] + o["w"], o["y"] + o["h"]] for o in objs], np.float32
            ).reshape(-1, 4),
            classes=np.array([object_ids[o["names"][0]] for o in objs], dtype=np.int64),
            attributes=attributes,
            colors=np.array(
                [next((a for a in row if a in colors), -1) for row in attributes.tolist()],
                dtype=np.int64,
            ),
        )
        (held_out if entry.get("coco_id") in val_ids else train).append(image)
    return train, held_out


def load_bgr(image: AnnotatedImage, preprocess: PreprocessConfig) -> np.ndarray:
    return decode_image(image.path.read_bytes(), str(image.path), preprocess)


def _aspect_grouped_order(
    images: list[AnnotatedImage], size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """One epoch's batches of `size` images with similar aspect ratios, in random order.

    Images are sorted by log aspect ratio plus a little noise (so neighbours change between
    epochs) and cut into consecutive batches; a trailing partial batch is dropped.
    """
    log_ratio = np.log([im.width / im.height for im in images])
    order = np.argsort(log_ratio + rng.normal(0.0, 0.05, len(images)))
    batches = [order[i : i + size] for i in range(0, len(order) - size + 1, size)]
    return [batches[k] for k in rng.permutation(len(batches))]


def _area(boxes: np.ndarray) -> np.ndarray:
    return np.clip(boxes[:, 2] - boxes[:, 0], 0, None) * np.clip(boxes[:, 3] - boxes[:, 1], 0, None)


def _crop(
    image: PreparedImage, boxes: np.ndarray, height: int, width: int, rng: np.random.Generator
) -> tuple[PreparedImage, np.ndarray, np.ndarray]:
    """A random (height, width) window of a prepared image; which of its boxes (original pixels)
    to keep (those keeping at least half their area); all boxes clipped to the window, in the
    window's original-pixel coordinates."""
    _, h, w = image.pixels.shape
    y0, x0 = int(rng.integers(h - height + 1)), int(rng.integers(w - width + 1))
    window = np.array(
        [x0 / image.scale_x, y0 / image.scale_y, (x0 + width) / image.scale_x,
         (y0 + height) / image.scale_y],
        dtype=np.float32,
    )
    clipped = np.concatenate(
        (np.maximum(boxes[:, :2], window[:2]), np.minimum(boxes[:, 2:], window[2:])), axis=1
    )
    keep = _area(clipped) >= 0.5 * _area(boxes)
    cropped = replace(image, pixels=image.pixels[:, y0 : y0 + height, x0 : x0 + width])
    return cropped, keep, clipped - np.tile(window[:2], 2)


class TrainingBatches:
    """Endless batches: per epoch, images of similar aspect ratio grouped (seeded), random
    horizontal flips, and each batch cropped to its smallest image's size. `state()` /
    `load(state)`: where it stands (its generator, the epoch's order, the next batch), for a
    checkpoint.

    After the resize every image of a group has nearly the same size, so the crop removes only a
    few pixels, and a batch needs no padding: a mixed batch of portrait and landscape images
    would be about half padding, and padding costs the backbone masked normalisation too
    (measured: 2x slower steps).
    """

    def __init__(self, images: list[AnnotatedImage], cfg: DetectorTrainConfig) -> None:
        if len(images) < cfg.optim.batch_size:
            raise ConfigError(f"{len(images)} training images, fewer than optim.batch_size "
                              f"{cfg.optim.batch_size}")
        self.images, self.cfg = images, cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.order: list[np.ndarray] = []
        self.position = 0

    def __iter__(self) -> TrainingBatches:
        return self

    def state(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "position": self.position,
                "order": [group.tolist() for group in self.order]}

    def load(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.position = state["position"]
        self.order = [np.asarray(group, dtype=np.int64) for group in state["order"]]

    def __next__(self):
        cfg, images, rng = self.cfg, self.images, self.rng
        if self.position == len(self.order):
            self.order = _aspect_grouped_order(images, cfg.optim.batch_size, rng)
            self.position = 0
        group = self.order[self.position]
        self.position += 1
        prepared, boxes = [], []
        for k in group:
            image = images[k]
            bgr = load_bgr(image, cfg.preprocess)
            box = image.boxes_xyxy.copy()
            if cfg.optim.hflip and rng.random() < 0.5:
                bgr = np.ascontiguousarray(bgr[:, ::-1])
                box[:, [0, 2]] = bgr.shape[1] - box[:, [2, 0]]
            prepared.append(resize_image(bgr, cfg.preprocess))
            boxes.append(box)
        height = min(p.pixels.shape[1] for p in prepared)
        width = min(p.pixels.shape[2] for p in prepared)
        cropped, kept_boxes, classes, attributes = [], [], [], []
        for k, p, box in zip(group, prepared, boxes):
            p, keep, box = _crop(p, box, height, width, rng)
            cropped.append(p)
            kept_boxes.append(box[keep])
            classes.append(images[k].classes[keep])
            attributes.append(images[k].attributes[keep])
        return make_batch(cropped, kept_boxes, classes, attributes, cfg.detector)


def _optimizer(model: torch.nn.Module, optim: DetectorOptimConfig) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": optim.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=optim.lr)


def learning_rate(step: int, optim: DetectorOptimConfig) -> float:
    """Linear warmup from 0 over warmup_steps, then cosine decay to 0 at `steps`."""
    if step < optim.warmup_steps:
        return optim.lr * (step + 1) / optim.warmup_steps
    progress = (step - optim.warmup_steps) / max(1, optim.steps - optim.warmup_steps)
    return optim.lr * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


CHECKPOINT = "checkpoint.pt"


def checkpoint_step(path: Path) -> int | None:
    """The step a detector training checkpoint was written at, or None when there is none."""
    if not path.is_file():
        return None
    # mmap: the step without reading the weights and optimizer state into memory
    return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"])


def train_detector(
    images: list[AnnotatedImage], cfg: DetectorTrainConfig, device: torch.device,
    checkpoint: Path | None = None, resume: bool = False,
) -> tuple[BUTDDetector, list[dict[str, float]]]:
    """Train from scratch, or (`resume`) from `checkpoint` where an earlier run wrote one;
    returns the model (frozen norms, eval mode) and the logged losses. With `checkpoint`, the
    state is written there every cfg.checkpoint_every steps and at the end (replaced
    atomically): a resumed run repeats the uninterrupted one's steps exactly."""
    torch.manual_seed(cfg.seed)
    model = BUTDDetector(cfg.detector)
    init_detector(model, torch.Generator().manual_seed(cfg.seed))
    model = unfreeze_batchnorm(model).to(device).train()
    optimizer = _optimizer(model, cfg.optim)
    sampler = torch.Generator().manual_seed(cfg.seed + 1)
    batches = TrainingBatches(images, cfg)
    log, window, start = [], {name: 0.0 for name in LOSS_NAMES}, 0
    if resume and checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        sampler.set_state(state["sampler"])
        batches.load(state["batches"])
        log, window, start = state["log"], state["window"], state["step"]
        print(f"resumed from {checkpoint} (step {start})")

    def save(step: int) -> None:
        tmp = checkpoint.with_suffix(".tmp")
        torch.save({"step": step, "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(), "sampler": sampler.get_state(),
                    "batches": batches.state(), "log": log, "window": window}, tmp)
        tmp.replace(checkpoint)

    progress = progress_bar(range(start, cfg.optim.steps), desc="detector train", unit="step",
                            initial=start, total=cfg.optim.steps)
    with progress:  # an error or Ctrl-C leaves the bar closed, its line ended
        for step in progress:
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, cfg.optim)
            losses = detector_losses(model, next(batches).to(device), cfg.losses, sampler)
            total = sum(losses.values())
            if not torch.isfinite(total):
                raise FloatingPointError(f"step {step}: non-finite loss {losses}")
            optimizer.zero_grad(set_to_none=True)
            total.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
            optimizer.step()
            for name in LOSS_NAMES:
                window[name] += losses[name].detach().item()
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.optim.steps:
                count = (step % cfg.log_every) + 1
                entry = {"step": step + 1, **{k: v / count for k, v in window.items()}}
                log.append(entry)
                progress.write(
                    f"step {step + 1}: "
                    + " ".join(f"{k} {v:.3f}" for k, v in entry.items() if k != "step")
                )
                window = {name: 0.0 for name in LOSS_NAMES}
            done = step + 1
            if checkpoint is not None and (done % cfg.checkpoint_every == 0
                                           or done == cfg.optim.steps):
                save(done)
    return freeze_batchnorm(model).eval(), log
