"""Detector checkpoint formats: restricted unpickling, strict loading, format parity, hashes.

Checkpoints are built from `reference_shapes`, a key/shape table written here from REFERENCE §1
(not from the model), filled with the same seeded values in every format.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import io
import math
import os
import pickle
import stat
import struct
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pytest
import safetensors.numpy
import torch

from extractor.config import DetectorConfig, ExtractorConfig, SelectionConfig
from extractor.detector import BUTDDetector
from extractor.extractor import Extractor
from extractor.weights import (
    WeightsError,
    detect_format,
    load_detector_weights,
    load_numpy_pickle,
    read_detector_config,
    read_safetensors_metadata,
    save_detector,
    weights_hash,
)

# Few proposals keep the RoI head cheap; the checkpoint's shapes do not depend on them.
TINY = DetectorConfig(depth=18, width=16, rpn_hidden=32, rpn_post_nms_topk=32)
ANCHORS = "proposal_generator.anchor_generator.cell_anchors.0"
CLS_SCORE = "roi_heads.box_predictor.cls_score.weight"
PIXEL_STD = 74.0  # of uniform 0..255 pixels: 255 / sqrt(12)


# --- the independent key/shape table ----------------------------------------------------------------


def reference_shapes(cfg: DetectorConfig) -> dict[str, tuple[int, ...]]:
    """detectron2 names and shapes of the BUTD detector (REFERENCE §1), FrozenBN (no counters)."""
    shapes: dict[str, tuple[int, ...]] = {}

    def conv_norm(prefix: str, out_ch: int, in_ch: int, kernel: int) -> None:
        shapes[f"{prefix}.weight"] = (out_ch, in_ch, kernel, kernel)
        for stat in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{prefix}.norm.{stat}"] = (out_ch,)

    blocks = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}[cfg.depth]
    bottleneck = cfg.depth >= 50
    w = cfg.width
    conv_norm("backbone.stem.conv1", w, 3, 7)
    in_ch = w
    for i, num_blocks in enumerate(blocks):
        prefix = "roi_heads.res5" if i == 3 else f"backbone.res{i + 2}"
        mid = w * 2**i
        out = 4 * mid if bottleneck else mid
        for b in range(num_blocks):
            p = f"{prefix}.{b}"
            if b == 0 and in_ch != out:
                conv_norm(f"{p}.shortcut", out, in_ch, 1)
            if bottleneck:
                conv_norm(f"{p}.conv1", mid, in_ch, 1)
                conv_norm(f"{p}.conv2", mid, mid, 3)
                conv_norm(f"{p}.conv3", out, mid, 1)
            else:
                conv_norm(f"{p}.conv1", out, in_ch, 3)
                conv_norm(f"{p}.conv2", out, out, 3)
            in_ch = out
        if i == 2:
            res4 = out
    feat = in_ch
    a = len(cfg.anchor_sizes) * len(cfg.aspect_ratios)
    rpn = "proposal_generator.rpn_head"
    for name, out_ch, in_ch_, k in (
        ("conv", cfg.rpn_hidden, res4, 3),
        ("objectness_logits", a, cfg.rpn_hidden, 1),
        ("anchor_deltas", 4 * a, cfg.rpn_hidden, 1),
    ):
        shapes[f"{rpn}.{name}.weight"] = (out_ch, in_ch_, k, k)
        shapes[f"{rpn}.{name}.bias"] = (out_ch,)
    shapes[ANCHORS] = (a, 4)
    c, e, h, k = cfg.num_classes, cfg.attr_embed_dim, cfg.attr_hidden, cfg.num_attributes
    box = "roi_heads.box_predictor"
    for name, rows, cols in (
        ("cls_score", c + 1, feat),
        ("bbox_pred", 4 * c, feat),
        ("fc_attr", h, feat + e),
        ("attr_score", k + 1, h),
    ):
        shapes[f"{box}.{name}.weight"] = (rows, cols)
        shapes[f"{box}.{name}.bias"] = (rows,)
    shapes[f"{box}.cls_embedding.weight"] = (c + 1, e)
    return shapes


def d2_anchors(cfg: DetectorConfig) -> np.ndarray:
    """detectron2's cell anchors: area size^2, aspect h/w, centred on 0, size-major."""
    rows = []
    for size in cfg.anchor_sizes:
        for ratio in cfg.aspect_ratios:
            width = math.sqrt(size * size / ratio)
            rows.append([-width / 2, -ratio * width / 2, width / 2, ratio * width / 2])
    return np.asarray(rows, dtype=np.float32)


