"""`pipeline extract` end to end on a folder with good and bad images, with a tiny detector."""

import json
import os
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
from PIL import Image
from skimage import data
from tiny_detector import TINY_DETECTOR

from extractor.config import PreprocessConfig
from pipeline.cli import main
from pipeline.common.config import ConfigError
from pipeline.datasets import ImageRef
from pipeline.extract.output import OutputLock
from pipeline.extract.steps import prepare
from shards.reader import iter_samples
from shards.store import INDEX_NAME, FeatureStore
from shards.verify import verify_shards

TINY = [*TINY_DETECTOR, "--set", "output.shard_size=3", "--set", "run.batch_size=2",
        "--device", "cpu", "--engine", "local"]


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height but holds almost no data (a decompression bomb)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


@pytest.fixture
def photo_folder(tmp_path):
    root = tmp_path / "photos"
    (root / "sub").mkdir(parents=True)
    Image.fromarray(data.astronaut()).resize((160, 160)).save(root / "astronaut.jpg")
    Image.fromarray(data.coffee()).resize((200, 150)).save(root / "sub" / "coffee.png")
    Image.fromarray(data.camera()).resize((120, 180)).save(root / "camera.jpg")
    good = (root / "astronaut.jpg").read_bytes()
    (root / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "empty.jpg").write_bytes(b"")
    (root / "notes.jpg").write_text("this is not an image\n")
    (root / "bomb.png").write_bytes(_png_header_only(20000, 20000))
    Image.new("RGB", (1, 1)).save(root / "dot.png")
    return root


def _run(photo_folder, out, *extra, random_weights=True):
    weights = ["--random-weights"] if random_weights else []
    return main(["extract", "--dataset", "folder", "--root", str(photo_folder), "--out", str(out),
                 *TINY, *weights, *extra])


def _failures(summary: str) -> list[str]:
    """The summary's lines from its count of images ok and failed to where every failure is."""
    lines = summary.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("  images ok:"))
    last = next(i for i, line in enumerate(lines) if line.startswith("  every image's outcome"))
    return lines[first : last + 1]


def _photo_folder_failures(root: Path, out: Path) -> list[str]:
    """What the summary says of photo_folder's failures: kinds by count (ties in shard order),
    each with its files."""
    return [
        "  images ok: 3   failed: 5",
        "    1 x decompression bomb",
        f"        {root}/bomb.png: refused by PIL: Image size (400000000 pixels) exceeds limit of "
        "178956970 pixels, could be decompression bomb DOS attack.",
        "    1 x too small",
        f"        {root}/dot.png: 1x1 is smaller than the minimum side of 16 px",
        "    1 x empty file (0 bytes)",
        f"        {root}/empty.jpg",
        "    1 x not a recognised image format",
        f"        {root}/notes.jpg",
        "    1 x truncated JPEG data",
        f"        {root}/truncated.jpg: image file is truncated (0 bytes not processed)",
        f"  every image's outcome and error: its shard's *_status.json in {out}",
    ]


def test_bad_images_are_recorded_and_the_rest_is_written(photo_folder, tmp_path, capsys):
    out = tmp_path / "feats"
    assert _run(photo_folder, out) == 0
    summary = capsys.readouterr().out
    assert _failures(summary) == _photo_folder_failures(photo_folder, out)
    log = [line.split(" ", 2)[2] for line in (out / "extract.log").read_text().splitlines()]
    assert _failures("\n".join(log)) == _photo_folder_failures(photo_folder, out)

    samples = {s.meta["image_id"]: s for s in iter_samples(out)}
    assert sorted(samples) == ["astronaut", "camera", "sub/coffee"]
    coffee = samples["sub/coffee"]
    assert (coffee.meta["width"], coffee.meta["height"]) == (200, 150)
    assert 10 <= coffee.num_boxes <= 100 and coffee.arrays["features"].shape == (coffee.num_boxes, 128)
    assert coffee.meta["preset"] == "caffe" and coffee.meta["detector"]["name"] == "random-init"
    assert verify_shards(out) == []

    failures = {}
    for stats in sorted(out.glob("*_stats.json")):
        for failure in json.loads(stats.read_text())["failures"]:
            failures[failure["path"].rsplit("/", 1)[-1]] = failure["reason"]
    assert sorted(failures) == ["bomb.png", "dot.png", "empty.jpg", "notes.jpg", "truncated.jpg"]
    for name, reason in failures.items():
        assert name in reason  # every reason names its file


