"""Sampling scenes: image size, background, objects and their placement, then the ground truth.

make_scene(image_id, split, seed) depends on (seed, image_id) alone, so any image can be
regenerated on its own, in any order or process. Objects are placed back to front; a placement
is kept only if every object stays clearly detectable (enough of it visible, a visible box big
enough), and some placements are drawn next to an earlier object so partial occlusion is common.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from pipeline.world.render import Layout, Sprite, paint_ids, render, shape_mask
from pipeline.world.scene import BACKGROUNDS, SIZES, Palette, Scene, WorldObject

# Shortest side of an object's rectangle in pixels; the gap keeps "small" and "large" apart.
SMALL_EXTENT_PX = (34, 48)
LARGE_EXTENT_PX = (62, 94)
# Long side / short side of a box (the most elongated shape).
BOX_MAX_RATIO = 1.6
# Image sides: the short side, and the long/short ratio (landscape or portrait).
SHORT_SIDE_PX = (180, 240)
MAX_LONG_SIDE_PX = 340
ASPECT_RANGE = (1.0, 1.7)
# The longest object (a large box, 1.6:1) fits in the smallest image with room to move.
assert LARGE_EXTENT_PX[1] * BOX_MAX_RATIO < SHORT_SIDE_PX[0] - 16
# Every annotated object keeps at least this much of itself and a visible box this wide.
MIN_VISIBLE = 0.6
MIN_VISIBLE_SIDE_PX = 20
# Objects of one colour keep this many pixels apart, so no two of them read as one shape.
SAME_COLOR_GAP_PX = 3
# Chance that an object is placed against an earlier one rather than anywhere.
OVERLAP_PROBABILITY = 0.4
_TRIES_PER_OBJECT = 25
OBJECTS_PER_ID = 64  # object ids are image_id * 64 + index; index 63 is the ground (formats/vg.py)
_ROTATED_SHAPES = {"triangle", "star", "cross", "heart"}


def _image_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height) in pixels, landscape or portrait with equal chance."""
    short = int(rng.integers(SHORT_SIDE_PX[0], SHORT_SIDE_PX[1] + 1))
    long = min(MAX_LONG_SIDE_PX, round(short * rng.uniform(*ASPECT_RANGE)))
    return (long, short) if rng.random() < 0.5 else (short, long)


def _object_mask(rng: np.random.Generator, shape: str, size: str) -> np.ndarray:
    """(h, w) bool mask whose shortest side is drawn from the size's extent range."""
    low, high = SMALL_EXTENT_PX if size == "small" else LARGE_EXTENT_PX
    extent = int(rng.integers(low, high + 1))
    if shape == "box":
        ratio = rng.uniform(1.0, BOX_MAX_RATIO)
    elif shape in ("ball", "ring"):
        ratio = 1.0
    elif shape == "diamond":  # a clearly elongated rhombus, never a square turned 45 degrees
        ratio = rng.uniform(1.3, 1.6)
    else:
        ratio = rng.uniform(1.0, 1.25)
    long = round(extent * ratio)
    w, h = (long, extent) if rng.random() < 0.5 else (extent, long)
    rotation = rng.uniform(-15, 15) if shape in _ROTATED_SHAPES else 0.0
    return shape_mask(shape, w, h, rotation)


def _position(rng: np.random.Generator, mask: np.ndarray, width: int, height: int,
              placed: list[Sprite]) -> tuple[int, int]:
    """Top-left (x, y) keeping the mask inside the image; sometimes against an earlier sprite."""
    h, w = mask.shape
    if placed and rng.random() < OVERLAP_PROBABILITY:
        other = placed[int(rng.integers(len(placed)))]
        oh, ow = other.mask.shape
        angle = rng.uniform(0, 2 * np.pi)
        reach = (w + h + ow + oh) / 4 * rng.uniform(0.5, 0.9)
        cx = other.x + ow / 2 + reach * np.cos(angle)
        cy = other.y + oh / 2 + reach * np.sin(angle)
        x = int(np.clip(round(cx - w / 2), 0, width - w))
        y = int(np.clip(round(cy - h / 2), 0, height - h))
        return x, y
    return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))


def _visible_box(ids: np.ndarray, sprite: Sprite, index: int) -> tuple[int, int, int, int] | None:
    """Tight x1, y1, x2, y2 (exclusive) of the pixels owned by sprite `index`, None if none."""
    own = ids[sprite.rect] == index
    cols, rows = np.flatnonzero(own.any(axis=0)), np.flatnonzero(own.any(axis=1))
    if cols.size == 0:
        return None
    return (sprite.x + int(cols[0]), sprite.y + int(rows[0]),
            sprite.x + int(cols[-1]) + 1, sprite.y + int(rows[-1]) + 1)


