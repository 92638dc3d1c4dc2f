"""The synthetic world's ground truth: scenes of coloured shapes, with boxes and relations.

Every name is a Visual Genome vocabulary entry (extractor/vg1600/), so the world's labels are
ordinary detector ids: shapes are object classes, colours/materials/sizes are attributes.
A relation holds only with a clear margin, so that every generated sentence is unambiguous.
"""

from __future__ import annotations

from dataclasses import dataclass

SHAPES = ("ball", "box", "triangle", "ring", "star", "heart", "cross", "diamond")
COLORS = ("red", "blue", "green", "yellow", "purple", "orange", "pink", "white", "brown", "gray")
MATERIALS = ("metal", "wooden", "plastic")
SIZES = ("small", "large")
BACKGROUNDS = ("grass", "sand", "wood", "tiles", "carpet", "concrete")

# Relations need this much separation (in pixels between centres, or as an area ratio).
RELATION_MARGIN_PX = 12.0
BIGGER_RATIO = 1.8


@dataclass(frozen=True)
class Palette:
    """The shapes, colours and materials a world's objects are drawn from: distinct values of the
    full vocabulary above (at least two shapes and two colours). A smaller palette makes a world
    that a small model learns sooner; a world of one material never asks about it."""

    shapes: tuple[str, ...] = SHAPES
    colors: tuple[str, ...] = COLORS
    materials: tuple[str, ...] = MATERIALS

    def __post_init__(self) -> None:
        for name, full, least in (("shapes", SHAPES, 2), ("colors", COLORS, 2),
                                  ("materials", MATERIALS, 1)):
            chosen = tuple(getattr(self, name))
            unknown = [v for v in chosen if v not in full]
            if unknown or len(set(chosen)) != len(chosen) or len(chosen) < least:
                raise ValueError(f"{name} must be at least {least} distinct of {', '.join(full)}; "
                                 f"got {list(chosen)}")
            object.__setattr__(self, name, chosen)

    @property
    def materials_vary(self) -> bool:
        """Whether material tells objects apart (else nothing asks about it)."""
        return len(self.materials) > 1


@dataclass(frozen=True)
class WorldObject:
    """One shape in a scene.

    object_id: unique over the whole world (VG object ids). box: the visible extent, x1 y1 x2 y2
    in pixels (after occlusion by objects in front). depth: drawing order, larger is in front.
    visible: fraction of the shape's own pixels that are not covered.
    """

    object_id: int
    shape: str
    color: str
    material: str
    size: str
    box: tuple[float, float, float, float]
    depth: int
    visible: float

    @property
    def center(self) -> tuple[float, float]:
        x1, y1, x2, y2 = self.box
        return (x1 + x2) / 2, (y1 + y2) / 2

    @property
    def area(self) -> float:
        x1, y1, x2, y2 = self.box
        return max(0.0, x2 - x1) * max(0.0, y2 - y1)

    @property
    def attributes(self) -> tuple[str, str, str]:
        """Attribute names, most salient first (the colour is what the detector must name)."""
        return (self.color, self.material, self.size)

    def phrase(self) -> str:
        """e.g. "small red metal ball"."""
        return f"{self.size} {self.color} {self.material} {self.shape}"


@dataclass(frozen=True)
class Scene:
    """One image: its id (shared by COCO and Visual Genome when it is in both), size,
    background texture, objects back to front, train/val split, and the world's palette (what
    questions about absent things may name)."""

    image_id: int
    width: int
    height: int
    background: str
    objects: tuple[WorldObject, ...]
    split: str
    palette: Palette = Palette()

    def count(self, **where: str) -> int:
        """How many objects match every given field, e.g. count(shape="ball", color="red")."""
        return sum(all(getattr(o, k) == v for k, v in where.items()) for o in self.objects)


def left_of(a: WorldObject, b: WorldObject) -> bool:
    return a.center[0] + RELATION_MARGIN_PX < b.center[0]


def above(a: WorldObject, b: WorldObject) -> bool:
    return a.center[1] + RELATION_MARGIN_PX < b.center[1]


def bigger(a: WorldObject, b: WorldObject) -> bool:
    return a.area > BIGGER_RATIO * b.area


RELATIONS = {
    "left of": left_of,
    "right of": lambda a, b: left_of(b, a),
    "above": above,
    "below": lambda a, b: above(b, a),
    "bigger than": bigger,
    "smaller than": lambda a, b: bigger(b, a),
}
