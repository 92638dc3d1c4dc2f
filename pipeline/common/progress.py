"""Progress bars that read well in a terminal and in a log file.

tqdm redraws its bar with carriage returns: on a terminal that is one line that moves; in a log
file or a pipe (a training run's train.log, Ray's forwarded output, `pipeline ... | tee`) every
redraw piles onto one endless line. `progress_bar` is tqdm on a terminal, and elsewhere the same
bar written as a plain line at most every LOG_SECONDS (and once at the end).
"""

from __future__ import annotations

import io
import re
import sys

from tqdm import tqdm

LOG_SECONDS = 10.0
_BREAKS = re.compile(r"[\r\n]+")


class _Lines(io.TextIOBase):
    """A stream for tqdm that is no terminal: each redraw (a carriage return, the bar, padding)
    becomes a line of its own; the blank redraws of a cleared bar vanish."""

    def __init__(self, stream) -> None:
        super().__init__()
        self.stream = stream

    def write(self, text: str) -> int:
        for line in _BREAKS.split(text):
            if line.strip():
                self.stream.write(line.rstrip() + "\n")
        self.stream.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


def progress_bar(iterable=None, **kwargs) -> tqdm:
    """tqdm(iterable, **kwargs) on stderr (or kwargs' `file`): a bar on a terminal, plain lines
    every LOG_SECONDS elsewhere (module docstring)."""
    stream = kwargs.pop("file", None) or sys.stderr
    if not (hasattr(stream, "isatty") and stream.isatty()):
        stream = _Lines(stream)
        kwargs["mininterval"] = max(kwargs.get("mininterval", 0.1), LOG_SECONDS)
    return tqdm(iterable, file=stream, **kwargs)
