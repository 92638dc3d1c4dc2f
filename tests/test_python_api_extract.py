"""issue 61, goals 1 and 2. Goal 1: `extractor.load(...)(images)` in Python gives the arrays
`pipeline extract` stores, bit for bit, for any mix of paths, PIL images, numpy arrays and tensors; `Regions.show`
draws the picture `pipeline show` draws; bad inputs fail by name. Goal 2: shards in one's own
loop (shards.RegionBatches, FeatureStore), and plain webdataset reading our shards.

The bundled world detector at the lxmert preset (cv2 resize, 36 boxes), on images resized to
192-320 pixels (the preset's 600-1000 took 4 times as long): the CLI reads the architecture from a
--config holding the detector's section, Python from the weights file."""

import json

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from skimage import data

import extractor
import shards
from extractor.config import DetectorConfig, PreprocessConfig
from extractor.inputs import read_image
from pipeline.cli import main
from pipeline.common.assets import bundled_detector
from shards.reader import iter_samples
from shards.schema import build_sample
from shards.writer import ShardWriter

CONFIG, WEIGHTS = bundled_detector()
SIZES = {"min_size": 192, "max_size": 320}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Three photographs of different sizes and modes (RGB JPEG, RGB PNG, grey JPEG), and a
    file that is not an image."""
    root = tmp_path_factory.mktemp("photos")
    Image.fromarray(data.astronaut()).resize((160, 160)).save(root / "astronaut.jpg")
    Image.fromarray(data.coffee()).resize((200, 150)).save(root / "coffee.png")
    Image.fromarray(data.camera()).resize((120, 180)).save(root / "camera.jpg")
    return root


@pytest.fixture(scope="module")
def extracted(photos, tmp_path_factory):
    """`pipeline extract` of the photos with the world detector at the lxmert preset: the shard
    directory and its samples by image id."""
    tmp = tmp_path_factory.mktemp("cli")
    config = tmp / "detector.yaml"
    config.write_text(yaml.safe_dump({"detector": yaml.safe_load(CONFIG.read_text())["detector"]}))
    out = tmp / "shards"
    code = main(["extract", "--dataset", "folder", "--root", str(photos), "--out", str(out),
                 "--weights", str(WEIGHTS), "--config", str(config), "--preset", "lxmert",
                 "--engine", "local", "--device", "cpu", "--set", "run.batch_size=3",
                 *(f"--set=preprocess.{k}={v}" for k, v in SIZES.items())])
    assert code == 0
    return out, {s.meta["image_id"]: s for s in iter_samples(out)}


@pytest.fixture(scope="module")
def ext():
    preprocess = PreprocessConfig(resize="cv2", **SIZES)
    return extractor.load(WEIGHTS, preset="lxmert", device="cpu", batch_size=3,
                          preprocess=preprocess)


def _same_as_stored(regions, sample):
    """Every array of `regions` equals the sample's, bit for bit (ids stored as int32)."""
    stored = sample.arrays
    assert (regions.image_height, regions.image_width) == (sample.meta["height"],
                                                           sample.meta["width"])
    assert sorted(regions.arrays()) == sorted(stored)
    for name, array in regions.arrays().items():
        assert array.dtype == stored[name].dtype or name.endswith("_ids"), name
        np.testing.assert_array_equal(array, stored[name], err_msg=name)


def test_any_mix_of_inputs_gives_the_arrays_pipeline_extract_stores(photos, extracted, ext):
    """The CLI's batch (run.batch_size 3, the folder in name order) and the same images as
    paths, PIL images, numpy arrays and tensors in a batch of 3: the same bits. (Other batches
    agree to float rounding only: a batch is padded to its largest image, tests/
    test_extractor_batching.py.)"""
    _, samples = extracted
    names = ["astronaut.jpg", "camera.jpg", "coffee.png"]
    pil = [Image.open(photos / name) for name in names]
    rgb = [np.array(image.convert("RGB")) for image in pil]
    mixes = [
        [photos / names[0], torch.from_numpy(rgb[1]).permute(2, 0, 1), rgb[2]],
        [pil[0], rgb[1][..., 0], str(photos / names[2])],  # the grey camera as (H, W)
    ]
    for inputs in mixes:
        regions = ext(inputs)
        for result, image_id in zip(regions, ["astronaut", "camera", "coffee"], strict=True):
            assert isinstance(result, extractor.Regions)
            assert result.num_boxes == 36
            _same_as_stored(result, samples[image_id])
    assert regions[1].name == "image 1 (numpy array (180, 120))"
    assert regions[0].object_names[0] == extractor.object_names()[regions[0].object_ids[0]]
    one = ext(pil[2])  # not in a list: one result
    assert one.source is pil[2] and one.image_size == (150, 200)
    for name, array in one.arrays().items():  # a batch of its own: float rounding apart
        np.testing.assert_allclose(array, samples["coffee"].arrays[name], rtol=1e-3, atol=1e-3)


