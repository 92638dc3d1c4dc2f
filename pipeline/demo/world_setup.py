"""A generated world made ready for training, the way a user makes one: generate the world
(`pipeline world generate`), extract its images with the bundled detector (`pipeline extract`),
build its corpus (`pipeline corpus build`, configs/corpus/world.yaml). The demo, the benchmarks
and the tests all set up their worlds here.

Each step keeps its output and is skipped when it is already there (the world's world.json, the
corpus's stats.json); extraction resumes by itself (finished shards are kept).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.assets import CONFIGS, bundled_detector
from pipeline.common.config import resolve
from pipeline.corpus.build import build_corpus
from pipeline.corpus.config import CorpusConfig
from pipeline.corpus.stats import format_table
from pipeline.extract.config import resolve_job
from pipeline.extract.job import extract_dataset
from pipeline.extract.output import format_summary
from pipeline.world.generate import WorldConfig, generate_world
from shards.verify import verify_shards


@dataclass(frozen=True)
class Extraction:
    """How the world's images are extracted with the bundled detector. engine: "local" or "ray";
    device: "auto", "cpu" or "cuda"; shard_size: images per shard; class_probs: save each
    region's class distribution (VL-BERT's and the objectives' soft labels); keep_images: store
    each image in its sample (training the detector end to end reads it)."""

    engine: str = "local"
    device: str = "cpu"
    shard_size: int = 64
    class_probs: bool = False
    keep_images: bool = False


@dataclass(frozen=True)
class PreparedWorld:
    """world: the generated world's root; corpus: its corpus (None when not built); shards:
    dataset -> its shard directory."""

    world: Path
    corpus: Path | None
    shards: dict[str, Path]


def world_config(experiment) -> WorldConfig:
    """The world of an experiment's config (a dataclass): its `world_images` and `world_seed`, and
    each of its fields that WorldConfig has (min_objects, shapes, vqa_per_image, ...)."""
    names = {f.name for f in dataclasses.fields(WorldConfig)}
    same = {k: v for k, v in dataclasses.asdict(experiment).items() if k in names}
    return WorldConfig(images=experiment.world_images, seed=experiment.world_seed, **same)


def generate(config: WorldConfig, out: Path, *, progress: bool = True) -> Path:
    """The world of `config` in `out` (generated once; an interrupted generation starts again)."""
    if (out / "world.json").is_file():
        print(f"{out}: generated already")
        return out
    if out.exists():
        shutil.rmtree(out)
    generate_world(config, out, progress=progress)
    return out


def extract(world: Path, dataset: str, out: Path, extraction: Extraction, *,
            reader: str | None = None, progress: bool = True, verify: bool = False,
            given_boxes: Path | None = None) -> Path:
    """World images of `dataset` (world/<dataset>, read with the `reader` dataset reader, by
    default the dataset's own) -> shards in `out`; with `verify`, checked end to end after.
    given_boxes: a `--given-boxes` JSON file: the regions are those boxes (`--boxes given`)."""
    from pipeline.extract.config import load_given_boxes

    config, weights = bundled_detector()
    sets = [f"output.shard_size={extraction.shard_size}"]
    if extraction.class_probs:
        sets.append("save_class_probs=true")
    if extraction.keep_images:
        sets.append("output.keep_images=true")
    job = resolve_job(str(config), sets, boxes="given" if given_boxes else None,
                      device=extraction.device, engine=extraction.engine)
    print(f"extracting {dataset} images in {world / dataset} -> {out} ({extraction.engine} engine)")
    given = load_given_boxes(str(given_boxes)) if given_boxes else None
    tally = extract_dataset(job, reader or dataset, str(world / dataset), out,
                            weights=str(weights), given_boxes=given, show_progress=progress)
    print(format_summary(tally, out))
    if verify:
        problems = verify_shards(out)
        if problems:
            raise RuntimeError(f"{out}: {len(problems)} shard problem(s), first: {problems[0]}")
        print(f"verify {out}: ok")
    return out


def corpus(world: Path, out: Path, *, minival_images: int, progress: bool = True) -> Path:
    """The world's pretraining corpus (configs/corpus/world.yaml, `minival_images` held out)."""
    if (out / "stats.json").is_file():
        print(f"{out}: built already")
        return out
    config = resolve(CorpusConfig(), CONFIGS / "corpus" / "world.yaml",
                     [f"minival_images={minival_images}"])
    stats = build_corpus(dataclasses.replace(config, root=str(world)), out, progress=progress)
    print(format_table(stats))
    return out


def prepare_world(root: Path, config: WorldConfig, *, datasets: Sequence[str] = ("coco", "vg"),
                  extraction: Extraction = Extraction(), minival_images: int | None = None,
                  progress: bool = True) -> PreparedWorld:
    """root/world generated, root/feats/<dataset> extracted for each of `datasets`, and, when
    `minival_images` is given, root/corpus built with that many minival images held out."""
    world = generate(config, root / "world", progress=progress)
    shards = {name: extract(world, name, root / "feats" / name, extraction, progress=progress)
              for name in datasets}
    built = None
    if minival_images is not None:
        built = corpus(world, root / "corpus", minival_images=minival_images, progress=progress)
    return PreparedWorld(world=world, corpus=built, shards=shards)
