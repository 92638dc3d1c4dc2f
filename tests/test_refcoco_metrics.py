"""RefCOCO+ accuracy (pipeline/evaluate/refcoco.py) on hand-computed boxes (IoU exactly 0.5
counts, 0.4999 does not, pixels counted inclusively), the refs pickle read as Python 2 writes it,
malicious pickles refused without running anything, the readers' errors, and `pipeline evaluate
refcoco+` end to end."""

from __future__ import annotations

import builtins
import json
import os
import pickle
import re
import struct
import subprocess
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.evaluate.inputs import EvaluationError
from pipeline.evaluate.refcoco import (
    RefSentence,
    box_iou,
    evaluate_refcoco,
    load_plain_pickle,
    read_refcoco,
    score_refcoco,
    write_refcoco_predictions,
)

# --- IoU and the accuracy ----------------------------------------------------------------------

TARGET = (0.0, 0.0, 9.0, 9.0)  # inclusive pixels: 10 x 10 = 100


@pytest.mark.parametrize("box, expected", [
    (TARGET, 1.0),
    # 10 x 20 = 200 pixels holding the target's 100: 100 / 200, exactly 0.5
    ((0.0, 0.0, 9.0, 19.0), 0.5),
    # 10 x 20.004: 100 / 200.04 = 0.49990...
    ((0.0, 0.0, 9.0, 19.004), 100 / 200.04),
    # shifted by 5: the overlap is 5 x 10 = 50 of 100 + 100 - 50 = 150
    ((5.0, 0.0, 14.0, 9.0), 50 / 150),
    # elsewhere: no overlap; touching at x = 10 (inclusive pixels 10..19) shares nothing
    ((100.0, 100.0, 120.0, 130.0), 0.0),
    ((10.0, 0.0, 19.0, 9.0), 0.0),
    # touching at x = 9 shares one column of 10 pixels: 10 / 190
    ((9.0, 0.0, 18.0, 9.0), 10 / 190),
])
def test_box_iou_counts_pixels_inclusively(box, expected):
    assert box_iou(box, TARGET) == pytest.approx(expected, abs=1e-12)
    assert box_iou(TARGET, box) == pytest.approx(expected, abs=1e-12)


def _sentence(sent_id: int, box=TARGET, split: str = "testA") -> RefSentence:
    return RefSentence(sent_id=sent_id, ref_id=sent_id // 10, ann_id=7, image_id=3, split=split,
                       category_id=1, sent="man in red", box_xyxy=box)


def test_iou_exactly_half_counts_and_just_under_does_not():
    assert box_iou((0.0, 0.0, 9.0, 19.0), TARGET) == 0.5  # exactly, in floating point
    sentences = [_sentence(1), _sentence(2), _sentence(3)]
    predictions = {1: (0.0, 0.0, 9.0, 19.0),        # IoU 0.5: right
                   2: (0.0, 0.0, 9.0, 19.004),      # IoU 0.4999: wrong
                   3: (100.0, 100.0, 109.0, 109.0)}  # the wrong place: wrong
    scores = score_refcoco(predictions, sentences)
    assert (scores.accuracy, scores.questions) == (33.33, 3)
    assert score_refcoco({1: TARGET, 2: TARGET, 3: TARGET}, sentences).accuracy == 100.0


# --- the files ---------------------------------------------------------------------------------

def _py2_pickle(obj) -> bytes:
    """What Python 2's cPickle.dump(obj, f, 2) writes: `bytes` stand for Python 2 `str`
    (SHORT_BINSTRING, decoded by the reader), `str` for `unicode` (BINUNICODE, UTF-8)."""
    out = bytearray(b"\x80\x02")

    def emit(value) -> None:
        if isinstance(value, bytes):
            out.extend(b"U" + bytes([len(value)]) + value)
        elif isinstance(value, str):
            data = value.encode("utf-8")
            out.extend(b"X" + struct.pack("<I", len(data)) + data)
        elif isinstance(value, int):
            out.extend(b"J" + struct.pack("<i", value))
        elif isinstance(value, float):
            out.extend(b"G" + struct.pack(">d", value))
        elif isinstance(value, list):
            out.extend(b"](")
            for item in value:
                emit(item)
            out.extend(b"e")
        elif isinstance(value, dict):
            out.extend(b"}(")
            for key, item in value.items():
                emit(key)
                emit(item)
            out.extend(b"u")
        else:
            raise TypeError(value)

    emit(obj)
    out.extend(b".")
    return bytes(out)


def _ref(ref_id: int, ann_id: int, split: bytes, sentences: list[tuple[int, bytes]]) -> dict:
    return {
        b"ref_id": ref_id, b"ann_id": ann_id, b"image_id": 500 + ref_id, b"split": split,
        b"category_id": 1, b"sent_ids": [s for s, _ in sentences],
        b"file_name": b"COCO_train2014_000000000500_%d.jpg" % ann_id,
        b"sentences": [{b"tokens": sent.split(), b"raw": sent, b"sent_id": s, b"sent": sent}
                       for s, sent in sentences],
    }


