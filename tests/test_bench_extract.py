"""`pipeline bench extract` runs end to end on the bundled photos (tiny detector, CPU)."""

import json
import math
from collections import Counter

import pytest
import torch
from tiny_detector import TINY_DETECTOR

from pipeline.bench.extract import STAGES, steady_rate, steady_stage_ms, with_mfu
from pipeline.bench.peaked import QUANTILES, SCALES, logit_scale, peaked_weights
from pipeline.cli import main
from pipeline.common.assets import SAMPLE_IMAGES
from pipeline.extract.output import Tally

TINY = [*TINY_DETECTOR, "--set", "detector.rpn_hidden=64", "--random-weights"]


def test_bench_extract_prints_one_row_per_setting(capsys, tmp_path):
    assert (SAMPLE_IMAGES / "astronaut.jpg").is_file()
    code = main(["bench", "extract", "--device", "cpu", "--num-images", "4",
                 "--batch-sizes", "1,2", "--json", str(tmp_path / "bench.json"), *TINY])
    assert code == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("| engine |"))
    columns = [c.strip() for c in head.split("|")[1:-1]]
    assert columns[8:] == ["dense", "fallback"] + [f"{s} ms" for s in STAGES] + [
        "syncs/img", "ops/img", "GFLOP/img", "MFU"]
    assert "prepare ms" in head
    rows = [line for line in out.splitlines() if line.startswith("| local |")]
    assert [row.split("|")[2].strip() for row in rows] == ["1", "2"]
    saved = json.loads((tmp_path / "bench.json").read_text())["rows"]
    for row, batch, numbers in zip(rows, (1, 2), saved):
        assert float(row.split("|")[4]) > 0  # images/s
        assert row.split("|")[6].strip() == "1"  # the 4 images include broken_truncated.jpg
        syncs, ops, gflops = (float(c) for c in row.split("|")[-5:-2])
        assert syncs == 2 / batch  # the RPN's counts and the results: two waits per batch
        assert ops > 50 and gflops > 0
        assert row.split("|")[9].strip() == "0.0%"  # random scores: every image settled batched
        assert row.split("|")[-2].strip() == "-"  # no MFU on a CPU
        assert numbers["batch"] == batch and numbers["mfu"] is None
        assert math.isclose(numbers["gflops_per_image"], gflops, rel_tol=0.01, abs_tol=0.05)


def test_mfu_is_the_achieved_share_of_the_gpus_peak():
    row = {"precision": "bf16", "images_per_s": 250.0, "gflops_per_image": 1960.0}
    assert with_mfu(row, "NVIDIA H100 80GB HBM3")["mfu"] == pytest.approx(250 * 1.96 / 989.4)
    assert with_mfu(row | {"precision": "fp32"}, "NVIDIA H200")["mfu"] == pytest.approx(
        250 * 1.96 / 494.7)
    assert with_mfu(row, "Some GPU")["mfu"] is None and with_mfu(row, None)["mfu"] is None


def test_rates_and_stage_times_count_extracted_images_after_the_warm_up_batch():
    # Three batches of 4: the first (warm-up) 10 s of backbone, then 1 s each; one image of the
    # second batch failed to decode.
    tally = Tally(ok=11, seconds=Counter(backbone=12.0, prepare=0.3, decode=1.2),
                  warmup_seconds=Counter(backbone=10.0, prepare=0.1, decode=0.4),
                  timeline=[(100.0, 4, 0), (101.0, 3, 1), (102.0, 4, 0)])
    # The last batch is left out of the rate (a GPU run writes it early), not out of stage times.
    assert steady_rate(tally) == pytest.approx(3 / 1.0)  # failures are not throughput
    two = Tally(ok=8, timeline=[(100.0, 4, 0), (101.5, 3, 1)])
    assert steady_rate(two) == pytest.approx(3 / 1.5)
    ms = steady_stage_ms(tally)
    assert ms["backbone"] == pytest.approx(1000 * 2.0 / 7)
    assert ms["prepare"] == pytest.approx(1000 * 0.2 / 7)
    assert ms["decode"] == pytest.approx(1000 * 0.8 / 7)
    assert ms["write"] == 0.0
    one = Tally(ok=4, seconds=Counter(backbone=10.0), timeline=[(100.0, 4, 0)])
    assert steady_rate(one) == 0.0 and steady_stage_ms(one)["backbone"] == 2500.0


