"""Drawing a scene: textured backgrounds, shape masks, material shading, back-to-front composition.

A Layout says what to draw where (sampling.py decides it); this module only turns it into pixels.
Masks are exact booleans, so the pixels an object owns in the picture are exactly its visible
mask (paint_ids), which is what its ground-truth box is measured from.
All colours are RGB, 0-255; arrays are (H, W) or (H, W, 3), rows first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw

# Hues far apart in RGB, and dark/light enough that shading keeps each nearest to itself:
# orange is bright and saturated, brown dark and dull, pink light, red deep.
COLOR_RGB = {
    "red": (205, 25, 30),
    "blue": (35, 75, 215),
    "green": (30, 165, 55),
    "yellow": (240, 222, 40),
    "purple": (135, 45, 180),
    "orange": (248, 124, 15),
    "pink": (245, 115, 185),
    "white": (245, 245, 245),
    "brown": (105, 60, 25),
    "gray": (115, 115, 115),
}

# Muted base tones: far from every object colour in saturation, so objects stand out.
_BACKGROUND_RGB = {
    "grass": (108, 126, 72),
    "sand": (188, 172, 138),
    "wood": (168, 142, 112),
    "tiles": (176, 182, 174),
    "carpet": (70, 90, 112),
    "concrete": (156, 154, 148),
}

_STAR_INNER_RADIUS = 0.45
_RING_INNER_RADIUS = 0.55
_CROSS_HALF_WIDTH = 0.34


@dataclass(frozen=True, eq=False)
class Sprite:
    """One object to draw: its attributes and its full (unoccluded) mask placed at (x, y).

    mask: (h, w) bool, the shape's own pixels inside its placement rectangle, whose top-left
    corner is pixel (x, y) of the image.
    """

    shape: str
    color: str
    material: str
    size: str
    x: int
    y: int
    mask: np.ndarray = field(repr=False)

    @property
    def rect(self) -> tuple[slice, slice]:
        """(rows, cols) slices of the placement rectangle in the image."""
        h, w = self.mask.shape
        return slice(self.y, self.y + h), slice(self.x, self.x + w)


@dataclass(frozen=True)
class Layout:
    """What one image shows: its size in pixels, background texture, sprites back to front."""

    width: int
    height: int
    background: str
    sprites: tuple[Sprite, ...]


def _polygon(shape: str) -> np.ndarray:
    """(N, 2) vertices x, y of a shape in [-1, 1]^2, y pointing down."""
    if shape == "triangle":
        return np.array([(0.0, -1.0), (1.0, 1.0), (-1.0, 1.0)])
    if shape == "diamond":
        return np.array([(0.0, -1.0), (1.0, 0.0), (0.0, 1.0), (-1.0, 0.0)])
    if shape == "star":
        angles = -np.pi / 2 + np.arange(10) * np.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, 1.0, _STAR_INNER_RADIUS)
        return np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)
    if shape == "cross":
        a, b = _CROSS_HALF_WIDTH, 1.0
        return np.array(
            [(-a, -b), (a, -b), (a, -a), (b, -a), (b, a), (a, a), (a, b), (-a, b), (-a, a),
             (-b, a), (-b, -a), (-a, -a)]
        )
    if shape == "heart":
        t = np.linspace(0, 2 * np.pi, 48, endpoint=False)
        x = 16 * np.sin(t) ** 3
        y = -(13 * np.cos(t) - 5 * np.cos(2 * t) - 2 * np.cos(3 * t) - np.cos(4 * t))
        return np.stack([x, y], axis=1)
    raise ValueError(f"no polygon for shape {shape!r}")


def _unit_grid(width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel centres as (h, w) arrays u (x) and v (y), each in (-1, 1)."""
    u = (np.arange(width) + 0.5) / width * 2 - 1
    v = (np.arange(height) + 0.5) / height * 2 - 1
    return np.meshgrid(u, v)


