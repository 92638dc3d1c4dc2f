"""The trainable visual front end (extractor/front_end.py) on the bundled world detector (and,
for parity with extraction, a random detector with the R101 model's head).

Untrained, it computes the extractor's features for the same boxes; gradients reach only the
trained stages and never a BatchNorm; RoIAlign, checkpointing and bf16 autocast are options of the
same network; masked regions' pixels are zeroed exactly where their boxes lie after the resize and
a flip; and a fine-tuned trunk saved as a detector re-extracts through `pipeline extract`.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil

import numpy as np
import pytest
import safetensors.torch
import torch
from test_extractor_batching import TINY, _random_detector

from extractor.backbone import ConvNorm, fold_frozen_norms
from extractor.config import (
    DetectorConfig, ExtractorConfig, PreprocessConfig, SelectionConfig, VisualFrontEndConfig,
)
from extractor.detector import BUTDDetector
from extractor.extractor import Extractor
from extractor.front_end import VisualFrontEnd, mask_region_pixels
from extractor.preprocess import decode_image, flip_boxes, resize_image, scale_boxes
from extractor.training import unfreeze_batchnorm
from extractor.weights import load_detector_weights, read_detector_config
from pipeline.common.assets import SAMPLE_IMAGES, bundled_detector
from pipeline.extract.config import resolve_job

PHOTOS = ("astronaut.jpg", "coffee.jpg", "chelsea.jpg")
# Short side 192: three sizes (192 x 192, 192 x 288, 192 x 289), so the batch is padded.
SMALL = PreprocessConfig(min_size=192, max_size=320)
TRUNK = ("stem", "res2", "res3", "res4")


def _detector() -> BUTDDetector:
    """The bundled world detector (R18, width 8: 64-d features), loaded as extraction loads it."""
    _, weights = bundled_detector()
    detector = BUTDDetector(read_detector_config(weights))
    load_detector_weights(detector, weights)
    return detector


def _bottleneck_detector() -> BUTDDetector:
    """Random, with random frozen norms, and the R101 model's head: bottleneck blocks, res5
    dilated by 2, a 14 x 14 pooler (the same weights at every call)."""
    cfg = dataclasses.replace(TINY, depth=50, width=4)
    assert (cfg.res5_dilation, cfg.pooler_resolution) == (2, 14)
    return _random_detector(cfg)


def _photos(names, cfg: PreprocessConfig):
    return [resize_image(decode_image((SAMPLE_IMAGES / n).read_bytes(), n, cfg), cfg)
            for n in names]


def _boxes(image, seed: int) -> np.ndarray:
    """(6, 4) boxes in original pixels: the whole image first (as VL-BERT), then five others."""
    rng = np.random.default_rng(seed)
    h, w = image.orig_height, image.orig_width
    x = np.sort(rng.uniform(0, w, size=(5, 2)), axis=1)
    y = np.sort(rng.uniform(0, h, size=(5, 2)), axis=1)
    others = np.stack((x[:, 0], y[:, 0], x[:, 1] + 20, y[:, 1] + 20), axis=1).clip(0, [w, h, w, h])
    return np.concatenate(([[0, 0, w, h]], others)).astype(np.float32)


def _batch(images, detector_cfg):
    """(N, 3, H, W) mean-subtracted BGR, each image top left, zero-padded; and the valid sizes:
    the extractor's batch, built here from its documented contract."""
    mean = torch.tensor(detector_cfg.pixel_mean_bgr).view(3, 1, 1)
    sizes = [tuple(im.pixels.shape[1:]) for im in images]
    batch = torch.zeros(len(images), 3, max(h for h, _ in sizes), max(w for _, w in sizes))
    for i, (im, (h, w)) in enumerate(zip(images, sizes)):
        batch[i, :, :h, :w] = im.pixels.float() - mean
    return batch, sizes


