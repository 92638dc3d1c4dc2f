"""A padded batch must give what one call per image gives (features, boxes, probabilities)."""

import dataclasses
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from extractor.config import DetectorConfig, ExtractorConfig, PreprocessConfig, SelectionConfig
from extractor.detector import BUTDDetector
from extractor.extractor import Extractor
from extractor.preprocess import DecodedImage, PreparedImage, resize_image

TINY = DetectorConfig(depth=18, width=8, rpn_hidden=32, rpn_post_nms_topk=30, rpn_min_size=4.0)


def _randomise_frozen_bn(model: torch.nn.Module, gen: torch.Generator) -> None:
    for name, buffer in model.named_buffers():
        if name.endswith("norm.weight"):
            buffer.copy_(0.5 + torch.rand(buffer.shape, generator=gen))
        elif name.endswith("norm.bias") or name.endswith("norm.running_mean"):
            buffer.copy_(0.2 * torch.randn(buffer.shape, generator=gen))
        elif name.endswith("norm.running_var"):
            buffer.copy_(0.5 + torch.rand(buffer.shape, generator=gen))


def _random_detector(cfg: DetectorConfig) -> BUTDDetector:
    torch.manual_seed(0)
    detector = BUTDDetector(cfg).eval()
    _randomise_frozen_bn(detector, torch.Generator().manual_seed(1))
    # Spread the random classifiers' logits so that argmaxes are not near-ties that rounding
    # noise (~1e-6) could flip.
    with torch.no_grad():
        detector.roi_heads.box_predictor.cls_score.weight.mul_(10)
        detector.roi_heads.box_predictor.attr_score.weight.mul_(10)
    return detector


@pytest.fixture(scope="module")
def model():
    return _random_detector(TINY)


def _image(h: int, w: int, seed: int) -> PreparedImage:
    """An (h, w) BGR photo-like image resized by the detector's preprocessing (short side 96)."""
    gen = torch.Generator().manual_seed(seed)
    # Smooth blobs plus noise: structure for the RPN to respond to.
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    base = 127 + 80 * torch.sin(yy / 7.0 + seed) * torch.cos(xx / 11.0)
    pixels = (base + 30 * torch.rand(h, w, 3, generator=gen).permute(2, 0, 1)).clamp(0, 255)
    bgr = pixels.permute(1, 2, 0).to(torch.uint8).numpy()
    return resize_image(bgr, PreprocessConfig(min_size=96, max_size=160))


@pytest.fixture(scope="module")
def images():
    # Landscape downscaled to 96x160, portrait kept at scale 1 (144x96), near-square upscaled.
    prepared = [_image(120, 200, 1), _image(144, 96, 2), _image(78, 82, 3)]
    assert [tuple(im.pixels.shape[1:]) for im in prepared] == [(96, 160), (144, 96), (96, 101)]
    assert prepared[1].scale_x == prepared[1].scale_y == 1.0
    return prepared


def _config(mode: str, **selection) -> ExtractorConfig:
    return ExtractorConfig(
        detector=TINY,
        selection=SelectionConfig(mode=mode, **selection),
        save_class_probs=True,
    )