def test_show_draws_the_picture_of_pipeline_show(photos, extracted, ext, tmp_path):
    shards, _ = extracted
    out = tmp_path / "shown.png"
    assert main(["show", "--shards", str(shards), "--key", "folder-coffee", "--out", str(out),
                 "--max-boxes", "5"]) == 0
    drawn = ext(photos / "coffee.png").show(max_boxes=5)
    np.testing.assert_array_equal(np.asarray(drawn), np.asarray(Image.open(out)))
    plain = np.asarray(Image.open(photos / "coffee.png"))
    assert (np.asarray(drawn) != plain).any()  # boxes were drawn


def test_a_bad_input_raises_naming_it(photos, ext):
    notes = photos / "notes.jpg"
    notes.write_text("this is not an image\n")
    cases = [
        (notes, f"{notes}: not a recognised image format"),
        (photos / "missing.jpg",
         f"{photos / 'missing.jpg'}: unreadable: No such file or directory"),
        (np.zeros((0, 40, 3), np.uint8),
         "image 0 (numpy array (0, 40, 3)): too small: 40x0 is smaller than the minimum side of "
         "16 px"),
        (np.zeros((40, 40, 3), np.float32),
         "image 0 (numpy array (40, 40, 3)): unsupported dtype float32: expected uint8, 0-255"),
        (torch.zeros(4, 40, 40),
         "image 0 (tensor (4, 40, 40)): unsupported dtype torch.float32: expected torch.uint8, "
         "0-255"),
        (torch.zeros(2, 40, 40, dtype=torch.uint8),
         "image 0 (tensor (2, 40, 40)): unsupported shape (2, 40, 40): expected (3, H, W) RGB, "
         "(4, H, W) RGBA or (H, W) grey"),
        ([[1, 2]], "image 0 (list): unsupported input list: expected a path, a PIL image, a numpy "
                   "array or a tensor"),
    ]
    for item, message in cases:
        with pytest.raises(extractor.ImageError) as caught:
            ext([item])
        assert str(caught.value) == message


def test_images_in_memory_have_the_pixels_of_their_files(photos, tmp_path):
    """An RGBA array or tensor is composited on white as its PNG file is; a PIL image keeps
    its EXIF orientation applied, as its file; grey arrays are the grey file's pixels."""
    cfg = PreprocessConfig()
    rgba = np.asarray(Image.open(photos / "coffee.png").convert("RGBA")).copy()
    rgba[:, :100, 3] = np.arange(100, dtype=np.uint8)[None, :] * 2  # a transparent left half
    Image.fromarray(rgba).save(tmp_path / "rgba.png")
    from_file = read_image(tmp_path / "rgba.png", "file", cfg)
    np.testing.assert_array_equal(read_image(rgba, "array", cfg), from_file)
    tensor = torch.from_numpy(rgba).permute(2, 0, 1)
    np.testing.assert_array_equal(read_image(tensor, "tensor", cfg), from_file)
    exif = Image.open(photos / "camera.jpg").getexif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to view
    Image.open(photos / "camera.jpg").save(tmp_path / "turned.jpg", exif=exif)
    turned = read_image(Image.open(tmp_path / "turned.jpg"), "pil", cfg)
    np.testing.assert_array_equal(turned, read_image(tmp_path / "turned.jpg", "file", cfg))
    assert turned.shape == (120, 180, 3)
    grey = np.asarray(Image.open(photos / "camera.jpg"))
    np.testing.assert_array_equal(read_image(grey, "grey", cfg),
                                  read_image(photos / "camera.jpg", "file", cfg))