@pytest.fixture(scope="module")
def inputs():
    """(photos, their boxes in original pixels, the padded batch, sizes, boxes in input px)."""
    photos = _photos(PHOTOS, SMALL)
    boxes = [_boxes(im, seed) for seed, im in enumerate(photos)]
    images, sizes = _batch(photos, _detector().cfg)
    assert len(set(sizes)) == 3  # padded in both directions
    return photos, boxes, images, sizes, [scale_boxes(b, im) for b, im in zip(boxes, photos)]


def _stage(name: str) -> str:
    """The stage of a front-end parameter: backbone.res3.0.conv1.weight -> res3."""
    parts = name.split(".")
    return parts[1] if parts[0] == "backbone" else "res5"


@pytest.mark.parametrize("make", [_detector, _bottleneck_detector], ids=["world", "bottleneck"])
def test_untrained_front_end_gives_the_extractors_features(inputs, make):
    photos, boxes, images, sizes, input_boxes = inputs
    detector = make()
    extractor = Extractor(
        ExtractorConfig(detector=detector.cfg, selection=SelectionConfig(mode="given")), detector
    )
    assert all(c.folded is not None for c in detector.modules() if isinstance(c, ConvNorm))
    pending = extractor.submit(photos, boxes)
    expected = pending.head.features  # float32, before RegionFeatures' float16
    stored = np.concatenate([r.features for r in extractor.collect(pending)])
    np.testing.assert_array_equal(stored, expected.half().numpy())

    front_end = VisualFrontEnd(make())
    features = front_end(images, sizes, input_boxes)
    assert features.dtype == torch.float32 and features.requires_grad
    assert features.shape == (6 * len(photos), front_end.detector_cfg.feature_dim)
    # The extractor's convolutions have their norms folded in; the front end's do not.
    scale = expected.abs().max().item()
    torch.testing.assert_close(features.detach(), expected, rtol=1e-4, atol=1e-4 * scale)


@pytest.mark.parametrize("frozen, trained", [
    (("stem", "res2"), {"res3", "res4", "res5"}),
    (TRUNK, {"res5"}),
], ids=["vl-bert", "res5-only"])
def test_gradients_reach_the_trained_stages_only(inputs, frozen, trained):
    _, _, images, sizes, input_boxes = inputs
    front_end = VisualFrontEnd(_detector(), config=VisualFrontEndConfig(frozen_stages=frozen))
    front_end(images, sizes, input_boxes).square().mean().backward()
    for name, param in front_end.named_parameters():
        if _stage(name) in trained:
            assert param.requires_grad and param.grad is not None, name
            assert param.grad.abs().sum() > 0, name
        else:
            assert not param.requires_grad and param.grad is None, name
    assert {_stage(n) for n, p in front_end.named_parameters() if p.requires_grad} == trained


def test_frozen_norms_and_stages_stay_as_they_were_after_steps(inputs):
    _, _, images, sizes, input_boxes = inputs
    front_end = VisualFrontEnd(_detector()).train()
    before = {k: v.clone() for k, v in front_end.state_dict().items()}
    buffers = {name for name, _ in front_end.named_buffers()}
    assert buffers and all(".norm." in name for name in buffers)
    # Every parameter handed to the optimiser, weight decay on: only gradients decide what moves.
    optimizer = torch.optim.AdamW(front_end.parameters(), lr=1e-3, weight_decay=0.1)
    target = torch.randn(len(torch.cat(input_boxes)), front_end.detector_cfg.feature_dim)
    for _ in range(3):
        optimizer.zero_grad()
        (front_end(images, sizes, input_boxes) - target).square().mean().backward()
        optimizer.step()
    after = front_end.state_dict()
    for name in buffers:
        assert torch.equal(after[name], before[name]), name
    for name, _ in front_end.named_parameters():
        moved = not torch.equal(after[name], before[name])
        assert moved == (_stage(name) in ("res3", "res4", "res5")), name


