"""`python -m pipeline.bench.attention`: one attention call of the training step (forward and
backward of model/attention.py `attend`) at the short lengths of our models, on each of SDPA's
kernels, to choose by shape (issue 40: on an H200, cuDNN's attention took 130-160 us a call at
20-56 positions, 18% of an LXMERT-base step's GPU time).

Shapes: LXMERT-base's batch of 256, 12 heads of 64, its four (queries, keys) pairs: text 20 and
regions 36, self and cross; with the -inf key bias a padded batch brings (`key_mask`) and without
a mask (static shapes with every region real: flash may then run). Kernels: SDPA restricted to
flash, memory-efficient, cuDNN or math (torch.nn.attention.sdpa_kernel), and the written-out
softmax (`need_weights`, which any kernel may fuse only when compiled). A kernel that cannot take
a shape (flash with a mask) is reported as such. Times: median microseconds per call (forward and
backward) of --repeats calls after a warm-up, in bf16 on CUDA (float32 on a CPU, `--quick`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

SHAPES = ((20, 20), (36, 36), (20, 36), (36, 20))  # (queries, keys): text and regions
KERNELS = ("flash", "efficient", "cudnn", "math", "written out")


def time_call(fn, device, repeats: int) -> float:
    """Median microseconds of fn() over `repeats` calls (each synchronised on CUDA)."""
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def bench_attention(batch: int, heads: int, head_dim: int, device_name: str, repeats: int,
                    shapes=SHAPES) -> dict[str, Any]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from model.attention import attend, key_mask

    device = torch.device(device_name)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    width = heads * head_dim
    g = torch.Generator(device=device).manual_seed(0)
    rows = []
    for lq, lk in shapes:
        q = torch.randn(batch, lq, width, device=device, dtype=dtype, generator=g)
        kv = torch.randn(batch, lk, width, device=device, dtype=dtype, generator=g)
        q.requires_grad_(True)
        kv.requires_grad_(True)
        lengths = torch.randint(lk // 2, lk + 1, (batch,), device=device, generator=g)
        keep = torch.arange(lk, device=device)[None] < lengths[:, None]
        for masked in (True, False):
            mask = key_mask(keep, dtype) if masked else None
            row = {"queries": lq, "keys": lk, "mask": masked}
            for kernel in KERNELS:
                def call(kernel=kernel, mask=mask):
                    out, _ = attend(q, kv, kv, mask, num_heads=heads, dropout_p=0.1,
                                    need_weights=kernel == "written out")
                    out.sum().backward()

                def run(kernel=kernel, call=call):
                    if kernel == "written out":
                        return call()
                    with sdpa_kernel([backends[kernel]]):
                        return call()

                try:
                    with warnings.catch_warnings():  # SDPA warns why a kernel cannot run
                        warnings.simplefilter("ignore")
                        row[kernel] = time_call(run, device, repeats)
                except RuntimeError as err:  # the kernel cannot take this shape or dtype
                    row[kernel] = None
                    row.setdefault("unavailable", {})[kernel] = str(err).splitlines()[0][:120]
            rows.append(row)
    return {"batch": batch, "heads": heads, "head_dim": head_dim, "device": device_name,
            "dtype": str(dtype).removeprefix("torch."), "repeats": repeats, "rows": rows}


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"one attention call, forward and backward, dropout 0.1: batch {report['batch']}, "
        f"{report['heads']} heads of {report['head_dim']}, {report['dtype']} on "
        f"{report['device']}; median us of {report['repeats']} calls",
        "| queries | keys | mask | " + " | ".join(KERNELS) + " |",
        "|---|---|---|" + "---|" * len(KERNELS),
    ]
    for row in report["rows"]:
        cells = ["-" if row[k] is None else f"{row[k]:.0f}" for k in KERNELS]
        lines.append(f"| {row['queries']} | {row['keys']} | {'bias' if row['mask'] else 'none'} "
                     f"| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(prog="python -m pipeline.bench.attention",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--quick", action="store_true", help="batch 4, 5 calls (checks it)")
    parser.add_argument("--json", metavar="OUT", help="also write the numbers to this file")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    report = bench_attention(4 if args.quick else 256, 12, 64, device, 5 if args.quick else 50)
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
