"""`pipeline demo`: the main job on the bundled sample photos, end to end, in seconds on a CPU.

Extracts `pipeline/sample_images/` (four photos, a grayscale one and a deliberately truncated
JPEG) into shards with a small randomly initialised detector (in-process engine, so no Ray
start-up; `--set extract.run.engine=ray` runs the Ray path), verifies the shards, reads them
back and prints what each image holds. The detector is random until one is trained on the
project's synthetic world, so the label names are placeholders; the plumbing is the real one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from extractor.config import DetectorConfig
from extractor.labels import attribute_names, object_names
from pipeline.config import resolve
from pipeline.extract import ExtractJobConfig, OutputConfig, RunConfig, extract_dataset
from pipeline.extract_output import format_summary
from shards.reader import iter_samples
from shards.verify import verify_shards

DEMO_DETECTOR = DetectorConfig(depth=18, width=16, rpn_hidden=64)


@dataclass(frozen=True)
class DemoConfig:
    extract: ExtractJobConfig = field(
        default_factory=lambda: ExtractJobConfig(
            detector=DEMO_DETECTOR,
            run=RunConfig(engine="local", device="cpu", batch_size=2),
            output=OutputConfig(shard_size=4),
        )
    )


def sample_images_dir() -> Path:
    return Path(str(resources.files("pipeline").joinpath("sample_images")))


def run_demo(args) -> int:
    cfg = resolve(DemoConfig(), args.config, args.sets)
    out = Path(args.out)
    print(f"extracting the bundled photos in {sample_images_dir()} -> {out}")
    tally = extract_dataset(cfg.extract, "folder", str(sample_images_dir()), out)
    print(format_summary(tally, out))
    problems = verify_shards(out)
    print(f"verify: {len(problems)} problem(s)")
    for problem in problems:
        print(f"  {problem}")
    objects, attributes = object_names(), attribute_names()
    print("first regions of each image (random detector: names are placeholders):")
    for sample in iter_samples(out):
        a = sample.arrays
        top = ", ".join(
            f"{attributes[a['attr_ids'][i]]} {objects[a['object_ids'][i]]}"
            for i in range(min(3, sample.num_boxes))
        )
        print(
            f"  {sample.key}: {sample.meta['width']}x{sample.meta['height']}, "
            f"{sample.num_boxes} boxes, features {a['features'].shape} {a['features'].dtype}: {top}"
        )
    return 1 if problems else 0
