"""A unit's images read together (pipeline.datasets.read.read_images): one request per run of
neighbouring members of one tar, the bytes and the errors of reading each image alone. Roots made
by `pipeline bench scale`'s generator (img2dataset's layout, every tenth url failed); requests on
S3 counted by moto's server as it serves them."""

from __future__ import annotations

import pytest

import pipeline.datasets.read as read_module
from pipeline.bench.scale import make_root
from pipeline.datasets import ImageRef, list_images
from pipeline.datasets import tar_index as tar_index_module
from pipeline.datasets.read import read_images
from pipeline.extract.plan import plan_shards, plan_units


@pytest.fixture
def root(tmp_path):
    """2 tars of 30 urls (27 images each)."""
    tar_index_module.index_with(tar_index_module.index_tar)  # none kept
    return make_root(tmp_path / "root", 60, per_tar=30)


@pytest.fixture
def requests(monkeypatch) -> list[tuple[str, int, int]]:
    """(archive name, offset, length) of each read_range read_images makes."""
    made = []
    real = read_module.read_range
    monkeypatch.setattr(read_module, "read_range",
                        lambda path, offset, n: made.append((path.name, offset, n))
                        or real(path, offset, n))
    return made


def _alone(ref: ImageRef) -> bytes | OSError:
    try:
        return ref.read_bytes()
    except OSError as err:
        return err


def _same(found: list, refs: list[ImageRef]) -> None:
    for got, alone in zip(found, map(_alone, refs), strict=True):
        if isinstance(alone, OSError):
            assert isinstance(got, OSError) and str(got) == str(alone)
        else:
            assert got == alone


def test_a_unit_is_one_request_per_tar_with_the_bytes_of_each_image(root, requests):
    refs = list_images("cc3m", str(root))
    _same(read_images(refs[3:20]), refs[3:20])
    assert [name for name, _, _ in requests] == ["00000.tar"]
    requests.clear()
    unit = refs[20:40]  # the end of one tar and the start of the next
    found = read_images(unit[::-1])  # in any order: each image in its place
    _same(found, unit[::-1])
    assert sorted(name for name, _, _ in requests) == ["00000.tar", "00001.tar"]


def test_members_farther_apart_than_the_gap_or_the_span_are_requested_apart(root, requests,
                                                                           monkeypatch):
    refs = list_images("cc3m", str(root))[:10]
    monkeypatch.setattr(read_module, "MAX_GAP", 0)  # an image's .json and .txt lie between
    _same(read_images(refs), refs)
    assert len(requests) == 10
    requests.clear()
    monkeypatch.setattr(read_module, "MAX_GAP", 1 << 20)
    first, length = refs[0].data_range()
    span = refs[4].data_range()[0] + refs[4].data_range()[1] - first  # images 0..4
    monkeypatch.setattr(read_module, "MAX_SPAN", span)
    _same(read_images(refs), refs)
    assert [offset for _, offset, _ in requests] == [first, refs[5].data_range()[0]]


def test_a_cut_tar_and_a_missing_file_fail_their_own_images_only(root, tmp_path):
    refs = list_images("cc3m", str(root))
    unit = refs[30:40]  # the second tar's first images
    unit[0].read_bytes()  # its index is made (and kept) while the tar is whole
    offset, length = unit[5].data_range()
    tar = root / "00001.tar"
    tar.write_bytes(tar.read_bytes()[:offset + length // 2])
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(b"\xff\xd8 not much of a JPEG")
    files = [ImageRef("folder", "photo", photo), ImageRef("folder", "gone", tmp_path / "gone.jpg")]
    found = read_images([*unit, *files])
    _same(found, [*unit, *files])
    assert [isinstance(item, OSError) for item in found] == [False] * 5 + [True] * 5 + [
        False, True]
    assert str(found[5]) == f"{tar}:{unit[5].member}: archive ends after {length // 2} of " \
                            f"{length} bytes"
    assert found[10] == photo.read_bytes()


def test_reading_a_download_on_s3_costs_a_request_per_unit_not_per_image(s3, tmp_path):
    """Two tars of 500 urls, read in units of 64 as `pipeline extract` plans them: GETs for the
    units and each tar's index, against one GET per image read alone."""
    url = s3.upload(make_root(tmp_path / "root", 1000, per_tar=500), "reading")
    tar_index_module.index_with(tar_index_module.index_tar)  # none kept
    refs = list_images("cc3m", url)
    units = plan_units(refs, plan_shards(len(refs), 1000), 64)
    with s3.recording() as together:
        found = [read_images(unit.refs) for unit in units]
    tar_index_module.index_with(tar_index_module.index_tar)  # none kept
    with s3.recording() as alone:
        separately = [[ref.read_bytes() for ref in unit.refs] for unit in units]
    assert found == separately and len(refs) == 900 and len(units) == 15
    gets = [r for r in together if r["method"] == "GET"]
    assert len(units) <= len(gets) <= len(units) + 2 * 3  # the units, each tar's index pass
    assert len([r for r in alone if r["method"] == "GET"]) >= len(refs)
