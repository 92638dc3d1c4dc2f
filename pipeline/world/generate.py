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
    vcr/{train,val,test}.jsonl, vcr/vcr1images/lsmdc_{movie}/{clip}.jpg and {clip}.json
    refcoco+/refs(unc).p, refcoco+/instances.json
    flickr30k/dataset_flickr30k.json, flickr30k/flickr30k-images/{id}.jpg
    flickr30k_entities/Sentences/{id}.txt, Annotations/{id}.xml, {train,val,test}.txt,
       parses.conllu

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

VCR (about `vcr_fraction` * images images, `vcr_per_image` questions each) and Flickr30K (about
`flickr30k_fraction` * images images, `captions_per_image` captions each, Flickr30K Entities
for the same images) use scenes of their own too, with ids from VCR_ID_BASE and
FLICKR30K_ID_BASE (a Flickr30K image's file name is its id); both are split about 80 / 10 / 10
with at least SMALLEST_HELD_OUT images in each held-out split. VCR scenes have two objects or
more (every question is about two). RefCOCO+ renders nothing: its refs are on the COCO train2014
images that hold two objects or more of one shape, at most `refs_per_image` refs an image, with
the annotation ids of instances_train2014.json; its splits are by image (see refcoco_splits).
JPEG quality is fixed (`jpeg_quality`).
"""

from __future__ import annotations

import math
import random
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from pipeline.common.config import ConfigError, to_dict
from pipeline.world.formats import (
    cc3m,
    coco,
    flickr30k,
    flickr30k_entities,
    gqa,
    nlvr2,
    refcoco,
    vcr,
    vg,
    vqa,
)
from pipeline.world.formats.files import (
    write_bytes,
    write_json,
    write_json_lines,
)
from pipeline.world.language import (
    captions,
    cc3m_caption,
    flickr30k_captions,
    gqa_questions,
    nlvr2_items,
    referring_expressions,
    region_descriptions,
    vcr_annotations,
    vg_question_answers,
    vqa_questions,
)
from pipeline.world.language.nlvr2 import SENTENCES_PER_SET
from pipeline.world.language.vqa import VQA_KINDS
from pipeline.world.language.refcoco import distinguishing_specs
from pipeline.world.pictures import SceneFile, Painter, Pictures
from pipeline.world.sampling import OBJECTS_PER_ID
from pipeline.world.scene import COLORS, MATERIALS, SHAPES, Palette, Scene

COCO_ID_OFFSET = 1_000_000
NLVR2_ID_BASE = 10_000_000
CC3M_ID_BASE = 20_000_000
VCR_ID_BASE = 30_000_000
FLICKR30K_ID_BASE = 40_000_000
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
# VCR and Flickr30K: the share of images in each held-out split, and their least count, so that
# even an 8-image world has a few items to evaluate on.
HELD_OUT_FRACTION = 0.1
SMALLEST_HELD_OUT = 2
SMALLEST_GROUNDED_WORLD = 9
# RefCOCO+'s shares of images (unc split: 1,500 val, 750 testA, 750 testB of 19,994 images).
REFCOCO_HELD_OUT = {"val": 0.075, "testA": 0.0375, "testB": 0.0375}


@dataclass(frozen=True)
class WorldConfig:
    """What `pipeline world generate` makes; `--images` and `--seed` override the first two.

    images: COCO + Visual Genome scenes (Visual Genome holds them all).
    seed: every random choice (scenes, texts, splits): the same config and seed write
    byte-identical files. coco_fraction: share of the scenes that are also COCO images.
    coco_val_fraction: share of the COCO images in val2014. vg_100k_2_fraction: share of the
    Visual Genome images stored in VG_100K_2. min_objects / max_objects: the fewest and the most
    objects in one scene.
    shapes / colors / materials: the palette objects are drawn from (scene.Palette; default all).
    captions_per_image: captions of each COCO image and of each Flickr30K image.
    vqa_per_image: VQA questions per COCO image (fewer where a scene offers fewer distinct ones).
    vqa_kinds: the only kinds of VQA question asked (language/vqa.py VQA_KINDS, e.g. [material,
    color]); empty: every kind.
    gqa_per_image: GQA questions per Visual Genome image, at most (a family of entailed
    questions is asked whole or not at all).
    nlvr2_fraction / cc3m_fraction: NLVR2 pairs and CC3M urls per COCO/VG scene.
    nlvr2_sentences_per_set: NLVR2 sentences written for each set of four pairs (every one is
    an item with each pair). nlvr2_dev_sets: sets of four pairs in NLVR2's dev split (0: 15% of
    the sets, as test1); more leave the train split and the dev split's first sets as they were
    (a larger evaluation set, the same training). cc3m_failed_fraction: share of the CC3M urls
    that fail to download (at least one).
    cc3m_samples_per_shard: CC3M urls per img2dataset shard (.tar, .parquet, _stats.json).
    jpeg_quality: quality (1..95) of every JPEG written: COCO / Visual Genome, VCR, Flickr30K
    and CC3M images (NLVR2's are PNG).
    vcr_fraction / flickr30k_fraction: VCR and Flickr30K images per COCO/VG scene (at least
    SMALLEST_GROUNDED_WORLD each). vcr_per_image: VCR questions per VCR image, at most.
    refs_per_image: the most RefCOCO+ refs on one COCO image.
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
    vqa_kinds: tuple[str, ...] = ()
    gqa_per_image: int = 6
    nlvr2_fraction: float = 0.25
    nlvr2_sentences_per_set: int = SENTENCES_PER_SET
    nlvr2_dev_sets: int = 0
    cc3m_fraction: float = 0.25
    cc3m_samples_per_shard: int = 64
    cc3m_failed_fraction: float = 0.08
    jpeg_quality: int = 90
    vcr_fraction: float = 0.1
    vcr_per_image: int = 3
    refs_per_image: int = 3
    flickr30k_fraction: float = 0.1

    def __post_init__(self) -> None:
        object.__setattr__(self, "vqa_kinds", tuple(self.vqa_kinds))
        unknown = set(self.vqa_kinds) - set(VQA_KINDS)
        if unknown:
            raise ConfigError(f"vqa_kinds: unknown {sorted(unknown)}; known: {list(VQA_KINDS)}")
        if not 8 <= self.images <= MAX_IMAGES:
            raise ConfigError(f"images must be between 8 and {MAX_IMAGES}, got {self.images}")
        if self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed}")
        if not 1 <= self.min_objects <= self.max_objects <= MAX_OBJECTS:
            raise ConfigError(f"need 1 <= min_objects <= max_objects <= {MAX_OBJECTS}")
        if min(self.captions_per_image, self.vqa_per_image, self.gqa_per_image,
               self.nlvr2_sentences_per_set, self.vcr_per_image, self.refs_per_image) < 1:
            raise ConfigError("captions_per_image, vqa_per_image, gqa_per_image, "
                              "nlvr2_sentences_per_set, vcr_per_image and refs_per_image must "
                              "be >= 1")
        for name in ("coco_fraction", "coco_val_fraction", "vg_100k_2_fraction",
                     "nlvr2_fraction", "cc3m_fraction", "cc3m_failed_fraction",
                     "vcr_fraction", "flickr30k_fraction"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be strictly between 0 and 1")
        if self.nlvr2_dev_sets < 0:
            raise ConfigError(f"nlvr2_dev_sets must be >= 0, got {self.nlvr2_dev_sets}")
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


def painter(cfg: WorldConfig) -> Painter:
    """What renders the world's scenes and encodes their files."""
    return Painter(cfg.seed, cfg.min_objects, cfg.max_objects, cfg.palette, cfg.jpeg_quality)


def write_coco_vg(cfg: WorldConfig, out: Path, plan: Sequence[PlannedImage], bar: tqdm,
                  pictures: Pictures) -> dict:
    """Render the COCO/VG scenes with `pictures` (as each writer does) and write COCO, Visual
    Genome, VQA and GQA. Returns counts."""
    scenes: dict[int, Scene] = {}
    rendered = pictures([SceneFile(image.vg_id, image.split) for image in plan])
    for image, (scene, data, _) in zip(plan, rendered, strict=True):
        scenes[image.vg_id] = scene
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
        if split == "train":
            counts["refcoco+"] = write_refcoco(cfg, out, images, instance_ann_id)
        caption_ann_id += len(caption_doc["annotations"])
        instance_ann_id += len(instance_doc["annotations"])
        counts["coco"][subset] = {
            "images": len(images),
            "captions": len(caption_doc["annotations"]),
            "instances": len(instance_doc["annotations"]),
        }

        questions = vqa_questions([s for _, s in images], cfg.seed, cfg.vqa_per_image, question_id,
                                  cfg.vqa_kinds)
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


def refcoco_splits(cfg: WorldConfig, referable: dict[int, list[int]],
                   scenes: dict[int, Scene]) -> dict[int, str]:
    """The RefCOCO+ split of each COCO image with referable objects (by COCO id).

    As RefCOCO's unc split: by image, testA the images with refs to people and testB those with
    refs to other objects; here "people" is the palette's first shape (COCO's first category is
    person), so a testA image gets refs to that shape only and a testB image to the others only.
    Shares as REFCOCO_HELD_OUT, at least one image each while train keeps half of the images.
    """
    rng = random.Random(f"world-refcoco-{cfg.seed}")
    order = rng.sample(sorted(referable), len(referable))
    people = cfg.palette.shapes[0]

    def holds(coco_id: int, split: str) -> bool:
        shapes = {scenes[coco_id].objects[i].shape for i in referable[coco_id]}
        return {"testA": people in shapes, "testB": bool(shapes - {people})}.get(split, True)

    wanted = {split: max(1, round(len(order) * share)) for split, share in REFCOCO_HELD_OUT.items()}
    splits: dict[int, str] = {}
    budget = len(order) // 2
    while budget and any(wanted.values()):
        for split in REFCOCO_HELD_OUT:
            pick = next((c for c in order if c not in splits and holds(c, split)), None)
            if wanted[split] and budget and pick is not None:
                splits[pick], wanted[split], budget = split, wanted[split] - 1, budget - 1
            elif pick is None:
                wanted[split] = 0
    return {c: splits.get(c, "train") for c in sorted(referable)}


def write_refcoco(cfg: WorldConfig, out: Path, images: Sequence[tuple[int, Scene]],
                  first_ann_id: int) -> dict:
    """RefCOCO+ on the train2014 images (coco_id, scene), whose instance annotation ids start at
    first_ann_id; nothing is rendered. Returns counts."""
    ann_ids = coco.instance_ids(images, first_ann_id)
    scenes = dict(images)
    referable = {}
    for coco_id, scene in images:
        same_shape = [i for i, o in enumerate(scene.objects)
                      if scene.count(shape=o.shape) >= 2 and distinguishing_specs(scene, o)]
        if same_shape:
            referable[coco_id] = same_shape
    splits = refcoco_splits(cfg, referable, scenes)
    people = cfg.palette.shapes[0]
    refs, carrying = [], []
    sent_id = 0
    for coco_id, split in splits.items():
        scene = scenes[coco_id]
        rng = _rng(cfg.seed, "refcoco", scene.image_id)
        objects = [i for i in referable[coco_id]
                   if {"testA": scene.objects[i].shape == people,
                       "testB": scene.objects[i].shape != people}.get(split, True)]
        for i in sorted(rng.sample(objects, min(cfg.refs_per_image, len(objects)))):
            expressions = referring_expressions(scene, i, rng)
            ann_id = ann_ids[scene.objects[i].object_id]
            refs.append(refcoco.ref_entry(len(refs), split, coco_id, scene, ann_id, expressions,
                                          sent_id))
            sent_id += len(expressions)
        carrying.append((coco_id, scene))
    write_bytes(out / "refcoco+" / "refs(unc).p", refcoco.refs_pickle(refs))
    write_json(out / "refcoco+" / "instances.json", refcoco.instances_json(carrying, ann_ids))
    return {
        "images": {s: sum(v == s for v in splits.values()) for s in refcoco.SPLITS},
        "refs": {s: sum(r["split"] == s for r in refs) for s in refcoco.SPLITS},
        "sentences": sent_id,
    }


def grounded_split_counts(cfg: WorldConfig, fraction: float) -> dict[str, int]:
    """Images per split of VCR or Flickr30K: HELD_OUT_FRACTION in val and test each (at least
    SMALLEST_HELD_OUT), the rest in train."""
    total = max(SMALLEST_GROUNDED_WORLD, round(cfg.images * fraction))
    held_out = max(SMALLEST_HELD_OUT, round(total * HELD_OUT_FRACTION))
    return {"train": total - 2 * held_out, "val": held_out, "test": held_out}


def write_vcr(cfg: WorldConfig, out: Path, bar: tqdm, pictures: Pictures) -> dict:
    """Render the VCR scenes split by split (movies of IMAGES_PER_MOVIE images, none shared by
    two splits) and write the images, their metadata and the jsonl files. Returns counts."""
    counts = {}
    next_id, first_movie = VCR_ID_BASE, 0
    for split, n_images in grounded_split_counts(cfg, cfg.vcr_fraction).items():
        scenes, stems, movies = [], {}, {}
        jobs = [SceneFile(next_id + k, split, least_objects=2) for k in range(n_images)]
        for k, (scene, data, _) in enumerate(pictures(jobs)):
            movie = vcr.movie_name(first_movie + k // vcr.IMAGES_PER_MOVIE)
            stem = vcr.image_stem(movie, k % vcr.IMAGES_PER_MOVIE, next_id)
            root = out / "vcr" / "vcr1images"
            write_bytes(root / f"{stem}.jpg", data)
            write_json(root / f"{stem}.json",
                       vcr.metadata_json(scene, _rng(cfg.seed, "vcr-boxes", next_id)))
            scenes.append(scene)
            stems[next_id], movies[next_id] = stem, movie
            next_id += 1
            bar.update()
        first_movie += math.ceil(n_images / vcr.IMAGES_PER_MOVIE)
        questions = vcr_annotations(scenes, cfg.seed, cfg.vcr_per_image, f"{split}-0")
        img_index = {s.image_id: n for n, s in enumerate(scenes)}
        objects = {s.image_id: [o.shape for o in s.objects] for s in scenes}
        rows = [vcr.line(q, split, movies[q.image_id], stems[q.image_id], objects[q.image_id],
                         img_index[q.image_id], n) for n, q in enumerate(questions)]
        write_json_lines(out / "vcr" / f"{split}.jsonl", rows)
        counts[split] = {"images": n_images, "questions": len(questions)}
    return counts


def write_flickr30k(cfg: WorldConfig, out: Path, bar: tqdm, pictures: Pictures) -> dict:
    """Render the Flickr30K scenes and write Karpathy's split file and Flickr30K Entities.

    Ids are consecutive; which are val and test is drawn, so the splits interleave in the file
    as in Karpathy's. A caption is written to fit no other scene of its split (language/
    flickr30k.py), so every image can be retrieved by each of its captions."""
    sizes = grounded_split_counts(cfg, cfg.flickr30k_fraction)
    ids = [FLICKR30K_ID_BASE + k for k in range(sum(sizes.values()))]
    order = random.Random(f"world-flickr30k-{cfg.seed}").sample(ids, len(ids))
    split_of = {i: "train" for i in ids}
    split_of.update({i: "val" for i in order[: sizes["val"]]})
    split_of.update({i: "test" for i in order[sizes["val"]: sizes["val"] + sizes["test"]]})
    scenes = {}
    rendered = pictures([SceneFile(image_id, split_of[image_id]) for image_id in ids])
    for image_id, (scene, data, _) in zip(ids, rendered, strict=True):
        scenes[image_id] = scene
        write_bytes(out / "flickr30k" / flickr30k.IMAGE_FOLDER / flickr30k.file_name(image_id),
                    data)
        bar.update()
    entries = []
    entities = out / "flickr30k_entities"
    conllu, next_chain = [], 1
    for image_id in ids:
        scene = scenes[image_id]
        peers = [s for s in scenes.values() if s.split == scene.split and s is not scene]
        texts = flickr30k_captions(scene, _rng(cfg.seed, "flickr30k", image_id),
                                   cfg.captions_per_image, peers)
        entries.append((scene.split, scene, texts))
        chains = flickr30k_entities.chains(texts, next_chain)
        next_chain += len(chains)
        write_bytes(entities / "Sentences" / f"{image_id}.txt",
                    flickr30k_entities.sentences_txt(texts, chains).encode("utf-8"))
        write_bytes(entities / "Annotations" / f"{image_id}.xml",
                    flickr30k_entities.annotation_xml(scene, chains).encode("utf-8"))
        conllu.append(flickr30k_entities.conllu(image_id, texts))
    write_json(out / "flickr30k" / "dataset_flickr30k.json", flickr30k.dataset_json(entries))
    for split in flickr30k.SPLITS:
        listed = "".join(f"{i}\n" for i in ids if split_of[i] == split)
        write_bytes(entities / f"{split}.txt", listed.encode("utf-8"))
    write_bytes(entities / "parses.conllu", "".join(conllu).encode("utf-8"))
    return {split: {"images": n, "captions": n * cfg.captions_per_image}
            for split, n in sizes.items()}


def nlvr2_set_counts(cfg: WorldConfig) -> dict[str, int]:
    """Sets of four image pairs per NLVR2 split: ~70% train, at least one set in each split
    (dev: nlvr2_dev_sets when given)."""
    sets = max(3, round(cfg.images * cfg.nlvr2_fraction / PAIRS_PER_SET))
    held_out = max(1, round(sets * 0.15))
    return {"train": sets - 2 * held_out, "dev": cfg.nlvr2_dev_sets or held_out,
            "test1": held_out}


def write_nlvr2(cfg: WorldConfig, out: Path, bar: tqdm, pictures: Pictures) -> dict:
    """Render the NLVR2 pairs split by split and write the json lines and PNG images."""
    counts = {}
    next_id = NLVR2_ID_BASE
    for split, sets in nlvr2_set_counts(cfg).items():
        ids = range(next_id, next_id + 2 * sets * PAIRS_PER_SET)
        files: dict[int, bytes] = {}
        scenes = []
        for image_id, (scene, data, _) in zip(
                ids, pictures([SceneFile(i, split, format="png") for i in ids]), strict=True):
            files[image_id] = data
            scenes.append(scene)
            bar.update()
        pairs = list(zip(scenes[0::2], scenes[1::2], strict=True))
        next_id = ids.stop
        items = nlvr2_items(pairs, split, cfg.seed, pairs_per_sentence=PAIRS_PER_SET,
                            sentences_per_set=cfg.nlvr2_sentences_per_set)
        written = set()
        for item in items:
            left, right = nlvr2.image_paths(item, split)
            if left not in written:
                write_bytes(out / "nlvr2" / left, files[item.left_image_id])
                write_bytes(out / "nlvr2" / right, files[item.right_image_id])
                written.add(left)
        write_json_lines(out / "nlvr2" / f"{split}.json", nlvr2.lines(items, split))
        counts[split] = {"items": len(items), "pairs": len(written)}
    return counts


def cc3m_url_count(cfg: WorldConfig) -> int:
    """CC3M urls, each with a scene of its own (rendered even when its download is made to fail:
    the caption describes it)."""
    return max(1, round(cfg.images * cfg.cc3m_fraction))


def write_cc3m(cfg: WorldConfig, out: Path, bar: tqdm, pictures: Pictures) -> dict:
    """Render the CC3M scenes and write img2dataset shards with a few failed downloads."""
    total = cc3m_url_count(cfg)
    rng = random.Random(f"world-cc3m-{cfg.seed}")
    failed = set(rng.sample(range(total), max(1, round(total * cfg.cc3m_failed_fraction))))
    downloads = []
    rendered = pictures([SceneFile(CC3M_ID_BASE + k, "train") for k in range(total)])
    for k, (scene, data, (width, height)) in enumerate(rendered):
        image_id = CC3M_ID_BASE + k
        url = f"http://{rng.choice(CC3M_HOSTS)}/images/{rng.getrandbits(48):012x}.jpg"
        caption = cc3m_caption(scene, _rng(cfg.seed, "cc3m", image_id))
        if k in failed:
            error = rng.choice(CC3M_ERRORS)
            downloads.append(cc3m.Download(url, caption, None, error_message=error))
        else:
            downloads.append(cc3m.Download(url, caption, data, width, height))
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
    """Write the whole world under `out` (which must be empty or absent); returns world.json.
    It is written into `.{out}.partial` beside it and renamed when complete: an interrupted run
    leaves nothing in `out`, and the same command run again starts afresh."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        world = _write_world(cfg, partial, progress)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if out.exists():
        out.rmdir()  # empty (checked above)
    partial.rename(out)
    return world


def scene_counts(cfg: WorldConfig) -> dict[str, int]:
    """The scenes rendered for each dataset, in the order they are rendered: what the progress
    bar counts. COCO's images are Visual Genome scenes (rendered once, stored in both) and
    RefCOCO+ is on COCO's images, so `images` scenes serve all four; NLVR2, CC3M, VCR and
    Flickr30K render scenes of their own."""
    return {
        "COCO / Visual Genome": cfg.images,
        "NLVR2": 2 * PAIRS_PER_SET * sum(nlvr2_set_counts(cfg).values()),
        "CC3M": cc3m_url_count(cfg),
        "VCR": sum(grounded_split_counts(cfg, cfg.vcr_fraction).values()),
        "Flickr30K": sum(grounded_split_counts(cfg, cfg.flickr30k_fraction).values()),
    }


def _write_world(cfg: WorldConfig, out: Path, progress: bool) -> dict:
    scenes = scene_counts(cfg)

    def rendering(dataset: str) -> None:
        # A plain line per dataset: on a terminal it says what the bar below counts; in a log,
        # where no bar is drawn, it is the progress.
        if progress:
            tqdm.write(f"world: rendering {scenes[dataset]} {dataset} scenes", file=sys.stderr)

    # tqdm redraws its bar with carriage returns, which a log file or pipe keeps as one endless
    # line: the bar is drawn on a terminal only.
    on_terminal = progress and sys.stderr.isatty()
    with tqdm(total=sum(scenes.values()), unit="scene", desc="world",
              disable=not on_terminal) as bar, Pictures(painter(cfg)) as pictures:
        rendering("COCO / Visual Genome")
        counts = write_coco_vg(cfg, out, plan_images(cfg), bar, pictures)
        rendering("NLVR2")
        counts["nlvr2"] = write_nlvr2(cfg, out, bar, pictures)
        rendering("CC3M")
        counts["cc3m"] = write_cc3m(cfg, out, bar, pictures)
        rendering("VCR")
        counts["vcr"] = write_vcr(cfg, out, bar, pictures)
        rendering("Flickr30K")
        counts["flickr30k"] = write_flickr30k(cfg, out, bar, pictures)
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
            "vcr_scene_id_base": VCR_ID_BASE,
            "flickr30k_scene_id_base": FLICKR30K_ID_BASE,
            "flickr30k_image_id": "scene id (file name {id}.jpg)",
            "refcoco_ann_id": "the object's id in coco/annotations/instances_train2014.json",
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
        "  VCR      " + ", ".join(f"{k} {v['images']} images / {v['questions']} questions"
                                  for k, v in c["vcr"].items()),
        "  RefCOCO+ " + ", ".join(f"{k} {v} refs" for k, v in c["refcoco+"]["refs"].items()),
        "  Flickr30K " + ", ".join(f"{k} {v['images']} images / {v['captions']} captions"
                                   for k, v in c["flickr30k"].items()),
    ])