def shape_mask(shape: str, width: int, height: int, rotation_deg: float = 0.0) -> np.ndarray:
    """(height, width) bool mask of a shape filling a width x height rectangle.

    rotation_deg turns polygon shapes before they are scaled back into the rectangle, so a
    rotated star still spans the whole rectangle; balls, rings and boxes are not rotated.
    """
    if shape == "box":
        return np.ones((height, width), dtype=bool)
    if shape in ("ball", "ring"):
        u, v = _unit_grid(width, height)
        r2 = u * u + v * v
        mask = r2 <= 1.0
        return mask & (r2 >= _RING_INNER_RADIUS**2) if shape == "ring" else mask
    points = _polygon(shape)
    theta = np.deg2rad(rotation_deg)
    rotation = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    points = points @ rotation.T
    lo, hi = points.min(axis=0), points.max(axis=0)
    # Vertices land on the outer pixel edges so the mask touches all four sides.
    scaled = (points - lo) / (hi - lo) * [width - 1, height - 1]
    canvas = Image.new("L", (width, height), 0)
    ImageDraw.Draw(canvas).polygon([tuple(p) for p in scaled], fill=1)
    return np.asarray(canvas, dtype=bool)


def paint_ids(layout: Layout) -> np.ndarray:
    """(H, W) int16 map: the index of the sprite that owns each pixel (front-most), -1 for none."""
    ids = np.full((layout.height, layout.width), -1, dtype=np.int16)
    for index, sprite in enumerate(layout.sprites):
        ids[sprite.rect][sprite.mask] = index
    return ids


def _value_noise(rng: np.random.Generator, width: int, height: int, cell_w: float,
                 cell_h: float | None = None) -> np.ndarray:
    """(height, width) float32 smooth noise in [0, 1] with features about cell_w x cell_h px."""
    cell_h = cell_w if cell_h is None else cell_h
    grid_w = max(2, int(np.ceil(width / cell_w)) + 1)
    grid_h = max(2, int(np.ceil(height / cell_h)) + 1)
    grid = Image.fromarray(rng.random((grid_h, grid_w), dtype=np.float32))
    return np.asarray(grid.resize((width, height), Image.Resampling.BILINEAR))


