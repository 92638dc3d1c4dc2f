"""Regions drawn on their image: each box outlined in its own colour and labelled ("red ball
0.93"), the most confident first. `pipeline show` draws a shard's sample with these, and
`Regions.show` (extractor.regions) the regions of an image extracted in Python: the same picture."""

from __future__ import annotations

import colorsys
from collections.abc import Mapping, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from extractor.labels import attribute_names, object_names

RGB = tuple[int, int, int]
Rect = tuple[int, int, int, int]  # x1 y1 x2 y2 in pixels, x2 and y2 exclusive


def box_colors(n: int) -> list[RGB]:
    """n distinct saturated colours; the hue steps by the golden ratio, so neighbours differ."""
    colors = []
    for k in range(n):
        rgb = colorsys.hsv_to_rgb((k * 0.618034) % 1.0, 0.85, 0.95)
        colors.append((round(255 * rgb[0]), round(255 * rgb[1]), round(255 * rgb[2])))
    return colors


def draw_regions(image: Image.Image, boxes_xyxy_abs: np.ndarray, labels: list[str]) -> Image.Image:
    """A copy of `image` (as RGB) with each box outlined in its own colour and labelled.

    boxes_xyxy_abs: (N, 4) x1 y1 x2 y2 in pixels of `image`; a box covers columns x1..x2-1 and
    rows y1..y2-1, and its outline is drawn on those border pixels. labels: N strings. Box k gets
    box_colors(N)[k]. A label sits on a filled background of its box's colour, placed by
    place_labels: inside the image and clear of the other labels, so pass the most important box
    first (its label gets its preferred place). Labels are drawn after all boxes, over their
    outlines. Line width and font size grow with the image.
    """
    boxes = np.asarray(boxes_xyxy_abs, dtype=np.float64).reshape(-1, 4)
    if len(boxes) != len(labels):
        raise ValueError(f"{len(boxes)} boxes but {len(labels)} labels")
    out = image.convert("RGB")
    short_side = min(out.size)
    line_width = max(1, round(short_side / 300))
    font = ImageFont.load_default(size=max(10, round(short_side / 35)))
    draw = ImageDraw.Draw(out)
    colors = box_colors(len(boxes))
    for (x1, y1, x2, y2), color in zip(np.rint(boxes).astype(int).tolist(), colors):
        draw.rectangle((x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)), outline=color, width=line_width)
    text_boxes = [draw.textbbox((0, 0), text, font=font) for text in labels]
    pads = [max(1, (bottom - top) // 5) for _, top, _, bottom in text_boxes]
    sizes = [(right - left + 2 * pad, bottom - top + 2 * pad)
             for (left, top, right, bottom), pad in zip(text_boxes, pads)]
    rects = place_labels(boxes, sizes, out.size)
    for text, (left, top, _, _), pad, rect, color in zip(labels, text_boxes, pads, rects, colors):
        if rect is None:
            continue
        x1, y1, x2, y2 = rect
        draw.rectangle((x1, y1, x2 - 1, y2 - 1), fill=color)
        # Dark text on light colours, white on dark, by the colour's luma.
        luma = 0.299 * color[0] + 0.587 * color[1] + 0.114 * color[2]
        ink = (0, 0, 0) if luma >= 128 else (255, 255, 255)
        draw.text((x1 + pad - left, y1 + pad - top), text, fill=ink, font=font)
    return out


def place_labels(
    boxes_xyxy_abs: np.ndarray, sizes: list[tuple[int, int]], image_size: tuple[int, int]
) -> list[Rect | None]:
    """Where each box's label goes: a Rect, or None.

    boxes_xyxy_abs: (N, 4) in pixels; sizes: N (width, height) of the labels; image_size:
    (width, height). Labels are placed in order, the first where it prefers: on the box's top
    left corner, just above the box where there is room, else just inside its top edge (a box at
    the top border), shifted left or up to end inside the image. A label whose preferred place
    overlaps one placed earlier goes to the nearest free place, moving sideways costing twice
    as much as moving up or down (the label should stay beside its box's top edge). Every
    rectangle lies inside the image and no two overlap; a label larger than the image is cut to
    it, and one that finds no free place at all (labels already cover the image) is None.
    """
    width, height = image_size
    placed: list[Rect] = []
    rects: list[Rect | None] = []
    for (x1, y1, _, _), (label_w, label_h) in zip(np.rint(boxes_xyxy_abs).astype(int).tolist(),
                                                  sizes):
        label_w, label_h = min(label_w, width), min(label_h, height)
        want_x = min(max(x1, 0), width - label_w)
        want_y = min(max(y1 - label_h if y1 >= label_h else y1, 0), height - label_h)
        rect = _nearest_free(want_x, want_y, label_w, label_h, placed, image_size)
        if rect is not None:
            placed.append(rect)
        rects.append(rect)
    return rects


def _nearest_free(want_x: int, want_y: int, label_w: int, label_h: int, placed: list[Rect],
                  image_size: tuple[int, int]) -> Rect | None:
    """The free place for a label_w x label_h rectangle nearest (want_x, want_y), or None.

    The nearest free place cannot move toward the wanted one along either axis without running
    into a placed rectangle, so each of its coordinates is the wanted one or puts it against a
    placed rectangle's edge: searching that grid finds it whenever a free place exists.
    """
    width, height = image_size
    others = np.array(placed, dtype=np.int64).reshape(-1, 4)
    xs = np.concatenate([[want_x], others[:, 2], others[:, 0] - label_w])
    ys = np.concatenate([[want_y], others[:, 3], others[:, 1] - label_h])
    xs = np.unique(xs[(xs >= 0) & (xs <= width - label_w)])
    ys = np.unique(ys[(ys >= 0) & (ys <= height - label_h)])
    x, y = (grid.ravel() for grid in np.meshgrid(xs, ys))
    overlaps = ((x[:, None] < others[:, 2]) & (x[:, None] + label_w > others[:, 0])
                & (y[:, None] < others[:, 3]) & (y[:, None] + label_h > others[:, 1]))
    free = ~overlaps.any(axis=1)
    if not free.any():
        return None
    # Down before up at equal distance: below the wanted place is the box's inside or a label
    # that moved out of the way, above it the box's surroundings.
    cost = 2 * np.abs(x - want_x) + np.abs(y - want_y) + 0.5 * (y < want_y)
    best = np.flatnonzero(free)[np.argmin(cost[free])]
    return int(x[best]), int(y[best]), int(x[best]) + label_w, int(y[best]) + label_h


def regions_to_draw(object_conf: np.ndarray, max_boxes: int, min_conf: float) -> np.ndarray:
    """Indices of the regions to draw: confidence >= min_conf, most confident first, at most
    max_boxes of them."""
    order = np.argsort(-object_conf, kind="stable")
    return order[object_conf[order] >= min_conf][:max_boxes]


def region_labels(arrays: Mapping[str, np.ndarray], order: np.ndarray,
                  min_attr_conf: float,
                  names: tuple[Sequence[str], Sequence[str]] | None = None) -> list[str]:
    """"red ball 0.93" for each region in `order`: top attribute (named only when its confidence
    is above min_attr_conf), object name, object confidence. arrays: a shard sample's
    object_ids, object_conf, attr_ids and attr_conf (N,). names: (objects, attributes) of the
    ids (default: Visual Genome's 1600 / 400; VinVL's: extractor.labels.labelmap_names)."""
    objects, attributes = names or (object_names(), attribute_names())
    labels = []
    for i in order:
        name = _vocab_name(objects, arrays["object_ids"][i])
        if arrays["attr_conf"][i] > min_attr_conf:
            name = f"{_vocab_name(attributes, arrays['attr_ids'][i])} {name}"
        labels.append(f"{name} {arrays['object_conf'][i]:.2f}")
    return labels


def draw_labelled(image: Image.Image, arrays: Mapping[str, np.ndarray], order: np.ndarray,
                  min_attr_conf: float,
                  names: tuple[Sequence[str], Sequence[str]] | None = None) -> Image.Image:
    """draw_regions of the regions `order` (regions_to_draw) of a sample's `arrays` (boxes in
    pixels of `image`, and what region_labels reads), labelled by region_labels."""
    labels = region_labels(arrays, order, min_attr_conf, names)
    return draw_regions(image, np.asarray(arrays["boxes"])[order], labels)


def _vocab_name(names: Sequence[str], index: int) -> str:
    return names[index] if index < len(names) else f"#{index}"
