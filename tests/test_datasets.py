"""Dataset readers against a generated world: each listing is checked against the world's own
annotation files (read here with plain json / tarfile / pyarrow), then extracted end to end through
the CLI with a tiny detector, and the shards' image ids joined back to the annotations."""

import hashlib
import io
import json
import logging
import shutil
import tarfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from tiny_detector import TINY_DETECTOR

from pipeline.cli import main
from pipeline.datasets import READERS, DatasetError, list_images, nlvr2_image_ids
from pipeline.world.generate import WorldConfig, generate_world
from shards.reader import iter_samples
from shards.schema import split_key
from shards.store import FeatureStore

IMAGES, SEED = 40, 5
# A detector small enough to extract a whole 40-image world in seconds on 2 CPU cores, in one
# process. Regressed boxes are saved because they are clipped to the image in original pixels;
# a raw proposal along the border can come back a float32 rounding step outside it.
TINY = ["--set", "run.engine=local", "--device", "cpu", "--set", "selection.saved_boxes=regressed",
        *TINY_DETECTOR, "--set", "detector.rpn_pre_nms_topk=300",
        "--set", "detector.rpn_post_nms_topk=20", "--set", "detector.pooler_resolution=6",
        "--set", "selection.min_boxes=2", "--set", "output.shard_size=16",
        "--set", "run.batch_size=4", "--set", "run.decode_threads=1", "--random-weights"]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny convolutions run ~10x slower on two intra-op threads when the two cores are busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("world") / "out"
    generate_world(WorldConfig(images=IMAGES, seed=SEED), root, progress=False)
    return root


def _load(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def _by_id(refs):
    return {ref.image_id: ref for ref in refs}


def _extract(dataset: str, root: Path, out: Path) -> FeatureStore:
    assert main(["extract", "--dataset", dataset, "--root", str(root), "--out", str(out),
                 *TINY]) == 0
    return FeatureStore(out)


def _stored_ids(store: FeatureStore, dataset: str) -> set[str]:
    pairs = [split_key(key) for key in store.keys()]
    assert {name for name, _ in pairs} == {dataset}
    return {image_id for _, image_id in pairs}


# COCO ------------------------------------------------------------------------------------------


def _coco_caption_ids(world: Path) -> dict[int, str]:
    """COCO image id -> subset, from the caption annotations."""
    ids = {}
    for subset in ("train2014", "val2014"):
        for ann in _load(world / "coco" / "annotations" / f"captions_{subset}.json")["annotations"]:
            ids[ann["image_id"]] = subset
    return ids


def test_coco_lists_every_annotated_image_once(world):
    refs = list_images("coco", str(world / "coco"))
    by_id = _by_id(refs)
    assert len(by_id) == len(refs)
    captioned = _coco_caption_ids(world)
    assert set(by_id) == {str(coco_id) for coco_id in captioned}
    for coco_id, subset in captioned.items():
        ref = by_id[str(coco_id)]
        assert ref.split == subset and ref.dataset == "coco"
        assert ref.path.name == f"COCO_{subset}_{coco_id:012d}.jpg"
    assert [ref.image_id for ref in refs] == sorted(by_id)


def _coco_2017(world: Path, root: Path) -> Path:
    """The world's COCO images under 2017 names: train2014 -> train2017, val2014 -> val2017."""
    for subset in ("train", "val"):
        (root / f"{subset}2017").mkdir(parents=True)
        for path in (world / "coco" / f"{subset}2014").iterdir():
            shutil.copy(path, root / f"{subset}2017" / path.name.split("_")[-1])
    return root


def test_coco_2017_layout_and_a_root_with_both_layouts(world, tmp_path):
    root = _coco_2017(world, tmp_path / "coco")
    by_id = _by_id(list_images("coco", str(root)))
    expected = {str(i): s.replace("2014", "2017") for i, s in _coco_caption_ids(world).items()}
    assert {image_id: ref.split for image_id, ref in by_id.items()} == expected

    shutil.copytree(world / "coco" / "val2014", root / "val2014")
    with pytest.raises(DatasetError, match=r"image id \d+ is both .*val2014.* and .*val2017"):
        list_images("coco", str(root))


def test_coco_wrong_empty_and_misnamed_roots(world, tmp_path):
    with pytest.raises(DatasetError, match=r"expected split folders .* found: cc3m/, coco/"):
        list_images("coco", str(world))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="found: nothing"):
        list_images("coco", str(tmp_path / "empty"))
    root = tmp_path / "coco"
    shutil.copytree(world / "coco" / "val2014", root / "val2014")
    (root / "val2014" / "holiday.jpg").write_bytes(b"")
    with pytest.raises(DatasetError, match=r"val2014: 1 image file\(s\) named like no COCO layout "
                                           r"\(holiday.jpg\)"):
        list_images("coco", str(root))


