"""extractor.roi_pool: the GPU's RoI max pooling equals torchvision's roi_pool bit for bit.

Triton's interpreter (TRITON_INTERPRET=1, read when a kernel is defined, hence a child process)
runs the kernel on CPU tensors; tests/test_extractor_gpu.py runs it compiled on a GPU.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHECK = textwrap.dedent("""
    import torch
    from torchvision.ops import roi_pool
    from extractor.roi_pool import roi_max_pool

    gen = torch.Generator().manual_seed(0)
    features = torch.randn(2, 12, 9, 13, generator=gen)
    features[1, 3] = float("-inf")  # a channel with no finite value: -FLT_MAX wins, as there
    features = features.contiguous(memory_format=torch.channels_last)
    edges = [
        [0, 0.0, 0, 200, 140],  # past the map's bottom right: clipped
        [1, 3.5, 7.9, 40.2, 33.3],
        [0, -20, -5, 8, 8],  # starts left of and above the map
        [0, 1000, 1000, 2000, 2000],  # wholly outside: every bin empty, 0
        [1, 24.0, 24, 23.9, 23.9],  # end before start: forced to one cell
        [0, 8, 8, 8.4, 8.2],  # under one cell
        [1, 7.5, 8.5, 23.5, 24.5],
        [0, -8, -24, 56, 40],  # -0.5 and -1.5 cells, 3.5 and 2.5: halves round away from 0
    ]
    # Random boxes on the 1/32 pixel grid: many land on half cells, where rounding decides.
    xy = torch.randint(-32 * 16, 32 * 220, (12, 4), generator=gen).float() / 32
    boxes = torch.cat((xy[:, :2].minimum(xy[:, 2:]), xy[:, :2].maximum(xy[:, 2:])), dim=1)
    image = torch.randint(0, 2, (12, 1), generator=gen).float()
    rois = torch.cat((torch.tensor(edges), torch.cat((image, boxes), dim=1)))
    expected = roi_pool(features, rois, (5, 5), 1 / 16)
    got = roi_max_pool(features, rois, 5, 1 / 16)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, expected), (got - expected).abs().max()
    assert (expected[3] == 0).all() and expected.eq(-3.4028234663852886e38).any()
    half = features.bfloat16()  # pooled in float32 and cast back: the same values
    got = roi_max_pool(half, rois, 3, 1 / 16)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, roi_pool(half.float(), rois, (3, 3), 1 / 16).bfloat16())
    print("equal")
""")


def test_the_kernel_equals_torchvision_roi_pool_in_float32_and_bf16():
    done = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0 and done.stdout.strip() == "equal", done.stderr[-3000:]


def test_it_refuses_what_it_cannot_read():
    import pytest
    import torch

    from extractor.roi_pool import roi_max_pool

    rois = torch.zeros(1, 5)
    with pytest.raises(ValueError, match="channels-last"):
        roi_max_pool(torch.zeros(1, 4, 3, 3), rois, 2, 1.0)
    features = torch.zeros(1, 4, 3, 3).contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match=r"\(R, 5\) float32"):
        roi_max_pool(features, rois.double(), 2, 1.0)
