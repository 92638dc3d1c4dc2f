"""Progress bars in a log file or pipe are plain lines (pipeline/common/progress.py): tqdm's
carriage returns would keep a whole run on one line of train.log or extract's output."""

from __future__ import annotations

import io

from pipeline.common.progress import progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_into_a_log_each_redraw_is_a_line_of_its_own():
    log = io.StringIO()
    with progress_bar(total=3, desc="finetune vqa", unit="step", file=log) as bar:
        for _ in range(3):
            bar.update(1)
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[0].startswith("finetune vqa:   0%") and lines[-1].startswith("finetune vqa: 100%")
    assert len(lines) == 2  # the start, and the end (the updates came within LOG_SECONDS)


def test_into_a_log_a_cleared_bar_leaves_nothing_and_redraws_are_spaced():
    log = io.StringIO()
    with progress_bar(total=1000, desc="extract", leave=False, file=log) as bar:
        for _ in range(1000):
            bar.update(1)  # 1,000 updates within LOG_SECONDS: no line but the first
    assert log.getvalue().splitlines() == [log.getvalue().splitlines()[0]]
    assert "0/1000" in log.getvalue()


def test_on_a_terminal_it_is_tqdm_as_it_is():
    screen = Terminal()
    with progress_bar(total=2, desc="world", file=screen, mininterval=0) as bar:
        bar.update(2)
    assert "\r" in screen.getvalue()
