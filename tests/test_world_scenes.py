import time
from functools import cache

import numpy as np
import pytest

from extractor.labels import attribute_names, object_names
from pipeline.world.render import (
    COLOR_RGB,
    Sprite,
    paint_ids,
    plastic_outline,
    shape_mask,
    sprite_pixels,
)
from pipeline.world.sampling import (
    LARGE_EXTENT_PX,
    MIN_VISIBLE,
    MIN_VISIBLE_SIDE_PX,
    SAME_COLOR_GAP_PX,
    SMALL_EXTENT_PX,
    make_scene,
    sample_layout,
)
from pipeline.world.scene import (
    BACKGROUNDS,
    BIGGER_RATIO,
    COLORS,
    MATERIALS,
    RELATIONS,
    RELATION_MARGIN_PX,
    SHAPES,
    SIZES,
    Palette,
)

SEED = 11


@cache
def _world(n: int = 60):
    """(layout, scene, RGB array) for images 0..n-1 of world SEED, made once per test run."""
    out = []
    for image_id in range(n):
        scene, image = make_scene(image_id, "train", SEED)
        out.append((sample_layout(image_id, SEED), scene, np.asarray(image)))
    return out


def test_same_seed_and_id_give_identical_pixels_and_scene_in_any_order():
    scene_a, image_a = make_scene(5, "val", 3)
    make_scene(6, "val", 3)
    scene_b, image_b = make_scene(5, "val", 3)
    assert scene_a == scene_b
    assert np.array_equal(np.asarray(image_a), np.asarray(image_b))
    other_id, other_seed = make_scene(6, "val", 3), make_scene(5, "val", 4)
    for scene, image in (other_id, other_seed):
        assert scene != scene_a
        pixels, pixels_a = np.asarray(image), np.asarray(image_a)
        assert pixels.shape != pixels_a.shape or not np.array_equal(pixels, pixels_a)


def test_object_ids_depths_and_counts_follow_the_contract():
    for image_id, (layout, scene, pixels) in enumerate(_world()):
        assert scene.image_id == image_id and scene.split == "train"
        assert pixels.shape == (scene.height, scene.width, 3) and pixels.dtype == np.uint8
        assert 2 <= len(scene.objects) <= 6
        indices = list(range(len(scene.objects)))
        assert [o.object_id for o in scene.objects] == [image_id * 64 + i for i in indices]
        assert [o.depth for o in scene.objects] == indices
    scene, _ = make_scene(3, "train", SEED, min_objects=5, max_objects=5)
    assert len(scene.objects) == 5


def test_a_palette_limits_what_objects_are():
    palette = Palette(("ball", "star"), ("red", "white"), ("metal",))
    seen = set()
    for image_id in range(30):
        scene, _ = make_scene(image_id, "train", SEED, min_objects=1, max_objects=3,
                              palette=palette)
        assert scene.palette == palette and 1 <= len(scene.objects) <= 3
        seen |= {(o.shape, o.color, o.material) for o in scene.objects}
    assert {s for s, _, _ in seen} == {"ball", "star"} and {c for _, c, _ in seen} == {"red", "white"}
    assert {m for _, _, m in seen} == {"metal"}


@pytest.mark.parametrize("palette, problem", [
    ({"colors": ["red"]}, "colors must be at least 2 distinct"),
    ({"shapes": ["ball", "cube"]}, "shapes must be at least 2 distinct"),
    ({"materials": []}, "materials must be at least 1 distinct"),
    ({"shapes": ["ball", "ball", "star"]}, "shapes must be at least 2 distinct"),
])
def test_world_config_rejects_a_bad_palette(palette, problem):
    from pipeline.common.config import ConfigError
    from pipeline.world.generate import WorldConfig

    with pytest.raises(ConfigError, match=problem):
        WorldConfig(**palette)


