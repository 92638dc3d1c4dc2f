"""Listing img2dataset's CC3M shards at a cost that does not grow with the images per shard: a
finished shard is listed from its parquet file (no tar is read through), and the process that
reads an image indexes its tar once. Roots made by `pipeline bench scale`'s generator (tiny JPEGs,
every tenth url failed); requests counted by moto's S3 server as it serves them."""

from __future__ import annotations

import argparse
import gc
import io
import json
import logging
import tarfile
import threading

import numpy as np
import pytest

from pipeline.bench.scale import S3Server, engine_names, exponents, make_root, url_counts
from pipeline.datasets import DatasetError, list_images
from pipeline.datasets import tar_index as tar_index_module
from pipeline.datasets.cc3m import _scanned_images
from pipeline.datasets.image_array import ArchiveImages, ImageArray
from pipeline.datasets.tar_index import TarIndexes, index_tar, member_range


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """2 shards of 50 urls (45 images each)."""
    return make_root(tmp_path_factory.mktemp("cc3m") / "small", 100, per_tar=50)


def test_parquet_listing_reads_what_the_tar_holds(small):
    refs = list_images("cc3m", str(small))
    assert len(refs) == 90 and all(ref.offset == -1 for ref in refs)
    scanned = {ref.image_id: ref for ref in
               ImageArray("cc3m", [_scanned_images(tar) for tar in small.glob("*.tar")])}
    assert {ref.image_id for ref in refs} == set(scanned)
    for ref in refs:
        assert ref.member == scanned[ref.image_id].member
        assert ref.read_bytes() == scanned[ref.image_id].read_bytes()


def test_an_unfinished_shard_is_listed_from_its_tar(small, tmp_path, caplog):
    root = make_root(tmp_path / "root", 100, per_tar=50)
    (root / "00001_stats.json").unlink()  # img2dataset was stopped while writing shard 1
    with caplog.at_level(logging.WARNING):
        refs = list_images("cc3m", str(root))
    by_tar = {tar: [r.offset for r in refs if r.path.name == tar] for tar in ("00000.tar",
                                                                             "00001.tar")}
    assert set(by_tar["00000.tar"]) == {-1} and min(by_tar["00001.tar"]) > 0
    assert "1 tar(s) have no _stats.json" in caplog.text


def test_a_member_the_tar_lacks_is_an_error_for_that_image_only(tmp_path):
    root = make_root(tmp_path / "root", 20, per_tar=20)
    refs = list_images("cc3m", str(root))
    tar_path = root / "00000.tar"
    data = io.BytesIO()
    with tarfile.open(tar_path) as old, tarfile.open(fileobj=data, mode="w") as new:
        for member in old:
            if member.name != refs[3].member:
                new.addfile(member, old.extractfile(member))
    tar_path.write_bytes(data.getvalue())
    tar_index_module.index_with(tar_index_module.index_tar)  # none kept
    with pytest.raises(OSError, match=f"{tar_path}: no member {refs[3].member} "):
        refs[3].read_bytes()
    assert refs[4].read_bytes()[:2] == b"\xff\xd8"  # a JPEG