# Visual Genome ---------------------------------------------------------------------------------


def test_vg_lists_every_image_data_entry_in_its_url_folder(world):
    refs = list_images("vg", str(world / "vg"))
    by_id = _by_id(refs)
    entries = _load(world / "vg" / "image_data.json")
    assert len(by_id) == len(refs) == len(entries)
    for entry in entries:
        ref = by_id[str(entry["image_id"])]
        assert ref.split == "" and ref.path.is_file()
        assert entry["url"].endswith(f"/{ref.path.parent.name}/{ref.path.name}")


def test_vg_missing_or_moved_files(world, tmp_path, caplog):
    root = tmp_path / "vg"
    for folder in ("VG_100K", "VG_100K_2"):
        shutil.copytree(world / "vg" / folder, root / folder)
    shutil.copy(world / "vg" / "image_data.json", root)
    (root / "VG_100K" / "3.jpg").unlink()
    moved = next((root / "VG_100K_2").iterdir())
    moved.rename(root / "VG_100K" / moved.name)
    with caplog.at_level(logging.WARNING):
        by_id = _by_id(list_images("vg", str(root)))
    assert len(by_id) == IMAGES
    assert by_id[moved.stem].path == root / "VG_100K" / moved.name
    assert by_id["3"].path == root / "VG_100K" / "3.jpg"
    with pytest.raises(OSError):
        by_id["3"].read_bytes()
    assert "1 of 40 images in image_data.json have no file in VG_100K/ or VG_100K_2/ (ids 3)" \
        in caplog.text


def test_vg_errors(world, tmp_path):
    with pytest.raises(DatasetError, match="expected image_data.json .* found: annotations/"):
        list_images("vg", str(world / "coco"))
    root = tmp_path / "vg"
    (root / "VG_100K").mkdir(parents=True)
    entries = _load(world / "vg" / "image_data.json")
    (root / "image_data.json").write_text(json.dumps(entries + entries[:1]))
    with pytest.raises(DatasetError, match="image_data.json: image id 1 is listed twice"):
        list_images("vg", str(root))


# NLVR2 -----------------------------------------------------------------------------------------


def _nlvr2_identifiers(world: Path) -> dict[str, str]:
    """identifier -> split, from the json-lines files."""
    return {
        json.loads(line)["identifier"]: split
        for split in ("train", "dev", "test1")
        for line in (world / "nlvr2" / f"{split}.json").read_text().splitlines()
    }


def test_nlvr2_every_identifier_joins_to_two_listed_images(world):
    by_id = _by_id(list_images("nlvr2", str(world / "nlvr2")))
    joined = set()
    for identifier, split in _nlvr2_identifiers(world).items():
        for image_id in nlvr2_image_ids(identifier):
            assert by_id[image_id].split == split
            joined.add(image_id)
    assert joined == set(by_id)
    assert by_id["train-0-0-img1"].path.parent == world / "nlvr2" / "images" / "train" / "0"


def test_nlvr2_join_rule():
    assert nlvr2_image_ids("train-10171-0-3") == ("train-10171-0-img0", "train-10171-0-img1")
    with pytest.raises(ValueError, match="split-set-pair-sentence"):
        nlvr2_image_ids("train-10171-0")


def test_nlvr2_errors_and_half_pairs(world, tmp_path, caplog):
    with pytest.raises(DatasetError, match=r"expected images/\{train,dev,test1\}/ .* found in"):
        list_images("nlvr2", str(world / "vg"))
    root = tmp_path / "nlvr2"
    shutil.copytree(world / "nlvr2" / "images" / "dev", root / "images" / "dev")
    (root / "images" / "dev" / "dev-0-2-img1.png").unlink()
    with caplog.at_level(logging.WARNING):
        assert len(list_images("nlvr2", str(root))) == 7
    assert "1 image(s) without the other image of their pair (dev-0-2-img0)" in caplog.text
    shutil.copy(root / "images" / "dev" / "dev-0-0-img0.png", root / "images" / "dev" / "x.png")
    with pytest.raises(DatasetError, match=r"dev: 1 image file\(s\) not named dev-\{set\}"):
        list_images("nlvr2", str(root))


