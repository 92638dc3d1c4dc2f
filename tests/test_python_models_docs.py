"""docs/python-models.md runs: its python blocks are executed in order, in one namespace, in a
folder holding what they name (a tiny fine-tuned VQA run at runs/vqa, the world's COCO shards at
feats/coco, its released VQA files at world/vqa)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "python-models.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.M | re.S)


def test_every_python_block_runs(pretrain_world, tiny_vqa_run, tmp_path, monkeypatch, capsys):
    for name, target in (("runs/vqa", tiny_vqa_run), ("feats/coco", pretrain_world.shards[0]),
                         ("world/vqa", pretrain_world.world / "vqa")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).symlink_to(target)
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) == 5
    namespace: dict = {}
    for number, block in enumerate(blocks, start=1):
        exec(compile(block, f"{DOC.name}, python block {number}", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "LxmertForPreTraining LxmertModel"
    # the top answers, scores best first, then the four answers of the batch
    scores = [float(line.split()[0]) for line in printed[2:5]]
    assert scores == sorted(scores, reverse=True)
    assert len(eval(printed[5])) == 4
