"""`pipeline demo`: the main job on bundled and generated data, end to end, in a minute on a CPU.

1. Generates a small synthetic world (`pipeline world generate`) and extracts its Visual Genome
   images with the bundled world detector (pipeline/assets/), then prints, per image, the objects
   it found next to the ground truth.
2. Extracts `pipeline/sample_images/` (real photos, a grayscale one and a deliberately truncated
   JPEG) with the same detector: the truncated file becomes a failure record, the rest is written.
Both shard sets are verified. The in-process engine is the default (no Ray start-up);
`--set engine=ray` runs the Ray path.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from extractor.labels import object_names
from pipeline.config import resolve
from pipeline.detector_train import bundled_detector
from pipeline.extract import extract_dataset, resolve_job
from pipeline.extract_output import format_summary
from pipeline.world.generate import WorldConfig, generate_world
from shards.reader import iter_samples
from shards.verify import verify_shards


@dataclass(frozen=True)
class DemoConfig:
    """world_images / world_seed: the generated world (the detector trained on seed 0).
    min_conf: the confidence above which a region counts as found. engine: local or ray."""

    world_images: int = 12
    world_seed: int = 1
    min_conf: float = 0.5
    engine: str = "local"


def sample_images_dir() -> Path:
    return Path(str(resources.files("pipeline").joinpath("sample_images")))


def _extract(cfg: DemoConfig, dataset: str, root: Path, out: Path) -> int:
    config, weights = bundled_detector()
    job = resolve_job(str(config), [], device="cpu")
    job = dataclasses.replace(
        job,
        run=dataclasses.replace(job.run, engine=cfg.engine, batch_size=4),
        output=dataclasses.replace(job.output, shard_size=8),
    )
    print(f"extracting {dataset} images in {root} -> {out}")
    tally = extract_dataset(job, dataset, str(root), out, weights=str(weights))
    print(format_summary(tally, out))
    problems = verify_shards(out)
    print(f"verify {out}: {len(problems)} problem(s)")
    for problem in problems:
        print(f"  {problem}")
    return len(problems)


def _compare_with_truth(world: Path, feats: Path, min_conf: float) -> None:
    truth = {
        str(entry["image_id"]): sorted(o["names"][0] for o in entry["objects"])
        for entry in json.loads((world / "vg" / "objects.json").read_text())
    }
    names = object_names()
    print(f"regions with confidence >= {min_conf} next to the ground truth:")
    for sample in iter_samples(feats):
        a = sample.arrays
        found = sorted(names[k] for k, c in zip(a["object_ids"], a["object_conf"]) if c >= min_conf)
        image_id = sample.meta["image_id"]
        print(f"  vg {image_id}: found {', '.join(found) or '-'} | truth {', '.join(truth[image_id])}")


def run_demo(args) -> int:
    cfg = resolve(DemoConfig(), args.config, args.sets)
    out = Path(args.out)
    world = out / "world"
    if not (world / "world.json").is_file():
        print(f"generating a {cfg.world_images}-image world in {world}")
        generate_world(WorldConfig(images=cfg.world_images, seed=cfg.world_seed), world)
    problems = _extract(cfg, "vg", world / "vg", out / "world_features")
    _compare_with_truth(world, out / "world_features", cfg.min_conf)
    problems += _extract(cfg, "folder", sample_images_dir(), out / "photo_features")
    return 1 if problems else 0