def test_images_given_fewer_boxes_than_min_boxes_are_counted_with_the_reason(photo_folder,
                                                                           tmp_path, capsys):
    """selection.min_boxes cannot be met where the detector proposes fewer regions: the summary
    and extract.log say so once, with the count; a run that meets it says nothing."""
    out = tmp_path / "feats"
    assert _run(photo_folder, out, "--set", "detector.rpn_post_nms_topk=20",
                "--set", "selection.min_boxes=50") == 0
    fewest = min(sample.num_boxes for sample in iter_samples(out))
    assert fewest <= 20
    line = (f"  3 of 3 images got fewer boxes than selection.min_boxes = 50 (fewest {fewest}): "
            "the detector proposed fewer regions for them (at most "
            "detector.rpn_post_nms_topk = 20, fewer where its RPN's NMS leaves fewer)")
    assert capsys.readouterr().out.splitlines().count(line) == 1
    log = [entry.split(" ", 2)[2] for entry in (out / "extract.log").read_text().splitlines()]
    assert log.count(line) == 1

    assert _run(photo_folder, tmp_path / "met", "--set", "selection.min_boxes=2") == 0
    assert "fewer boxes than" not in capsys.readouterr().out


def test_an_unreadable_file_and_an_image_without_given_boxes_name_their_kind(photo_folder,
                                                                            tmp_path):
    """Failures before and after decoding read "<location>: <kind>: <detail>" too, as the
    summary's count by kind expects."""
    gone = tmp_path / "gone.jpg"
    item = prepare(ImageRef("folder", "gone", gone), PreprocessConfig())
    assert item.error == f"{gone}: unreadable: [Errno 2] No such file or directory: '{gone}'"
    photo = photo_folder / "camera.jpg"
    item = prepare(ImageRef("folder", "camera", photo), PreprocessConfig(), given_boxes={})
    assert item.error == f"{photo}: no boxes given: none for image id 'camera'"


def test_strict_exits_non_zero_on_failures(photo_folder, tmp_path):
    assert _run(photo_folder, tmp_path / "feats", "--strict") == 1


def test_the_summary_and_strict_cover_the_whole_folder(photo_folder, tmp_path, capsys):
    """Totals and --strict are the output folder's, every run's: a re-run of a finished run, and
    one that resumes after a lost shard, report its 3 images ok and 5 failed, and fail --strict."""
    out = tmp_path / "feats"
    assert _run(photo_folder, out) == 0
    capsys.readouterr()
    assert _run(photo_folder, out, "--strict") == 1  # nothing left to extract, 5 failed before
    summary = capsys.readouterr().out
    assert _failures(summary) == _photo_folder_failures(photo_folder, out)  # every run's files
    assert "this run: 0 ok, 0 failed" in summary
    (out / "00001.tar").unlink()  # as a run killed before that shard finished leaves it
    (out / "00001_stats.json").unlink()
    assert _run(photo_folder, out, "--strict") == 1
    summary = capsys.readouterr().out
    assert "resumed: 2 finished shard(s) kept" in summary
    assert _failures(summary) == _photo_folder_failures(photo_folder, out)


