"""`pipeline world generate`: a deterministic world of rendered scenes in real datasets' layouts.

Same config and seed -> byte-identical files. What is written under `--out`:

    world.json                          config, seed, id scheme and counts per dataset
    coco/train2014/COCO_train2014_%012d.jpg, coco/val2014/COCO_val2014_%012d.jpg
    coco/annotations/captions_{train,val}2014.json, instances_{train,val}2014.json
    vg/VG_100K/{image_id}.jpg, vg/VG_100K_2/{image_id}.jpg
    vg/image_data.json, objects.json, attributes.json, region_descriptions.json,
       question_answers.json
    vqa/v2_OpenEnded_mscoco_{train,val}2014_questions.json,
       v2_mscoco_{train,val}2014_annotations.json
    gqa/{train,val}_balanced_questions.json
    nlvr2/{train,dev,test1}.json, nlvr2/images/train/{directory}/{split}-{set}-{pair}-img{0,1}.png,
       nlvr2/images/{dev,test1}/...-img{0,1}.png
    cc3m/{shard:05d}.tar, {shard:05d}.parquet, {shard:05d}_stats.json   (img2dataset webdataset)

COCO and Visual Genome share scenes, as in reality. `images` scenes get Visual Genome image ids
1..images; Visual Genome holds all of them. About `coco_fraction` of them (chosen at random) are
also COCO images, with COCO id = Visual Genome id + COCO_ID_OFFSET (a different number, as in
reality; image_data.json's `coco_id` is the join), split into train2014 and val2014
(`coco_val_fraction`). A scene's `split` is its COCO subset ("train" / "val"); Visual Genome-only
scenes are "train". The detector is evaluated on the Visual Genome images whose coco_id is in
val2014. The last `vg_100k_2_fraction` of the Visual Genome ids are stored in VG_100K_2, the rest
in VG_100K (image_data.json's url names the folder). COCO category ids and VG object ids follow
extractor/vg1600 (see formats/coco.py); VG object ids are image_id * 64 + index.

VQA v2 covers the COCO images (COCO ids), GQA covers all Visual Genome images (ids as strings),
both split like the scenes. NLVR2 (about `nlvr2_fraction` * images pairs, in sets of four pairs,
PNG) and CC3M (about `cc3m_fraction` * images urls, a few failed downloads that appear only in the
parquet files) use scenes of their own, with internal ids from NLVR2_ID_BASE and CC3M_ID_BASE.
JPEG quality is fixed (`jpeg_quality`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image
from tqdm import tqdm

from pipeline.common.config import ConfigError, to_dict
from pipeline.world.formats import cc3m, coco, gqa, nlvr2, vg, vqa
from pipeline.world.formats.files import (
    jpeg_bytes,
    png_bytes,
    write_bytes,
    write_json,
    write_json_lines,
)
from pipeline.world.language import (
    captions,
    cc3m_caption,
    gqa_questions,
    nlvr2_items,
    region_descriptions,
    vg_question_answers,
    vqa_questions,
)
from pipeline.world.language.nlvr2 import SENTENCES_PER_SET
from pipeline.world.sampling import OBJECTS_PER_ID, make_scene
from pipeline.world.scene import COLORS, MATERIALS, SHAPES, Palette, Scene

COCO_ID_OFFSET = 1_000_000
NLVR2_ID_BASE = 10_000_000
CC3M_ID_BASE = 20_000_000
MAX_IMAGES = COCO_ID_OFFSET - 1  # keeps COCO ids and Visual Genome ids disjoint
PAIRS_PER_SET = 4
MAX_OBJECTS = OBJECTS_PER_ID - 1  # object ids are image_id * 64 + index, the last one the ground's
CC3M_HOSTS = (
    "img.world.invalid", "cdn.world.invalid", "photos.world.invalid", "media.world.invalid",
)
CC3M_ERRORS = (
    "HTTP Error 404: Not Found",
    "<urlopen error [Errno -2] Name or service not known>",
    "The read operation timed out",
)


@dataclass(frozen=True)
class WorldConfig:
    """What `pipeline world generate` makes; `--images` and `--seed` override the first two.

    images: COCO + Visual Genome scenes. coco_fraction: share of them that are COCO images;
    coco_val_fraction: share of the COCO images in val2014. vg_100k_2_fraction: share of the
    Visual Genome images stored in VG_100K_2. min_objects / max_objects: objects per scene.
    shapes / colors / materials: the palette objects are drawn from (scene.Palette; default all).
    *_per_image: questions per image. nlvr2_fraction / cc3m_fraction: NLVR2 pairs and CC3M urls
    per COCO/VG scene. nlvr2_sentences_per_set: NLVR2 sentences written for each set of four
    pairs (every one is an item with each pair). cc3m_failed_fraction: urls that fail to
    download (at least one).
    """

    images: int = 600
    seed: int = 0
    coco_fraction: float = 0.7
    coco_val_fraction: float = 0.15
    vg_100k_2_fraction: float = 0.4
    min_objects: int = 2
    max_objects: int = 6
    shapes: tuple[str, ...] = SHAPES
    colors: tuple[str, ...] = COLORS
    materials: tuple[str, ...] = MATERIALS
    captions_per_image: int = 5
    vqa_per_image: int = 6
    gqa_per_image: int = 6
    nlvr2_fraction: float = 0.25
    nlvr2_sentences_per_set: int = SENTENCES_PER_SET
    cc3m_fraction: float = 0.25
    cc3m_samples_per_shard: int = 64
    cc3m_failed_fraction: float = 0.08
    jpeg_quality: int = 90

    def __post_init__(self) -> None:
        if not 8 <= self.images <= MAX_IMAGES:
            raise ConfigError(f"images must be between 8 and {MAX_IMAGES}, got {self.images}")
        if self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed}")
        if not 1 <= self.min_objects <= self.max_objects <= MAX_OBJECTS:
            raise ConfigError(f"need 1 <= min_objects <= max_objects <= {MAX_OBJECTS}")
        if min(self.captions_per_image, self.vqa_per_image, self.gqa_per_image,
               self.nlvr2_sentences_per_set) < 1:
            raise ConfigError("captions_per_image, vqa_per_image, gqa_per_image and "
                              "nlvr2_sentences_per_set must be >= 1")
        for name in ("coco_fraction", "coco_val_fraction", "vg_100k_2_fraction",
                     "nlvr2_fraction", "cc3m_fraction", "cc3m_failed_fraction"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be strictly between 0 and 1")
        if self.cc3m_samples_per_shard < 1 or not 1 <= self.jpeg_quality <= 95:
            raise ConfigError("cc3m_samples_per_shard must be >= 1 and jpeg_quality in 1..95")
        try:
            self.palette
        except ValueError as err:
            raise ConfigError(str(err)) from err

    @property
    def palette(self) -> Palette:
        return Palette(tuple(self.shapes), tuple(self.colors), tuple(self.materials))


@dataclass(frozen=True)
class PlannedImage:
    """One COCO/Visual Genome image: its Visual Genome id and folder, COCO id (None if VG-only)
    and scene split."""

    vg_id: int
    vg_folder: str
    coco_id: int | None
    split: str


def plan_images(cfg: WorldConfig) -> list[PlannedImage]:
    """Which Visual Genome ids are COCO images, in which subset and which VG folder."""
    rng = random.Random(f"world-plan-{cfg.seed}")
    vg_ids = list(range(1, cfg.images + 1))
    shuffled = rng.sample(vg_ids, len(vg_ids))
    n_coco = max(2, round(cfg.images * cfg.coco_fraction))
    n_val = min(n_coco - 1, max(1, round(n_coco * cfg.coco_val_fraction)))
    val, train = set(shuffled[:n_val]), set(shuffled[n_val:n_coco])
    first_vg_100k_2 = cfg.images - round(cfg.images * cfg.vg_100k_2_fraction) + 1
    plan = []
    for vg_id in vg_ids:
        is_coco = vg_id in val or vg_id in train
        plan.append(PlannedImage(
            vg_id=vg_id,
            vg_folder=vg.FOLDERS[vg_id >= first_vg_100k_2],
            coco_id=vg_id + COCO_ID_OFFSET if is_coco else None,
            split="val" if vg_id in val else "train",
        ))
    return plan


def _rng(seed: int, purpose: str, image_id: int) -> random.Random:
    # String seeds are hashed with SHA-512 by `random`, so this is stable across runs and platforms.
    return random.Random(f"{seed}:{purpose}:{image_id}")


def _scene(cfg: WorldConfig, image_id: int, split: str) -> tuple[Scene, Image.Image]:
    return make_scene(image_id, split, cfg.seed, min_objects=cfg.min_objects,
                      max_objects=cfg.max_objects, palette=cfg.palette)


def write_coco_vg(cfg: WorldConfig, out: Path, plan: Sequence[PlannedImage], bar: tqdm) -> dict:
    """Render the COCO/VG scenes and write COCO, Visual Genome, VQA and GQA. Returns counts."""
    scenes: dict[int, Scene] = {}
    for image in plan:
        scene, picture = _scene(cfg, image.vg_id, image.split)
        scenes[image.vg_id] = scene
        data = jpeg_bytes(picture, cfg.jpeg_quality)
        write_bytes(out / "vg" / image.vg_folder / f"{image.vg_id}.jpg", data)
        if image.coco_id is not None:
            subset = coco.subset_name(image.split)
            write_bytes(out / "coco" / subset / coco.image_file_name(subset, image.coco_id), data)
        bar.update()

    counts: dict = {"coco": {}, "vg": {}, "vqa": {}, "gqa": {}}
    coco_ids = {p.vg_id: p.coco_id for p in plan if p.coco_id is not None}
    caption_ann_id = instance_ann_id = question_id = 1
    for split in ("train", "val"):
        subset = coco.subset_name(split)
        images = [(p.coco_id, scenes[p.vg_id]) for p in plan
                  if p.coco_id is not None and p.split == split]
        texts = {
            s.image_id: captions(s, _rng(cfg.seed, "captions", s.image_id), cfg.captions_per_image)
            for _, s in images
        }
        caption_doc = coco.captions_json(subset, images, texts, caption_ann_id)
        instance_doc = coco.instances_json(subset, images, instance_ann_id)
        write_json(out / "coco" / "annotations" / f"captions_{subset}.json", caption_doc)
        write_json(out / "coco" / "annotations" / f"instances_{subset}.json", instance_doc)
        caption_ann_id += len(caption_doc["annotations"])
        instance_ann_id += len(instance_doc["annotations"])
        counts["coco"][subset] = {
            "images": len(images),
            "captions": len(caption_doc["annotations"]),
            "instances": len(instance_doc["annotations"]),
        }

        questions = vqa_questions([s for _, s in images], cfg.seed, cfg.vqa_per_image, question_id)
        question_id += len(questions)
        write_json(out / "vqa" / vqa.questions_file_name(subset),
                   vqa.questions_json(subset, questions, coco_ids))
        write_json(out / "vqa" / vqa.annotations_file_name(subset),
                   vqa.annotations_json(subset, questions, coco_ids))
        counts["vqa"][subset] = len(questions)

        gqa_scenes = [scenes[p.vg_id] for p in plan if p.split == split]
        balanced = gqa_questions(gqa_scenes, cfg.seed, cfg.gqa_per_image)
        write_json(out / "gqa" / gqa.file_name(split), gqa.balanced_questions_json(balanced))
        counts["gqa"][split] = len(balanced)

    vg_scenes = [scenes[p.vg_id] for p in plan]
    folders = {p.vg_id: p.vg_folder for p in plan}
    regions, qas = {}, {}
    region_id = qa_id = 1
    for scene in vg_scenes:
        regions[scene.image_id] = region_descriptions(scene, region_id)
        qa_rng = _rng(cfg.seed, "vg-qa", scene.image_id)
        qas[scene.image_id] = vg_question_answers(scene, qa_rng, qa_id)
        region_id += len(regions[scene.image_id])
        qa_id += len(qas[scene.image_id])
    write_json(out / "vg" / "image_data.json", vg.image_data_json(vg_scenes, folders, coco_ids))
    write_json(out / "vg" / "objects.json", vg.objects_json(vg_scenes, folders))
    write_json(out / "vg" / "attributes.json", vg.attributes_json(vg_scenes))
    write_json(out / "vg" / "region_descriptions.json",
               vg.region_descriptions_json(vg_scenes, regions))
    write_json(out / "vg" / "question_answers.json", vg.question_answers_json(vg_scenes, qas))
    counts["vg"] = {
        "images": len(vg_scenes),
        "with_coco_id": len(coco_ids),
        "VG_100K_2": sum(p.vg_folder == "VG_100K_2" for p in plan),
        "objects": sum(len(s.objects) for s in vg_scenes),
        "regions": region_id - 1,
        "question_answers": qa_id - 1,
    }
    return counts


def nlvr2_set_counts(cfg: WorldConfig) -> dict[str, int]:
    """Sets of four image pairs per NLVR2 split: ~70% train, at least one set in each split."""
    sets = max(3, round(cfg.images * cfg.nlvr2_fraction / PAIRS_PER_SET))
    held_out = max(1, round(sets * 0.15))
    return {"train": sets - 2 * held_out, "dev": held_out, "test1": held_out}


def write_nlvr2(cfg: WorldConfig, out: Path, bar: tqdm) -> dict:
    """Render the NLVR2 pairs split by split and write the json lines and PNG images."""
    counts = {}
    next_id = NLVR2_ID_BASE
    for split, sets in nlvr2_set_counts(cfg).items():
        pictures: dict[int, bytes] = {}
        pairs = []
        for _ in range(sets * PAIRS_PER_SET):
            pair = []
            for image_id in (next_id, next_id + 1):
                scene, picture = _scene(cfg, image_id, split)
                pictures[image_id] = png_bytes(picture)
                pair.append(scene)
                bar.update()
            pairs.append((pair[0], pair[1]))
            next_id += 2
        items = nlvr2_items(pairs, split, cfg.seed, pairs_per_sentence=PAIRS_PER_SET,
                            sentences_per_set=cfg.nlvr2_sentences_per_set)
        written = set()
        for item in items:
            left, right = nlvr2.image_paths(item, split)
            if left not in written:
                write_bytes(out / "nlvr2" / left, pictures[item.left_image_id])
                write_bytes(out / "nlvr2" / right, pictures[item.right_image_id])
                written.add(left)
        write_json_lines(out / "nlvr2" / f"{split}.json", nlvr2.lines(items, split))
        counts[split] = {"items": len(items), "pairs": len(written)}
    return counts


def write_cc3m(cfg: WorldConfig, out: Path, bar: tqdm) -> dict:
    """Render the CC3M scenes and write img2dataset shards with a few failed downloads."""
    total = max(1, round(cfg.images * cfg.cc3m_fraction))
    rng = random.Random(f"world-cc3m-{cfg.seed}")
    failed = set(rng.sample(range(total), max(1, round(total * cfg.cc3m_failed_fraction))))
    downloads = []
    for k in range(total):
        image_id = CC3M_ID_BASE + k
        scene, picture = _scene(cfg, image_id, "train")
        url = f"http://{rng.choice(CC3M_HOSTS)}/images/{rng.getrandbits(48):012x}.jpg"
        caption = cc3m_caption(scene, _rng(cfg.seed, "cc3m", image_id))
        if k in failed:
            error = rng.choice(CC3M_ERRORS)
            downloads.append(cc3m.Download(url, caption, None, error_message=error))
        else:
            downloads.append(cc3m.Download(url, caption, jpeg_bytes(picture, cfg.jpeg_quality),
                                           picture.width, picture.height))
        bar.update()
    size = cfg.cc3m_samples_per_shard
    shards = [cc3m.write_shard(out / "cc3m", shard_id, downloads[start:start + size])
              for shard_id, start in enumerate(range(0, total, size))]
    return {
        "shards": len(shards),
        "urls": total,
        "successes": sum(s["successes"] for s in shards),
        "failed_to_download": sum(s["failed_to_download"] for s in shards),
    }


def generate_world(cfg: WorldConfig, out: Path, progress: bool = True) -> dict:
    """Write the whole world under `out` (which must be empty or absent); returns world.json."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory")
    out.mkdir(parents=True, exist_ok=True)
    plan = plan_images(cfg)
    nlvr2_scenes = 2 * PAIRS_PER_SET * sum(nlvr2_set_counts(cfg).values())
    cc3m_scenes = max(1, round(cfg.images * cfg.cc3m_fraction))
    with tqdm(total=len(plan) + nlvr2_scenes + cc3m_scenes, unit="img", disable=not progress,
              desc="world") as bar:
        counts = write_coco_vg(cfg, out, plan, bar)
        counts["nlvr2"] = write_nlvr2(cfg, out, bar)
        counts["cc3m"] = write_cc3m(cfg, out, bar)
    world = {
        "generator": "pipeline world generate",
        "seed": cfg.seed,
        "config": to_dict(cfg),
        "ids": {
            "vg_image_id": f"1..{cfg.images}",
            "coco_id": f"vg_image_id + {COCO_ID_OFFSET}",
            "vg_object_id": "vg_image_id * 64 + index",
            "nlvr2_scene_id_base": NLVR2_ID_BASE,
            "cc3m_scene_id_base": CC3M_ID_BASE,
            "coco_category_id": "line index in extractor/vg1600/objects_vocab.txt + 1",
        },
        "counts": counts,
    }
    write_json(out / "world.json", world)
    return world


def format_summary(world: dict, seconds: float, out: Path) -> str:
    c = world["counts"]
    coco_line = ", ".join(f"{k} {v['images']} images / {v['captions']} captions / "
                          f"{v['instances']} boxes" for k, v in c["coco"].items())
    return "\n".join([
        f"world written to {out} in {seconds:.1f} s (seed {world['seed']})",
        f"  COCO     {coco_line}",
        f"  VG       {c['vg']['images']} images ({c['vg']['with_coco_id']} with coco_id), "
        f"{c['vg']['objects']} objects, {c['vg']['regions']} regions, "
        f"{c['vg']['question_answers']} QAs",
        "  VQA v2   " + ", ".join(f"{k} {v} questions" for k, v in c["vqa"].items()),
        "  GQA      " + ", ".join(f"{k} {v} questions" for k, v in c["gqa"].items()),
        "  NLVR2    " + ", ".join(f"{k} {v['items']} items / {v['pairs']} pairs"
                                  for k, v in c["nlvr2"].items()),
        f"  CC3M     {c['cc3m']['urls']} urls in {c['cc3m']['shards']} shards, "
        f"{c['cc3m']['failed_to_download']} failed to download",
    ])
