"""Fixtures shared by test files.

`world_shards`: real shards, built once per session the way a user builds them: a small generated
world (`pipeline world generate`) whose Visual Genome images go through `pipeline extract` with the
bundled world detector (pipeline/assets/) on the CPU. About 7 s on one core, plus imports.
"""

from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class WorldShards:
    """world: the generated world's root (vg/, coco/, vqa/, ... and world.json).
    shards: the extracted `*.tar` shards of world/vg (feature_dim 64, adaptive boxes, float16
    features, class probabilities saved). images / seed: the world's WorldConfig."""

    world: Path
    shards: Path
    images: int
    seed: int


# The detector trained on seed 0, so seed 11 gives scenes it never saw. 16 images in shards of 8:
# two shards, enough for the reader's shard splitting and a few batches.
WORLD_IMAGES = 16
WORLD_SEED = 11


@pytest.fixture(scope="session")
def world_shards(tmp_path_factory) -> WorldShards:
    from pipeline.cli import main
    from pipeline.detector_train import bundled_detector
    from pipeline.world.generate import WorldConfig, generate_world

    root = tmp_path_factory.mktemp("world")
    generate_world(WorldConfig(images=WORLD_IMAGES, seed=WORLD_SEED), root, progress=False)
    config, weights = bundled_detector()
    out = root / "feats"
    code = main(["extract", "--dataset", "folder", "--root", str(root / "vg"), "--out", str(out),
                 "--config", str(config), "--weights", str(weights), "--device", "cpu",
                 "--engine", "local", "--set", "output.shard_size=8",
                 "--set", "save_class_probs=true"])
    assert code == 0, "pipeline extract failed on the generated world"
    return WorldShards(world=root, shards=out, images=WORLD_IMAGES, seed=WORLD_SEED)