def _texture(name: str, width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """(H, W) float32 brightness factor around 1 that gives each background its pattern."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    blotches = _value_noise(rng, width, height, rng.uniform(30, 60)) - 0.5
    if name == "grass":
        blades = _value_noise(rng, width, height, 2.0, rng.uniform(8, 14)) - 0.5
        return 1 + 0.25 * blotches + 0.35 * blades
    if name == "sand":
        angle = rng.uniform(0, np.pi)
        phase = (x * np.cos(angle) + y * np.sin(angle)) / rng.uniform(9, 16) * 2 * np.pi
        ripples = np.sin(phase + 4 * blotches)
        return 1 + 0.06 * ripples + 0.15 * blotches + 0.05 * rng.standard_normal((height, width))
    if name == "wood":
        plank_h = rng.uniform(24, 44)
        plank = np.floor((y + rng.uniform(0, plank_h)) / plank_h).astype(int)
        plank_tone = rng.uniform(0.88, 1.08, size=plank.max() + 1)[plank]
        grain = np.sin(y * rng.uniform(0.9, 1.4) + 6 * _value_noise(rng, width, height, 40, 8))
        seam = np.diff(plank, axis=0, prepend=plank[:1]) != 0
        return plank_tone * (1 + 0.06 * grain + 0.1 * blotches) * np.where(seam, 0.6, 1.0)
    if name == "tiles":
        side = rng.uniform(26, 48)
        row, col = np.floor(y / side).astype(int), np.floor(x / side).astype(int)
        tone = rng.uniform(0.92, 1.08, size=(row.max() + 1, col.max() + 1))[row, col]
        grout = ((y % side) < 2.5) | ((x % side) < 2.5)
        return tone * (1 + 0.08 * blotches) * np.where(grout, 0.68, 1.0)
    if name == "carpet":
        period = rng.uniform(10, 18)
        weave = np.sin(2 * np.pi * (x + y) / period) * np.sin(2 * np.pi * (x - y) / period)
        fibres = _value_noise(rng, width, height, 1.5) - 0.5
        return 1 + 0.05 * weave + 0.35 * fibres + 0.1 * blotches
    if name == "concrete":
        speckles = rng.random((height, width)) < 0.015
        fine = _value_noise(rng, width, height, 6) - 0.5
        return (1 + 0.2 * blotches + 0.12 * fine) * np.where(speckles, 0.7, 1.0)
    raise ValueError(f"unknown background {name!r}")


def background_pixels(name: str, width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """(height, width, 3) float32 RGB of a muted procedural texture (noise, stripes, tiles...)."""
    tone = np.asarray(_BACKGROUND_RGB[name], dtype=np.float32) * rng.uniform(0.9, 1.1)
    return _texture(name, width, height, rng)[..., None] * tone


def _outline(mask: np.ndarray, width_px: int) -> np.ndarray:
    """(h, w) bool: mask pixels within width_px of the mask's edge (4-neighbour erosion)."""
    inner = mask.copy()
    for _ in range(width_px):
        shrunk = inner.copy()
        shrunk[1:, :] &= inner[:-1, :]
        shrunk[:-1, :] &= inner[1:, :]
        shrunk[:, 1:] &= inner[:, :-1]
        shrunk[:, :-1] &= inner[:, 1:]
        shrunk[[0, -1], :] = False
        shrunk[:, [0, -1]] = False
        inner = shrunk
    return mask & ~inner


def plastic_outline(sprite: Sprite) -> np.ndarray:
    """(h, w) bool: the dark rim a plastic sprite gets, 4 px wide on large sprites, 3 on small."""
    return _outline(sprite.mask, 4 if sprite.size == "large" else 3)


def sprite_pixels(sprite: Sprite, rng: np.random.Generator) -> np.ndarray:
    """(h, w, 3) float32 RGB of a sprite over its whole rectangle (only mask pixels are used).

    Material: metal = light gradient and a specular highlight; wooden = broad grain stripes in a
    darker shade; plastic = flat with a thick dark outline. Balls also get sphere shading.
    The darkening is bounded so that, outside a plastic sprite's rim, each colour stays nearest its
    own name (see COLOR_RGB).
    """
    h, w = sprite.mask.shape
    u, v = _unit_grid(w, h)
    base = np.asarray(COLOR_RGB[sprite.color], dtype=np.float32)
    base = base * rng.uniform(0.94, 1.04) + rng.uniform(-6, 6, size=3)
    light = np.ones((h, w), dtype=np.float32)
    if sprite.shape == "ball":
        # Lambert shading of a sphere lit from the upper left.
        nz = np.sqrt(np.clip(1 - u * u - v * v, 0, 1))
        lambert = np.clip(-0.45 * u - 0.45 * v + 0.77 * nz, 0, 1)
        light = light * (0.82 + 0.24 * lambert)
    highlight = np.zeros((h, w), dtype=np.float32)
    if sprite.material == "metal":
        angle = rng.uniform(0, 2 * np.pi)
        light = light * (0.97 + 0.13 * (u * np.cos(angle) + v * np.sin(angle)))
        cx, cy = rng.uniform(-0.5, 0.0, size=2)
        highlight = 0.75 * np.exp(-((u - cx) ** 2 + (v - cy) ** 2) / (2 * 0.2**2))
    elif sprite.material == "wooden":
        angle = rng.uniform(0, np.pi)
        warp = _value_noise(rng, w, h, max(w, h) / 3)
        along = (u * np.cos(angle) + v * np.sin(angle)) * max(w, h) / 2
        stripes = np.sin(along * 2 * np.pi / rng.uniform(10, 14) + 5 * warp) > 0.2
        light = light * np.where(stripes, 0.62, 1.0)
    elif sprite.material == "plastic":
        light = light * np.where(plastic_outline(sprite), 0.3, 1)
    else:
        raise ValueError(f"unknown material {sprite.material!r}")
    shaded = base * light[..., None]
    return shaded + (255 - shaded) * highlight[..., None]


def render(layout: Layout, rng: np.random.Generator) -> Image.Image:
    """The RGB picture of a layout: background, then sprites back to front, then sensor noise."""
    pixels = background_pixels(layout.background, layout.width, layout.height, rng)
    for sprite in layout.sprites:
        pixels[sprite.rect][sprite.mask] = sprite_pixels(sprite, rng)[sprite.mask]
    pixels += rng.normal(0, 3, size=pixels.shape).astype(np.float32)
    return Image.fromarray(np.clip(pixels, 0, 255).round().astype(np.uint8))
