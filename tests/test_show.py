"""`pipeline show`: boxes land on their pixels; the image comes from the shard or the dataset."""

import shutil

import numpy as np
import pytest
import yaml
from PIL import Image, ImageDraw

from extractor.labels import attribute_names, object_names
from extractor.preprocess import decode_image
from pipeline.cli import main
from pipeline.extract.show import (
    box_colors, draw_regions, place_labels, region_labels, select_regions,
)
from shards.reader import iter_samples
from shards.schema import build_sample
from shards.writer import ShardWriter

BACKGROUND = (128, 128, 128)
# Two solid rectangles in a 200 x 120 scene, x1 y1 x2 y2 in pixels (x2, y2 exclusive).
SCENE_BOXES = [[20, 30, 80, 90], [120, 10, 190, 60]]
FILLS = [(200, 40, 40), (40, 40, 200)]
OTHER_BOXES = [[5, 5, 50, 40]]
BALL, RED = object_names().index("ball"), attribute_names().index("red")


@pytest.fixture
def photos(tmp_path):
    """A folder dataset: `scene` (the rectangles above) and `sub/other`."""
    root = tmp_path / "photos"
    (root / "sub").mkdir(parents=True)
    scene = Image.new("RGB", (200, 120), BACKGROUND)
    draw = ImageDraw.Draw(scene)
    for (x1, y1, x2, y2), fill in zip(SCENE_BOXES, FILLS):
        draw.rectangle((x1, y1, x2 - 1, y2 - 1), fill=fill)
    scene.save(root / "scene.png")
    Image.new("RGB", (90, 70), (20, 120, 60)).save(root / "sub" / "other.png")
    return root


def write_shards(out, root, keep_images=False, boxes_by_id=None):
    """Shards of images under `root` as an extraction writes them, without running a detector:
    the size of the decoded image, boxes in its pixels, confidences falling from 0.9 to 0.6, and
    extract_config.yaml's dataset and root (the two fields show reads)."""
    boxes_by_id = boxes_by_id or {"scene": SCENE_BOXES, "sub/other": OTHER_BOXES}
    with ShardWriter(out, "00000") as writer:
        for image_id, boxes in boxes_by_id.items():
            path = next(root.glob(f"{image_id}.*"))
            height, width = decode_image(path.read_bytes(), str(path)).shape[:2]
            n = len(boxes)
            writer.write(build_sample(
                dataset="folder", image_id=image_id, split="", width=width, height=height,
                boxes=np.float32(boxes), object_ids=np.full(n, BALL),
                object_conf=np.linspace(0.9, 0.6, n), attr_ids=np.full(n, RED),
                attr_conf=np.full(n, 0.5), features=np.zeros((n, 8), np.float16),
                box_mode="given", preset="caffe", params={},
                detector={"name": "test", "config_hash": "0", "weights_hash": "0"},
                image_bytes=path.read_bytes() if keep_images else None,
                image_ext=path.suffix[1:] if keep_images else None,
            ))
    record = {"dataset": "folder", "root": str(root)}
    (out / "extract_config.yaml").write_text(yaml.safe_dump(record))
    return out