def test_errors_return_keeps_the_good_images(photos, extracted, ext):
    _, samples = extracted
    bad = np.zeros((40, 40, 3), np.float32)
    # A batch of 5 inputs, the bad ones left out: the CLI's batch of the three images.
    inputs = [photos / "astronaut.jpg", bad, photos / "camera.jpg", photos / "missing.jpg",
              photos / "coffee.png"]
    ext5 = extractor.RegionExtractor(ext.extractor, batch_size=5)
    results = ext5(inputs, errors="return")
    assert [type(r) for r in results] == [extractor.Regions, extractor.ImageFailure,
                                          extractor.Regions, extractor.ImageFailure,
                                          extractor.Regions]
    assert results[1].index == 1 and results[1].source is bad
    assert results[1].error.startswith("image 1 (numpy array (40, 40, 3)): unsupported dtype")
    assert results[3].error == f"{photos / 'missing.jpg'}: unreadable: No such file or directory"
    for result, image_id in zip(results[::2], ["astronaut", "camera", "coffee"]):
        _same_as_stored(result, samples[image_id])
    streamed = list(ext5.stream(iter(inputs)))  # the same, from an iterable
    assert [type(r) for r in streamed] == [type(r) for r in results]
    _same_as_stored(streamed[2], samples["camera"])
    with pytest.raises(ValueError, match="errors = 'ignore'"):
        ext([photos / "coffee.png"], errors="ignore")


def test_given_boxes_give_the_features_pipeline_extract_stores_for_them(photos, tmp_path):
    root = tmp_path / "one"
    root.mkdir()
    (root / "coffee.png").write_bytes((photos / "coffee.png").read_bytes())
    boxes = np.float32([[10, 20, 90, 100], [0, 0, 200, 150], [120.5, 30, 190, 140]])
    (tmp_path / "boxes.json").write_text(json.dumps({"coffee": boxes.tolist()}))
    config = tmp_path / "detector.yaml"
    config.write_text(yaml.safe_dump({"detector": yaml.safe_load(CONFIG.read_text())["detector"]}))
    out = tmp_path / "shards"
    assert main(["extract", "--dataset", "folder", "--root", str(root), "--out", str(out),
                 "--weights", str(WEIGHTS), "--config", str(config), "--preset", "lxmert",
                 "--boxes", "given", "--given-boxes", str(tmp_path / "boxes.json"),
                 "--engine", "local", "--device", "cpu",
                 *(f"--set=preprocess.{k}={v}" for k, v in SIZES.items())]) == 0
    [sample] = iter_samples(out)
    ext = extractor.load(WEIGHTS, preset="lxmert", boxes="given",
                         preprocess=PreprocessConfig(resize="cv2", **SIZES))
    regions = ext(Image.open(root / "coffee.png"), boxes=boxes)
    np.testing.assert_array_equal(regions.boxes_xyxy_abs, boxes)
    _same_as_stored(regions, sample)
    with pytest.raises(ValueError, match="box mode 'given'"):
        ext(Image.open(root / "coffee.png"))
    with pytest.raises(ValueError, match="2 box arrays for 1 images"):
        ext([root / "coffee.png"], boxes=[boxes, boxes])


def test_load_reads_the_architecture_a_checkpoint_of_ours_records(tmp_path):
    ext = extractor.load(WEIGHTS, preset="pb-demo")
    stored = yaml.safe_load(CONFIG.read_text())["detector"]
    assert ext.cfg.detector == DetectorConfig(**{k: tuple(v) if isinstance(v, list) else v
                                                 for k, v in stored.items()})
    assert ext.cfg.preset == "pb-demo" and ext.cfg.selection.rank == "detection"
    assert extractor.load(WEIGHTS, device="auto").extractor.device.type == (
        "cuda" if torch.cuda.is_available() else "cpu")
    detecting = extractor.load(WEIGHTS, preset="lxmert")
    with pytest.raises(ValueError, match="this extractor's mode is 'fixed'"):
        detecting(np.zeros((40, 40, 3), np.uint8), boxes=np.zeros((1, 4)))
    with pytest.raises(extractor.WeightsError, match="does not exist"):
        extractor.load(tmp_path / "none.safetensors")
    with pytest.raises(ValueError, match="unknown preset 'lxmrt'"):
        extractor.load(WEIGHTS, preset="lxmrt")


# --- goal 2: shards in one's own loop -----------------------------------------------------------