REFS = [
    _ref(1, 11, b"testA", [(100, b"man in red"), (101, b"caf\xc3\xa9 guy")]),  # UTF-8 bytes
    _ref(2, 12, b"testA", [(102, b"left person")]),
    _ref(3, 13, b"val", [(103, b"dog")]),
]
INSTANCES = {
    "images": [{"id": 501, "file_name": "x.jpg", "height": 480, "width": 640}],
    "categories": [{"id": 1, "name": "person"}],
    "annotations": [
        {"id": 11, "image_id": 501, "category_id": 1, "bbox": [0, 0, 9, 9], "area": 81},
        {"id": 12, "image_id": 502, "category_id": 1, "bbox": [20.5, 30.25, 100, 50], "area": 1},
        {"id": 13, "image_id": 503, "category_id": 18, "bbox": [1, 2, 3, 4], "area": 12},
    ],
}


def _files(tmp_path: Path, refs=REFS) -> tuple[Path, Path]:
    refs_path = tmp_path / "refs(unc).p"
    refs_path.write_bytes(_py2_pickle(refs))
    instances = tmp_path / "instances.json"
    instances.write_text(json.dumps(INSTANCES), encoding="utf-8")
    return refs_path, instances


def test_read_refcoco_from_a_python2_pickle(tmp_path):
    refs, instances = _files(tmp_path)
    sentences = read_refcoco(refs, instances, "testA")
    assert [s.sent_id for s in sentences] == [100, 101, 102]
    first, second, third = sentences
    assert (first.ref_id, first.ann_id, first.image_id, first.split, first.category_id) == (
        1, 11, 501, "testA", 1)
    assert first.sent == "man in red" and second.sent == "café guy"
    # COCO's [x, y, w, h] -> [x, y, x + w, y + h], as ViLBERT and VL-BERT build the target
    assert first.box_xyxy == (0.0, 0.0, 9.0, 9.0)
    assert third.box_xyxy == (20.5, 30.25, 120.5, 80.25)
    assert [s.sent_id for s in read_refcoco(refs, instances)] == [100, 101, 102, 103]

    # A Python 2 str that is not UTF-8 (latin-1 bytes) is read as latin-1.
    latin = [_ref(1, 11, b"testA", [(100, b"caf\xe9")])]
    refs, instances = _files(tmp_path, latin)
    assert read_refcoco(refs, instances, "testA")[0].sent == "café"


def test_read_refcoco_errors_name_the_file_and_entry(tmp_path):
    refs, instances = _files(tmp_path)
    with pytest.raises(EvaluationError, match=r"no ref of split 'testC'; its splits are "
                                              r"\['testA', 'val'\]") as info:
        read_refcoco(refs, instances, "testC")
    assert str(info.value).startswith(str(refs))

    orphan = [_ref(4, 99, b"testA", [(104, b"cat")])]
    refs, instances = _files(tmp_path, orphan)
    with pytest.raises(EvaluationError, match=r"ref 0 \(ref_id 4\): ann_id 99 is not in") as info:
        read_refcoco(refs, instances, "testA")
    assert str(info.value).startswith(str(refs))

    twice = [_ref(1, 11, b"testA", [(100, b"a")]), _ref(2, 12, b"testA", [(100, b"b")])]
    refs, _ = _files(tmp_path, twice)
    with pytest.raises(EvaluationError, match="sent_id 100 appears twice"):
        read_refcoco(refs, instances)

    refs.write_bytes(_py2_pickle({b"refs": []}))
    with pytest.raises(EvaluationError, match="expected a list of refs"):
        read_refcoco(refs, instances)
    refs.write_bytes(_py2_pickle(REFS)[:-20])
    with pytest.raises(EvaluationError, match="not a readable pickle") as info:
        read_refcoco(refs, instances)
    assert str(info.value).startswith(str(refs))

    bad = json.loads(json.dumps(INSTANCES))
    bad["annotations"][1]["bbox"] = [1, 2, -3, 4]
    refs, instances = _files(tmp_path)
    instances.write_text(json.dumps(bad))
    with pytest.raises(EvaluationError, match=r"annotation 1 \(id 12\): 'bbox' must be") as info:
        read_refcoco(refs, instances)
    assert str(info.value).startswith(str(instances))


# --- malicious pickles -------------------------------------------------------------------------

class _Payload:
    """Unpickling it calls `call(*args)`: what a malicious refs file would do."""

    def __init__(self, call, *args) -> None:
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