def _assert_same(batched, single):
    assert len(batched) == len(single)
    for b, s in zip(batched, single):
        assert (b.image_height, b.image_width) == (s.image_height, s.image_width)
        np.testing.assert_array_equal(b.object_ids, s.object_ids)
        np.testing.assert_array_equal(b.attr_ids, s.attr_ids)
        np.testing.assert_allclose(b.boxes_xyxy_abs, s.boxes_xyxy_abs, rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(b.object_conf, s.object_conf, rtol=1e-4)
        np.testing.assert_allclose(b.attr_conf, s.attr_conf, rtol=1e-4)
        np.testing.assert_allclose(b.cls_probs, s.cls_probs, rtol=1e-4, atol=1e-9)
        # float32 features agree to ~1e-6 (test_padding_does_not_leak_float32); stored as
        # float16, a value next to a rounding boundary may land one float16 step away.
        one_step = np.spacing(np.maximum(np.abs(b.features), np.abs(s.features)))
        assert (np.abs(b.features.astype(np.float32) - s.features) <= one_step).all()


@pytest.mark.parametrize(
    "selection",
    [
        dict(mode="adaptive", min_boxes=5, max_boxes=20),
        dict(mode="fixed", num_boxes=12, saved_boxes="regressed"),
    ],
    ids=["adaptive", "fixed"],
)
def test_batched_equals_one_by_one(model, images, selection):
    extractor = Extractor(_config(**selection), model)
    batched = extractor(images)
    single = [extractor([im])[0] for im in images]
    _assert_same(batched, single)
    for region, im in zip(batched, images):
        assert region.features.dtype == np.float16
        assert region.features.shape[1] == TINY.feature_dim
        assert region.num_boxes >= 5
        boxes = region.boxes_xyxy_abs
        assert (boxes >= 0).all()
        assert (boxes[:, 2] <= im.orig_width + 1e-3).all() and (
            boxes[:, 3] <= im.orig_height + 1e-3
        ).all()
    assert set(extractor.last_timings) >= {"backbone", "rpn", "roi_head", "selection"}


@pytest.mark.parametrize(
    "cfg", [TINY, dataclasses.replace(TINY, depth=50, width=4)], ids=["basic", "bottleneck"]
)
def test_padding_does_not_leak_float32(cfg, images):
    """res4, proposals and RoI features of a padded batch equal each image's own, in float32."""
    model = _random_detector(cfg)
    extractor = Extractor(ExtractorConfig(detector=cfg), model)
    sizes = [tuple(im.pixels.shape[1:]) for im in images]
    min_sizes = [(4.0, 4.0)] * len(images)
    with torch.inference_mode():
        res4 = model.backbone(extractor._batch(images), sizes)
        proposals = model.proposal_generator(res4, sizes, min_sizes)
        head = model.roi_heads(res4, proposals)
        offset = 0
        for i, im in enumerate(images):
            alone = model.backbone(extractor._batch([im]), None)
            h, w = alone.shape[-2:]
            torch.testing.assert_close(res4[i, :, :h, :w], alone[0], rtol=1e-4, atol=1e-5)
            assert (res4[i, :, h:] == 0).all() and (res4[i, :, :, w:] == 0).all()
            own = model.proposal_generator(alone, sizes[i : i + 1], min_sizes[:1])[0]
            torch.testing.assert_close(proposals[i], own, rtol=1e-4, atol=1e-3)
            features = model.roi_heads(alone, [own]).features
            count = len(own)
            torch.testing.assert_close(
                head.features[offset : offset + count], features, rtol=1e-4, atol=1e-5
            )
            offset += count


def test_given_mode_batched_and_exact_boxes(model, images):
    rng = np.random.default_rng(0)
    given = []
    for im in images:
        x1 = rng.uniform(0, im.orig_width * 0.6, 7)
        y1 = rng.uniform(0, im.orig_height * 0.6, 7)
        w = rng.uniform(8, im.orig_width * 0.4, 7)
        h = rng.uniform(8, im.orig_height * 0.4, 7)
        given.append(np.stack([x1, y1, x1 + w, y1 + h], axis=1).astype(np.float32))
    extractor = Extractor(_config("given"), model)
    batched = extractor(images, given)
    single = [extractor([im], [g])[0] for im, g in zip(images, given)]
    _assert_same(batched, single)
    for region, boxes in zip(batched, given):
        np.testing.assert_array_equal(region.boxes_xyxy_abs, boxes)
        assert region.boxes_xyxy_abs.dtype == np.float32


def test_given_boxes_reproduce_proposal_features(model, images):
    """Features of a region depend only on its box: feeding the adaptive mode's saved proposals
    back as given boxes returns the same features, ids and class distribution."""
    im = images[1]  # scale 1: original pixels are input pixels, no rounding on the way back
    detected = Extractor(_config("adaptive", min_boxes=5, max_boxes=20), model)([im])[0]
    again = Extractor(_config("given"), model)([im], [detected.boxes_xyxy_abs])[0]
    np.testing.assert_array_equal(again.object_ids, detected.object_ids)
    np.testing.assert_allclose(again.cls_probs, detected.cls_probs, rtol=1e-5, atol=1e-9)
    np.testing.assert_array_equal(again.features, detected.features)


def test_class_probs_in_caffe_order(model, images):
    region = Extractor(_config("fixed", num_boxes=6), model)(images[:1])[0]
    probs = region.cls_probs
    assert probs.shape == (6, TINY.num_classes + 1)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    # Column 0 is background; object id k is column k + 1.
    np.testing.assert_array_equal(probs[:, 1:].argmax(axis=1), region.object_ids)
    np.testing.assert_allclose(
        probs[np.arange(6), region.object_ids + 1], region.object_conf, rtol=1e-6
    )
    assert (region.attr_ids < TINY.num_attributes).all()


def test_mode_and_boxes_must_agree(model, images):
    with pytest.raises(ValueError):
        Extractor(_config("adaptive"), model)(images[:1], [np.zeros((1, 4), np.float32)])
    with pytest.raises(ValueError):
        Extractor(_config("given"), model)(images[:1])
    with pytest.raises(ValueError, match="model built for"):
        Extractor(
            dataclasses.replace(_config("given"), detector=DetectorConfig(depth=18, width=8)), model
        )
    cfg = dataclasses.replace(_config("given"), save_class_probs=False)
    region = Extractor(cfg, model)(images[:1], [np.array([[0, 0, 30, 40]], np.float32)])[0]
    assert region.cls_probs is None and region.num_boxes == 1


def test_bfloat16_autocast_stays_close(model, images):
    boxes = [np.array([[5, 5, 60, 50], [20, 10, 90, 70]], np.float32)]
    exact = Extractor(_config("given"), model)(images[:1], boxes)[0]
    fast = Extractor(_config("given"), model, autocast_dtype=torch.bfloat16)(images[:1], boxes)[0]
    np.testing.assert_array_equal(fast.boxes_xyxy_abs, exact.boxes_xyxy_abs)
    error = np.abs(fast.features.astype(np.float32) - exact.features).mean()
    assert error < 0.05 * np.abs(exact.features.astype(np.float32)).mean()
    assert fast.cls_probs.dtype == np.float32


def test_saved_proposals_stay_inside_the_original_image(model):
    # 102 px wide -> 151 px input: 151 / float32(151 / 102) is 102.00001, so an RoI on the
    # input's right edge lands outside the image unless clipped (an invalid shard sample).
    images = [_image(65, 102, 4), _image(67, 107, 5)]
    cfg = _config("adaptive", saved_boxes="proposals", min_boxes=10, max_boxes=100)
    touching = 0
    for im, feats in zip(images, Extractor(cfg, model)(images)):
        boxes = feats.boxes_xyxy_abs
        assert (boxes >= 0).all()
        assert (boxes[:, [0, 2]] <= im.orig_width).all()
        assert (boxes[:, [1, 3]] <= im.orig_height).all()
        touching += int((boxes[:, 2] == im.orig_width).sum())
    assert touching > 0, "no proposal reaches the right edge: the test checks nothing"


def test_box_regression_runs_only_for_presets_that_save_regressed_boxes():
    """Proposal-saving presets (caffe, lxmert) never read regressed boxes: bbox_pred, 3/4 of the
    predictor's FLOPs, is skipped for them, and runs for the regressed-box presets."""
    from torch.utils.flop_counter import FlopCounterMode

    images = [_image(120, 200, 1), _image(144, 96, 2)]
    model = _random_detector(TINY)
    for selection, regressed in [({}, False),
                                 ({"saved_boxes": "regressed", "rank": "detection"}, True)]:
        extractor = Extractor(_config("adaptive", **selection), model)
        with FlopCounterMode(display=False) as counter:
            extractor(images)
        bbox = sum(sum(ops.values()) for name, ops in counter.get_flop_counts().items()
                   if name.endswith("bbox_pred"))
        rois = extractor.model.cfg.rpn_post_nms_topk * len(images)
        per_roi = 2 * TINY.feature_dim * 4 * TINY.num_classes
        assert bbox == (rois * per_roi if regressed else 0), selection


def test_padding_to_shape_buckets_changes_nothing(model, images):
    """On a GPU batches are padded to multiples of GPU_SIZE_MULTIPLE px (a bounded set of shapes
    for cuDNN); padding to any multiple changes nothing (64 here: more padding than 16)."""
    extractor = Extractor(_config("adaptive", min_boxes=5, max_boxes=20), model)
    assert extractor.pad_multiple == 1  # on the CPU
    exact = extractor(images)
    extractor.pad_multiple = 64
    assert extractor._batch(images).shape[-2:] == (192, 192)
    _assert_same(extractor(images), exact)


def test_two_canvases_change_no_region_and_cut_the_backbones_flops(model, images):
    """On a GPU the backbone runs on up to two canvases (extractor.canvases): here the landscape
    image gets one (96x160), the portrait and the near-square ones share the other (144x101),
    instead of all three padded to 144x160. The regions are those of one canvas, and the
    backbone's FLOPs are those of the two canvases alone (34.5% fewer)."""
    from torch.utils.flop_counter import FlopCounterMode

    def backbone_flops(canvases):
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            for n, h, w in canvases:
                model.backbone(torch.zeros(n, 3, h, w), [(h, w)] * n)
        return counter.get_total_flops()

    extractor = Extractor(_config("adaptive", min_boxes=5, max_boxes=20), model)
    assert extractor.canvases == 1  # on the CPU
    exact = extractor(images)
    extractor.canvases = 2
    with FlopCounterMode(display=False) as counter:
        _assert_same(extractor(images), exact)
    flops = sum(counter.get_flop_counts()["ResNetC4"].values())
    assert flops == backbone_flops([(1, 96, 160), (2, 144, 101)])
    assert flops < 0.66 * backbone_flops([(3, 144, 160)])


def test_uint8_pixels_give_the_same_regions(model, images):
    """Extraction ships PIL-resized pixels (whole numbers) as uint8 (steps.ship_pixels)."""
    from pipeline.extract.steps import Prepared, ship_pixels

    extractor = Extractor(_config("adaptive", min_boxes=5, max_boxes=20), model)
    items = [Prepared(ref=None, image=dataclasses.replace(im)) for im in images]
    ship_pixels(items, PreprocessConfig(resize="pil"), pin=False)
    assert all(item.image.pixels.dtype == torch.uint8 for item in items)
    assert all(torch.equal(i.image.pixels.float(), im.pixels) for i, im in zip(items, images))
    shipped = extractor([item.image for item in items])
    for a, b in zip(shipped, extractor(images)):
        np.testing.assert_array_equal(a.features, b.features)
        np.testing.assert_array_equal(a.boxes_xyxy_abs, b.boxes_xyxy_abs)


def test_images_resized_in_the_extractor_give_the_same_regions(model, tmp_path):
    """On a GPU the decoding threads leave the cv2 resize to the device (prepare's device_resize,
    resized in Extractor.submit); the regions are the same as with the resize done at decode
    time. A PIL-resize preset still resizes at decode time."""
    from pipeline.datasets import ImageRef
    from pipeline.extract.steps import prepare, ship_pixels

    refs = []
    for seed, (h, w) in enumerate([(120, 200), (144, 96)]):
        path = tmp_path / f"{seed}.png"
        Image.fromarray(_image(h, w, seed).pixels.permute(1, 2, 0).byte().numpy()).save(path)
        refs.append(ImageRef(dataset="test", image_id=str(seed), path=path))
    cfg = PreprocessConfig(min_size=96, max_size=160, resize="cv2")
    extractor = Extractor(_config("adaptive", min_boxes=5, max_boxes=20), model)
    at_decode = [prepare(ref, cfg) for ref in refs]
    deferred = [prepare(ref, cfg, device_resize=True) for ref in refs]
    ship_pixels(deferred, cfg, pin=False)
    assert all(isinstance(item.image, DecodedImage) for item in deferred)
    assert all(item.image.bgr.dtype == torch.uint8 for item in deferred)
    now = extractor([item.image for item in at_decode])
    for a, b in zip(extractor([item.image for item in deferred]), now):
        np.testing.assert_array_equal(a.features, b.features)
        np.testing.assert_array_equal(a.boxes_xyxy_abs, b.boxes_xyxy_abs)
    pil = prepare(refs[0], dataclasses.replace(cfg, resize="pil"), device_resize=True)
    assert isinstance(pil.image, PreparedImage)


def detected_alone_and_shared(extractor: Extractor, images: list) -> list[tuple]:
    """(alone, shared) RegionFeatures of every image of six batches: detected one batch after
    another, and by two threads through one SharedExtractor (the Ray engine's actor, two calls
    at once)."""
    from concurrent.futures import ThreadPoolExecutor
    from pipeline.extract.steps import Prepared, SharedExtractor, detect_batch

    picks = [(0, 1), (2,), (1, 2, 0), (0,), (2, 0), (1,)]

    def batch(pick):
        return [Prepared(ref=None, image=dataclasses.replace(images[i])) for i in pick]

    alone = []
    for pick in picks:
        detect_batch(extractor, items := batch(pick), Counter())
        alone.append(items)
    shared = SharedExtractor(extractor)
    together = [batch(pick) for pick in picks]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda items: shared.detect(items, Counter()), together))
    pairs = [(a, b) for one, two in zip(alone, together) for a, b in zip(one, two)]
    assert all(a.error is None and b.error is None for a, b in pairs)
    return [(a.features, b.features) for a, b in pairs]


def test_threads_sharing_an_extractor_get_their_own_batches_regions(model, images):
    extractor = Extractor(_config("adaptive", min_boxes=5, max_boxes=20), model)
    for alone, shared in detected_alone_and_shared(extractor, images):
        np.testing.assert_array_equal(alone.object_ids, shared.object_ids)
        np.testing.assert_array_equal(alone.features, shared.features)
        np.testing.assert_array_equal(alone.boxes_xyxy_abs, shared.boxes_xyxy_abs)