def _write_shard_set(out, shards=3, per_shard=3, dim=8):
    """`shards` shards of `per_shard` samples, sample i with i + 1 regions of `dim` features
    whose values say which sample and region they are (i + region / 100)."""
    rng = np.random.default_rng(0)
    i = 0
    for shard in range(shards):
        with ShardWriter(out, f"{shard:05d}") as writer:
            for _ in range(per_shard):
                n = i + 1
                writer.write(build_sample(
                    dataset="coco", image_id=str(100 + i), split="train", width=64, height=48,
                    boxes=np.tile(np.float32([4, 2, 32, 24]), (n, 1)),
                    object_ids=np.arange(n), object_conf=rng.random(n),
                    attr_ids=np.arange(n) + 1, attr_conf=rng.random(n),
                    features=(i + np.arange(n)[:, None] / 100 + np.zeros((n, dim))).astype(
                        np.float16),
                    box_mode="adaptive", preset="caffe", params={},
                    detector={"name": "test", "config_hash": "0", "weights_hash": "0"},
                ))
                i += 1
    return out


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory):
    return _write_shard_set(tmp_path_factory.mktemp("shards") / "feats")


def test_region_batches_are_collated_samples_split_by_node_and_worker(shard_set):
    samples = list(shards.iter_samples(shard_set))
    assert [s.key for s in samples] == [f"coco-{100 + i}" for i in range(9)]
    batches = list(shards.RegionBatches(shard_set, batch_size=4, max_boxes=5))
    assert [b.keys for b in batches] == [tuple(s.key for s in samples[i:i + 4])
                                         for i in (0, 4, 8)]
    expected = shards.collate_regions(samples[4:8], max_boxes=5)
    for name in ("features", "boxes_xyxy_norm", "region_mask", "object_ids", "image_hw"):
        torch.testing.assert_close(getattr(batches[1], name), getattr(expected, name))
    assert batches[1].features.shape == (4, 5, 8)  # samples of 5..8 regions, cut at 5
    assert list(shards.RegionBatches(shard_set, batch_size=4, drop_last=True))[-1].keys == \
        batches[1].keys

    # Two ranks, two DataLoader workers each: every sample once, whole shards per worker.
    seen = []
    for rank in (0, 1):
        data = shards.RegionBatches(shard_set, batch_size=2, rank=rank, world_size=2,
                                    shuffle=4, seed=1)
        loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2)
        seen += [key for batch in loader for key in batch.keys]
    assert sorted(seen) == sorted(s.key for s in samples)

    # Shuffled by (seed, epoch): the same order again, another one the next epoch.
    data = shards.RegionBatches(shard_set, batch_size=9, shuffle=9, seed=3)
    first, again = next(iter(data)).keys, next(iter(data)).keys
    data.set_epoch(1)
    assert first == again != next(iter(data)).keys
    assert sorted(first) == sorted(s.key for s in samples)


def test_feature_store_reads_a_sample_by_image_id(shard_set):
    store = shards.FeatureStore(shard_set)
    sample = store.get_image("coco", "104")
    assert sample.key == "coco-104" and sample.num_boxes == 5
    np.testing.assert_array_equal(sample.arrays["features"][:, 0],
                                  np.float16(4 + np.arange(5) / 100))


def test_plain_webdataset_reads_our_shards_with_its_default_decoders(shard_set):
    """The convention's promise, with the webdataset package and none of our code."""
    import webdataset as wds

    urls = [str(p) for p in sorted(shard_set.glob("*.tar"))]
    read = list(wds.WebDataset(urls, shardshuffle=False).decode())
    ours = list(shards.iter_samples(shard_set))
    assert [r["__key__"] for r in read] == [s.key for s in ours]
    for r, s in zip(read, ours):
        assert r["json"] == s.meta
        for name, array in s.arrays.items():
            np.testing.assert_array_equal(r[f"{name}.npy"], array)
            assert r[f"{name}.npy"].dtype == array.dtype


def test_region_batches_stream_from_s3(bucket, shard_set):
    """s3:// as the training reader has it: a shard set uploaded as it is, read from the URL."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(f"{bucket}/feats")
    for path in shard_set.glob("*.tar"):
        fs.put_file(str(path), f"{root}/{path.name}")
    batches = list(shards.RegionBatches(f"{bucket}/feats", batch_size=5, max_boxes=3))
    assert [len(b) for b in batches] == [5, 4]
    local = list(shards.RegionBatches(shard_set, batch_size=5, max_boxes=3))
    torch.testing.assert_close(batches[1].features, local[1].features)