def test_each_tar_is_indexed_once_per_process(small):
    calls = []
    tar_index_module.index_with(lambda path: calls.append(path.name) or index_tar(path))
    refs = list_images("cc3m", str(small))
    threads = [threading.Thread(target=lambda part: [r.read_bytes() for r in part],
                                args=(refs[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(calls) == ["00000.tar", "00001.tar"]
    offset, length = member_range(refs[0].path, refs[0].member)  # kept: no third index
    assert len(calls) == 2
    assert refs[0].path.read_bytes()[offset:offset + length] == refs[0].read_bytes()
    tar_index_module.index_with(index_tar)


def test_tar_indexes_make_each_once_side_by_side_and_keep_the_last_ones():
    """Threads asking for one tar wait for one index; a tar's index does not wait for another's
    (tar "a" is made only once "b" has started); the least recently asked is dropped first."""
    started_b = threading.Event()
    made = []

    def make(path):
        made.append(path)
        if path == "a":
            assert started_b.wait(timeout=10), "tar a's index waited for tar b's"
        else:
            started_b.set()
        return {f"{path}.jpg": (512, 1)}

    indexes = TarIndexes(2, make)
    found = {}
    threads = [threading.Thread(target=lambda p, i: found.__setitem__(i, indexes.index(p)),
                                args=(path, i)) for i, path in enumerate("aaab")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(made) == ["a", "b"]
    assert [found[i] for i in range(4)] == [{"a.jpg": (512, 1)}] * 3 + [{"b.jpg": (512, 1)}]
    indexes.index("a")  # b is now the least recently asked
    indexes.index("c")
    indexes.index("a")
    indexes.index("b")
    assert made == made[:2] + ["c", "b"]


def test_listing_on_s3_costs_the_same_requests_whatever_the_images_per_tar(tmp_path):
    """Two roots of 2 shards each, 50 and 2,000 urls per shard: the same requests, and bytes read
    that stay far below the tars'."""
    server = S3Server(tmp_path)
    try:
        counted = []
        for per_tar in (50, 2000):
            root = make_root(tmp_path / f"r{per_tar}", 2 * per_tar, per_tar=per_tar)
            url = server.upload(root, f"listing-{per_tar}")
            numbers = server.measure(url)
            assert numbers["images"] == 2 * per_tar * 9 // 10
            tars = sum(path.stat().st_size for path in root.glob("*.tar"))
            counted.append((numbers["requests_by_method"], numbers["bytes_read"], tars))
    finally:
        server.close()
    (small_requests, small_bytes, _), (large_requests, large_bytes, large_tars) = counted
    assert small_requests == large_requests
    assert sum(large_requests.values()) <= 4 * 2 + 2  # per shard: stats, parquet, tar head
    assert large_bytes < large_tars / 20


def test_fitted_exponents():
    rows = [{"urls": 10, "list_s": 2.0, "requests": 4}, {"urls": 1000, "list_s": 200.0,
                                                         "requests": 4}]
    fitted = exponents(rows)
    assert fitted["list_s"] == pytest.approx(1.0) and fitted["requests"] == pytest.approx(0.0)


def test_sizes_are_url_counts():
    assert url_counts("10,2000") == [10, 2000]
    for bad in ("abc", "0", "10,", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=f"got {bad!r}"):
            url_counts(bad)


def test_engines_are_named_and_extracting_from_s3_needs_the_server(capsys):
    from pipeline.cli import main

    assert engine_names("ray,local") == ["ray", "local"]
    with pytest.raises(argparse.ArgumentTypeError, match="among local, ray"):
        engine_names("local,spark")
    with pytest.raises(SystemExit, match="--extract-from s3 extracts from the S3 server: give "
                                         "--s3 and --extract-sizes too"):
        main(["bench", "scale", "--sizes", "10", "--extract-from", "s3"])
    with pytest.raises(SystemExit, match="--work /proc/none: cannot make it"):
        main(["bench", "scale", "--sizes", "10", "--work", "/proc/none"])


def test_the_listing_and_the_plan_hold_no_object_per_image(tmp_path):
    from pipeline.datasets.base import ImageRef
    from pipeline.extract.plan import plan_shards, plan_units

    root = make_root(tmp_path / "root", 2000, per_tar=1000)
    gc.collect()
    before = sum(isinstance(o, ImageRef) for o in gc.get_objects())
    images = list_images("cc3m", str(root))
    units = plan_units(images, plan_shards(len(images), 100), 8)
    gc.collect()
    assert sum(isinstance(o, ImageRef) for o in gc.get_objects()) == before
    assert isinstance(images, ImageArray) and len(images) == 1800
    assert images.nbytes <= 40 * len(images)  # id, suffix, offset, length, archive
    scanned = sorted(k.decode() for tar in root.glob("*.tar") for k in _scanned_images(tar).keys)
    assert [r.image_id for r in units[1].refs] == scanned[8:16]


def test_images_of_several_archives_are_sorted_by_id_and_a_repeated_id_is_named(tmp_path):
    def archive(name, keys, offset):
        return ArchiveImages(tmp_path / name, np.array(keys, np.bytes_),
                             np.array([b".jpg"] * len(keys), np.bytes_),
                             np.arange(len(keys), dtype=np.int64) + offset,
                             np.full(len(keys), 7, np.int64))

    images = ImageArray("cc3m", [archive("b.tar", [b"000000003", b"000000001"], 100),
                                 archive("a.tar", [b"000000002"], 200)])
    assert [(r.image_id, r.path.name, r.member, r.offset, r.length) for r in images] == [
        ("000000001", "b.tar", "000000001.jpg", 101, 7), ("000000002", "a.tar", "000000002.jpg",
                                                         200, 7),
        ("000000003", "b.tar", "000000003.jpg", 100, 7)]
    assert images[-1] == images[2] and images[1:] == [images[1], images[2]]
    with pytest.raises(IndexError):
        images[3]
    with pytest.raises(DatasetError, match=f"key 000000002 is both {tmp_path / 'a.tar'}:"
                                           f"000000002.jpg and {tmp_path / 'c.tar'}"):
        ImageArray("cc3m", [archive("a.tar", [b"000000002"], 0),
                            archive("c.tar", [b"000000002"], 0)])



def test_the_summary_merges_runs_by_size_and_draws_what_they_measured(tmp_path):
    """Two runs' --json files: a size measured in both counts once, the later file's; a cost a
    row did not measure is left out; the picture is written; a missing --from or a file that is
    not JSON is one line."""
    from pipeline.bench.scale_plot import merged_rows, series
    from pipeline.cli import main

    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"local": {"rows": [{"urls": 10, "list_s": 1.0},
                                                    {"urls": 100, "list_s": 9.0}]},
                                 "feed": {"pairs": 5}}))
    second.write_text(json.dumps({"local": {"rows": [{"urls": 100, "list_s": 10.0},
                                                     {"urls": 1000, "list_s": None}]},
                                  "build": {"rows": [{"sentences": 50, "wall_s": 2.0}]}}))
    blocks = merged_rows([str(first), str(second)])
    assert blocks["local"] == [{"urls": 10, "list_s": 1.0}, {"urls": 100, "list_s": 10.0},
                               {"urls": 1000, "list_s": None}]
    assert series(blocks["local"], "urls", lambda row: row.get("list_s")) == [(10, 1.0),
                                                                              (100, 10.0)]
    assert set(blocks) == {"local", "build"}
    png = tmp_path / "summary.png"
    assert main(["bench", "scale", "--summary", str(png), "--from", f"{first},{second}"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="--summary /proc/none/s.png: cannot write it"):
        main(["bench", "scale", "--summary", "/proc/none/s.png", "--from", str(first)])
    with pytest.raises(SystemExit, match="--summary PNG draws the --from JSON files: give both"):
        main(["bench", "scale", "--summary", str(png)])
    for bad in ("{", "[1, 2]"):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(SystemExit, match=f"--from {tmp_path}/bad.json: not a --json file"):
            main(["bench", "scale", "--summary", str(png), "--from", str(tmp_path / "bad.json")])
