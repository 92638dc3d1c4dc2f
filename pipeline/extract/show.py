"""`pipeline show`: draw one extracted sample's regions on its image, to check an extraction by eye.

The image is the one stored in the sample (extracted with `--set output.keep_images=true`), else
the dataset's own file: the dataset and its root are read from the shard directory's
extract_config.yaml (`--root` replaces the root when the images have moved), and the image is the
dataset's ImageRef whose id is the key's image id. It is decoded as the extractor decodes it (EXIF
orientation applied), so the stored boxes, in original-image pixels, fall where the detector saw
the regions.
"""

from __future__ import annotations

import colorsys
import difflib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from PIL import Image, ImageDraw, ImageFont

from extractor.config import PreprocessConfig
from extractor.labels import attribute_names, object_names
from extractor.preprocess import ImageError, decode_image
from pipeline.datasets import DatasetError, list_images
from shards.schema import Sample, SchemaError, split_key
from shards.store import FeatureStore

RGB = tuple[int, int, int]
Rect = tuple[int, int, int, int]  # x1 y1 x2 y2 in pixels, x2 and y2 exclusive


@dataclass(frozen=True)
class ShowConfig:
    """max_boxes: draw at most this many regions, the most confident first. min_conf: leave out
    regions whose object confidence is below this. min_attr_conf: name a region's top attribute
    only when its confidence is above this (0.1, as the bottom-up-attention demo does)."""

    max_boxes: int = 36
    min_conf: float = 0.0
    min_attr_conf: float = 0.1


class ShowError(ValueError):
    """A sample or image that cannot be shown; the message names what is missing and where."""


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


def select_regions(object_conf: np.ndarray, max_boxes: int, min_conf: float) -> np.ndarray:
    """Indices of the regions to draw: confidence >= min_conf, most confident first, at most
    max_boxes of them."""
    order = np.argsort(-object_conf, kind="stable")
    return order[object_conf[order] >= min_conf][:max_boxes]


def region_labels(sample: Sample, order: np.ndarray, min_attr_conf: float) -> list[str]:
    """"red ball 0.93" for each region in `order`: top attribute (named only when its confidence
    is above min_attr_conf), object name, object confidence."""
    objects, attributes = object_names(), attribute_names()
    arrays = sample.arrays
    labels = []
    for i in order:
        name = _vocab_name(objects, arrays["object_ids"][i])
        if arrays["attr_conf"][i] > min_attr_conf:
            name = f"{_vocab_name(attributes, arrays['attr_ids'][i])} {name}"
        labels.append(f"{name} {arrays['object_conf'][i]:.2f}")
    return labels


def _vocab_name(names: tuple[str, ...], index: int) -> str:
    return names[index] if index < len(names) else f"#{index}"


def load_sample(shards_dir: Path, key: str) -> Sample:
    """The sample `key` of a shard directory; an unknown key names the closest keys."""
    if not shards_dir.is_dir():
        raise ShowError(f"shard directory {shards_dir} does not exist")
    try:
        store = FeatureStore(shards_dir)
        try:
            if key in store:
                return store[key]
            keys = list(store.keys())
        finally:
            store.close()
    except SchemaError as err:
        raise ShowError(f"{shards_dir}: {err}") from err
    if not keys:
        raise ShowError(f"{shards_dir} holds no samples (no *.tar shards, or only empty ones)")
    raise ShowError(
        f"no sample with key {key!r} among the {len(keys)} samples in {shards_dir}; "
        f"{_key_hint(key, keys)}"
    )