def _payloads(marker: Path) -> list[tuple[object, str]]:
    """(object whose unpickling would create `marker`, the global its pickle names)."""
    return [
        (_Payload(os.system, f"touch {marker}"), r"(posix|os|nt)\.system"),
        (_Payload(builtins.eval, f"open({str(marker)!r}, 'w').write('x')"),
         r"(builtins|__builtin__)\.eval"),
        (_Payload(builtins.exec, f"open({str(marker)!r}, 'w').write('x')"),
         r"(builtins|__builtin__)\.exec"),
        # protocols < 3 write Python 2's names: __builtin__, commands.call
        (_Payload(subprocess.call, ["touch", str(marker)]), r"(subprocess|commands)\.call"),
        (_Payload(subprocess.Popen, ["touch", str(marker)]), r"(subprocess|commands)\.Popen"),
        (_Payload(builtins.open, str(marker), "w"), r"(builtins|__builtin__|io)\.open"),
    ]


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_malicious_pickles_are_refused_and_run_nothing(tmp_path, protocol):
    marker = tmp_path / "pwned"
    refs = tmp_path / "refs(unc).p"
    for payload, name in _payloads(marker):
        # Hidden inside an otherwise plausible list of refs.
        refs.write_bytes(pickle.dumps([{"ref_id": 1, "sentences": [payload]}], protocol=protocol))
        with pytest.raises(EvaluationError) as info:
            load_plain_pickle(refs)
        message = str(info.value)
        assert message.startswith(f"{refs}: refusing to unpickle global ")
        assert re.search(f"global {name}:", message), message
        assert not marker.exists(), f"unpickling {name} ran it"
        # and through the reader
        with pytest.raises(EvaluationError, match="refusing to unpickle global"):
            read_refcoco(refs, tmp_path / "instances.json")
        assert not marker.exists()


def test_the_payloads_do_run_under_the_standard_unpickler(tmp_path):
    # So the test above would see a reader that ran them: builtins.open creates the marker.
    marker = tmp_path / "pwned"
    payload, _ = _payloads(marker)[-1]
    pickle.loads(pickle.dumps(payload)).close()
    assert marker.exists()


def test_a_plain_pickle_needs_no_global(tmp_path):
    # Plain containers under every protocol load; a set (a global under protocol 2) does not,
    # nor Python 3 bytes under protocols < 3 (written as a call of _codecs.encode).
    path = tmp_path / "plain.p"
    data = [{"a": 1, "b": [1.5, "x", None, True, (1, 2), 2**70], "c": {"d": "é"}}]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        path.write_bytes(pickle.dumps(data, protocol=protocol))
        assert load_plain_pickle(path) == data
    path.write_bytes(pickle.dumps([b"raw"], protocol=3))
    assert load_plain_pickle(path) == [b"raw"]
    path.write_bytes(pickle.dumps([b"raw"], protocol=2))
    with pytest.raises(EvaluationError, match=r"global _codecs\.encode"):
        load_plain_pickle(path)
    path.write_bytes(pickle.dumps({1, 2}, protocol=2))
    with pytest.raises(EvaluationError, match=r"global (builtins|__builtin__)\.set"):
        load_plain_pickle(path)


# --- predictions and the verb ------------------------------------------------------------------

def _argv(tmp_path: Path, rows: list[tuple[int, list[float]]], split: str = "testA") -> list[str]:
    refs, instances = _files(tmp_path)
    predictions = tmp_path / "boxes.json"
    write_refcoco_predictions(rows, predictions)
    return ["evaluate", "refcoco+", "--predictions", str(predictions), "--annotations",
            str(refs), "--instances", str(instances), "--split", split]


def test_evaluate_refcoco_cli(tmp_path, capsys):
    rows = [(100, [0, 0, 9, 19]),              # IoU 0.5 with ann 11: right
            (101, [50, 50, 60, 60]),           # elsewhere: wrong
            (102, [20.5, 30.25, 120.5, 80.25]),  # ann 12 exactly: right
            (103, [1, 2, 4, 6])]               # a val sentence: ignored for testA
    argv = _argv(tmp_path, rows)
    out = tmp_path / "refcoco.json"
    assert main([*argv, "--json", str(out)]) == 0
    assert json.loads(out.read_text()) == {"accuracy": 66.67}
    printed = capsys.readouterr().out
    assert "RefCOCO+ testA" in printed and "3 expressions" in printed and "66.67" in printed
    assert evaluate_refcoco(Path(argv[3]), Path(argv[5]), Path(argv[7]), "val").accuracy == 100.0


def test_evaluate_refcoco_cli_errors(tmp_path, capsys):
    def error(argv: list[str]) -> str:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("pipeline: evaluation error: ") and err.count("\n") == 1
        return err

    argv = _argv(tmp_path, [(100, [0, 0, 9, 9]), (101, [0, 0, 9, 9])])
    err = error(argv)
    assert argv[3] in err and "no prediction for 1 of the 3 sentences" in err and "102" in err
    err = error(argv[:6] + argv[8:])
    assert "refcoco+ needs --instances FILE" in err
    err = error(argv[:-2])
    assert "--split" in err
    Path(argv[3]).write_text(json.dumps([{"sent_id": 100, "box": [0, 0, 9]}]))
    err = error(argv)
    assert argv[3] in err and "prediction 0 (sent_id 100): 'box' must be [x1, y1, x2, y2]" in err
    Path(argv[3]).write_text(json.dumps([{"sent_id": 100, "box": [0, 0, 9, 9]}] * 2))
    assert "two predictions for sent_id 100" in error(argv)
    err = error(["evaluate", "vcr", "--predictions", argv[3], "--annotations", argv[5],
                 "--instances", argv[7]])
    assert "--instances" in err and "refcoco+ only" in err
