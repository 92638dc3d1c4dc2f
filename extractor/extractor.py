"""Extractor: prepared images -> RegionFeatures, batched on one device.

A batch is padded at the bottom/right to its largest image; the backbone masks the padding and the
RPN only keeps anchors on each image's own grid, so a batched call returns what one call per image
returns (pinned in tests/test_extractor_batching.py).
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch

from extractor.config import ExtractorConfig
from extractor.detector import BUTDDetector, RoIHeadOutputs, clip_boxes
from extractor.features import RegionFeatures
from extractor.preprocess import PreparedImage
from extractor.selection import select_regions

STAGES = ("prepare", "backbone", "rpn", "roi_head", "selection")


class Extractor:
    """Runs a BUTDDetector over batches of prepared images and selects the saved regions.

    cfg: the extraction config (its `selection` decides the regions; `save_class_probs` whether
        the 1601-way class distribution is returned).
    model: the detector; moved to `device` and put in eval mode.
    autocast_dtype: torch.bfloat16 / torch.float16 to run the CNN under autocast (CUDA), or None
        for float32. Probabilities and boxes are always computed in float32.
    After each call, `last_timings` holds seconds per stage (STAGES): on CUDA from events in the
    device's stream, read once the call's results are on the host (the stages themselves never
    wait for the device), on the CPU from the clock.
    """

    def __init__(
        self,
        cfg: ExtractorConfig,
        model: BUTDDetector,
        device: str | torch.device = "cpu",
        autocast_dtype: torch.dtype | None = None,
    ):
        if model.cfg != cfg.detector:
            raise ValueError(
                f"model built for {model.cfg}, but the extraction config says {cfg.detector}"
            )
        self.cfg = cfg
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        # cuDNN's tensor-core convolutions want NHWC; on CPU the default layout is kept.
        self.memory_format = (
            torch.channels_last if self.device.type == "cuda" else torch.contiguous_format
        )
        self.model.to(memory_format=self.memory_format)
        self.autocast_dtype = autocast_dtype
        mean = torch.tensor(cfg.detector.pixel_mean_bgr, dtype=torch.float32)
        self.pixel_mean = mean.view(3, 1, 1).to(self.device)
        self.last_timings: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self._marks: list[tuple[str, torch.cuda.Event]] = []

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _event(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _begin(self) -> float:
        """The call's start: the clock, and on CUDA the first event."""
        if self.device.type == "cuda":
            self._marks = [("start", self._event())]
        return time.perf_counter()

    def _tick(self, stage: str, start: float) -> float:
        """End `stage` (begun at `start`, the clock): on CUDA an event recorded in the stream,
        read by `_read_marks`; on the CPU the clock, returned as the next stage's start."""
        if self.device.type == "cuda":
            self._marks.append((stage, self._event()))
            return start
        now = time.perf_counter()
        self.last_timings[stage] = now - start
        return now

    def _read_marks(self) -> None:
        """On CUDA, the stages' seconds from consecutive events (the last one has completed once
        the results are on the host; waiting for it costs nothing more)."""
        if self.device.type != "cuda":
            return
        self._marks[-1][1].synchronize()
        for (_, begun), (stage, ended) in zip(self._marks, self._marks[1:]):
            self.last_timings[stage] = begun.elapsed_time(ended) / 1000
        self._marks = []

    def _batch(self, images: list[PreparedImage]) -> torch.Tensor:
        """(N, 3, H, W) mean-subtracted BGR, zero-padded at the bottom/right of each image."""
        height = max(im.pixels.shape[1] for im in images)
        width = max(im.pixels.shape[2] for im in images)
        batch = torch.zeros(len(images), 3, height, width, device=self.device)
        for i, im in enumerate(images):
            _, h, w = im.pixels.shape
            pixels = im.pixels.to(self.device, torch.float32, non_blocking=True)
            batch[i, :, :h, :w] = pixels - self.pixel_mean
        return batch.contiguous(memory_format=self.memory_format)

    @torch.inference_mode()
    def __call__(
        self, images: list[PreparedImage], given_boxes: list[np.ndarray] | None = None
    ) -> list[RegionFeatures]:
        """Regions of each image.

        images: outputs of extractor.preprocess.resize_image (BGR 0-255 pixels (3, h, w), resized,
            not mean-subtracted, with scale_y / scale_x = resized / original and the original size).
        given_boxes: in "given" mode, one (K_i, 4) array per image, x1 y1 x2 y2 in original pixels;
            their features are returned in the same order. None in the other modes.
        """
        given = self.cfg.selection.mode == "given"
        if given != (given_boxes is not None):
            raise ValueError(
                "given_boxes must be passed exactly when cfg.selection.mode == 'given'"
            )
        if given and len(given_boxes) != len(images):
            raise ValueError(f"{len(given_boxes)} box arrays for {len(images)} images")
        if not images:
            return []
        start = self._begin()
        sizes = [(int(im.pixels.shape[1]), int(im.pixels.shape[2])) for im in images]
        # (scale_x, scale_y, scale_x, scale_y) per image maps original pixels to input pixels.
        scales = torch.tensor(
            [(im.scale_x, im.scale_y, im.scale_x, im.scale_y) for im in images],
            dtype=torch.float32,
            device=self.device,
        )
        batch = self._batch(images)
        start = self._tick("prepare", start)

        with self._autocast():
            res4 = self.model.backbone(batch, sizes)
        start = self._tick("backbone", start)

        if given:
            rois = [
                torch.as_tensor(b, dtype=torch.float32, device=self.device).view(-1, 4) * scales[i]
                for i, b in enumerate(given_boxes)
            ]
        else:
            min_sizes = None
            if self.cfg.selection.rpn_filter == "caffe":
                # Caffe's RPN minimum is 16 pixels of the original image: 16 * scale in the input.
                min_size = self.cfg.detector.rpn_min_size
                min_sizes = [(min_size * im.scale_y, min_size * im.scale_x) for im in images]
            with self._autocast():
                rois = self.model.proposal_generator(res4, sizes, min_sizes)
        start = self._tick("rpn", start)

        # Regressed boxes matter only to presets that save them (NMS runs on the saved boxes).
        regress = not given and self.cfg.selection.saved_boxes == "regressed"
        with self._autocast():
            head = self.model.roi_heads(res4, rois, box_deltas=regress)
        start = self._tick("roi_head", start)

        results = self._select(images, rois, head, scales, given_boxes)
        self._tick("selection", start)
        self._read_marks()
        return results

    def _select(
        self,
        images: list[PreparedImage],
        rois: list[torch.Tensor],
        head: RoIHeadOutputs,
        scales: torch.Tensor,
        given_boxes: list[np.ndarray] | None,
    ) -> list[RegionFeatures]:
        """Per-image box selection and assembly of RegionFeatures (all RoIs' math batched)."""
        counts = [len(r) for r in rois]
        all_rois = torch.cat(rois).float()
        cls_probs = torch.softmax(head.cls_logits.float(), dim=1)  # (R, C + 1), background last
        attr_logits = head.attr_logits.float()  # (R, A + 1), "no attribute" last
        if self.cfg.selection.attr_softmax == "with_none":
            attr_probs = torch.softmax(attr_logits, dim=1)[:, :-1]
        else:
            attr_probs = torch.softmax(attr_logits[:, :-1], dim=1)
        attr_conf, attr_ids = attr_probs.max(dim=1)
        roi_scale = torch.repeat_interleave(
            scales, torch.tensor(counts, device=scales.device), dim=0
        )
        regressed = None
        if head.box_deltas is not None:
            regressed = self.model.decode_boxes(head.box_deltas, all_rois)  # (R, C, 4) input px
            regressed = regressed / roi_scale[:, None, :]
        features = head.features.to(torch.float16)

        results = []
        offsets = np.cumsum([0, *counts])
        for i, im in enumerate(images):
            lo, hi = int(offsets[i]), int(offsets[i + 1])
            fg_probs = cls_probs[lo:hi, :-1]
            if given_boxes is None:
                h, w = float(im.orig_height), float(im.orig_width)
                # Proposals are clipped to the input; divided by a float32 scale, an edge at
                # the input's border can land a rounding step outside the original image.
                proposals = clip_boxes(all_rois[lo:hi] / roi_scale[lo:hi], h, w)
                sel = select_regions(
                    proposals,
                    fg_probs,
                    None if regressed is None else clip_boxes(regressed[lo:hi], h, w),
                    self.cfg.selection,
                )
                idx = sel.indices.to(self.device) + lo
                boxes = sel.boxes
                object_ids, object_conf = sel.object_ids, sel.object_conf
            else:
                idx = torch.arange(lo, hi, device=self.device)
                boxes = np.asarray(given_boxes[i], dtype=np.float32).reshape(-1, 4)
                object_conf, object_ids = fg_probs.max(dim=1)
            probs = None
            if self.cfg.save_class_probs:
                # Caffe order: background first, so column k + 1 is object id k.
                p = cls_probs[idx]
                probs = torch.cat((p[:, -1:], p[:, :-1]), dim=1).cpu().numpy()
            results.append(
                RegionFeatures(
                    image_height=int(im.orig_height),
                    image_width=int(im.orig_width),
                    boxes_xyxy_abs=_numpy(boxes, np.float32),
                    object_ids=_numpy(object_ids, np.int64),
                    object_conf=_numpy(object_conf, np.float32),
                    attr_ids=_numpy(attr_ids[idx], np.int64),
                    attr_conf=_numpy(attr_conf[idx], np.float32),
                    features=features[idx].cpu().numpy(),
                    cls_probs=probs,
                )
            )
        return results


def _numpy(x: torch.Tensor | np.ndarray, dtype) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)