def test_the_summary_names_a_few_failed_files_of_each_kind(photo_folder, tmp_path, capsys):
    """Three files of a kind, then how many more: every failure is in the status files. A JPEG
    with garbage for its compressed pixels, or for its header, is corrupt, not unrecognised."""
    root = tmp_path / "mixed"
    root.mkdir()
    good = (photo_folder / "astronaut.jpg").read_bytes()
    (root / "good.jpg").write_bytes(good)
    for i in range(5):
        (root / f"empty{i}.jpg").write_bytes(b"")
    noise = np.random.default_rng(0).integers(0, 256, len(good), dtype=np.uint8).tobytes()
    scan = good.index(b"\xff\xda")  # start of scan: the compressed pixels follow its header
    pixels = scan + 2 + int.from_bytes(good[scan + 2 : scan + 4], "big")
    (root / "garbage_pixels.jpg").write_bytes(good[:pixels] + noise[: len(good) - pixels])
    (root / "garbage_header.jpg").write_bytes(good[:3] + noise[:5000])
    out = tmp_path / "feats"
    assert _run(root, out) == 0
    assert _failures(capsys.readouterr().out) == [
        "  images ok: 1   failed: 7",
        "    5 x empty file (0 bytes)",
        f"        {root}/empty0.jpg",
        f"        {root}/empty1.jpg",
        f"        {root}/empty2.jpg",
        "        ... and 2 more",
        "    1 x corrupt JPEG header",
        f"        {root}/garbage_header.jpg: no marker found",
        "    1 x corrupt JPEG data",
        f"        {root}/garbage_pixels.jpg: broken data stream when reading image file",
        f"  every image's outcome and error: its shard's *_status.json in {out}",
    ]
    statuses = [s for p in sorted(out.glob("*_status.json"))
                for s in json.loads(p.read_text())["images"]]
    assert [s["error"] for s in statuses if s["image_id"] in ("empty3", "empty4")] == [
        f"{root}/empty3.jpg: empty file (0 bytes)", f"{root}/empty4.jpg: empty file (0 bytes)"]


def test_rerun_resumes_without_duplicates(photo_folder, tmp_path, capsys):
    out = tmp_path / "feats"
    assert _run(photo_folder, out) == 0
    first = {p.name: p.read_bytes() for p in out.glob("*.tar")}
    (out / "00001.tar").unlink()
    (out / "00001_stats.json").unlink()
    capsys.readouterr()
    assert _run(photo_folder, out) == 0
    assert "resumed: 2 finished shard(s) kept" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in out.glob("*.tar")} == first
    assert _run(photo_folder, out) == 0  # all done: no empty progress bar ("extract: 0img" twice)
    printed = capsys.readouterr()
    assert "resumed: 3 finished shard(s) kept" in printed.out and "0img" not in printed.err


def test_reading_the_shards_leaves_their_folder_as_extraction_wrote_it(photo_folder, tmp_path,
                                                                        capsys):
    """The readers (the by-key store that fine-tuning and `show` use, `shards verify`, `shards
    export-tsv`) write nothing into the shard folder, so the same extraction command run again
    resumes; an index that earlier versions wrote there does not block it either."""
    out = tmp_path / "feats"
    assert _run(photo_folder, out) == 0
    written = {p.name: p.read_bytes() for p in out.iterdir()}
    store = FeatureStore(out)
    key = next(iter(store.keys()))
    assert main(["show", "--shards", str(out), "--key", key, "--out", str(tmp_path / "k.png")]) == 0
    assert main(["shards", "verify", str(out)]) == 0
    assert main(["shards", "export-tsv", str(out), "--out", str(tmp_path / "f.tsv")]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == written
    (out / INDEX_NAME).write_bytes(b"an earlier version's index")
    capsys.readouterr()
    assert _run(photo_folder, out) == 0
    assert "resumed: 3 finished shard(s) kept" in capsys.readouterr().out


def test_rerun_with_other_engine_settings_resumes(photo_folder, tmp_path, capsys):
    out = tmp_path / "feats"
    assert _run(photo_folder, out) == 0
    capsys.readouterr()
    assert _run(photo_folder, out, "--batch-size", "3", "--actors", "2", "--decoders", "1") == 0
    assert "resumed: 3 finished shard(s) kept" in capsys.readouterr().out


def test_rerun_with_another_config_is_refused_naming_what_differs(photo_folder, tmp_path, capsys):
    out = tmp_path / "feats"
    assert _run(photo_folder, out) == 0
    shards = {p.name: p.read_bytes() for p in out.glob("*.tar")}
    capsys.readouterr()
    assert _run(photo_folder, out, "--preset", "lxmert", "--set", "preprocess.max_size=900") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pipeline: config error: {out} holds shards made with other settings")
    for change in ("config.preset: 'caffe' -> 'lxmert'", "config.selection.mode: 'adaptive' -> "
                   "'fixed'", "config.preprocess.max_size: 160 -> 900"):
        assert change in err
    assert "config.preprocess.min_size" not in err and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in out.glob("*.tar")} == shards


