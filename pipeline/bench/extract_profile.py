"""Where the detector's time goes: the Extractor alone under torch's profiler, for the GPU suite.

The detector runs as the local engine runs it on a GPU (the next batch submitted before the last
one is collected, decoded images resized on the device, pinned), on one batch of good images
submitted again and again, without decoding or writing. Two passes over `batches` batches:
- timed, without the profiler: wall milliseconds per image;
- profiled: the time of each kernel (on a GPU; each op's own CPU time on a CPU), per batch and
  per image, the largest first. On a GPU, their sum over the wall time is how busy it was: below
  100%, it waited for the host.
Comparing two batch sizes shows which kernels cost per batch rather than per image.
"""

from __future__ import annotations

import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from pipeline.datasets import ImageRef
from pipeline.extract.config import ExtractJobConfig
from pipeline.extract.detector import build_extractor
from pipeline.extract.steps import prepare, ship_pixels

TOP = 15  # kernels listed by name; the rest are summed as "other"


def _run(extractor, images: list, batches: int) -> None:
    pending = None
    for _ in range(batches):
        submitted = extractor.submit(images)
        if pending is not None:
            extractor.collect(pending)
        pending = submitted
    extractor.collect(pending)


def profile_detector(job: ExtractJobConfig, refs: list[ImageRef], weights: str | None,
                     batches: int = 4) -> dict:
    """{"batch", "precision", "wall_ms_per_image", "device_ms_per_image", "busy" (None off a
    GPU), "kernels": [{"name", "calls_per_batch", "ms_per_batch", "ms_per_image", "share"}]} for
    one batch of job.run.batch_size good images of `refs`."""
    extractor, _ = build_extractor(job, weights)
    cuda = extractor.device.type == "cuda"
    items = [prepare(ref, job.preprocess, device_resize=cuda) for ref in refs]
    items = [item for item in items if item.error is None][: job.run.batch_size]
    ship_pixels(items, job.preprocess, pin=cuda)
    images = [item.image for item in items]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    _run(extractor, images, 1)  # the warm-up: kernels chosen, the RPN's NMS prefix settled
    sync()
    start = time.perf_counter()
    _run(extractor, images, batches)
    sync()
    wall = time.perf_counter() - start
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        _run(extractor, images, batches)
        sync()
    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    rows = [e for e in prof.key_averages() if e.device_type == kind]
    seconds = {e.key: (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e6
               for e in rows}
    calls = {e.key: e.count for e in rows}
    total = sum(seconds.values())
    names = sorted(seconds, key=seconds.get, reverse=True)
    listed = names[:TOP]
    if names[TOP:]:
        seconds["other"] = sum(seconds[n] for n in names[TOP:])
        calls["other"] = sum(calls[n] for n in names[TOP:])
        listed.append("other")
    n = len(images)
    kernels = [{"name": name, "calls_per_batch": calls[name] / batches,
                "ms_per_batch": 1e3 * seconds[name] / batches,
                "ms_per_image": 1e3 * seconds[name] / (batches * n),
                "share": seconds[name] / total if total else 0.0} for name in listed]
    return {"batch": n, "precision": job.run.precision,
            "wall_ms_per_image": 1e3 * wall / (batches * n),
            "device_ms_per_image": 1e3 * total / (batches * n),
            "busy": total / wall if cuda else None, "kernels": kernels}


def format_profile(row: dict) -> str:
    busy = "" if row["busy"] is None else f" ({100 * row['busy']:.0f}% busy)"
    lines = [
        f"{row['precision']}, batch {row['batch']}: {row['device_ms_per_image']:.2f} ms of device "
        f"time per image in {row['wall_ms_per_image']:.2f} ms of wall time{busy}", "",
        "| kernel | calls/batch | ms/batch | ms/image | share |", "|---|---|---|---|---|",
    ]
    for k in row["kernels"]:
        name = k["name"] if len(k["name"]) <= 70 else k["name"][:67] + "..."
        lines.append(f"| `{name}` | {k['calls_per_batch']:.0f} | {k['ms_per_batch']:.2f} | "
                     f"{k['ms_per_image']:.3f} | {100 * k['share']:.1f}% |")
    return "\n".join(lines)