# CC3M ------------------------------------------------------------------------------------------


def _cc3m_rows(world: Path) -> list[dict]:
    """Every url's parquet row, all shards, in key order."""
    rows = [row for path in sorted((world / "cc3m").glob("*.parquet"))
            for row in pq.read_table(path).to_pylist()]
    return sorted(rows, key=lambda row: row["key"])


def test_cc3m_img2dataset_lists_every_success_with_its_bytes(world, caplog):
    with caplog.at_level(logging.WARNING):
        by_id = _by_id(list_images("cc3m", str(world / "cc3m")))
    rows = _cc3m_rows(world)
    success = {row["key"]: row for row in rows if row["status"] == "success"}
    assert set(by_id) == set(success) and len(success) < len(rows)
    failed = len(rows) - len(success)
    assert f"{failed} of {len(rows)} urls failed to download" in caplog.text
    with tarfile.open(world / "cc3m" / "00000.tar") as tar:
        for key, row in success.items():
            data = by_id[key].read_bytes()
            assert data == tar.extractfile(f"{key}.jpg").read()
            assert hashlib.sha256(data).hexdigest() == row["sha256"]
            with Image.open(io.BytesIO(data)) as image:
                assert image.convert("RGB").size == (row["width"], row["height"])


def _cc3m_tsv(world: Path, root: Path, header: bool) -> list[dict]:
    """The official TSV of the world's urls and an images/ folder with the downloaded ones."""
    rows = _cc3m_rows(world)
    lines = ["caption\turl"] if header else []
    lines += [f"{row['caption']}\t{row['url']}" for row in rows]
    root.mkdir()
    (root / "Train_GCC-training.tsv").write_text("\n".join(lines) + "\n")
    with tarfile.open(world / "cc3m" / "00000.tar") as tar:
        for member in tar:
            if member.name.endswith(".jpg"):
                folder = root / "images" / ("00000" if int(member.name[:9]) % 2 else "")
                folder.mkdir(parents=True, exist_ok=True)
                (folder / member.name).write_bytes(tar.extractfile(member).read())
    return rows


@pytest.mark.parametrize("header", [False, True])
def test_cc3m_tsv_layout_gives_the_img2dataset_ids(world, tmp_path, caplog, header):
    rows = _cc3m_tsv(world, tmp_path / "cc3m", header)
    with caplog.at_level(logging.WARNING):
        by_id = _by_id(list_images("cc3m", str(tmp_path / "cc3m")))
    assert set(by_id) == set(_by_id(list_images("cc3m", str(world / "cc3m"))))
    dead = [int(row["key"]) for row in rows if row["status"] != "success"]
    assert f"{len(dead)} of {len(rows)} rows of Train_GCC-training.tsv have no image" in caplog.text
    assert f"(rows {', '.join(map(str, dead))})" in caplog.text


def test_cc3m_errors(world, tmp_path):
    with pytest.raises(DatasetError, match=r"expected img2dataset shards .* found: annotations/"):
        list_images("cc3m", str(world / "coco"))
    root = tmp_path / "cc3m"
    _cc3m_tsv(world, root, header=False)
    (root / "images" / "000000099.jpg").write_bytes(b"")
    with pytest.raises(DatasetError, match=r"not named after a row .* \(10 rows, so 000000000 .. "
                                           r"000000009\): 000000099.jpg"):
        list_images("cc3m", str(root))
    (root / "images" / "000000099.jpg").unlink()
    with (root / "Train_GCC-training.tsv").open("a") as f:
        f.write("a caption without its url\n")
    with pytest.raises(DatasetError, match=r"Train_GCC-training.tsv:11: expected caption<TAB>url"):
        list_images("cc3m", str(root))
    (root / "Val_GCC.tsv").write_text("")
    with pytest.raises(DatasetError, match="found: Train_GCC-training.tsv, Val_GCC.tsv, images/"):
        list_images("cc3m", str(root))


