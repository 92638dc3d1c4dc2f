"""docs/notebook.ipynb runs, every cell, in a Jupyter kernel (nbclient, ipykernel: the test
extra), in a folder laid out as after `pipeline demo`: the world (the pretraining world of the
test session), the bundled detector, and a fine-tuned VQA run (the tiny one the Python API's tests
share). What it shows is checked: the regions of every image, their picture, three answers best
first, the attention figure and the picture of the regions most attended to."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "docs" / "notebook.ipynb"


def outputs(cell) -> tuple[str, list[Image.Image]]:
    """A code cell's printed text (stdout) and the pictures it displayed."""
    text, pictures = "", []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream" and out["name"] == "stdout":
            text += out["text"]
        elif "image/png" in out.get("data", {}):
            pictures.append(Image.open(io.BytesIO(base64.b64decode(out["data"]["image/png"]))))
    return text, pictures


def test_the_notebook_runs_from_images_to_an_answer_and_its_attention(
        pretrain_world, tiny_vqa_run, tmp_path):
    links = {"demo_out/world": pretrain_world.world, "demo_out/runs/vqa_pretrained": tiny_vqa_run,
             "pipeline/assets": ROOT / "pipeline" / "assets"}
    for name, target in links.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).symlink_to(target)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code")
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    cells = [outputs(cell) for cell in notebook.cells if cell.cell_type == "code"]
    listed = cells[1][0].splitlines()
    images = sorted((pretrain_world.world / "coco" / "val2014").glob("*.jpg"))[:8]
    assert [line.split(":")[0] for line in listed] == [p.name for p in images]
    assert all("36 regions, features (36, 64)" in line for line in listed)
    (drawn,) = cells[2][1]
    assert drawn.size == Image.open(images[0]).size
    question, *answers = cells[3][0].splitlines()
    assert question.endswith("?") and len(answers) == 3
    scores = [float(line.split()[0]) for line in answers]
    assert scores == sorted(scores, reverse=True)
    figure, attended = cells[4][1]
    assert figure.size[0] > 400 and attended.mode == "RGB"
