"""The images the batched selection cannot settle (selected one at a time by
extractor.selection.select_regions, with host syncs) are counted: in extraction's summary (and
so extract.log) and in `pipeline bench extract`'s fallback column. On the bundled world
detector, whose scores look like a trained detector's on sparse scenes."""

from __future__ import annotations

import re

import pytest

import extractor.extractor as extractor_module
from pipeline.bench.extract import STAGES, format_table
from pipeline.cli import main

DETECTOR = ["--config", "pipeline/assets/world_detector.yaml",
            "--weights", "pipeline/assets/world_detector.safetensors"]


@pytest.mark.parametrize("preset", ["caffe", "lxmert", "pb-demo"])
def test_every_image_selected_alone_is_counted_in_the_summary(preset, pretrain_world, tmp_path,
                                                              monkeypatch, capsys):
    calls = []
    alone = extractor_module.select_regions

    def counted(*args, **kwargs):
        calls.append(1)
        return alone(*args, **kwargs)

    monkeypatch.setattr(extractor_module, "select_regions", counted)
    out = tmp_path / "feats"
    assert main(["extract", "--dataset", "coco", "--root", str(pretrain_world.world / "coco"),
                 "--out", str(out), *DETECTOR, "--engine", "local", "--device", "cpu",
                 "--preset", preset, "--batch-size", "8"]) == 0
    summary = capsys.readouterr().out
    images = int(re.search(r"images ok: (\d+)", summary).group(1))
    found = re.search(r"selected one image at a time: (\d+) of (\d+)", summary)
    assert (int(found.group(1)) if found else 0) == len(calls)
    if found:
        assert int(found.group(2)) == images
        assert found.group(0) in (out / "extract.log").read_text()
    if preset == "lxmert":  # 36 regions from scenes of a few objects: the top-up below 0.2
        assert calls


def test_the_bench_table_has_the_fallback_column():
    stages = dict.fromkeys(STAGES, 1.0)
    row = {"engine": "local", "compiled": False, "batch": 8, "precision": "fp32",
           "images_per_s": 2.0, "end_to_end_per_s": 1.5, "failed": 0, "first_batch_s": 3.0,
           "boxes_per_image": 36.0, "fallback": 0.375, "syncs_per_image": 21.75,
           "ops_per_image": 512.0, "gflops_per_image": 1.0, "mfu": None, **stages}
    lines = format_table([row]).splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert len(head) == len(cells) == lines[1].count("---")
    assert cells[head.index("fallback")] == "37.5%"