# list ------------------------------------------------------------------------------------------


def test_list_file_ids_paths_comments_and_duplicates(world, tmp_path, caplog):
    vg = world / "vg" / "VG_100K"
    list_path = tmp_path / "lists" / "images.txt"
    list_path.parent.mkdir()
    shutil.copy(vg / "1.jpg", tmp_path / "lists" / "one.jpg")
    list_path.write_text(f"# my images\n\none.jpg\n  custom-2\t{vg / '2.jpg'}  \ngone.png\n")
    with caplog.at_level(logging.WARNING):
        by_id = _by_id(list_images("list", str(list_path)))
    assert {i: r.path for i, r in by_id.items()} == {
        "one": list_path.parent / "one.jpg",
        "custom-2": vg / "2.jpg",
        "gone": list_path.parent / "gone.png",
    }
    assert "1 of 3 listed files do not exist" in caplog.text

    list_path.write_text(f"one.jpg\n\n# again\none\t{vg / '1.jpg'}\n")
    with pytest.raises(DatasetError, match="lines 1 and 4 give the same id 'one'"):
        list_images("list", str(list_path))
    list_path.write_text("a\tb\tc.jpg\n")
    with pytest.raises(DatasetError, match=r"images.txt:1: expected PATH or ID<TAB>PATH"):
        list_images("list", str(list_path))
    with pytest.raises(DatasetError, match="expected a text file .* found a directory"):
        list_images("list", str(tmp_path))


# All readers through the CLI ---------------------------------------------------------------------


def test_extract_help_lists_every_reader(capsys):
    with pytest.raises(SystemExit):
        main(["extract", "--help"])
    assert "{" + ",".join(sorted(READERS)) + "}" in capsys.readouterr().out


def test_cli_reports_a_wrong_root_as_a_dataset_error(world, tmp_path, capsys):
    assert main(["extract", "--dataset", "vg", "--root", str(world / "coco"),
                 "--out", str(tmp_path / "out"), *TINY]) == 2
    assert "pipeline: dataset error: vg root" in capsys.readouterr().err


def test_extract_coco_keys_join_the_captions(world, tmp_path):
    store = _extract("coco", world / "coco", tmp_path / "feats")
    captioned = _coco_caption_ids(world)
    assert _stored_ids(store, "coco") == {str(coco_id) for coco_id in captioned}
    for coco_id, subset in captioned.items():
        assert store.get_image("coco", str(coco_id)).meta["split"] == subset


def test_extract_vg_keys_join_image_data(world, tmp_path):
    store = _extract("vg", world / "vg", tmp_path / "feats")
    entries = _load(world / "vg" / "image_data.json")
    assert _stored_ids(store, "vg") == {str(entry["image_id"]) for entry in entries}


def test_extract_nlvr2_keys_join_the_identifiers(world, tmp_path):
    store = _extract("nlvr2", world / "nlvr2", tmp_path / "feats")
    for identifier, split in _nlvr2_identifiers(world).items():
        for image_id in nlvr2_image_ids(identifier):
            assert store.get_image("nlvr2", image_id).meta["split"] == split


def test_extract_cc3m_keys_join_the_parquet(world, tmp_path):
    store = _extract("cc3m", world / "cc3m", tmp_path / "feats")
    success = {row["key"]: row for row in _cc3m_rows(world) if row["status"] == "success"}
    assert _stored_ids(store, "cc3m") == set(success)
    for key, row in success.items():
        meta = store.get_image("cc3m", key).meta
        assert (meta["width"], meta["height"]) == (row["width"], row["height"])


def test_extract_list_records_a_missing_file_as_a_failure(world, tmp_path):
    list_path = tmp_path / "images.txt"
    list_path.write_text(f"a\t{world / 'vg' / 'VG_100K' / '1.jpg'}\nb\t{tmp_path / 'gone.jpg'}\n")
    out = tmp_path / "feats"
    assert main(["extract", "--dataset", "list", "--root", str(list_path), "--out", str(out),
                 "--strict", *TINY]) == 1
    assert [sample.meta["image_id"] for sample in iter_samples(out)] == ["a"]
    failures = [f for stats in out.glob("*_stats.json") for f in _load(stats)["failures"]]
    assert [f["path"] for f in failures] == [str(tmp_path / "gone.jpg")]