def test_concurrent_run_into_one_directory_is_refused(tmp_path):
    with OutputLock(tmp_path):
        with pytest.raises(ConfigError, match="another extraction"):
            with OutputLock(tmp_path):
                pass


def test_fixed_preset_and_given_boxes(photo_folder, tmp_path):
    out = tmp_path / "fixed"
    # At the preset's own sizes: the tiny detector at 96-160 pixels proposes fewer than 36.
    assert _run(photo_folder, out, "--preset", "lxmert", "--set", "save_class_probs=true",
                "--set", "preprocess.min_size=600", "--set", "preprocess.max_size=1000") == 0
    for sample in iter_samples(out):
        assert sample.num_boxes == 36 and sample.meta["box_mode"] == "fixed"
        assert sample.arrays["cls_probs"].shape == (36, 1601)

    boxes = {"astronaut": [[0, 0, 80, 80], [10, 20, 150, 160]], "camera": [[5, 5, 60, 90]]}
    given = tmp_path / "boxes.json"
    given.write_text(json.dumps(boxes))
    out = tmp_path / "given"
    assert _run(photo_folder, out, "--boxes", "given", "--given-boxes", str(given)) == 0
    samples = {s.meta["image_id"]: s for s in iter_samples(out)}
    assert sorted(samples) == ["astronaut", "camera"]
    for image_id, rows in boxes.items():
        np.testing.assert_array_equal(samples[image_id].arrays["boxes"], np.float32(rows))
        assert samples[image_id].meta["box_mode"] == "given"


def test_keep_images_stores_the_original_bytes(photo_folder, tmp_path):
    out = tmp_path / "feats"
    assert _run(photo_folder, out, "--set", "output.keep_images=true") == 0
    sample = next(s for s in iter_samples(out) if s.meta["image_id"] == "astronaut")
    assert sample.image_ext == "jpg"
    assert sample.image_bytes == (photo_folder / "astronaut.jpg").read_bytes()


def test_no_weights_is_refused_unless_random_weights_are_asked_for(photo_folder, tmp_path, capsys):
    out = tmp_path / "feats"
    assert _run(photo_folder, out, random_weights=False) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeline: config error: no detector weights") and err.count("\n") == 1
    assert "--weights FILE" in err and "--random-weights" in err
    assert not out.exists()