def random_arrays(cfg: DetectorConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded float32 values for every reference tensor, scaled so that a random image gets
    unit-scale activations and small RPN deltas (hence proposals to compare)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in reference_shapes(cfg).items():
        if name == ANCHORS:
            value = d2_anchors(cfg)
        elif name.endswith(("norm.weight", "norm.running_var")):
            value = rng.uniform(0.5, 1.5, shape)
            if name == "backbone.stem.conv1.norm.running_var":
                value *= PIXEL_STD**2
        elif name.startswith(("proposal_generator", "roi_heads.box_predictor")):
            value = rng.normal(0.0, 0.01, shape)  # detectron2's initialisation of these heads
        elif name.endswith("weight") and len(shape) > 1:
            value = rng.normal(0.0, math.sqrt(1.0 / np.prod(shape[1:])), shape)
        else:
            value = rng.normal(0.0, 0.1, shape)
        arrays[name] = np.asarray(value, dtype=np.float32)
    return arrays


# --- writers for each format --------------------------------------------------------------------------


class Python2Pickler(pickle._Pickler):
    """Protocol 2 as Python 2 wrote it: strings and raw bytes as `str` (BINSTRING, no
    `_codecs.encode`), numpy globals under their pre-2.0 module `numpy.core`."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj: bytes | str) -> None:
        data = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str

    def save_global(self, obj, name=None) -> None:
        name = name or obj.__qualname__
        module = pickle.whichmodule(obj, name).replace("numpy._core", "numpy.core")
        self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode("ascii"))
        self.memoize(obj)


def pickle_bytes(obj, protocol: int | str) -> bytes:
    if protocol == "py2":
        buffer = io.BytesIO()
        Python2Pickler(buffer, protocol=2).dump(obj)
        return buffer.getvalue()
    return pickle.dumps(obj, protocol=protocol)


def write_d2_pickle(path, arrays: dict[str, np.ndarray], protocol: int | str = "py2") -> None:
    path.write_bytes(pickle_bytes({"model": arrays, "__author__": "Caffe2"}, protocol))


def write_hf_bin(path, arrays: dict[str, np.ndarray]) -> None:
    """A torch.save state dict as the Hugging Face port's BatchNorm2d modules produce it."""
    state = OrderedDict()
    for name, value in arrays.items():
        state[name] = torch.from_numpy(value.copy())
        if name.endswith(".norm.running_var"):
            state[name.replace("running_var", "num_batches_tracked")] = torch.tensor(0)
    torch.save(state, path)


def write_safetensors(path, arrays: dict[str, np.ndarray]) -> None:
    safetensors.numpy.save_file(arrays, path)


def fresh_model(seed: int) -> BUTDDetector:
    torch.manual_seed(seed)
    return BUTDDetector(TINY).eval()


def state_numpy(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {name: t.numpy().copy() for name, t in model.state_dict().items()}


# --- the table against REFERENCE and against the detector ----------------------------------------------


def test_reference_table_has_the_real_checkpoint_sizes():
    shapes = reference_shapes(DetectorConfig())
    num_norms = sum(name.endswith(".norm.running_var") for name in shapes)
    values = sum(math.prod(s) for s in shapes.values()) + num_norms  # + HF's num_batches_tracked
    assert len(shapes) + num_norms == 640  # REFERENCE: the HF port's state dict has 640 entries
    assert values == 65_545_318  # REFERENCE: "about 65.6M values", "~262 MB in float32"
    assert round(values * 4 / 1e6) == 262
    assert shapes["proposal_generator.rpn_head.conv.weight"] == (512, 1024, 3, 3)
    assert shapes["roi_heads.box_predictor.bbox_pred.weight"] == (6400, 2048)
    assert shapes["roi_heads.box_predictor.fc_attr.weight"] == (512, 2304)


@pytest.mark.parametrize("cfg", [TINY, DetectorConfig(depth=50, width=4, rpn_hidden=8)], ids=["r18", "r50"])
def test_detector_state_dict_is_the_reference_table(cfg):
    model = BUTDDetector(cfg)
    found = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert found == reference_shapes(cfg)
    np.testing.assert_allclose(model.state_dict()[ANCHORS].numpy(), d2_anchors(cfg), atol=1e-4)


# --- restricted unpickler ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("protocol", "marker"),
    [
        ("py2", b"numpy.core.multiarray\n_reconstruct\n"),
        (2, b"_codecs\nencode\n"),
        (4, b"numpy._core.multiarray"),
        (5, b"_frombuffer"),
    ],
)
def test_numpy_pickle_round_trip(protocol, marker):
    obj = {
        "model": OrderedDict(w=np.arange(600, dtype=np.float32).reshape(20, 30), i=np.arange(3)),
        "scale": np.float32(2.5),
        "__author__": "Caffe2",
    }
    data = pickle_bytes(obj, protocol)
    assert marker in data  # each protocol exercises a different admitted global
    if protocol == "py2":
        assert b"_codecs" not in data and b"numpy._core" not in data
    loaded = load_numpy_pickle(io.BytesIO(data))
    assert list(loaded["model"]) == ["w", "i"]
    np.testing.assert_array_equal(loaded["model"]["w"], obj["model"]["w"])
    assert loaded["model"]["i"].dtype == np.int64
    assert loaded["scale"] == np.float32(2.5) and loaded["__author__"] == "Caffe2"


class _Exploit:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.mark.parametrize("protocol", ["py2", 2, 5])
def test_malicious_pickle_is_refused_without_running(tmp_path, protocol):
    marker = tmp_path / "pwned"
    path = tmp_path / "model.pkl"
    path.write_bytes(pickle_bytes({"model": {"x": _Exploit(f"touch {marker}")}}, protocol))
    model = fresh_model(0)
    before = state_numpy(model)
    with pytest.raises(WeightsError, match=rf"{os.system.__module__}\.system"):
        load_detector_weights(model, path)
    assert not marker.exists()
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), before[name])


