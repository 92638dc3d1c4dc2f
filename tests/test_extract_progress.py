"""The progress bar of `pipeline extract`: images counted as written, and the stage of the batch
in hand named in the postfix, so that a slow batch does not look like a hung run."""

import time

import pytest
from PIL import Image
from progress_bars import RecordingBar
from skimage import data
from tiny_detector import TINY_DETECTOR

import pipeline.extract.job
from pipeline.cli import main
from pipeline.extract.output import ShardSink
from pipeline.extract.progress import ExtractProgress

TINY = [*TINY_DETECTOR, "--device", "cpu", "--random-weights"]


@pytest.fixture
def five_images(tmp_path):
    """Three photos and two bad files: a failed image goes through every stage too."""
    root = tmp_path / "photos"
    root.mkdir()
    for name, photo in [("a", data.astronaut()), ("b", data.coffee()), ("c", data.camera())]:
        Image.fromarray(photo).resize((96, 96)).save(root / f"{name}.jpg")
    (root / "d.jpg").write_bytes(b"")
    (root / "e.jpg").write_text("not an image\n")
    return root


def test_local_engine_names_each_batch_stage_it_waits_on(five_images, tmp_path, monkeypatch):
    """Batches of 2, 2 and 1 images on the CPU: each batch's decoding counted image by image,
    then the detector; each batch's write is named when the engine waits for it (the third
    batch has to wait for the first one's: two batches are written behind the detector at
    most). Every write here waits until the bar names it, so a write the engine does not
    announce would stop the run."""
    monkeypatch.setattr(pipeline.extract.job, "progress_bar", RecordingBar)
    add = ShardSink.add
    writes = []

    def add_once_named(sink, unit, items):
        writes.append(unit)
        RecordingBar.last.wait_for_postfix(f"batch {len(writes)}/3: write")
        add(sink, unit, items)

    monkeypatch.setattr(ShardSink, "add", add_once_named)
    out = tmp_path / "feats"
    assert main(["extract", "--root", str(five_images), "--out", str(out), *TINY,
                 "--engine", "local", "--batch-size", "2"]) == 0
    bar = RecordingBar.last
    assert bar.postfixes == [
        "batch 1/3: decode 0/2", "batch 1/3: decode 1/2", "batch 1/3: detector",
        "batch 2/3: decode 0/2", "batch 2/3: decode 1/2", "batch 2/3: detector",
        "batch 3/3: decode 0/1", "batch 3/3: detector",
        "batch 1/3: write",
        "batch 2/3: write", "batch 3/3: write",
        "",  # a finished run's bar ends without a stage
    ]
    assert (bar.total, bar.updates, bar.closed) == (5, [2, 2, 1], True)
    assert bar.refreshes == 0  # not a terminal: nothing redraws it


def test_a_stopped_run_keeps_the_stage_it_stopped_in():
    bar = RecordingBar(total=4)
    progress = ExtractProgress(bar, batches=2)
    progress.stage(0, "detector")
    progress.written(2)
    progress.stage(1, "detector")
    progress.close()
    assert bar.postfixes == ["batch 1/2: detector", "batch 2/2: detector"]
    assert (bar.updates, bar.closed) == ([2], True)


def test_on_a_terminal_the_bar_is_redrawn_while_a_batch_runs(monkeypatch):
    """tqdm draws only when it is updated, and one CPU batch can take minutes: the redraws show
    the stage and the elapsed time meanwhile. They stop when the bar closes."""
    monkeypatch.setattr(ExtractProgress, "REDRAW_SECONDS", 0.01)
    monkeypatch.setattr(RecordingBar, "terminal", True)
    bar = RecordingBar(total=4)
    progress = ExtractProgress(bar, batches=1)
    progress.stage(0, "detector")
    deadline = time.monotonic() + 30
    while bar.refreshes < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    progress.close()
    redraws = bar.refreshes
    assert redraws >= 3
    time.sleep(0.05)
    assert bar.refreshes == redraws and bar.closed