def _still_detectable(ids: np.ndarray, sprites: list[Sprite]) -> bool:
    """Whether every sprite keeps MIN_VISIBLE of its pixels in `ids` and a visible box at least
    MIN_VISIBLE_SIDE_PX on each side."""
    for index, sprite in enumerate(sprites):
        visible, full = np.count_nonzero(ids[sprite.rect] == index), np.count_nonzero(sprite.mask)
        if visible == full:
            continue
        if visible < MIN_VISIBLE * full:
            return False
        x1, y1, x2, y2 = _visible_box(ids, sprite, index)
        if min(x2 - x1, y2 - y1) < MIN_VISIBLE_SIDE_PX:
            return False
    return True


def _near_same_color(ids: np.ndarray, sprites: list[Sprite], sprite: Sprite) -> bool:
    """Whether an earlier sprite of the same colour shows pixels within SAME_COLOR_GAP_PX of the
    new sprite's rectangle: touching same-coloured shapes would merge into one blob."""
    same = [index for index, other in enumerate(sprites) if other.color == sprite.color]
    if not same:
        return False
    rows, cols = sprite.rect
    g = SAME_COLOR_GAP_PX
    near = ids[max(0, rows.start - g) : rows.stop + g, max(0, cols.start - g) : cols.stop + g]
    return bool(np.isin(near, same).any())


def sample_layout(
    image_id: int, seed: int, *, min_objects: int = 2, max_objects: int = 6,
    palette: Palette = Palette(),
) -> Layout:
    """The size, background and back-to-front sprites of image `image_id` of world `seed`.

    Between min_objects and max_objects sprites, each at least MIN_VISIBLE visible with a visible
    box at least MIN_VISIBLE_SIDE_PX on each side once every sprite in front is drawn.
    """
    if not 1 <= min_objects <= max_objects < OBJECTS_PER_ID:
        raise ValueError(f"need 1 <= min_objects <= max_objects < {OBJECTS_PER_ID}")
    rng = np.random.default_rng([seed, image_id, 0])
    width, height = _image_size(rng)
    background = BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))]
    wanted = int(rng.integers(min_objects, max_objects + 1))
    sprites: list[Sprite] = []
    ids = np.full((height, width), -1, dtype=np.int16)
    # An object that finds no place is replaced by a new draw, up to 4 draws per wanted object.
    for _ in range(wanted * 4):
        if len(sprites) == wanted:
            break
        shape = palette.shapes[int(rng.integers(len(palette.shapes)))]
        color = palette.colors[int(rng.integers(len(palette.colors)))]
        material = palette.materials[int(rng.integers(len(palette.materials)))]
        size = SIZES[int(rng.integers(len(SIZES)))]
        mask = _object_mask(rng, shape, size)
        for _ in range(_TRIES_PER_OBJECT):
            x, y = _position(rng, mask, width, height, sprites)
            sprite = Sprite(shape, color, material, size, x, y, mask)
            if _near_same_color(ids, sprites, sprite):
                continue
            trial = ids.copy()
            trial[sprite.rect][mask] = len(sprites)
            if _still_detectable(trial, sprites):
                sprites.append(sprite)
                ids = trial
                break
    if len(sprites) < min_objects:
        raise RuntimeError(f"image {image_id}: placed {len(sprites)} of {min_objects} objects")
    return Layout(width, height, background, tuple(sprites))


def scene_of(layout: Layout, image_id: int, split: str, palette: Palette = Palette()) -> Scene:
    """The ground truth of a layout: visible boxes (x1, y1, x2, y2, pixel edges, x2/y2 exclusive)
    and visible fractions measured on the drawn pixels, objects back to front."""
    ids = paint_ids(layout)
    objects = []
    for index, sprite in enumerate(layout.sprites):
        box = _visible_box(ids, sprite, index)
        assert box is not None, "sample_layout keeps every sprite visible"
        visible = np.count_nonzero(ids[sprite.rect] == index) / np.count_nonzero(sprite.mask)
        objects.append(
            WorldObject(
                object_id=image_id * OBJECTS_PER_ID + index,
                shape=sprite.shape,
                color=sprite.color,
                material=sprite.material,
                size=sprite.size,
                box=tuple(float(v) for v in box),
                depth=index,
                visible=round(float(visible), 4),
            )
        )
    return Scene(image_id, layout.width, layout.height, layout.background, tuple(objects), split,
                 palette)


def make_scene(image_id: int, split: str, seed: int, *, min_objects: int = 2,
               max_objects: int = 6, palette: Palette = Palette()) -> tuple[Scene, Image.Image]:
    """Image `image_id` of world `seed`: its ground truth and its RGB picture.

    Deterministic from (seed, image_id) and the world's object counts and palette (seed and
    image_id non-negative integers); `split` is only recorded in the Scene. The image is (height, width) RGB with sides of 180..340 px.
    """
    layout = sample_layout(image_id, seed, min_objects=min_objects, max_objects=max_objects,
                           palette=palette)
    image = render(layout, np.random.default_rng([seed, image_id, 1]))
    return scene_of(layout, image_id, split, palette), image