def _key_hint(key: str, keys: list[str]) -> str:
    """The keys one typo away (a character dropped, added or changed: ids are long runs of
    digits, where difflib's similarity ranks a dozen near-equal keys arbitrarily), else difflib's
    closest; and each dataset's first and last key."""
    close = sorted(k for k in keys if _one_edit_apart(key, k))
    close = close or difflib.get_close_matches(key, keys, n=5)
    shown = ", ".join(close[:5]) + (f" (and {len(close) - 5} more)" if len(close) > 5 else "")
    ranges: dict[str, list[str]] = {}
    for k in sorted(keys, key=lambda k: (len(k), k)):  # numeric ids in their order
        ranges.setdefault(k.split("-", 1)[0], []).append(k)
    spans = "; ".join(f"{v[0]} .. {v[-1]} ({len(v)})" for _, v in sorted(ranges.items()))
    return (f"closest keys: {shown}" if close else "no key is close") + f"; the keys: {spans}"


def _one_edit_apart(a: str, b: str) -> bool:
    """Whether b is a with one character dropped, added or changed."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    if len(a) > len(b):
        a, b = b, a
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    return a[i + (len(a) == len(b)):] == b[i + 1:]


def sample_image(sample: Sample, shards_dir: Path, root: str | None) -> tuple[bytes, str]:
    """(encoded image bytes, where they came from) of `sample`: its stored image, else the file of
    its dataset under `root` (default: the root recorded in extract_config.yaml)."""
    if sample.image_bytes is not None:
        return sample.image_bytes, f"{sample.key}.image.{sample.image_ext} stored in {shards_dir}"
    record_path = shards_dir / "extract_config.yaml"
    if not record_path.is_file():
        raise ShowError(
            f"sample {sample.key} has no stored image and {shards_dir} has no extract_config.yaml "
            "to name its dataset and root, so there is no image to draw on (extract with "
            "--set output.keep_images=true to store images in the shards)"
        )
    record = yaml.safe_load(record_path.read_text())
    dataset = record["dataset"]
    if root is None:
        root, origin = record["root"], f"the root recorded in {record_path}"
    else:
        origin = "given by --root"
    move_hint = "if the images have moved, pass their directory with --root"
    try:
        refs = list_images(dataset, root)
    except DatasetError as err:
        raise ShowError(
            f"cannot list dataset {dataset!r} under {root} ({origin}): {err}; {move_hint}"
        ) from err
    _, image_id = split_key(sample.key)
    ref = next((r for r in refs if r.image_id == image_id), None)
    if ref is None:
        raise ShowError(
            f"image {image_id!r} of dataset {dataset!r} not found under {root} ({origin}; "
            f"{len(refs)} images there); {move_hint}"
        )
    try:
        return ref.read_bytes(), ref.location
    except OSError as err:
        raise ShowError(f"cannot read {ref.location}: {err}") from err


def show_sample(shards_dir: Path, key: str, out: Path, root: str | None, cfg: ShowConfig) -> str:
    """Draw sample `key` on its image and save it to `out`; returns the line to print."""
    if cfg.max_boxes < 0:
        raise ShowError(f"max_boxes must be at least 0, got {cfg.max_boxes}")
    sample = load_sample(shards_dir, key)
    data, source = sample_image(sample, shards_dir, root)
    try:
        # min_side 1: the sample exists, so its image already passed extraction's size checks.
        bgr = decode_image(data, source, PreprocessConfig(min_side=1))
    except ImageError as err:
        raise ShowError(str(err)) from err
    image = Image.fromarray(np.ascontiguousarray(bgr[..., ::-1]))
    width, height = sample.meta["width"], sample.meta["height"]
    if image.size != (width, height):
        raise ShowError(
            f"{source} is {image.width}x{image.height} but {key} was extracted from a "
            f"{width}x{height} image: not the same image, so its boxes would not line up"
        )
    order = select_regions(sample.arrays["object_conf"], cfg.max_boxes, cfg.min_conf)
    labels = region_labels(sample, order, cfg.min_attr_conf)
    drawn = draw_regions(image, sample.arrays["boxes"][order], labels)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        drawn.save(out)
    except (OSError, ValueError) as err:
        raise ShowError(f"cannot write {out}: {err}") from err
    return (
        f"wrote {out}: {len(order)} of {sample.num_boxes} boxes of {key} on its {width}x{height} "
        f"image (from {source})"
    )
