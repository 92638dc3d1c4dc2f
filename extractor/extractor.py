"""Extractor: prepared images -> RegionFeatures, batched on one device.

A batch is padded at the bottom/right to its largest image; the backbone masks the padding and the
RPN only keeps anchors on each image's own grid, so a batched call returns what one call per image
returns (pinned in tests/test_extractor_batching.py). On a GPU the backbone runs on up to two
canvases, images grouped by shape (extractor.canvases), so that a portrait photo does not pad a
landscape one; their res4 features then share one canvas again for the RPN and the RoI head.

A call waits for the device twice, whatever the batch size: for the RPN's proposal counts and for
the selected regions (extractor.host.fetch). The RPN's NMS and the selection run for the whole
batch on the device (extractor.nms, extractor.batch_selection); an image they cannot settle
exactly is redone alone by the reference path (torchvision's nms, extractor.selection), with the
same result (tests/test_extractor_syncs.py).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from extractor.backbone import fold_frozen_norms
from extractor.batch_selection import SELECTION_PASSES, RegressedBoxes, select_batch, select_dense
from extractor.canvases import canvas_groups, size_multiple
from extractor.config import ExtractorConfig
from extractor.detector import BUTDDetector, RoIHeadOutputs, clip_boxes
from extractor.features import RegionFeatures
from extractor.host import Transfer, fetch, to_device
from extractor.preprocess import DecodedImage, PreparedImage, pad_batch
from extractor.selection import select_regions

STAGES = ("prepare", "backbone", "rpn", "roi_head", "selection")


@dataclass
class PendingBatch:
    """A batch submitted to the device (Extractor.submit), for Extractor.collect.

    transfer: the results' copy to the host (None when there is nothing to copy); head, scales,
    rows: what selecting an image alone needs (the RoI head's outputs; per-image scales; the
    RoIs, probabilities and attributes of the batch, and each image's RoI counts and offsets).
    """

    images: list[PreparedImage]
    given_boxes: list[np.ndarray] | None
    clock: _StageClock
    transfer: Transfer | None = None
    head: RoIHeadOutputs | None = None
    scales: torch.Tensor | None = None
    rows: dict = field(default_factory=dict)
    selection: _SelectionInputs | None = None

    def ready(self) -> None:
        """Blocks until the batch's results are on the host (a host sync); `Extractor.collect`
        then waits for the device only where an image's selection is finished alone."""
        if self.transfer is not None:
            self.transfer.ready()


@dataclass
class _SelectionInputs:
    """What the batched selections read of N images: rois, the batch's RoIs (every image's,
    input pixels); proposals (N, R, 4) in original-image pixels, valid (N, R), rows (N, R) of
    `rois`, fg_probs (N, R, C); scale (N, 1, 2) input / original, height and width (N, 1)."""

    rois: torch.Tensor
    proposals: torch.Tensor
    valid: torch.Tensor
    rows: torch.Tensor
    fg_probs: torch.Tensor
    scale: torch.Tensor
    height: torch.Tensor
    width: torch.Tensor

    def images(self, index: torch.Tensor) -> _SelectionInputs:
        """The inputs of the images `index` (M,) of these."""
        return _SelectionInputs(self.rois, *(getattr(self, f)[index] for f in (
            "proposals", "valid", "rows", "fg_probs", "scale", "height", "width")))


class _StageClock:
    """Seconds per stage (STAGES) of one batch: on CUDA from events in the device's stream, read
    once the batch's results are on the host (the stages never wait for the device), on the CPU
    from the clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.current_stream(device) if self.cuda else None
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.marks: list[tuple[str, torch.cuda.Event]] = []
        self.last = time.perf_counter()
        if self.cuda:
            self.marks.append(("start", self._event()))

    def _event(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return event

    def tick(self, stage: str) -> None:
        """End `stage`: an event in the stream on CUDA, the clock on the CPU."""
        if self.cuda:
            self.marks.append((stage, self._event()))
            return
        now = time.perf_counter()
        self.seconds[stage] = now - self.last
        self.last = now

    def read(self) -> dict[str, float]:
        """The stages' seconds (on CUDA, once the last event has completed)."""
        if self.cuda and len(self.marks) > 1:
            self.marks[-1][1].synchronize()
            for (_, begun), (stage, ended) in zip(self.marks, self.marks[1:]):
                self.seconds[stage] = begun.elapsed_time(ended) / 1000
        return dict(self.seconds)


class Extractor:
    """Runs a BUTDDetector over batches of prepared images and selects the saved regions.

    cfg: the extraction config (its `selection` decides the regions; `save_class_probs` whether
        the 1601-way class distribution is returned).
    model: the detector; moved to `device` and put in eval mode, its frozen BatchNorms folded
        into their convolutions (ConvNorm.fold_norm; the state dict is unchanged).
    autocast_dtype: torch.bfloat16 / torch.float16 to run the CNN under autocast (CUDA), or None
        for float32. Probabilities and boxes are always computed in float32.
    compile_head: torch.compile the RoI head's res5 (compiled at the first call).
    After each call (or `collect`), `last_timings` holds that batch's seconds per stage (STAGES):
    on CUDA from events in the device's stream, read once its results are on the host (the stages
    themselves never wait for the device), on the CPU from the clock.
    """

    def __init__(
        self,
        cfg: ExtractorConfig,
        model: BUTDDetector,
        device: str | torch.device = "cpu",
        autocast_dtype: torch.dtype | None = None,
        compile_head: bool = False,
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
        fold_frozen_norms(self.model)
        # On a GPU, batches are padded to sizes in steps of 16 pixels (size_multiple), so that a
        # bounded set of shapes reaches cuDNN. Padding never changes results (see the module
        # docstring). cuDNN's benchmark mode is left as it is: on an H200 its choices were no
        # faster than the heuristics' (bf16, batch 32: 107 against 110 images/s) and each new
        # shape, such as a batch's RoI count, costs ~0.8 s of trials (docs/performance.md).
        self.pad_multiple = size_multiple(self.device.type)
        # The most canvases a batch's backbone runs on (extractor.canvases). One on the CPU,
        # where a smaller canvas rounds float32 differently and extraction stays as it was.
        self.canvases = 2 if self.device.type == "cuda" else 1
        if compile_head:  # the module's own forward: its state dict keeps its names
            res5 = self.model.roi_heads.res5
            res5.forward = torch.compile(res5.forward)
        self.autocast_dtype = autocast_dtype
        mean = torch.tensor(cfg.detector.pixel_mean_bgr, dtype=torch.float32)
        self.pixel_mean = mean.view(3, 1, 1).to(self.device)
        self.last_timings: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        # Passes of the batched selection's NMS: grown for the next batches where they fell short.
        self.selection_passes = SELECTION_PASSES

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _batch(self, images: list[PreparedImage]) -> torch.Tensor:
        """(N, 3, H, W) mean-subtracted BGR, zero-padded at the bottom/right of each image to a
        size that is a multiple of `pad_multiple`."""
        # uint8 or float32 as given (pinned: the copy does not block), float32 on the device.
        return pad_batch([im.pixels for im in images], self.pixel_mean, self.pad_multiple,
                         self.device, self.memory_format)

    def _backbone(
        self, batches: list[torch.Tensor], groups: list[list[int]], sizes: list[tuple[int, int]]
    ) -> torch.Tensor:
        """res4 of the whole batch from the backbone run once per canvas (`groups` of image
        indices, `batches` their padded pixels): each group's res4, zero outside its images,
        copied into one zero canvas, the largest group's size in each dimension, which is the
        size of the res4 of a single canvas for the whole batch."""
        outs = [self.model.backbone(b, [sizes[i] for i in g]) for b, g in zip(batches, groups)]
        if len(outs) == 1:
            return outs[0]
        height, width = max(o.shape[2] for o in outs), max(o.shape[3] for o in outs)
        res4 = torch.empty(
            len(sizes), outs[0].shape[1], height, width, dtype=outs[0].dtype, device=self.device,
            memory_format=self.memory_format,
        ).zero_()
        for out, group in zip(outs, groups):
            area = res4[:, :, : out.shape[2], : out.shape[3]]
            area.index_copy_(0, to_device(group, self.device), out)
        return res4

    def __call__(
        self,
        images: list[PreparedImage | DecodedImage],
        given_boxes: list[np.ndarray] | None = None,
    ) -> list[RegionFeatures]:
        """Regions of each image: `collect(submit(images, given_boxes))`."""
        return self.collect(self.submit(images, given_boxes))

    @torch.inference_mode()
    def submit(
        self,
        images: list[PreparedImage | DecodedImage],
        given_boxes: list[np.ndarray] | None = None,
    ) -> PendingBatch:
        """Queue a batch on the device and start its results' copy to the host; returns without
        waiting for them (one host sync inside: the RPN's proposal counts). Submitting the next
        batch before collecting this one keeps a GPU busy while the host assembles results.

        images: outputs of extractor.preprocess.resize_image (BGR 0-255 pixels (3, h, w), resized,
            not mean-subtracted, with scale_y / scale_x = resized / original and the original size),
            or DecodedImage, resized here on the device.
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
        clock = _StageClock(self.device)
        if not images:
            return PendingBatch(images, given_boxes, clock)
        # Decoded images are resized here, on the device (timed as part of "prepare").
        images = [im.resized(self.device) if isinstance(im, DecodedImage) else im for im in images]
        sizes = [(int(im.pixels.shape[1]), int(im.pixels.shape[2])) for im in images]
        # (scale_x, scale_y, scale_x, scale_y) per image maps original pixels to input pixels.
        scales = to_device([(im.scale_x, im.scale_y, im.scale_x, im.scale_y) for im in images],
                           self.device, torch.float32)
        groups = canvas_groups(sizes, self.pad_multiple, self.canvases)
        batches = [self._batch([images[i] for i in group]) for group in groups]
        clock.tick("prepare")

        with self._autocast():
            res4 = self._backbone(batches, groups, sizes)
        clock.tick("backbone")

        if given:
            rois = [
                to_device(b, self.device, torch.float32).view(-1, 4) * scales[i]
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
        clock.tick("rpn")

        # Regressed boxes matter only to presets that save them (NMS runs on the saved boxes).
        regress = not given and self.cfg.selection.saved_boxes == "regressed"
        with self._autocast():
            head = self.model.roi_heads(res4, rois, box_deltas=regress)
        clock.tick("roi_head")

        pending = self._select(images, given_boxes, rois, head, scales, clock)
        clock.tick("selection")
        return pending

    @torch.inference_mode()
    def collect(self, pending: PendingBatch) -> list[RegionFeatures]:
        """The regions of a submitted batch (waits for its copy: one host sync); sets
        `last_timings` to its stages."""
        started = time.perf_counter()
        results = self._assemble(pending)
        self.last_timings = pending.clock.read()
        if self.device.type != "cuda":  # the host's part of selection
            self.last_timings["selection"] += time.perf_counter() - started
        return results

    def _select(
        self,
        images: list[PreparedImage],
        given_boxes: list[np.ndarray] | None,
        rois: list[torch.Tensor],
        head: RoIHeadOutputs,
        scales: torch.Tensor,
        clock: _StageClock,
    ) -> PendingBatch:
        """Box selection for the whole batch on the device (extractor.batch_selection), and the
        start of every result's copy to the host."""
        counts = [len(r) for r in rois]
        pending = PendingBatch(images, given_boxes, clock, head=head, scales=scales)
        if not any(counts):
            return pending
        most = max(counts)
        offsets = np.cumsum([0, *counts])
        # (N, R) rows of the concatenated RoIs: each image's, then repeats of a row (not valid).
        padded_rows = np.minimum(np.arange(most)[None, :], np.maximum(counts, 1)[:, None] - 1)
        rows = np.minimum(offsets[:-1, None] + padded_rows, offsets[-1] - 1)
        rows = to_device(rows, self.device)
        valid = to_device(np.arange(most)[None, :] < np.array(counts)[:, None], self.device)
        all_rois = torch.cat(rois).float()
        cls_probs = torch.softmax(head.cls_logits.float(), dim=1)  # (R, C + 1), background last
        attr_conf, attr_ids = self._attributes(head.attr_logits)
        pending.rows = {"counts": counts, "offsets": offsets, "rois": all_rois,
                        "cls_probs": cls_probs, "attr_ids": attr_ids, "attr_conf": attr_conf}

        if given_boxes is None:
            sizes = to_device([(im.orig_height, im.orig_width) for im in images], self.device,
                              torch.float32)
            height, width = sizes[:, :1], sizes[:, 1:]
            scale = scales[:, None, :]
            # Proposals are clipped to the input; divided by a float32 scale, an edge at the
            # input's border can land a rounding step outside the original image.
            proposals = clip_boxes(all_rois[rows] / scale, height, width)

            batch = _SelectionInputs(all_rois, proposals, valid, rows, cls_probs[rows][..., :-1],
                                     scale, height, width)
            sel = select_batch(batch.proposals, batch.valid, batch.fg_probs,
                               self._regressed(batch, head), self.cfg.selection,
                               self.selection_passes)
            picked = rows.gather(1, sel.rows)
            arrays = {"boxes": sel.boxes, "object_ids": sel.object_ids,
                      "object_conf": sel.object_conf, "counts": sel.counts, "exact": sel.exact,
                      "converged": sel.converged}
            pending.selection = batch
        else:
            picked = rows
            object_conf, object_ids = cls_probs[rows][..., :-1].max(dim=2)
            arrays = {"object_ids": object_ids, "object_conf": object_conf}
        pending.transfer = Transfer(arrays | self._picked(pending, picked, arrays["object_ids"]))
        return pending

    def _attributes(self, attr_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(confidence, id) of the best real attribute of logits (..., A + 1), "no attribute"
        last, normalised as cfg.selection.attr_softmax says; a confidence <= attr_thresh is 0."""
        attr_logits = attr_logits.float()
        if self.cfg.selection.attr_softmax == "with_none":
            attr_probs = torch.softmax(attr_logits, dim=-1)[..., :-1]
        else:
            attr_probs = torch.softmax(attr_logits[..., :-1], dim=-1)
        attr_conf, attr_ids = attr_probs.max(dim=-1)
        thresh = self.cfg.selection.attr_thresh
        if thresh > 0:  # VinVL's AttributePostProcessor: scores > thresh, else 0
            attr_conf = torch.where(attr_conf > thresh, attr_conf, 0.0)
        return attr_conf, attr_ids

    def _regressed(self, batch: _SelectionInputs, head: RoIHeadOutputs) -> RegressedBoxes | None:
        """The class-specific regressed boxes of chosen (row, class) pairs of `batch`'s images,
        in original-image pixels (None when the head did not regress them)."""
        if head.box_deltas is None:
            return None

        def regressed(sel_rows: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
            flat = batch.rows.gather(1, sel_rows)
            num_classes = head.box_deltas.shape[1] // 4
            deltas = head.box_deltas.view(-1, num_classes, 4)[flat, classes]
            decoded = self.model.decode_boxes(deltas.reshape(-1, 4), batch.rois[flat].view(-1, 4))
            return clip_boxes(decoded.view(*flat.shape, 4) / batch.scale, batch.height, batch.width)

        return regressed

    def _picked(self, pending: PendingBatch, picked: torch.Tensor,
                object_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The per-region arrays of the chosen rows `picked` (N, K) (or (K,)) of the batch's RoIs,
        saved with the classes `object_ids` of the same shape."""
        batch, head = pending.rows, pending.head
        features = head.features[picked]
        if self.cfg.selection.attr_on_label:  # the attribute head after selection (VinVL)
            logits = self.model.roi_heads.box_predictor.attributes(
                features.reshape(-1, features.shape[-1]), object_ids.reshape(-1))
            attr_conf, attr_ids = self._attributes(logits.view(*object_ids.shape, -1))
        else:
            attr_conf, attr_ids = batch["attr_conf"][picked], batch["attr_ids"][picked]
        dtype = torch.float32 if self.cfg.selection.features_dtype == "float32" else torch.float16
        arrays = {"attr_ids": attr_ids, "attr_conf": attr_conf, "features": features.to(dtype)}
        if self.cfg.save_class_probs:
            # Caffe order: background first, so column k + 1 is object id k.
            arrays["cls_probs"] = _background_first(batch["cls_probs"][picked])
        return arrays

    def _assemble(self, pending: PendingBatch) -> list[RegionFeatures]:
        """RegionFeatures of a submitted batch: its copied results, and the images the batched
        selection could not settle selected alone (extractor.selection)."""
        images, given_boxes = pending.images, pending.given_boxes
        if pending.transfer is None:  # no images, or no RoIs in any
            return [self._regions(im, _empty_arrays(self.cfg, pending.head)) for im in images]
        host = pending.transfer.wait("selected regions")
        if given_boxes is None and not host["converged"].all():
            self.selection_passes += self.selection_passes // 2
        dense = {}
        if given_boxes is None and not host["exact"].all():
            dense = self._select_dense(pending, np.flatnonzero(~host["exact"]))
        counts = pending.rows["counts"]
        results = []
        for i, im in enumerate(images):
            if given_boxes is not None:
                count = counts[i]
                boxes = np.asarray(given_boxes[i], dtype=np.float32).reshape(-1, 4)
                image = {k: v[i, :count] for k, v in host.items()} | {"boxes": boxes[:count]}
                results.append(self._regions(im, image))
            elif host["exact"][i]:
                results.append(self._regions(im, _image(host, i)))
            elif i in dense:
                results.append(self._regions(im, dense[i], selected_by="dense"))
            else:
                results.append(self._select_alone(pending, i))
        return results

    def _select_dense(self, pending: PendingBatch, unsettled: np.ndarray) -> dict[int, dict]:
        """The regions of the batch's images `unsettled` by select_batch, selected together by
        select_dense (one host sync for all of them): {image index: arrays} for each image whose
        NMS converged (the others are left to select_regions)."""
        index = to_device(unsettled, self.device)
        images = pending.selection.images(index)
        sel = select_dense(images.proposals, images.valid, images.fg_probs,
                           self._regressed(images, pending.head), self.cfg.selection,
                           self.selection_passes)
        arrays = {"boxes": sel.boxes, "object_ids": sel.object_ids,
                  "object_conf": sel.object_conf, "counts": sel.counts, "exact": sel.exact}
        host = fetch(arrays | self._picked(pending, images.rows.gather(1, sel.rows),
                                           sel.object_ids),
                     "regions of the images the batched selection left")
        if not host["exact"].all():
            self.selection_passes += self.selection_passes // 2
        return {int(i): _image(host, j) for j, i in enumerate(unsettled) if host["exact"][j]}

    def _select_alone(self, pending: PendingBatch, i: int) -> RegionFeatures:
        """Image i's regions by extractor.selection.select_regions (syncs as it needs)."""
        im, head, batch = pending.images[i], pending.head, pending.rows
        lo, hi = int(batch["offsets"][i]), int(batch["offsets"][i + 1])
        all_rois, scale = batch["rois"], pending.scales[i]
        h, w = float(im.orig_height), float(im.orig_width)
        proposals = clip_boxes(all_rois[lo:hi] / scale, h, w)
        regressed = None
        if head.box_deltas is not None:
            regressed = self.model.decode_boxes(head.box_deltas[lo:hi], all_rois[lo:hi])
            regressed = clip_boxes(regressed / scale[None, None, :], h, w)
        sel = select_regions(proposals, batch["cls_probs"][lo:hi, :-1], regressed,
                             self.cfg.selection)
        arrays = {"boxes": sel.boxes, "object_ids": sel.object_ids,
                  "object_conf": sel.object_conf}
        arrays |= self._picked(pending, sel.indices.to(self.device) + lo,
                               sel.object_ids.to(self.device))
        return self._regions(im, fetch(arrays, "regions of one image"), selected_by="alone")

    def _regions(self, im: PreparedImage, arrays: dict[str, np.ndarray], *,
                 selected_by: str = "batch") -> RegionFeatures:
        return RegionFeatures(
            image_height=int(im.orig_height),
            image_width=int(im.orig_width),
            boxes_xyxy_abs=np.asarray(arrays["boxes"], dtype=np.float32),
            object_ids=np.asarray(arrays["object_ids"], dtype=np.int64),
            object_conf=np.asarray(arrays["object_conf"], dtype=np.float32),
            attr_ids=np.asarray(arrays["attr_ids"], dtype=np.int64),
            attr_conf=np.asarray(arrays["attr_conf"], dtype=np.float32),
            features=np.asarray(arrays["features"]),
            cls_probs=arrays.get("cls_probs"),
            selected_by=selected_by,
        )


def _image(host: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
    """Image i's regions of a batch's selection copied to the host: its first `counts[i]`."""
    count = int(host["counts"][i])
    return {k: v[i, :count] for k, v in host.items() if k not in ("counts", "exact", "converged")}


def _empty_arrays(cfg: ExtractorConfig, head: RoIHeadOutputs) -> dict[str, np.ndarray]:
    """The arrays of an image without regions."""
    arrays = {
        "boxes": np.zeros((0, 4), np.float32),
        "object_ids": np.zeros(0, np.int64),
        "object_conf": np.zeros(0, np.float32),
        "attr_ids": np.zeros(0, np.int64),
        "attr_conf": np.zeros(0, np.float32),
        "features": np.zeros((0, head.features.shape[1]), cfg.selection.features_dtype),
    }
    if cfg.save_class_probs:
        arrays["cls_probs"] = np.zeros((0, head.cls_logits.shape[1]), np.float32)
    return arrays


def _background_first(probs: torch.Tensor) -> torch.Tensor:
    """Class probabilities (..., C + 1) in Caffe's order: background first, so column k + 1 is
    object id k (the model keeps background last)."""
    return torch.cat((probs[..., -1:], probs[..., :-1]), dim=-1)