def test_malicious_torch_file_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "pytorch_model.bin"
    torch.save({"x": _Exploit(f"touch {marker}")}, path)
    with pytest.raises(WeightsError, match="weights_only"):
        load_detector_weights(fresh_model(0), path)
    assert not marker.exists()


def test_codecs_encode_is_admitted_only_for_latin1():
    class Rot13:
        def __reduce__(self):
            return codecs.encode, ("payload", "rot13")

    with pytest.raises(WeightsError, match="rot13"):
        load_numpy_pickle(io.BytesIO(pickle.dumps(Rot13(), protocol=2)))


def test_non_numeric_arrays_are_refused(tmp_path):
    path = tmp_path / "model.pkl"
    write_d2_pickle(path, {"x": np.array([1, "a"], dtype=object)}, protocol=2)
    with pytest.raises(WeightsError, match="not numeric arrays: x"):
        load_detector_weights(fresh_model(0), path)


# --- format detection -----------------------------------------------------------------------------------------


def test_detect_format_by_content_then_suffix(tmp_path):
    arrays = {"a": np.zeros(3, dtype=np.float32)}
    write_d2_pickle(tmp_path / "m.pkl", arrays)
    write_hf_bin(tmp_path / "pytorch_model.bin", arrays)
    write_safetensors(tmp_path / "m.safetensors", arrays)
    torch.save({"a": torch.zeros(3)}, tmp_path / "odd.pkl")  # a zip archive, whatever its name
    torch.save({"a": torch.zeros(3)}, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    assert detect_format(tmp_path / "m.pkl") == "d2-pickle"
    assert detect_format(tmp_path / "pytorch_model.bin") == "torch"
    assert detect_format(tmp_path / "m.safetensors") == "safetensors"
    assert detect_format(tmp_path / "odd.pkl") == "torch"
    assert detect_format(tmp_path / "legacy.pth") == "torch"
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(WeightsError, match="cannot tell the format"):
        detect_format(tmp_path / "notes.txt")


def test_torch_file_that_is_not_a_state_dict_is_refused(tmp_path):
    path = tmp_path / "model_final.pth"
    torch.save({"model": {"a": torch.zeros(1)}, "iteration": 5}, path)
    with pytest.raises(WeightsError, match="flat state dict"):
        load_detector_weights(fresh_model(0), path)


# --- the three formats load the same detector ------------------------------------------------------------


@dataclass
class _Prepared:
    """The fields of extractor.preprocess.PreparedImage that the Extractor reads."""

    pixels: torch.Tensor
    scale_y: float
    scale_x: float
    orig_height: int
    orig_width: int


def one_image_outputs(model: BUTDDetector) -> dict[str, np.ndarray]:
    """Every RegionFeatures array the Extractor returns for one seeded 96 x 128 BGR image."""
    pixels = torch.rand(3, 96, 128, generator=torch.Generator().manual_seed(7)) * 255
    cfg = ExtractorConfig(
        detector=TINY, selection=SelectionConfig(mode="fixed", num_boxes=10), save_class_probs=True
    )
    (regions,) = Extractor(cfg, model)([_Prepared(pixels, 1.0, 1.0, 96, 128)])
    return {f.name: getattr(regions, f.name) for f in dataclasses.fields(regions)}


def assert_same_outputs(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray], what: str):
    for key, value in expected.items():
        np.testing.assert_array_equal(actual[key], value, err_msg=f"{what}: {key}")