def test_bench_extract_needs_weights_or_random_weights(capsys):
    tiny = [arg for arg in TINY if arg != "--random-weights"]
    assert main(["bench", "extract", "--device", "cpu", "--num-images", "1", "--batch-sizes", "1",
                 *tiny]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeline: config error: no detector weights")
    assert "--random-weights" in err


def test_peaked_scale_is_the_smallest_that_makes_the_median_roi_confident():
    # Four classes, the first ahead by d: its probability is e^(kd) / (e^(kd) + 3) >= 0.5 from
    # k = ln 3 / d on; the ladder is 2, 4, 8, ...
    logits = torch.tensor([[0.1, 0.0, 0.0, 0.0]] * 3 + [[0.0, 0.0, 0.0, 0.0]] * 2)
    assert math.log(3) / 0.1 == pytest.approx(10.99, abs=0.01)
    assert logit_scale(logits) == 16.0
    assert logit_scale(logits * 2) == 8.0  # three of five rows decide the median


def test_sparse_scale_makes_only_the_top_three_in_a_hundred_rois_confident():
    ahead, flat = [[0.1, 0.0, 0.0, 0.0]], [[0.0, 0.0, 0.0, 0.0]]
    four = torch.tensor(ahead * 4 + flat * 96)
    assert logit_scale(four, QUANTILES["sparse"]) == 16.0  # the 97th row of 100 is ahead
    assert logit_scale(four, QUANTILES["peaked"]) == SCALES[-1]  # the median row never is
    assert logit_scale(torch.tensor(ahead * 3 + flat * 97), QUANTILES["sparse"]) == SCALES[-1]


def test_peaked_weights_scale_only_the_class_logits(tmp_path):
    from extractor.weights import read_checkpoint, read_safetensors_metadata
    from pipeline.bench.extract import bench_refs, first_good_images
    from pipeline.extract.config import resolve_job
    from pipeline.extract.detector import load_detector

    job = resolve_job(None, [s for s in TINY if s.startswith("detector.")], device="cpu")
    images = first_good_images(job, bench_refs(SAMPLE_IMAGES, 4), 2)
    path = peaked_weights(job, images, tmp_path / "peaked.safetensors")
    scale = float(read_safetensors_metadata(path)["peaked_logit_scale"])
    _, saved = read_checkpoint(path)
    random = load_detector(job, None).state_dict()
    assert saved.keys() == random.keys() and scale > 1
    for name, tensor in random.items():
        expected = tensor * scale if "cls_score" in name else tensor
        assert torch.equal(saved[name], expected), name
    load_detector(job, str(path))  # loads strictly as the run's detector


def test_peaked_scores_need_random_weights(capsys, tmp_path):
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    tiny = [arg for arg in TINY if arg != "--random-weights"]
    assert main(["bench", "extract", "--device", "cpu", "--num-images", "1", "--batch-sizes", "1",
                 "--scores", "peaked", "--weights", str(weights), *tiny]) == 2
    assert "--scores peaked scales a random detector" in capsys.readouterr().err


@pytest.mark.parametrize("op", ["cudnn_convolution_relu", "cudnn_convolution_add_relu"])
def test_fused_cudnn_convolutions_count_the_flops_of_their_convolution(op):
    """The extractor's fused kernels (GPU only) count as the convolution they hold."""
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    x, w, b = torch.randn(2, 8, 10, 12), torch.randn(16, 8, 3, 3), torch.randn(16)
    geometry = ([2, 1], [2, 2], [2, 2], 1)  # stride, padding, dilation, groups
    with FlopCounterMode(display=False) as counter:
        out = torch.nn.functional.conv2d(x, w, b, *geometry)
    args = (x, w, b, *geometry) if op == "cudnn_convolution_relu" else (x, w, out, 1.0, b, *geometry)
    formula = flop_registry[getattr(torch.ops.aten, op)]
    assert formula(*args, out_val=out) == counter.get_total_flops() == 2 * out.numel() * 8 * 9
