"""On the bundled world detector, whose scores look like a trained detector's on sparse scenes (a
few confident objects, the rest of a preset's regions topped up below its threshold), the batched
selection settles every image of every preset: none is left to the dense second pass or selected
one at a time, a batch waits for its device at most twice whatever its size, and the regions equal
select_regions' image by image. The counts reach extraction's summary (and so extract.log) and
`pipeline bench extract`'s columns."""

from __future__ import annotations

import re

import pytest
import torch
from test_extractor_syncs import _same

import extractor.extractor as extractor_module
from extractor import detector
from extractor.config import PRESETS
from pipeline.bench.dispatch import count_dispatch
from pipeline.bench.extract import STAGES, first_good_images, format_table
from pipeline.cli import main
from pipeline.common.assets import bundled_detector
from pipeline.datasets import list_images
from pipeline.extract.config import resolve_job
from pipeline.extract.detector import build_extractor

CONFIG, WEIGHTS = (str(p) for p in bundled_detector())
DETECTOR = ["--config", CONFIG, "--weights", WEIGHTS]


@pytest.fixture(scope="module")
def world_images(pretrain_world):
    """16 world COCO images, prepared as the world detector's extractions take them."""
    coco = pretrain_world.world / "coco"
    refs = [ref for split in ("train2014", "val2014")
            for ref in list_images("folder", str(coco / split))]
    return first_good_images(resolve_job(CONFIG, []), refs, 16)


def world_extractor(preset: str):
    extractor, _ = build_extractor(resolve_job(CONFIG, [f"preset={preset}"]), WEIGHTS, "cpu")
    return extractor


# vinvl's detector is a ResNeXt, which the world detector's weights are not: its syncs are counted
# in test_vinvl.py on a small ResNeXt of the released layout.
@pytest.mark.parametrize("preset", sorted(set(PRESETS) - {"vinvl"}))
def test_world_detector_batches_settle_every_image_with_two_syncs(preset, world_images,
                                                                  monkeypatch):
    """Batches of 1, 3 and 8 (the last of 3 holds one image): at most 2 syncs each, every image
    settled by the first pass, the regions select_regions' image by image."""
    assert len(world_images) == 16
    extractor = world_extractor(preset)
    extractor(world_images[:1])  # the RPN's NMS prefix settles on the first batch
    batched = {}
    for size in (1, 3, 8):
        batched[size] = []
        for start in range(0, 16, size):
            chunk = world_images[start:start + size]
            results, counts = count_dispatch(lambda: extractor(chunk))
            assert counts.syncs <= 2, (size, dict(counts.sync_ops))
            assert [r.selected_by for r in results] == ["batch"] * len(chunk)
            batched[size] += results
    # The reference: every image selected alone by select_regions.
    reference = world_extractor(preset)
    reference.selection_passes = 0  # the batched pass never converges ...
    reference._select_dense = lambda pending, unsettled: {}  # ... and nothing else settles
    monkeypatch.setattr(detector, "greedy_passes", lambda o, v, p: (v, torch.zeros_like(v[:, 0])))
    for size, results in batched.items():  # the same batches: padding is the batch's
        expected = [r for start in range(0, 16, size)
                    for r in reference(world_images[start:start + size])]
        assert [r.selected_by for r in expected] == ["alone"] * 16
        _same(results, expected)


@pytest.mark.parametrize("preset", ["caffe", "lxmert"])
def test_images_left_by_the_batched_pass_are_counted_in_the_summary(preset, pretrain_world,
                                                                   tmp_path, monkeypatch, capsys):
    """With the batched pass made to settle nothing (no NMS pass, nothing seen per class), the
    dense second pass selects every image, and the summary and extract.log say so."""
    monkeypatch.setattr(extractor_module, "SELECTION_PASSES", 0)
    monkeypatch.setattr("extractor.batch_selection.DENSE_UP_TO", 0)
    monkeypatch.setattr(extractor_module, "select_dense", _with_passes(64))
    out = tmp_path / "feats"
    assert main(["extract", "--dataset", "coco", "--root", str(pretrain_world.world / "coco"),
                 "--out", str(out), *DETECTOR, "--engine", "local", "--device", "cpu",
                 "--preset", preset, "--batch-size", "8"]) == 0
    summary = capsys.readouterr().out
    images = int(re.search(r"images ok: (\d+)", summary).group(1))
    found = re.search(r"selected by the dense second pass: (\d+) of (\d+)", summary)
    assert found and int(found.group(1)) == int(found.group(2)) == images
    assert found.group(0) in (out / "extract.log").read_text()
    assert "one image at a time" not in summary


def _with_passes(passes: int):
    dense = extractor_module.select_dense
    return lambda *args: dense(*args[:5], passes)


def test_the_bench_table_has_the_dense_and_fallback_columns():
    stages = dict.fromkeys(STAGES, 1.0)
    row = {"engine": "local", "compiled": False, "batch": 8, "precision": "fp32",
           "images_per_s": 2.0, "end_to_end_per_s": 1.5, "failed": 0, "first_batch_s": 3.0,
           "boxes_per_image": 36.0, "dense": 0.5, "fallback": 0.375, "syncs_per_image": 21.75,
           "ops_per_image": 512.0, "gflops_per_image": 1.0, "mfu": None, **stages}
    lines = format_table([row]).splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert len(head) == len(cells) == lines[1].count("---")
    assert cells[head.index("fallback")] == "37.5%"
    assert cells[head.index("dense")] == "50.0%"
