"""The batch contract between shards and models: Samples -> one padded RegionBatch of tensors.

`collate_regions` is the DataLoader `collate_fn` for ShardDataset / FeatureStore samples
(`functools.partial(collate_regions, max_boxes=36)` to fix its options; it pickles for workers).
What it does to each sample, in order:
- keeps the first `max_boxes` regions: shards store regions best-ranked first;
- divides the boxes by the image's width and height (x1 y1 x2 y2 in [0, 1], clipped), the box
  format every model takes (model/__init__.py);
- pads to the batch's largest region count, or to `pad_to` for fixed shapes, with region_mask 0,
  features, boxes and confidences 0, and object / attribute ids -1 (never a real class);
- casts features (float16 in shards) and class probabilities to float32.

A sample with no regions is legal in a shard (adaptive selection with `min_boxes: 0`, an image
where the detector finds nothing): it collates to a row whose region_mask is all 0. A batch of
only such samples has N = 0 unless `pad_to` is given. Models see a query that may attend to no
region at all, so their masking must not turn such a row into NaN.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from shards.schema import NUM_CLS_PROBS, Sample, SchemaError

# Fills the padding of object_ids and attr_ids: never a class, so a loss can ignore it.
_PAD_IDS = -1


@dataclass(frozen=True, eq=False)
class RegionBatch:
    """B images' regions padded to N, as tensors.

    features         (B, N, D) float32
    boxes_xyxy_norm  (B, N, 4) float32  x1 y1 x2 y2 divided by the image width / height, in [0, 1]
    region_mask      (B, N) long        1 for a real region, 0 for padding
    object_ids       (B, N) long        VG 1600-class id, -1 for padding
    object_conf      (B, N) float32
    attr_ids         (B, N) long        VG 400-attribute id, -1 for padding
    attr_conf        (B, N) float32
    cls_probs        (B, N, 1601) float32, or None unless every sample stored it
    image_hw         (B, 2) long        original image height and width in pixels
    keys             the B sample keys, in batch order
    """

    features: torch.Tensor
    boxes_xyxy_norm: torch.Tensor
    region_mask: torch.Tensor
    object_ids: torch.Tensor
    object_conf: torch.Tensor
    attr_ids: torch.Tensor
    attr_conf: torch.Tensor
    cls_probs: torch.Tensor | None
    image_hw: torch.Tensor
    keys: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.keys)

    def _map(self, fn) -> RegionBatch:
        changes = {
            f.name: fn(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> RegionBatch:
        """A copy with every tensor on `device`."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> RegionBatch:
        """Called by a DataLoader with pin_memory=True."""
        return self._map(lambda t: t.pin_memory())

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """The region arguments of every model's forward: features, boxes, region_mask."""
        return {
            "features": self.features,
            "boxes": self.boxes_xyxy_norm,
            "region_mask": self.region_mask,
        }


