"""shards.tar_headers: a tar's member headers read without tarfile's objects, equal to what
tarfile reads for our shards and for tars of other writers (pax and GNU extended headers,
directories, signed checksums), and a damaged or truncated tar refused as tarfile refuses it."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest

from shards.tar_headers import headers
from shards.writer import ShardWriter
from test_pretrain_data import fake_sample


def by_tarfile(data: bytes) -> list[tuple[str, int, int, int, bool]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return [(i.name, i.offset, i.offset_data, i.size, i.isfile()) for i in tar]


def by_headers(data: bytes) -> list[tuple[str, int, int, int, bool]]:
    return list(headers(io.BytesIO(data)))


def tar_of(members: list[tuple[str, bytes]], tar_format: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tar_format) as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            if payload is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                continue
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return out.getvalue()


def test_a_shards_headers_are_tarfiles(tmp_path):
    with ShardWriter(tmp_path, "s") as writer:
        for i in range(5):
            writer.write(fake_sample("coco", i))
    data = writer.path.read_bytes()
    found = by_headers(data)
    assert found == by_tarfile(data)
    assert len({name.partition(".")[0] for name, *_ in found}) == 5
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for name, _, offset, size, _ in found:  # the offsets point at the payloads
            assert data[offset:offset + size] == tar.extractfile(name).read()


@pytest.mark.parametrize("tar_format", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT,
                                        tarfile.USTAR_FORMAT])
def test_other_writers_tars_go_to_tarfile_from_the_first_header_it_needs(tar_format):
    long = "d/" + "x" * 150 + ".npy"
    members = [("coco-1.json", b"{}"), ("coco-1.npy", bytes(700)), ("a/b", None),
               ("coco-2.json", b"[1]")]
    if tar_format != tarfile.USTAR_FORMAT:
        members += [(long, b"long"), ("caf\u00e9-3.json", b"{}"), ("coco-4.json", b"4")]
    data = tar_of(members, tar_format)
    assert by_headers(data) == by_tarfile(data)
    assert [regular for *_, regular in by_headers(data)][2] is False  # the directory


def test_a_signed_checksum_is_tarfiles_to_judge():
    data = bytearray(tar_of([("caf\u00e9.json", b"{}"), ("k.npy", b"x")], tarfile.USTAR_FORMAT))
    blank = bytes(data[:148]) + b" " * 8 + bytes(data[156:512])
    signed = int(np.frombuffer(blank, np.int8).astype(np.int64).sum())
    assert signed != sum(blank)  # the name's two UTF-8 bytes are over 127
    data[148:156] = b"%06o\0 " % signed
    assert by_headers(bytes(data)) == by_tarfile(bytes(data))
    assert by_headers(bytes(data))[0][0] == "caf\u00e9.json"


def same_as_tarfile(data: bytes) -> bool:
    """Whether headers() gives tarfile's members, or raises its error; True when it raised."""
    try:
        expected = by_tarfile(data)
    except tarfile.TarError as err:
        with pytest.raises(type(err), match=str(err)):
            by_headers(data)
        return True
    assert by_headers(data) == expected
    return False


def test_damaged_cut_and_empty_tars_end_or_fail_where_tarfile_does():
    """tarfile raises for a damaged or cut first header and ends the members at a later one."""
    data = tar_of([("k.json", b"{}"), ("k.npy", bytes(600)), ("l.json", b"{}")],
                  tarfile.USTAR_FORMAT)
    for at in (0, 1024):  # the first header, the second (after one block of payload)
        bad_sum, bad_size = bytearray(data), bytearray(data)
        bad_sum[at + 5] ^= 1  # the name changed, the checksum not
        bad_size[at + 124:at + 136] = b"9" * 12  # not octal
        bad_field = bytearray(data)
        bad_field[at + 148:at + 156] = b"zzzzzz\0 "  # a checksum that is not a number
        for damaged in (bytes(bad_sum), bytes(bad_size), bytes(bad_field), data[:at + 300],
                        data[:at]):
            assert same_as_tarfile(damaged) == (at == 0)
    assert not same_as_tarfile(bytes(10240))  # end-of-archive blocks only: no member