def test_boxes_are_the_tight_extent_of_each_objects_visible_pixels():
    for layout, scene, _ in _world():
        ids = paint_ids(layout)
        for index, obj in enumerate(scene.objects):
            ys, xs = np.nonzero(ids == index)
            assert obj.box == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
            full = np.count_nonzero(layout.sprites[index].mask)
            assert obj.visible == pytest.approx(len(xs) / full, abs=1e-4)
            assert obj.visible >= MIN_VISIBLE
            assert min(obj.box[2] - obj.box[0], obj.box[3] - obj.box[1]) >= MIN_VISIBLE_SIDE_PX


def test_every_name_is_in_the_visual_genome_vocabularies():
    objects, attributes = set(object_names()), set(attribute_names())
    assert set(SHAPES) | set(BACKGROUNDS) <= objects
    assert set(COLORS) | set(MATERIALS) | set(SIZES) <= attributes
    for _, scene, _ in _world():
        assert scene.background in BACKGROUNDS
        for obj in scene.objects:
            assert obj.shape in SHAPES and obj.color in COLORS
            assert obj.material in MATERIALS and obj.size in SIZES


def test_image_sizes_aspect_ratios_and_contents_vary():
    world = _world()
    widths = [scene.width for _, scene, _ in world]
    heights = [scene.height for _, scene, _ in world]
    aspects = [w / h for w, h in zip(widths, heights)]
    assert len(set(widths)) > 20 and len(set(heights)) > 20
    assert min(aspects) < 0.7 and max(aspects) > 1.45
    assert min(widths + heights) >= 180 and max(widths + heights) <= 340
    assert {scene.background for _, scene, _ in world} == set(BACKGROUNDS)
    objects = [o for _, scene, _ in world for o in scene.objects]
    for field, names in (("shape", SHAPES), ("color", COLORS), ("material", MATERIALS)):
        assert {getattr(o, field) for o in objects} == set(names)


def test_small_and_large_objects_have_separate_pixel_extents():
    for layout, _, _ in _world():
        for sprite in layout.sprites:
            low, high = SMALL_EXTENT_PX if sprite.size == "small" else LARGE_EXTENT_PX
            assert low <= min(sprite.mask.shape) <= high


def test_partial_occlusion_is_common_but_never_hides_most_of_an_object():
    world = _world()
    occluded = [any(o.visible < 0.95 for o in scene.objects) for _, scene, _ in world]
    assert 0.3 <= np.mean(occluded) <= 0.95
    assert min(o.visible for _, scene, _ in world for o in scene.objects) >= MIN_VISIBLE


def _grow(mask: np.ndarray, axis: int) -> np.ndarray:
    """mask with every pixel's two neighbours along `axis` set (no wrap-around at the edges)."""
    out = mask.copy()
    lead = [slice(None)] * mask.ndim
    lag = [slice(None)] * mask.ndim
    lead[axis], lag[axis] = slice(1, None), slice(None, -1)
    out[tuple(lead)] |= mask[tuple(lag)]
    out[tuple(lag)] |= mask[tuple(lead)]
    return out


def test_objects_of_one_colour_never_touch():
    for layout, scene, _ in _world():
        ids = paint_ids(layout)
        for i, a in enumerate(scene.objects):
            grown = ids == i  # grown by SAME_COLOR_GAP_PX - 1 px in each direction
            for _ in range(SAME_COLOR_GAP_PX - 1):
                grown = _grow(_grow(grown, axis=0), axis=1)
            for j, b in enumerate(scene.objects):
                if j != i and a.color == b.color:
                    assert not (grown & (ids == j)).any(), (scene.image_id, a, b)


def test_visible_pixels_are_nearest_their_nominal_colour():
    """As a viewer reads colour: the median pixel (wood grain darkens under half of an object),
    inside a plastic object's dark rim."""
    names = list(COLOR_RGB)
    table = np.array([COLOR_RGB[name] for name in names], dtype=float)
    for layout, scene, pixels in _world():
        ids = paint_ids(layout)
        for index, obj in enumerate(scene.objects):
            sprite = layout.sprites[index]
            rim = np.zeros(ids.shape, dtype=bool)
            if sprite.material == "plastic":
                rim[sprite.rect] = plastic_outline(sprite)
            median = np.median(pixels[(ids == index) & ~rim].astype(float), axis=0)
            distances = np.linalg.norm(table - median, axis=1)
            assert names[int(np.argmin(distances))] == obj.color, (scene.image_id, obj)