def test_every_format_loads_the_same_weights_and_outputs(tmp_path):
    arrays = random_arrays(TINY)
    without_anchors = {k: v for k, v in arrays.items() if k != ANCHORS}  # as converted Caffe pickles
    files = {
        "d2-pickle": tmp_path / "faster_rcnn_from_caffe_attr.pkl",
        "torch": tmp_path / "pytorch_model.bin",
        "safetensors": tmp_path / "detector.safetensors",
    }
    write_d2_pickle(files["d2-pickle"], without_anchors)
    write_hf_bin(files["torch"], arrays)
    write_safetensors(files["safetensors"], arrays)
    expected_counts = {"d2-pickle": len(arrays) - 1, "torch": len(arrays), "safetensors": len(arrays)}

    outputs = {}
    for seed, (fmt, path) in enumerate(files.items()):
        model = fresh_model(seed)
        info = load_detector_weights(model, path)
        assert info.format == fmt
        assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert info.num_tensors == expected_counts[fmt]
        state = model.state_dict()
        assert set(state) == set(arrays)
        for name, value in arrays.items():
            np.testing.assert_array_equal(state[name].numpy(), value, err_msg=f"{fmt}: {name}")
        outputs[fmt] = one_image_outputs(model)

    reference = outputs["d2-pickle"]
    assert reference["boxes_xyxy_abs"].shape == (10, 4) and np.isfinite(reference["cls_probs"]).all()
    for fmt in ("torch", "safetensors"):
        assert_same_outputs(outputs[fmt], reference, fmt)
    assert not np.array_equal(one_image_outputs(fresh_model(0))["features"], reference["features"])


def test_d2_pickle_protocols_load_identically(tmp_path):
    arrays = random_arrays(TINY, seed=1)
    states = []
    for protocol in ("py2", 2, 4, 5):
        path = tmp_path / f"p{protocol}.pkl"
        write_d2_pickle(path, arrays, protocol)
        model = fresh_model(3)
        load_detector_weights(model, path)
        states.append(model.state_dict())
    for state in states:
        for name, value in arrays.items():
            np.testing.assert_array_equal(state[name].numpy(), value)


# --- strict loading ---------------------------------------------------------------------------------------


def test_missing_unexpected_and_misshaped_tensors_are_all_named(tmp_path):
    arrays = random_arrays(TINY)
    del arrays["backbone.res3.0.conv2.norm.running_mean"]
    arrays["roi_heads.box_predictor.extra.weight"] = np.zeros((2, 3), dtype=np.float32)
    arrays[CLS_SCORE] = np.zeros((1600, TINY.feature_dim), dtype=np.float32)  # no background row
    arrays["proposal_generator.rpn_head.conv.bias"] = np.zeros(32, dtype=np.int64)
    path = tmp_path / "bad.pkl"
    write_d2_pickle(path, arrays)
    model = fresh_model(0)
    before = state_numpy(model)
    with pytest.raises(WeightsError) as err:
        load_detector_weights(model, path)
    message = str(err.value)
    assert "4 problem(s)" in message
    assert "missing: backbone.res3.0.conv2.norm.running_mean (expected shape [32])" in message
    assert "unexpected: roi_heads.box_predictor.extra.weight (shape [2, 3])" in message
    assert f"wrong shape: {CLS_SCORE}: expected [1601, 128], found [1600, 128]" in message
    rpn_bias = "proposal_generator.rpn_head.conv.bias"
    assert f"wrong dtype: {rpn_bias}: expected torch.float32, found torch.int64" in message
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), before[name])


