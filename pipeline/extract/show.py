"""`pipeline show`: draw one extracted sample's regions on its image, to check an extraction by eye.

The image is the one stored in the sample (extracted with `--set output.keep_images=true`), else
the dataset's own file: the dataset and its root are read from the shard directory's
extract_config.yaml (`--root` replaces the root when the images have moved), and the image is the
dataset's ImageRef whose id is the key's image id. It is decoded as the extractor decodes it (EXIF
orientation applied), so the stored boxes, in original-image pixels, fall where the detector saw
the regions.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

from extractor import drawing
from extractor.config import PreprocessConfig
from extractor.drawing import RGB, box_colors, draw_regions, place_labels
from extractor.drawing import regions_to_draw as select_regions
from extractor.preprocess import ImageError, decode_image
from pipeline.datasets import DatasetError, list_images
from shards.schema import Sample, SchemaError, split_key
from shards.store import FeatureStore

# box_colors, draw_regions, place_labels, RGB: also imported from here by pipeline.demo.pictures
__all__ = ["RGB", "ShowConfig", "ShowError", "box_colors", "draw_regions", "place_labels",
           "region_labels", "select_regions", "load_sample", "sample_image", "show_sample"]


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


def region_labels(sample: Sample, order: np.ndarray, min_attr_conf: float) -> list[str]:
    """extractor.drawing.region_labels of a sample's arrays."""
    return drawing.region_labels(sample.arrays, order, min_attr_conf)


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


def show_sample(shards_dir: Path, key: str, out: Path, root: str | None, cfg: ShowConfig,
                names: tuple[tuple[str, ...], tuple[str, ...]] | None = None) -> str:
    """Draw sample `key` on its image and save it to `out`; returns the line to print. names:
    (objects, attributes) of the ids, where not Visual Genome's 1600 / 400 (VinVL's label map)."""
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
    drawn = drawing.draw_labelled(image, sample.arrays, order, cfg.min_attr_conf, names)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        drawn.save(out)
    except (OSError, ValueError) as err:
        raise ShowError(f"cannot write {out}: {err}") from err
    return (
        f"wrote {out}: {len(order)} of {sample.num_boxes} boxes of {key} on its {width}x{height} "
        f"image (from {source})"
    )