def test_roi_align_pools_between_cells_where_roi_pool_quantises(inputs):
    _, _, images, sizes, input_boxes = inputs
    detector = _detector()
    pool = VisualFrontEnd(detector)
    align = VisualFrontEnd(detector, config=VisualFrontEndConfig(pooler="roi_align"))
    with torch.no_grad():
        pooled, aligned = pool(images, sizes, input_boxes), align(images, sizes, input_boxes)
    assert aligned.shape == pooled.shape and torch.isfinite(aligned).all()
    assert (aligned - pooled).abs().max() > 0.05 * pooled.abs().max()
    # Moved by 3 of res4's 16 pixels, the box rounds to the same cells: RoIPool sees no change.
    box = torch.tensor([[32.0, 32, 160, 160]])
    moved = [torch.cat((box, box + 3.0))]
    with torch.no_grad():
        pooled = pool(images[:1], sizes[:1], moved)
        aligned = align(images[:1], sizes[:1], moved)
    torch.testing.assert_close(pooled[0], pooled[1], rtol=0, atol=0)
    assert not torch.allclose(aligned[0], aligned[1], rtol=1e-3, atol=1e-3)
    align(images, sizes, input_boxes).sum().backward()
    assert detector.backbone.res3[0].conv1.weight.grad.abs().sum() > 0


def _run(front_end, images, sizes, boxes):
    """(features, {name: gradient}, bytes autograd saved for the backward pass outside
    checkpointed regions)."""
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    front_end.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        features = front_end(images, sizes, boxes)
    features.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in front_end.named_parameters() if p.grad is not None}
    return features.detach(), grads, sum(saved)


def test_checkpointed_res5_gives_the_same_features_and_gradients(inputs):
    _, _, images, sizes, input_boxes = inputs
    detector = _detector()
    plain = VisualFrontEnd(detector)
    checkpointed = VisualFrontEnd(detector, config=VisualFrontEndConfig(checkpoint_res5=True))
    features, grads, saved = _run(plain, images, sizes, input_boxes)
    features_c, grads_c, saved_c = _run(checkpointed, images, sizes, input_boxes)
    torch.testing.assert_close(features_c, features, rtol=0, atol=0)
    assert grads_c.keys() == grads.keys() and len(grads) > 0
    for name in grads:
        torch.testing.assert_close(grads_c[name], grads[name], rtol=1e-6, atol=0)
    # res5 keeps no activations: at least its output (R, D, P, P) float32 is not saved.
    cfg = detector.cfg
    res5_out = len(features) * cfg.feature_dim * cfg.pooler_resolution**2 * 4
    assert saved - saved_c >= res5_out


def test_bf16_autocast_on_the_cpu(inputs):
    _, _, images, sizes, input_boxes = inputs
    detector = _detector()
    front_end = VisualFrontEnd(detector)
    with torch.no_grad():
        reference = front_end(images, sizes, input_boxes)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        features = front_end(images, sizes, input_boxes)
    assert features.dtype == torch.float32
    assert not torch.equal(features.detach(), reference)  # the CNN did run in bfloat16
    scale = reference.abs().max().item()
    torch.testing.assert_close(features.detach(), reference, rtol=0.05, atol=0.02 * scale)
    features.square().mean().backward()
    grad = detector.backbone.res3[0].conv1.weight.grad
    assert grad.dtype == torch.float32 and grad.abs().sum() > 0


def test_a_folded_detector_is_unfolded_and_folding_later_is_refused(inputs):
    _, _, images, sizes, input_boxes = inputs
    folded = _detector()
    fold_frozen_norms(folded)
    front_end = VisualFrontEnd(folded)
    assert all(c.folded is None for c in folded.modules() if isinstance(c, ConvNorm))
    with torch.no_grad():  # where a folded copy would be used: bit for bit the unfolded network
        features = front_end(images, sizes, input_boxes)
        expected = VisualFrontEnd(_detector())(images, sizes, input_boxes)
    torch.testing.assert_close(features, expected, rtol=0, atol=0)
    fold_frozen_norms(folded)  # e.g. an Extractor built on the same detector
    with pytest.raises(RuntimeError, match="folded after it was built"):
        front_end(images, sizes, input_boxes)