def collate_regions(
    samples: Sequence[Sample], *, max_boxes: int | None = None, pad_to: int | None = None,
    features_dtype: torch.dtype = torch.float32,
) -> RegionBatch:
    """One RegionBatch from shard Samples (see the module docstring for what happens to each).

    max_boxes: keep at most this many regions per sample (the first, best-ranked ones).
    pad_to: N of the batch; every sample must fit in it after max_boxes (else ValueError).
    features_dtype: float16 keeps the shards' values as they are stored, for a batch that is
    copied to a GPU and cast there (half the bytes); float32 by default.
    Raises SchemaError (a ValueError) naming the sample key when samples disagree on the feature
    dimension or a sample's arrays disagree with its num_boxes.
    """
    if not samples:
        raise ValueError("collate_regions: no samples")
    if max_boxes is not None and max_boxes < 0:
        raise ValueError(f"max_boxes must be >= 0, got {max_boxes}")
    counts = [_checked_count(s) for s in samples]
    if max_boxes is not None:
        counts = [min(n, max_boxes) for n in counts]
    dims = [s.arrays["features"].shape[1] for s in samples]
    for s, dim in zip(samples, dims):
        if dim != dims[0]:
            raise SchemaError(
                f"{s.key}: feature_dim {dim} differs from {dims[0]} of {samples[0].key}; "
                "samples from different extractions cannot share a batch"
            )
    n_max = max(counts)
    if pad_to is not None:
        if pad_to < n_max:
            key = samples[counts.index(n_max)].key
            raise ValueError(
                f"{key}: {n_max} regions do not fit in pad_to={pad_to}; set max_boxes <= pad_to"
            )
        n_max = pad_to
    batch, dim = len(samples), dims[0]
    with_probs = all("cls_probs" in s.arrays for s in samples)

    # Filled in numpy, in the dtypes the samples store, and handed to torch at the end, which
    # casts whole arrays (vectorised: numpy's float16 conversion is not): a slice assignment in
    # numpy costs about a microsecond, in torch several.
    stored = samples[0].arrays
    shared = None  # the features' tensor, where it is made in shared memory
    if (torch.utils.data.get_worker_info() is not None
            and torch.from_numpy(stored["features"][:0]).dtype == features_dtype):
        # In a DataLoader worker a tensor goes to the training process in shared memory: made
        # there, the batch's features are not copied once more (16 ms for 38 MB of them).
        shared = _shared_zeros((batch, n_max, dim), features_dtype)
        features = shared.numpy()
    else:
        features = np.zeros((batch, n_max, dim), dtype=stored["features"].dtype)
    boxes = np.zeros((batch, n_max, 4), dtype=np.float32)
    mask = np.zeros((batch, n_max), dtype=np.int64)
    object_ids = np.full((batch, n_max), _PAD_IDS, dtype=np.int64)
    attr_ids = np.full((batch, n_max), _PAD_IDS, dtype=np.int64)
    object_conf = np.zeros((batch, n_max), dtype=np.float32)
    attr_conf = np.zeros((batch, n_max), dtype=np.float32)
    cls_probs = (np.zeros((batch, n_max, NUM_CLS_PROBS), dtype=stored["cls_probs"].dtype)
                 if with_probs else None)
    image_hw = np.zeros((batch, 2), dtype=np.int64)

    for i, (s, n) in enumerate(zip(samples, counts)):
        a, height, width = s.arrays, int(s.meta["height"]), int(s.meta["width"])
        image_hw[i] = height, width
        mask[i, :n] = 1
        features[i, :n] = a["features"][:n]
        # Division in float32, so the result is the correctly rounded quotient of the stored box.
        scale = np.array([width, height, width, height], dtype=np.float32)
        boxes[i, :n] = np.clip(a["boxes"][:n].astype(np.float32) / scale, 0.0, 1.0)
        object_ids[i, :n] = a["object_ids"][:n]
        attr_ids[i, :n] = a["attr_ids"][:n]
        object_conf[i, :n] = a["object_conf"][:n]
        attr_conf[i, :n] = a["attr_conf"][:n]
        if cls_probs is not None:
            cls_probs[i, :n] = a["cls_probs"][:n]

    return RegionBatch(
        features=shared if shared is not None else torch.from_numpy(features).to(features_dtype),
        boxes_xyxy_norm=torch.from_numpy(boxes),
        region_mask=torch.from_numpy(mask),
        object_ids=torch.from_numpy(object_ids),
        object_conf=torch.from_numpy(object_conf),
        attr_ids=torch.from_numpy(attr_ids),
        attr_conf=torch.from_numpy(attr_conf),
        cls_probs=None if cls_probs is None else torch.from_numpy(cls_probs).float(),
        image_hw=torch.from_numpy(image_hw),
        keys=tuple(s.key for s in samples),
    )


def _checked_count(sample: Sample) -> int:
    """The sample's num_boxes, after checking its arrays have that many rows (the streaming
    reader does not validate samples, and a silent mismatch would misalign features and boxes)."""
    n = sample.num_boxes
    for name in ("boxes", "features", "object_ids", "object_conf", "attr_ids", "attr_conf"):
        if name not in sample.arrays:
            raise SchemaError(f"{sample.key}: missing array {name!r}")
        if sample.arrays[name].shape[0] != n:
            shape = sample.arrays[name].shape
            raise SchemaError(f"{sample.key}: {name} has shape {shape} but num_boxes is {n}")
    if sample.arrays["features"].ndim != 2:
        shape = sample.arrays["features"].shape
        raise SchemaError(f"{sample.key}: features must be (N, D), got shape {shape}")
    return n


def _shared_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor in shared memory, as DataLoader's own collate makes its batches."""
    storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(int(np.prod(shape)))
    return torch.empty(0, dtype=dtype).new(storage).view(shape).zero_()
