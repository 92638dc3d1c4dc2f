"""`pipeline shards import-tsv | verify | export-tsv` through the command line."""

import base64

import numpy as np

from pipeline.cli import main


def _b64(arr: np.ndarray) -> str:
    return base64.b64encode(arr.tobytes()).decode("ascii")


def _write_lxmert_tsv(path, rows=5, boxes=4, dim=16, seed=0):
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(rows):
        h, w = 300 + i, 400 + i
        xy = rng.uniform(0, 150, size=(boxes, 2)).astype(np.float32)
        box = np.concatenate([xy, xy + 100], axis=1).astype(np.float32)
        fields = [
            f"COCO_val2014_{i:012d}", str(h), str(w),
            _b64(rng.integers(0, 1600, boxes).astype(np.int64)),
            _b64(rng.random(boxes, dtype=np.float32)),
            _b64(rng.integers(0, 400, boxes).astype(np.int64)),
            _b64(rng.random(boxes, dtype=np.float32)),
            str(boxes), _b64(box), _b64(rng.random((boxes, dim), dtype=np.float32)),
        ]
        lines.append("\t".join(fields) + "\r\n")
    path.write_bytes("".join(lines).encode())


def test_import_verify_export_round_trip_and_corruption(tmp_path, capsys):
    tsv, out, back = tmp_path / "in.tsv", tmp_path / "shards", tmp_path / "back.tsv"
    _write_lxmert_tsv(tsv)
    assert main(["shards", "import-tsv", str(tsv), "--out", str(out), "--dataset", "coco",
                 "--split", "val2014", "--set", "shard_size=2"]) == 0
    assert "5 samples written" in capsys.readouterr().out
    assert sorted(p.name for p in out.glob("*.tar")) == ["00000.tar", "00001.tar", "00002.tar"]

    assert main(["shards", "verify", str(out)]) == 0
    assert main(["shards", "export-tsv", str(out), "--out", str(back)]) == 0
    assert back.read_bytes() == tsv.read_bytes()

    shard = out / "00001.tar"
    raw = bytearray(shard.read_bytes())
    raw[2048] ^= 0xFF  # inside the first member's data
    shard.write_bytes(bytes(raw))
    capsys.readouterr()
    assert main(["shards", "verify", str(out)]) == 1
    report = capsys.readouterr().out
    assert "00001.tar" in report and "sha256" in report


def test_import_config_rejects_unknown_keys(tmp_path, capsys):
    tsv = tmp_path / "in.tsv"
    _write_lxmert_tsv(tsv, rows=1)
    code = main(["shards", "import-tsv", str(tsv), "--out", str(tmp_path / "o"), "--dataset",
                 "coco", "--set", "features_dtyp=float16"])
    assert code == 2 and "did you mean 'features_dtype'" in capsys.readouterr().err


def test_a_missing_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    """A shard folder or TSV prefix that does not exist: `pipeline: file error: PATH: ...`, exit
    2, no output made (before, a traceback)."""
    labelmap = tmp_path / "labelmap.json"
    labelmap.write_text('{"label_to_idx": {"ball": 1}, "attribute_to_idx": {"red": 1}}')
    missing = tmp_path / "missing"
    runs = [["shards", "export-tsv", str(missing), "--out", str(tmp_path / "out.tsv")],
            ["shards", "export-vinvl-tsv", str(missing), "--out", str(tmp_path / "out"),
             "--labelmap", str(labelmap)],
            ["shards", "import-vinvl-tsv", str(missing), "--out", str(tmp_path / "shards"),
             "--dataset", "coco", "--labelmap", str(labelmap)]]
    for argv, named in zip(runs, [missing, missing, f"{missing}.feature.tsv"]):
        capsys.readouterr()
        assert main(argv) == 2
        error = capsys.readouterr().err
        assert error == f"pipeline: file error: {named}: No such file or directory\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["labelmap.json"]
