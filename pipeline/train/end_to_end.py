"""Training the detector with the transformer, as VL-BERT does (Su et al. 2020, §3.2 and §4).

With `visual.trainable` the region features are no longer read from the shards: the trainer's
data path decodes each row's image (the shards must hold it: `output.keep_images=true`) and maps
the shard's boxes onto it (pipeline/train/pixels.py), and `EndToEnd` computes the features in the
forward with the detector's own trunk, pooler and res5 head (extractor/front_end.py), so the loss
trains them with the transformer. The wrapped model and the objectives do not change: EndToEnd
hands the model the `features` argument it would have read from the batch.

VL-BERT's choices, our defaults (VisualConfig): given boxes (no RPN), the stem and res2 frozen,
every BatchNorm frozen, one learning rate for all (`lr_multiplier` 1.0), the pixels of a masked
RoI zeroed before the trunk (`mask_pixels`), random horizontal flips of image and boxes
(`flip_prob`; VL-BERT flips with 0.5 where its task allows; 0 by default here, as a flip turns
"left" into "right"). A checkpoint holds the trunk in the model state (exact resume) and the
whole detector as DETECTOR_FILE, which `pipeline extract --weights` re-extracts with.

The trunk starts from `visual.weights`: a detector checkpoint (the one the shards were extracted
with), or VL-BERT's released end-to-end file, whose Fast R-CNN CNN (`image_feature_extractor.*`)
is the trunk and res5 VL-BERT trained with its transformer (both read by
pipeline/extract/detector.py `load_front_end_detector`). Fine-tuning from such a file (`--from
vl-bert-base-e2e.model`) takes its CNN when visual.weights is left empty.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from extractor.canvases import size_multiple
from extractor.config import PreprocessConfig
from extractor.detector import BUTDDetector
from extractor.front_end import VisualFrontEnd, mask_region_pixels
from pipeline.common.config import ConfigError
from pipeline.train.config import VisualConfig
from pipeline.train.pixels import PixelConfig
from shards.schema import Sample


DETECTOR_FILE = "detector.safetensors"


class EndToEnd(nn.Module):
    """`model` with its region features computed by `front_end` in the forward.

    forward(images (S, 3, H, W), image_sizes (S (h, w) pairs), pixel_boxes (S, N, 4), **inputs):
    the first S rows of the batch show those images (rows after them, VL-BERT's text-only rows,
    get no region: zero features); inputs are the model's other arguments. The features of row
    i's regions are the front end's on its pixel boxes, zero where region_mask is 0; with
    mask_pixels the pixels of the rows' `masked_regions` are zeroed first.
    State dict: `front_end.*` (the detector's trunk and res5) and `model.*`.
    """

    def __init__(self, front_end: VisualFrontEnd, model: nn.Module, *, mask_pixels: bool):
        super().__init__()
        self.front_end, self.model, self.mask_pixels = front_end, model, mask_pixels

    def forward(self, *, images: torch.Tensor, image_sizes, pixel_boxes: torch.Tensor,
                **inputs):
        S, N = pixel_boxes.shape[:2]
        rows = inputs["input_ids"].shape[0]
        region_mask, masked = inputs.get("region_mask"), inputs.get("masked_regions")
        boxes = list(pixel_boxes)  # S views (N, 4): no host sync
        if self.mask_pixels and masked is not None:
            images = mask_region_pixels(images, image_sizes, boxes, list(masked[:S]))
        features = self.front_end(images, image_sizes, boxes).view(S, N, -1)  # (S, N, D)
        if region_mask is not None:
            features = features * region_mask[:S, :, None].to(features.dtype)
        if rows > S:  # text-only rows: no region
            features = torch.cat([features, features.new_zeros(rows - S, N, features.shape[-1])])
        return self.model(features=features, **inputs)


def require_images(sample: Sample, shards: str) -> None:
    """ConfigError, before any step, when `sample` (one of a run's shard samples; `shards` names
    their directories) holds no image: the front end trains and predicts on the images."""
    if sample.image_bytes is None:
        raise ConfigError(
            f"visual.trainable trains the detector on the images, but the shards of {shards} hold "
            f"none (sample {sample.key}): extract them again with `pipeline extract ... --set "
            f"output.keep_images=true`, or train on their features (visual.trainable=false)"
        )


def end_to_end(visual: VisualConfig, model: nn.Module, detector: BUTDDetector,
               preprocess: PreprocessConfig, device: torch.device) -> tuple[EndToEnd, PixelConfig]:
    """`model` wrapped with a front end on `detector` (the one the shards were extracted with,
    `preprocess` its extraction's), and how the rows' images join their batches."""
    front_end = VisualFrontEnd(detector, config=visual.front_end_config())
    pixels = PixelConfig(preprocess=preprocess, pixel_mean_bgr=detector.cfg.pixel_mean_bgr,
                         flip_prob=visual.flip_prob,
                         size_multiple=size_multiple(device.type))  # as the Extractor
    return EndToEnd(front_end, model, mask_pixels=visual.mask_pixels), pixels


def train_detector_with(
    visual: VisualConfig, module: nn.Module, sample: Sample, shards: str, device: torch.device,
    load_detector: Callable[[], tuple[BUTDDetector, object]],
) -> tuple[EndToEnd, PixelConfig, Callable[[nn.Module, Path], None]]:
    """`module` with the extraction's detector trained with it: the wrapped module, how the rows'
    images join their batches, and what writes the trained detector beside a checkpoint
    (DETECTOR_FILE in its directory). load_detector(): a fresh (detector, its extraction config)
    at each call (pipeline/extract/detector.py). ConfigError when the shards hold no images
    (`sample`: one of them; `shards` names their directories)."""
    require_images(sample, shards)
    detector, extraction = load_detector()
    wrapped, pixels = end_to_end(visual, module, detector, extraction.preprocess, device)

    def save_detector(module: nn.Module, directory: Path) -> None:
        fresh, _ = load_detector()
        module.front_end.save_as_detector(fresh, directory / DETECTOR_FILE)

    return wrapped, pixels, save_detector
