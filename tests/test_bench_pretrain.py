"""`pipeline bench pretrain` on the fixture world, in-process (0 workers: no Ray start-up)."""

import re

from pipeline.cli import main


def test_bench_pretrain_prints_rates(pretrain_world, capsys):
    shards = ",".join(str(s) for s in pretrain_world.shards)
    code = main(["bench", "pretrain", "--corpus", str(pretrain_world.corpus), "--shards", shards,
                 "--workers", "0", "--steps", "6", "--warmup", "2", "--micro-batch", "8",
                 "--device", "cpu", "--set", "data.shuffle_buffer=100"])
    assert code == 0
    out = capsys.readouterr().out
    row = re.search(r"^\s+0\s+8\s+([\d.]+)\s+1\.00x\s+100%", out, re.MULTILINE)
    assert row, out
    assert float(row.group(1)) > 0