def test_trainable_norms_and_bad_options_are_refused():
    with pytest.raises(ValueError, match="freeze_batchnorm"):
        VisualFrontEnd(unfreeze_batchnorm(_detector()))
    with pytest.raises(ValueError, match="res6"):
        VisualFrontEndConfig(frozen_stages=("stem", "res6"))
    with pytest.raises(ValueError, match="pooler"):
        VisualFrontEndConfig(pooler="max")
    with pytest.raises(TypeError):
        VisualFrontEndConfig(("stem",))  # keyword-only
    with pytest.raises(TypeError):
        VisualFrontEnd(_detector(), VisualFrontEndConfig())  # keyword-only


def _write_checkpoint(fmt: str, path):
    """The world detector's tensors as a detectron2 pickle or as the Hugging Face port's
    torch.save file (BatchNorm2d counters included)."""
    _, weights = bundled_detector()
    tensors = safetensors.torch.load_file(weights)
    if fmt == "d2-pickle":
        model = {name: t.numpy() for name, t in tensors.items()}
        path.write_bytes(pickle.dumps({"model": model, "__author__": "test"}, protocol=2))
    else:
        for name in [n for n in tensors if n.endswith(".norm.running_var")]:
            tensors[name.replace("running_var", "num_batches_tracked")] = torch.tensor(0)
        torch.save(tensors, path)


@pytest.mark.parametrize("fmt, suffix", [("d2-pickle", ".pkl"), ("torch", ".bin")])
def test_weights_load_from_every_checkpoint_format(inputs, tmp_path, fmt, suffix):
    _, _, images, sizes, input_boxes = inputs
    path = tmp_path / f"detector{suffix}"
    _write_checkpoint(fmt, path)
    detector = BUTDDetector(_detector().cfg)
    assert load_detector_weights(detector, path).format == fmt
    with torch.no_grad():
        features = VisualFrontEnd(detector)(images, sizes, input_boxes)
        expected = VisualFrontEnd(_detector())(images, sizes, input_boxes)
    torch.testing.assert_close(features, expected, rtol=0, atol=0)


def test_masked_pixels_are_zeroed_inside_masked_boxes_only_after_resize_and_flip():
    cfg = PreprocessConfig(min_size=8, max_size=20, min_side=1)
    rng = np.random.default_rng(0)
    # 4 x 5 and 4 x 4 originals, resized by 2 to 8 x 10 and 8 x 8.
    originals = [rng.integers(0, 256, size=(4, w, 3), dtype=np.uint8) for w in (5, 4)]
    first, second = (resize_image(o, cfg) for o in originals)
    assert (first.scale_x, first.scale_y, second.scale_x) == (2.0, 2.0, 2.0)
    first.pixels = first.pixels.flip(-1)  # the first image is flipped left to right

    boxes_abs = np.array([[1.0, 0.5, 2.25, 1.5], [0, 2.5, 1, 4], [3.6, 3, 5, 4]], np.float32)
    flipped = flip_boxes(scale_boxes(boxes_abs, first), first.pixels.shape[-1])
    # By hand: x2, y2 scaled to input pixels, then x -> 10 - x, x1 and x2 swapped.
    torch.testing.assert_close(flipped, torch.tensor([[5.5, 1, 8, 3], [8, 5, 10, 8],
                                                      [0, 6, 2.8, 8]]))
    second_boxes = scale_boxes(np.array([[3.0, 3, 6, 4.5]], np.float32), second)  # (6, 6, 12, 9)
    images, sizes = _batch([first, second], DetectorConfig())
    images[1, :, :, 8:] = 7.0  # padding to the right of the 8 x 8 image: must stay as it is
    masked = [torch.tensor([True, False, True]), torch.tensor([True])]
    out = mask_region_pixels(images, sizes, [flipped, second_boxes], masked)

    # Every pixel the masked boxes touch, by hand: first image rows 1-2 x columns 5-7 (box 0) and
    # rows 6-7 x columns 0-2 (box 2; box 1 is not masked); second image rows 6-7 x columns 6-7
    # (its box reaches column 12, the image ends at 8).
    covered = torch.zeros(2, 8, 10, dtype=torch.bool)
    covered[0, 1:3, 5:8] = True
    covered[0, 6:8, 0:3] = True
    covered[1, 6:8, 6:8] = True
    covered = covered[:, None].expand_as(images)
    assert (images[covered] != 0).all()
    assert (out[covered] == 0).all()
    torch.testing.assert_close(out[~covered], images[~covered], rtol=0, atol=0)

    # Masking commutes with the flip when the boxes are flipped with the image.
    unflipped = images[:1].flip(-1)
    out_unflipped = mask_region_pixels(unflipped, sizes[:1], [flip_boxes(flipped, 10)], masked[:1])
    torch.testing.assert_close(out_unflipped.flip(-1), out[:1], rtol=0, atol=0)