class _RunsCode:
    """Pickles as a call of os.system: what a malicious checkpoint holds."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _torch_file_that_runs_code(path: Path, marker: Path) -> None:
    torch.save({"x": _RunsCode(f"touch {marker}")}, path)


def _pickle_that_runs_code(path: Path, marker: Path) -> None:
    path.write_bytes(pickle.dumps({"model": {"x": _RunsCode(f"touch {marker}")}}, protocol=2))


def _other_tensors(path: Path, marker: Path) -> None:
    safetensors.torch.save_file({"a": torch.zeros(1)}, path)


def _not_a_pickle(path: Path, marker: Path) -> None:
    path.write_bytes(b"\x80\x02 not a pickle")


@pytest.mark.parametrize("engine", ["local", "ray"])
@pytest.mark.parametrize(
    "name, write, message",
    [
        ("model.pth", _torch_file_that_runs_code, "refused by torch.load(weights_only=True): it "
         f"holds global {os.system.__module__}.system"),
        ("model.pkl", _pickle_that_runs_code,
         f"refusing to unpickle global {os.system.__module__}.system"),
        ("model.safetensors", _other_tensors, "does not match the detector"),
        ("model.pkl", _not_a_pickle, "not a readable pickle"),
    ],
)
def test_a_bad_weights_file_is_one_line_and_runs_nothing(photo_folder, tmp_path, capsys, engine,
                                                         name, write, message):
    weights, marker, out = tmp_path / name, tmp_path / "pwned", tmp_path / "feats"
    write(weights, marker)
    assert _run(photo_folder, out, "--weights", str(weights), "--engine", engine,
                random_weights=False) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeline: weights error: ") and err.count("\n") == 1
    assert str(weights) in err and message in err
    assert "weights_only` set to `False" not in err and "weights_only=False" not in err
    assert not marker.exists()
    assert not out.exists()  # not even the lock: the next run starts from nothing


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--set", "detector.depth=19"], "detector.depth = 19: supported depths are 18, 34, 50, "
         "101, 152"),
        (["--set", "preprocess.min_size=0"], "preprocess.min_size = 0: must be positive"),
        (["--set", "preprocess.max_size=-1"], "preprocess.max_size = -1: must be positive"),
        (["--set", "preprocess.min_size=1200"], "preprocess.min_size = 1200: must be <= "
         "max_size = 160"),
        (["--set", "preprocess.min_side=700"], "preprocess.min_side = 700: must be <= "
         "min_size = 96"),
        (["--set", "run.batch_size=-8"], "run.batch_size = -8: must be positive"),
        (["--batch-size", "0"], "run.batch_size = 0: must be positive"),
        (["--set", "output.shard_size=0"], "output.shard_size = 0: must be positive"),
    ],
)
def test_values_out_of_range_are_named_before_anything_is_written(photo_folder, tmp_path, capsys,
                                                                  flags, message):
    out = tmp_path / "feats"
    assert _run(photo_folder, out, *flags) == 2
    assert capsys.readouterr().err == f"pipeline: config error: {message}\n"
    assert not out.exists()


def test_an_out_that_holds_other_files_is_refused(photo_folder, tmp_path, capsys):
    run = tmp_path / "pretrain_run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("arch: lxmert\n")
    (run / "metrics.jsonl").write_text("")
    assert _run(photo_folder, run) == 2
    err = capsys.readouterr().err
    assert err == (f"pipeline: config error: --out {run} holds 3 entries no extraction writes "
                   "(e.g. checkpoints, config.yaml, metrics.jsonl); choose a new or empty "
                   "directory\n")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.yaml", "metrics.jsonl"]


def test_a_read_only_out_is_one_line(photo_folder, read_only_dir, capsys):
    out = read_only_dir / "feats"
    assert _run(photo_folder, out) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pipeline: file error: {out}: ") and err.count("\n") == 1
    assert not out.exists()


def test_nothing_extracted_is_an_error(photo_folder, tmp_path, capsys):
    root = tmp_path / "not_images"
    root.mkdir()
    good = (photo_folder / "astronaut.jpg").read_bytes()
    (root / "half.jpg").write_bytes(good[: len(good) // 2])
    (root / "notes.jpg").write_text("not an image\n")
    (root / "empty.png").write_bytes(b"")
    assert _run(root, tmp_path / "feats") == 2
    captured = capsys.readouterr()
    assert "images ok: 0   failed: 3" in captured.out
    assert captured.err.splitlines()[-1] == (
        f"pipeline: dataset error: no image of {root} was extracted: all 3 failed (the reasons "
        "above)"
    )


def test_unknown_set_key_is_a_clear_error(photo_folder, tmp_path, capsys):
    assert _run(photo_folder, tmp_path / "x", "--set", "detector.depht=18") == 2
    assert "did you mean 'detector.depth'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [[], ["extract"], ["shards"], ["shards", "verify"], ["shards", "import-tsv"],
     ["shards", "export-tsv"], ["bench"], ["bench", "extract"], ["demo"], ["world"],
     ["world", "generate"], ["detector"], ["detector", "train"]],
)
def test_every_verb_has_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    assert "usage: pipeline" in capsys.readouterr().out
