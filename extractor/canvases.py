"""Which images of a batch share a padded canvas in the backbone.

A batch padded to one canvas spends the backbone's work on padding wherever its images differ in
shape: a portrait photo next to a landscape one (600x800 and 800x600 at 600/1000) pads both to
800x800, a third of the pixels wasted. Images grouped by shape, each group on its own canvas,
waste less; the backbone then runs once per group. The padding never changes an image's
features (the backbone masks it), so the grouping is free to choose.

`canvas_groups` splits a batch into at most `most` groups, each split the one that saves the
most padded pixels, and only while a split saves at least `min_saving` of the batch's pixels:
each group is one more pass of the backbone's ~100 kernels, with smaller matrices.
"""

from __future__ import annotations

from collections.abc import Sequence

MIN_SAVING = 0.1  # a split must save this fraction of the batch's padded pixels

# On a GPU a canvas's height and width are rounded up to a multiple of this (res4's stride), so
# that a long run shows cuDNN a bounded set of shapes, each of which it plans once: at 600/1000,
# 26 heights by 26 widths. 64 padded a 600x900 image to 640x960, 11% more backbone work than
# 608x912; its few shapes served cuDNN's benchmark mode, which extraction no longer uses.
GPU_SIZE_MULTIPLE = 16


def size_multiple(device_type: str) -> int:
    """What a canvas's sides round up to on a device of this type: GPU_SIZE_MULTIPLE on a GPU,
    1 (no rounding) elsewhere."""
    return GPU_SIZE_MULTIPLE if device_type == "cuda" else 1


def round_up(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def canvas_groups(
    sizes: Sequence[tuple[int, int]], multiple: int, most: int, min_saving: float = MIN_SAVING
) -> list[list[int]]:
    """Images (h, w), each padded up to a multiple of `multiple` -> at most `most` groups of
    their indices (ascending; groups ordered by their first index), each group padded to the
    largest height and the largest width among its images."""
    padded = [(round_up(h, multiple), round_up(w, multiple)) for h, w in sizes]
    groups = [list(range(len(sizes)))]
    while len(groups) < most:
        total = sum(_pixels(g, padded) for g in groups)
        splits = [(_best_split(g, padded), k) for k, g in enumerate(groups)]
        (saving, inside, outside), k = max(splits, key=lambda s: (s[0][0], -s[1]))
        if saving <= 0 or saving < min_saving * total:
            break
        groups[k:k + 1] = [inside, outside]
        groups.sort(key=lambda g: g[0])
    return groups


def _pixels(group: list[int], padded: list[tuple[int, int]]) -> int:
    """Pixels of the group's canvas, all its images together."""
    return len(group) * max(padded[i][0] for i in group) * max(padded[i][1] for i in group)


def _best_split(
    group: list[int], padded: list[tuple[int, int]]
) -> tuple[int, list[int], list[int]]:
    """(pixels saved, inside, outside): the group split in two that saves the most.

    Of two canvases, every image that fits the smaller one is best placed there (moving it out
    of the larger one can only shrink it); so one candidate per possible smaller canvas, each
    image height by each image width, covers every optimal split.
    """
    whole = _pixels(group, padded)
    best = (0, group, [])
    for height in sorted({padded[i][0] for i in group}):
        for width in sorted({padded[i][1] for i in group}):
            fits = [padded[i][0] <= height and padded[i][1] <= width for i in group]
            inside = [i for i, fit in zip(group, fits) if fit]
            outside = [i for i, fit in zip(group, fits) if not fit]
            if not inside or not outside:
                continue
            saving = whole - _pixels(inside, padded) - _pixels(outside, padded)
            if saving > best[0]:
                best = (saving, inside, outside)
    return best