def test_a_fine_tuned_front_end_re_extracts_through_pipeline_extract(tmp_path):
    from pipeline.cli import main
    from shards.reader import iter_samples

    config, weights = bundled_detector()
    job = resolve_job(str(config), [], boxes="given")  # the bundled detector's preprocessing
    folder = tmp_path / "photos"
    folder.mkdir()
    names = PHOTOS[:2]
    for name in names:
        shutil.copy(SAMPLE_IMAGES / name, folder / name)
    photos = _photos(names, job.preprocess)
    boxes = [_boxes(im, seed) for seed, im in enumerate(photos)]
    given = tmp_path / "boxes.json"
    given.write_text(json.dumps({n.split(".")[0]: b.tolist() for n, b in zip(names, boxes)}))

    detector = _detector()
    front_end = VisualFrontEnd(detector)
    images, sizes = _batch(photos, detector.cfg)
    input_boxes = [scale_boxes(b, im) for b, im in zip(boxes, photos)]
    with torch.no_grad():
        before = front_end(images, sizes, input_boxes)
    optimizer = torch.optim.Adam([p for p in front_end.parameters() if p.requires_grad], lr=1e-2)
    target = torch.randn(before.shape, generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        optimizer.zero_grad()
        (front_end(images, sizes, input_boxes) - target).square().mean().backward()
        optimizer.step()
    with torch.no_grad():
        tuned = front_end(images, sizes, input_boxes)

    # Into a detector freshly loaded from the starting checkpoint: its RPN and predictors.
    saved = tmp_path / "tuned.safetensors"
    front_end.save_as_detector(_detector(), saved)
    original = safetensors.torch.load_file(weights)
    written = safetensors.torch.load_file(saved)
    assert written.keys() == original.keys()
    for name, tensor in written.items():
        trained = name.startswith(("backbone.res3", "backbone.res4", "roi_heads.res5"))
        assert torch.equal(tensor, original[name]) != (trained and "norm" not in name), name

    out = tmp_path / "feats"
    assert main(["extract", "--dataset", "folder", "--root", str(folder), "--out", str(out),
                 "--config", str(config), "--weights", str(saved), "--boxes", "given",
                 "--given-boxes", str(given), "--engine", "local", "--device", "cpu"]) == 0
    samples = {s.meta["image_id"]: s for s in iter_samples(out)}
    extracted = np.concatenate([samples[n.split(".")[0]].arrays["features"] for n in names])
    assert extracted.dtype == np.float16
    # Shards store float16: compare at its precision, far below what the fine-tuning changed.
    scale = tuned.abs().max().item()
    tolerance = 2e-3 * scale
    np.testing.assert_allclose(extracted.astype(np.float32), tuned.numpy(), rtol=2e-3,
                               atol=tolerance)
    assert (tuned - before).abs().max() > 20 * tolerance