def test_num_batches_tracked_is_unexpected_outside_torch_files(tmp_path):
    arrays = random_arrays(TINY)
    arrays["backbone.stem.conv1.norm.num_batches_tracked"] = np.zeros((), dtype=np.int64)
    path = tmp_path / "m.safetensors"
    write_safetensors(path, arrays)
    with pytest.raises(WeightsError, match=r"unexpected: backbone\.stem\.conv1\.norm\.num_batches_tracked"):
        load_detector_weights(fresh_model(0), path)


def test_different_anchor_convention_is_refused(tmp_path):
    arrays = random_arrays(TINY)
    # Caffe's integer anchors with +1 widths sit half a pixel off detectron2's.
    arrays[ANCHORS] = arrays[ANCHORS] + np.array([-0.5, -0.5, 0.5, 0.5], dtype=np.float32)
    path = tmp_path / "pytorch_model.bin"
    write_hf_bin(path, arrays)
    with pytest.raises(WeightsError, match=r"different anchors: .*cell_anchors\.0: the file's anchor"):
        load_detector_weights(fresh_model(0), path)


# --- our safetensors and hashes ---------------------------------------------------------------------------


def test_save_detector_round_trip_and_hashes(tmp_path):
    source = fresh_model(11)
    path = tmp_path / "detector.safetensors"
    umask = os.umask(0o022)
    try:
        save_detector(source, path, TINY, {"source": "unit test"})
    finally:
        os.umask(umask)
    assert not (tmp_path / "detector.safetensors.tmp").exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # others (a container's user) can read it
    meta = read_safetensors_metadata(path)
    assert meta["source"] == "unit test"
    assert read_detector_config(path) == TINY

    target = fresh_model(12)
    assert weights_hash(target) != weights_hash(source)
    info = load_detector_weights(target, path)
    assert info.format == "safetensors" and info.num_tensors == len(source.state_dict())
    assert weights_hash(target) == weights_hash(source)
    assert weights_hash(path) == info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert_same_outputs(one_image_outputs(target), one_image_outputs(source), "round trip")

    with torch.no_grad():
        target.roi_heads.box_predictor.attr_score.bias[400] += 1.0
    assert weights_hash(target) != weights_hash(source)


def test_read_detector_config_refuses_foreign_files(tmp_path):
    path = tmp_path / "other.safetensors"
    write_safetensors(path, {"a": np.zeros(2, dtype=np.float32)})
    with pytest.raises(WeightsError, match="not written by save_detector"):
        read_detector_config(path)
    newer = {"format": "vlpipe-butd-detector", "detector_config": '{"depth": 18, "use_fpn": true}'}
    safetensors.numpy.save_file({"a": np.zeros(2, dtype=np.float32)}, path, metadata=newer)
    with pytest.raises(WeightsError, match="use_fpn"):
        read_detector_config(path)


@pytest.mark.parametrize("saved, config, said", [
    (dict(depth=18, width=8, rpn_hidden=64), dict(depth=101, width=64, rpn_hidden=512),
     "depth 18, width 8, rpn_hidden 64 (the config has depth 101, width 64, rpn_hidden 512)"),
    (dict(depth=50, width=8, rpn_hidden=32), dict(depth=34, width=8, rpn_hidden=32),
     "depth 50 (the config has depth 34)"),  # same blocks per stage: bottlenecks tell them apart
    (dict(depth=18, width=8, rpn_hidden=32, num_classes=20, num_attributes=5),
     dict(depth=18, width=8, rpn_hidden=32),
     "num_classes 20, num_attributes 5 (the config has num_classes 1600, num_attributes 400)"),
])
def test_weights_that_do_not_fit_say_which_config_they_fit(tmp_path, saved, config, said):
    """Weights of another detector name the fields their tensors fix, against the config's; a
    checkpoint with its config file beside it names that file."""
    path = tmp_path / "det.safetensors"
    save_detector(BUTDDetector(dataclasses.replace(DetectorConfig(), **saved)), path,
                  dataclasses.replace(DetectorConfig(), **saved))
    model = BUTDDetector(dataclasses.replace(DetectorConfig(), **config))
    with pytest.raises(WeightsError, match="does not match the detector") as caught:
        load_detector_weights(model, path)
    assert f": its tensors fit a detector with {said}, " in str(caught.value)
    assert "--config" not in str(caught.value)
    (tmp_path / "det.yaml").write_text("detector: {}\n")
    with pytest.raises(WeightsError) as caught:
        load_detector_weights(model, path)
    assert f"{said}; extract with --config {tmp_path / 'det.yaml'}, " in str(caught.value)
