"""`pipeline bench extract` runs end to end on the bundled photos (tiny detector, CPU)."""

from pipeline.common.assets import SAMPLE_IMAGES
from pipeline.cli import main

TINY = ["--set", "detector.depth=18", "--set", "detector.width=16", "--set", "detector.rpn_hidden=64",
        "--random-weights"]


def test_bench_extract_prints_one_row_per_setting(capsys):
    assert (SAMPLE_IMAGES / "astronaut.jpg").is_file()
    code = main(["bench", "extract", "--device", "cpu", "--num-images", "3",
                 "--batch-sizes", "1,2", *TINY])
    assert code == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| local |")]
    assert [row.split("|")[2].strip() for row in rows] == ["1", "2"]
    for row in rows:
        assert float(row.split("|")[4]) > 0  # images/s


def test_bench_extract_needs_weights_or_random_weights(capsys):
    tiny = [arg for arg in TINY if arg != "--random-weights"]
    assert main(["bench", "extract", "--device", "cpu", "--num-images", "1", "--batch-sizes", "1",
                 *tiny]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeline: config error: no detector weights")
    assert "--random-weights" in err