def show(capsys, shards, key, out, *extra):
    code = main(["show", "--shards", str(shards), "--key", key, "--out", str(out), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_outlined(pixels, box, color, fill):
    """The box's border pixels have `color`; pixels just outside and well inside are untouched."""
    x1, y1, x2, y2 = box
    mid_x, mid_y = (x1 + x2) // 2, (y1 + y2) // 2
    for y, x in [(mid_y, x1), (mid_y, x2 - 1), (y2 - 1, mid_x)]:
        assert tuple(pixels[y, x]) == color, (box, x, y)
    for y, x in [(mid_y, x1 - 2), (mid_y, x2 + 1), (y2 + 1, mid_x)]:
        assert tuple(pixels[y, x]) == BACKGROUND, (box, x, y)
    assert tuple(pixels[y2 - 5, mid_x]) == fill


def test_boxes_are_drawn_on_their_objects(photos, tmp_path, capsys):
    """Stored boxes are original-image pixels: show outlines exactly the rectangles' pixels."""
    feats = write_shards(tmp_path / "feats", photos)
    code, printed, _ = show(capsys, feats, "folder-scene", tmp_path / "look.png")
    assert code == 0
    assert str(tmp_path / "look.png") in printed
    assert "2 of 2 boxes" in printed and "200x120" in printed
    pixels = np.asarray(Image.open(tmp_path / "look.png"))
    assert pixels.shape == (120, 200, 3)
    for box, color, fill in zip(SCENE_BOXES, box_colors(2), FILLS):
        assert_outlined(pixels, box, color, fill)


def test_draw_regions_outlines_box_pixels_and_keeps_labels_inside():
    image = Image.new("RGB", (100, 100), BACKGROUND)
    drawn = draw_regions(image, np.float32([[10, 20, 40, 50], [70, 80, 100, 100]]),
                         ["red ball 0.90", "corner box 0.50"])
    assert image.getpixel((10, 30)) == BACKGROUND  # the input is not modified
    pixels = np.asarray(drawn)
    assert_outlined(pixels, [10, 20, 40, 50], box_colors(2)[0], BACKGROUND)
    # The corner box's label does not fit right of x=70: it is shifted left to stay visible.
    assert (pixels[:80, :70] == box_colors(2)[1]).all(-1).any()
    assert len(set(box_colors(36))) == 36


def assert_inside_and_apart(rects, image_size):
    width, height = image_size
    for x1, y1, x2, y2 in rects:
        assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height, (x1, y1, x2, y2)
    for i, a in enumerate(rects):
        for b in rects[i + 1:]:
            apart = a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
            assert apart, (a, b)


def test_labels_at_the_borders_stay_inside_the_image():
    boxes = [[0, 0, 60, 40],      # top left corner: no room above, so just inside the top edge
             [150, 50, 200, 90],  # right edge: the label is wider than the room right of x1
             [20, 100, 90, 120],  # bottom edge: above the box as usual
             [170, 105, 200, 120],  # bottom right corner, under a label placed before
             [-30, -20, 250, 150]]  # larger than the image
    sizes = [(70, 14)] * 5
    rects = place_labels(np.float32(boxes), sizes, (200, 120))
    assert rects[:3] == [(0, 0, 70, 14), (130, 36, 200, 50), (20, 86, 90, 100)]
    assert None not in rects
    assert [(x2 - x1, y2 - y1) for x1, y1, x2, y2 in rects] == sizes
    assert_inside_and_apart(rects, (200, 120))


def test_coincident_boxes_get_labels_that_do_not_overlap():
    box = [60, 40, 100, 80]
    rects = place_labels(np.float32([box] * 4), [(70, 14)] * 4, (200, 120))
    # The first where it wants to be, the next just below it (inside the box), then the nearest
    # free places: above the first, then below the second.
    assert rects == [(60, 26, 130, 40), (60, 40, 130, 54), (60, 12, 130, 26), (60, 54, 130, 68)]


def test_labels_larger_than_the_image_are_cut_and_no_room_leaves_a_label_out():
    assert place_labels(np.float32([[5, 5, 10, 10]]), [(300, 50)], (200, 30)) == [(0, 0, 200, 30)]
    rects = place_labels(np.float32([[0, 0, 20, 20]] * 3), [(20, 10)] * 3, (20, 20))
    assert rects == [(0, 0, 20, 10), (0, 10, 20, 20), None]


def test_many_labels_in_a_crowded_image_never_overlap():
    rng = np.random.default_rng(0)
    corners = rng.integers(-10, 190, size=(36, 2))
    boxes = np.concatenate([corners, corners + rng.integers(5, 80, size=(36, 2))], axis=1)
    sizes = [(int(w), 12) for w in rng.integers(30, 90, size=36)]
    rects = place_labels(boxes, sizes, (200, 150))
    placed = [r for r in rects if r is not None]
    assert len(placed) >= 25  # 36 labels of ~60 x 12 fill 86% of 200 x 150: most fit
    assert_inside_and_apart(placed, (200, 150))


def test_drawn_labels_of_coincident_boxes_are_both_visible():
    image = Image.new("RGB", (100, 100), BACKGROUND)
    drawn = np.asarray(draw_regions(image, np.float32([[20, 40, 80, 90]] * 2),
                                    ["red ball 0.90", "blue ball 0.50"]))
    first, second = box_colors(2)
    # Rows where a label's background spans the columns just right of the box's left edge.
    first_rows = np.flatnonzero((drawn[:, 21:50] == first).all(-1).all(-1))
    second_rows = np.flatnonzero((drawn[:, 21:50] == second).all(-1).all(-1))
    assert len(first_rows) and first_rows.max() < 40  # above the box
    # Inside the box, between its top and bottom outlines (rows 40 and 89, the second colour).
    assert ((second_rows > 40) & (second_rows < 89)).any()


def test_labels_and_selection(photos, tmp_path):
    sample = next(iter_samples(write_shards(tmp_path / "feats", photos)))
    sample.arrays["attr_conf"][:] = [0.5, 0.05]
    labels = region_labels(sample, np.array([0, 1]), min_attr_conf=0.1)
    assert labels == ["red ball 0.90", "ball 0.60"]
    conf = np.float32([0.2, 0.9, 0.5, 0.7])
    assert select_regions(conf, max_boxes=2, min_conf=0.3).tolist() == [1, 3]
    assert select_regions(conf, max_boxes=36, min_conf=0.6).tolist() == [1, 3]


def test_image_from_the_dataset_the_shard_and_a_moved_root(photos, tmp_path, capsys):
    feats = write_shards(tmp_path / "feats", photos)
    code, printed, _ = show(capsys, feats, "folder-sub%2Fother", tmp_path / "a.png")
    assert code == 0 and str(photos / "sub" / "other.png") in printed and "90x70" in printed

    kept = write_shards(tmp_path / "kept", photos, keep_images=True)
    moved = tmp_path / "moved"
    shutil.move(photos, moved)
    code, printed, _ = show(capsys, kept, "folder-scene", tmp_path / "b.png", "--max-boxes", "1")
    assert code == 0 and "1 of 2 boxes" in printed and "stored in" in printed

    code, _, err = show(capsys, feats, "folder-scene", tmp_path / "c.png")
    assert code == 2 and str(photos) in err and "--root" in err
    code, printed, _ = show(capsys, feats, "folder-scene", tmp_path / "c.png", "--root", str(moved))
    assert code == 0 and str(moved / "scene.png") in printed
    # The stored image and the moved file give the same picture (below the labels).
    assert np.array_equal(np.asarray(Image.open(tmp_path / "b.png").crop((0, 60, 200, 120))),
                          np.asarray(Image.open(tmp_path / "c.png").crop((0, 60, 200, 120))))


def test_exif_orientation_is_applied_as_in_extraction(tmp_path, capsys):
    """A photo stored sideways: its boxes refer to the upright image the extractor decoded."""
    root = tmp_path / "photos"
    root.mkdir()
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise for display
    Image.new("RGB", (120, 200), BACKGROUND).save(root / "phone.jpg", exif=exif)
    feats = write_shards(tmp_path / "feats", root, boxes_by_id={"phone": [[10, 10, 150, 100]]})
    code, printed, _ = show(capsys, feats, "folder-phone", tmp_path / "look.png")
    assert code == 0 and "200x120" in printed
    assert Image.open(tmp_path / "look.png").size == (200, 120)


def test_unknown_key_lists_close_keys(photos, tmp_path, capsys):
    feats = write_shards(tmp_path / "feats", photos)
    code, _, err = show(capsys, feats, "folder-scen", tmp_path / "x.png")
    assert code == 2
    assert "'folder-scen'" in err and "2 samples" in err and "closest keys: folder-scene" in err
    assert not (tmp_path / "x.png").exists()


def test_a_key_one_digit_short_is_suggested_first():
    """coco-100002 for coco-1000002: difflib ranked ten keys ending in 2 above it."""
    from pipeline.extract.show import _key_hint

    keys = [f"coco-{1_000_000 + i}" for i in range(60)] + [f"vg-{i}" for i in range(1, 60)]
    assert _key_hint("coco-100002", keys) == (
        "closest keys: coco-1000002, coco-1000012, coco-1000020, coco-1000021, coco-1000022 "
        "(and 10 more); the keys: coco-1000000 .. coco-1000059 (60); vg-1 .. vg-59 (59)")
    assert _key_hint("nlvr2-x", keys).startswith("no key is close; the keys: coco-1000000 ..")


def test_missing_image_says_where_it_looked(photos, tmp_path, capsys):
    feats = write_shards(tmp_path / "feats", photos)
    (photos / "scene.png").unlink()
    code, _, err = show(capsys, feats, "folder-scene", tmp_path / "x.png")
    assert code == 2
    assert "'scene'" in err and str(photos) in err
    assert "extract_config.yaml" in err and "--root" in err

    Image.new("RGB", (50, 50)).save(photos / "scene.png")
    code, _, err = show(capsys, feats, "folder-scene", tmp_path / "x.png")
    assert code == 2 and "50x50" in err and "200x120" in err

    (feats / "extract_config.yaml").unlink()
    code, _, err = show(capsys, feats, "folder-scene", tmp_path / "x.png", "--root", str(photos))
    assert code == 2 and "no stored image" in err and "no extract_config.yaml" in err


def test_show_has_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["show", "--help"])
    assert exit_info.value.code == 0
    assert "--max-boxes" in capsys.readouterr().out
