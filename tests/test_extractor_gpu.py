"""The extractor on CUDA: same results as on the CPU, padding invariance, bf16/fp16 autocast.

Opt-in (`pytest -m gpu`) and skipped without a CUDA device.
"""

import time
from collections import Counter

import numpy as np
import pytest
import torch
from skimage import data
from torch.utils._python_dispatch import TorchDispatchMode

from extractor.backbone import fold_frozen_norms
from extractor.config import DetectorConfig, PreprocessConfig, preset_config
from extractor.detector import BUTDDetector
from extractor.extractor import Extractor
from extractor.preprocess import DecodedImage, resize_image
from pipeline.bench.dispatch import count_dispatch
from test_extractor_batching import (
    TINY, _config, _image, _random_detector, detected_alone_and_shared,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(autouse=True)
def exact_float32():
    """cuDNN runs float32 convolutions in TF32 (10-bit mantissa) by default, which moves scores by
    1e-3 and random-weight boxes by a pixel; these tests compare float32 arithmetic."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


@pytest.fixture(scope="module")
def images():
    return [_image(120, 200, 1), _image(144, 96, 2), _image(78, 82, 3)]


def test_cuda_matches_cpu(images):
    cpu_model = _random_detector(TINY)
    gpu_model = _random_detector(TINY)
    boxes = [np.array([[4, 4, 60, 50], [10, 20, 90, 70]], np.float32)] * len(images)
    cpu = Extractor(_config("given"), cpu_model)(images, boxes)
    gpu = Extractor(_config("given"), gpu_model, device="cuda")(images, boxes)
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(a.features.astype(np.float32), b.features.astype(np.float32),
                                   rtol=2e-2, atol=2e-3)
        np.testing.assert_allclose(a.object_conf, b.object_conf, rtol=1e-3, atol=1e-5)


def test_cuda_batched_equals_one_by_one(images):
    extractor = Extractor(_config("adaptive"), _random_detector(TINY), device="cuda")
    batched = extractor(images)
    for image, together in zip(images, batched):
        alone = extractor([image])[0]
        np.testing.assert_array_equal(alone.object_ids, together.object_ids)
        np.testing.assert_allclose(alone.boxes_xyxy_abs, together.boxes_xyxy_abs, rtol=1e-4)


def test_two_canvases_on_the_gpu_give_the_regions_of_one(images):
    """A GPU's backbone runs on two canvases where images differ in shape (extractor.canvases);
    the regions stay those of one canvas for the whole batch."""
    extractor = Extractor(
        _config("adaptive", min_boxes=5, max_boxes=20), _random_detector(TINY), device="cuda"
    )
    assert extractor.canvases == 2
    two = extractor(images)
    extractor.canvases = 1
    for a, b in zip(two, extractor(images)):
        np.testing.assert_array_equal(a.object_ids, b.object_ids)
        np.testing.assert_allclose(a.boxes_xyxy_abs, b.boxes_xyxy_abs, rtol=1e-4)


def test_threads_sharing_an_extractor_on_the_gpu(images):
    """The Ray actor's two calls at once on a GPU: one thread submits while the other waits for
    its batch's copy (an event in the same stream); each gets its own batch's regions."""
    extractor = Extractor(
        _config("adaptive", min_boxes=5, max_boxes=20), _random_detector(TINY), device="cuda"
    )
    for alone, shared in detected_alone_and_shared(extractor, images):
        np.testing.assert_array_equal(alone.object_ids, shared.object_ids)
        np.testing.assert_allclose(alone.features, shared.features, rtol=1e-4, atol=0)
        np.testing.assert_allclose(alone.boxes_xyxy_abs, shared.boxes_xyxy_abs, rtol=1e-4, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_stays_close_to_float32(images, dtype):
    model = _random_detector(TINY)
    boxes = [np.array([[4, 4, 60, 50]], np.float32)] * len(images)
    exact = Extractor(_config("given"), model, device="cuda")(images, boxes)
    fast = Extractor(_config("given"), model, device="cuda", autocast_dtype=dtype)(images, boxes)
    for a, b in zip(exact, fast):
        cos = np.sum(a.features * b.features, dtype=np.float64) / (
            np.linalg.norm(a.features.astype(np.float64)) * np.linalg.norm(b.features.astype(np.float64)))
        assert cos > 0.99


@pytest.mark.parametrize("preset, lo, hi", [("caffe", 10, 100), ("lxmert", 36, 36),
                                            ("pb-demo", 36, 36), ("hf-demo", 36, 36)])
def test_real_r101_runs_every_preset_in_bf16(preset, lo, hi):
    torch.manual_seed(0)
    cfg = preset_config(preset, DetectorConfig())
    extractor = Extractor(cfg, BUTDDetector(cfg.detector), device="cuda", autocast_dtype=torch.bfloat16)
    photo = np.ascontiguousarray(data.astronaut()[:, :, ::-1])
    out = extractor([resize_image(photo, cfg.preprocess)])[0]
    assert lo <= out.num_boxes <= hi and out.features.shape == (out.num_boxes, 2048)
    assert (out.image_height, out.image_width) == (512, 512)


def test_stage_times_come_from_events_without_waiting_between_stages(images, monkeypatch):
    extractor = Extractor(_config("adaptive"), _random_detector(TINY), device="cuda")
    extractor(images)  # warm-up
    waits = []
    real = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: waits.append(a) or real(*a))
    start = time.perf_counter()
    extractor(images)
    wall = time.perf_counter() - start
    assert waits == []  # the stages are timed with events, read after the results
    timings = extractor.last_timings
    assert set(timings) == {"prepare", "backbone", "rpn", "roi_head", "selection"}
    assert all(t >= 0 for t in timings.values()) and sum(timings.values()) <= 1.05 * wall


class _OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched, by name (`cudnn_convolution_relu`, ...)."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _real_r101(fold: bool) -> BUTDDetector:
    torch.manual_seed(0)
    model = BUTDDetector(DetectorConfig()).cuda().eval().to(memory_format=torch.channels_last)
    if fold:
        fold_frozen_norms(model)
    return model


def test_fused_cudnn_kernels_equal_conv_then_norm_in_float32():
    """The real R101: folded norms with conv+bias(+residual)+ReLU in one cuDNN kernel equal the
    unfused network (a conv, then the norm, the addition and the ReLU as passes) to 1e-4."""
    photo = torch.rand(2, 3, 320, 480, device="cuda").mul_(255).sub_(110)
    photo = photo.contiguous(memory_format=torch.channels_last)
    sizes = [(320, 480), (288, 416)]
    boxes = [torch.tensor([[0.0, 0, 200, 150], [64, 32, 480, 300]], device="cuda")] * 2
    outputs = []
    for fold in (False, True):
        model = _real_r101(fold)
        with torch.inference_mode(), _OpCounter() as ops:
            res4 = model.backbone(photo, sizes)
            features = model.roi_heads(res4, boxes).features
        outputs.append((res4, features, ops.counts))
    (res4, features, unfused_ops), (fused_res4, fused_features, fused_ops) = outputs
    assert unfused_ops["cudnn_convolution_relu"] == unfused_ops["cudnn_convolution_add_relu"] == 0
    # every ConvNorm but the projection shortcuts: stem 1 + 2 per block, + 1 per block
    assert fused_ops["cudnn_convolution_relu"] == 1 + 2 * (3 + 4 + 23 + 3)
    assert fused_ops["cudnn_convolution_add_relu"] == 3 + 4 + 23 + 3
    scale = res4.abs().max().item()
    torch.testing.assert_close(fused_res4, res4, rtol=1e-4, atol=1e-4 * scale)
    scale = features.abs().max().item()
    torch.testing.assert_close(fused_features, features, rtol=1e-4, atol=1e-4 * scale)


def test_cv2_resize_on_the_gpu_has_the_cpus_bits():
    """Extraction resizes decoded images on the GPU (DecodedImage): the same pixels as on the
    host, so features do not depend on where the resize ran."""
    cfg = PreprocessConfig(resize="cv2")
    for name in ("chelsea", "coffee", "astronaut"):
        bgr = np.ascontiguousarray(getattr(data, name)()[..., ::-1])
        host = resize_image(bgr, cfg)
        pinned = torch.from_numpy(bgr).pin_memory()
        device = DecodedImage(pinned, cfg).resized("cuda")
        assert device.pixels.is_cuda and torch.equal(device.pixels.cpu(), host.pixels)


def test_submit_waits_for_the_device_only_for_the_proposal_counts(images):
    """Extractor.submit returns while the device still works on the batch: its one host sync is
    the RPN's proposal counts, an event's wait. Every input (sizes, scales, padding masks,
    selection rows, decoded pixels and their resize taps) is copied without blocking, since a
    blocking copy would first wait for every kernel queued before it. The dispatch mode misses
    copies made by torch.tensor(list, device=...) inside C++, so CUDA's sync debug mode checks
    too: it raises on every synchronizing call except an event's wait."""
    extractor = Extractor(_config("adaptive"), _random_detector(TINY), device="cuda")
    cfg = PreprocessConfig(min_size=160, max_size=240, resize="cv2")
    decoded = []
    for name in ("chelsea", "coffee", "astronaut"):
        bgr = np.ascontiguousarray(getattr(data, name)()[..., ::-1])
        decoded.append(DecodedImage(torch.from_numpy(bgr), cfg))
        decoded[-1].pin()
    batch = [*images, *decoded]
    extractor(batch)  # the warm-up: the RPN's NMS prefix settles
    pending, counts = count_dispatch(lambda: extractor.submit(batch))
    assert counts.syncs == 1, dict(counts.sync_ops)
    assert len(extractor.collect(pending)) == len(batch)
    torch.cuda.set_sync_debug_mode("error")
    try:
        pending = extractor.submit(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(extractor.collect(pending)) == len(batch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_roi_max_pool_compiled_equals_torchvision(dtype):
    """The Triton kernel compiled for the GPU: torchvision's roi_pool of the float32 features,
    cast to the features' dtype, bit for bit (res4-sized, 600 RoIs, half-cell coordinates)."""
    from torchvision.ops import roi_pool

    from extractor.roi_pool import roi_max_pool

    gen = torch.Generator(device="cuda").manual_seed(0)
    features = torch.randn(2, 1024, 38, 63, device="cuda", generator=gen).relu().to(dtype)
    features = features.contiguous(memory_format=torch.channels_last)
    xy = torch.randint(-64, 32 * 1000, (600, 4), device="cuda", generator=gen).float() / 32
    boxes = torch.cat((xy[:, :2].minimum(xy[:, 2:]), xy[:, :2].maximum(xy[:, 2:])), dim=1)
    image = torch.randint(0, 2, (600, 1), device="cuda", generator=gen).float()
    rois = torch.cat((image, boxes), dim=1)
    got = roi_max_pool(features, rois, 14, 1 / 16)
    expected = roi_pool(features.float(), rois, (14, 14), 1 / 16).to(dtype)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, expected)


def test_the_extractor_pools_regions_with_the_kernel(images):
    """On a GPU without gradients, the RoI head pools with extractor.roi_pool, not torchvision."""
    extractor = Extractor(_config("adaptive"), _random_detector(TINY), device="cuda",
                          autocast_dtype=torch.bfloat16)
    with _OpCounter() as ops:
        extractor(images)
    assert ops.counts["roi_pool"] == 0
