"""Scoring every head as a grounding classifier, one batch at a time (Li et al. 2020, §3).

A *case* is a source in the text and a target box in the image: an entity's phrase and its
ground-truth box (entity grounding), or a word and the box of the entity its dependency arc
links it to (syntactic grounding, grouped by relation). For each head, the case's attention row
over the regions is pooled from its wordpieces by `weights` (cases.py: the mean over the words of
the mean over each word's wordpieces); the head's prediction is the region that gets the most of
it, padded regions excluded, the first on ties; it is right when that region's IoU with the
target box is >= 0.5. The baseline predicts the region the detector is most confident of (the
first on ties), whatever the text. `any_region` counts the cases some region could get right
(the detector's recall, the ceiling of every head).

Memory: a batch's attention maps are reduced to counts here and dropped; a HeadTally holds
(L, heads) counters per group, whatever the number of sentences.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

IOU_THRESHOLD = 0.5
ACTIVE_SHARE = 0.2  # Li et al.: a head is "active" when > 20% of its attention goes to regions


def box_ious(regions: np.ndarray, target: np.ndarray) -> np.ndarray:
    """(N,) float64 IoU of each region [x1, y1, x2, y2] with the target box, in continuous pixel
    coordinates (area (x2 - x1) * (y2 - y1)): the detector's boxes are continuous, and
    entities.py converts the annotations' inclusive pixels to them (xmin - 1, xmax)."""
    regions = np.asarray(regions, dtype=np.float64).reshape(-1, 4)
    t = np.asarray(target, dtype=np.float64)
    w = np.clip(np.minimum(regions[:, 2], t[2]) - np.maximum(regions[:, 0], t[0]), 0, None)
    h = np.clip(np.minimum(regions[:, 3], t[3]) - np.maximum(regions[:, 1], t[1]), 0, None)
    inter = w * h
    area = (regions[:, 2] - regions[:, 0]) * (regions[:, 3] - regions[:, 1])
    union = area + (t[2] - t[0]) * (t[3] - t[1]) - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


@dataclass
class GroupTally:
    """One group's counts: correct (L, heads) per head, image_share (L, heads) summed over the
    cases, count, baseline and any_region."""

    correct: np.ndarray
    image_share: np.ndarray
    count: int = 0
    baseline: int = 0
    any_region: int = 0

    def add(self, correct: torch.Tensor, share: torch.Tensor, baseline: torch.Tensor,
            any_region: torch.Tensor) -> None:
        """Cases (C, L, heads) correct and share, (C,) baseline and any_region."""
        self.correct += correct.sum(0).numpy().astype(np.int64)
        self.image_share += share.sum(0).double().numpy()
        self.count += int(correct.shape[0])
        self.baseline += int(baseline.sum())
        self.any_region += int(any_region.sum())


@dataclass
class HeadTally:
    """The counts of every group ("entity", and one per dependency relation)."""

    layers: tuple[str, ...]
    heads: int
    groups: dict[str, GroupTally] = field(default_factory=dict)

    def group(self, name: str) -> GroupTally:
        if name not in self.groups:
            shape = (len(self.layers), self.heads)
            self.groups[name] = GroupTally(np.zeros(shape, np.int64), np.zeros(shape))
        return self.groups[name]


@dataclass(frozen=True)
class BatchCases:
    """The cases of a batch of B sentences, at most C per sentence (padded).

    weights (B, C, T) float: each case's pooling weights over the text positions (a row sums to
    1; padding rows are 0); hits (B, C, N) bool: regions whose IoU with the case's target is
    >= 0.5 (padded regions false); groups: per sentence, its cases' group names (the padding
    has none); region_mask (B, N) bool: the real regions; most_confident (B,) long: each
    sentence's region of highest detection confidence.
    """

    weights: torch.Tensor
    hits: torch.Tensor
    groups: tuple[tuple[str, ...], ...]
    region_mask: torch.Tensor
    most_confident: torch.Tensor


def head_choices(maps: torch.Tensor, cases: BatchCases) -> tuple[torch.Tensor, torch.Tensor]:
    """(choice (B, C, L, heads) long, share (B, C, L, heads) float) of each head for each case:
    the region it attends to most and the share of its attention that goes to the real regions.
    maps: (B, L, heads, T, N) text -> region attention (attention.py)."""
    pooled = torch.einsum("blhtn,bct->bclhn", maps.float(), cases.weights.float())
    padding = ~cases.region_mask[:, None, None, None, :]  # (B, 1, 1, 1, N)
    # Padded slots are no part of the image: whatever attention the maps give them (a model that
    # masks with a finite bias, or one run without region_mask) is neither the image's share nor
    # a choice. Masked after pooling, which mixes text positions only, never regions.
    share = pooled.masked_fill(padding, 0.0).sum(-1)
    return pooled.masked_fill(padding, float("-inf")).argmax(-1), share


def score_batch(tally: HeadTally, maps: torch.Tensor, cases: BatchCases) -> torch.Tensor:
    """Adds a batch's cases to the tally; returns the choices (B, C, L, heads) (for examples)."""
    choice, share = head_choices(maps, cases)
    B, C, L, H = choice.shape
    hits = cases.hits
    correct = hits.gather(2, choice.reshape(B, C, L * H)).reshape(B, C, L, H)
    rows = torch.arange(B)
    baseline = hits[rows, :, cases.most_confident]  # (B, C)
    any_region = hits.any(-1)  # (B, C)
    for b, names in enumerate(cases.groups):
        for name in sorted(set(names)):
            at = torch.tensor([c for c, n in enumerate(names) if n == name])
            tally.group(name).add(correct[b, at], share[b, at], baseline[b, at],
                                  any_region[b, at])
    return choice