def test_backgrounds_are_muted_tones_unlike_any_object_colour():
    table = np.array(list(COLOR_RGB.values()), dtype=float)
    for layout, scene, pixels in _world():
        mean = pixels[paint_ids(layout) < 0].astype(float).mean(axis=0)
        assert np.linalg.norm(table - mean, axis=1).min() > 30, scene.background


def test_shape_masks_fill_their_rectangle_and_keep_their_form():
    for shape in SHAPES:
        mask = shape_mask(shape, 41, 33, rotation_deg=10.0)
        assert mask.shape == (33, 41)
        assert mask[0].any() and mask[-1].any() and mask[:, 0].any() and mask[:, -1].any()
    assert shape_mask("box", 10, 7).all()
    ball, ring = shape_mask("ball", 40, 40), shape_mask("ring", 40, 40)
    assert ball[20, 20] and not ring[20, 20] and not ball[0, 0]
    assert abs(ball.mean() - np.pi / 4) < 0.02
    star, diamond = shape_mask("star", 40, 40), shape_mask("diamond", 40, 40)
    assert 0.25 < star.mean() < 0.45 and abs(diamond.mean() - 0.5) < 0.05


def test_materials_look_different():
    mask = np.ones((40, 40), dtype=bool)
    rng = np.random.default_rng(0)
    looks = {
        material: sprite_pixels(Sprite("box", "blue", material, "large", 0, 0, mask), rng)
        for material in MATERIALS
    }
    inner = (slice(5, -5), slice(5, -5))
    brightness = {m: pixels[inner].mean(axis=2) for m, pixels in looks.items()}
    assert brightness["plastic"].std() < 2  # flat inside its outline
    assert looks["plastic"][0].mean() < 0.7 * looks["plastic"][inner].mean()  # dark outline
    assert brightness["metal"].max() > 200  # specular highlight on a dark blue
    assert brightness["wooden"].std() > 10  # grain stripes


def test_relation_helpers_agree_with_the_boxes():
    held = {name: 0 for name in RELATIONS}
    for _, scene, _ in _world():
        for a in scene.objects:
            for b in scene.objects:
                if a is b:
                    continue
                ax, ay = (a.box[0] + a.box[2]) / 2, (a.box[1] + a.box[3]) / 2
                bx, by = (b.box[0] + b.box[2]) / 2, (b.box[1] + b.box[3]) / 2
                area_a = (a.box[2] - a.box[0]) * (a.box[3] - a.box[1])
                area_b = (b.box[2] - b.box[0]) * (b.box[3] - b.box[1])
                assert RELATIONS["left of"](a, b) == (ax + RELATION_MARGIN_PX < bx)
                assert RELATIONS["right of"](a, b) == (bx + RELATION_MARGIN_PX < ax)
                assert RELATIONS["above"](a, b) == (ay + RELATION_MARGIN_PX < by)
                assert RELATIONS["below"](a, b) == (by + RELATION_MARGIN_PX < ay)
                assert RELATIONS["bigger than"](a, b) == (area_a > BIGGER_RATIO * area_b)
                # The size attribute never contradicts the visible boxes.
                if a.size == "small" and b.size == "large":
                    assert not RELATIONS["bigger than"](a, b)
                for name, holds in RELATIONS.items():
                    held[name] += holds(a, b)
    assert min(held.values()) > 20


def test_rendering_is_fast():
    start = time.perf_counter()
    for image_id in range(25):
        make_scene(image_id, "train", 99)
    # About 15 ms an image on one core; the bound leaves room for a busy shared machine.
    assert time.perf_counter() - start < 5.0
