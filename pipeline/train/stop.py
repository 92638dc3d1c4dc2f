"""Stopping a run when asked: SIGTERM (a scheduler's: Kubernetes, Slurm, a spot reclaim) or SIGINT
(Ctrl-C, or Slurm's `--signal=INT`).

Taken while the loop trains, the signal is noted and acted on between two steps: the step in
flight finishes, a checkpoint of it is written (atomically, as every checkpoint) and the run ends
with `Stopped`: exit 143 for SIGTERM, 130 for SIGINT, and one line saying where to resume. The
exact resume (loop.py) then repeats the uninterrupted run step for step. A second SIGINT stops at
once (Ctrl-C twice: the last whole checkpoint stays).

run.stop_grace_s (25 s: Kubernetes kills 30 s after its SIGTERM) bounds the wait: when the step
and its checkpoint are not done by then, the process says so and exits at once, with the same
status; the checkpoint it was writing is a `.tmp` directory that no resume reads, and the last
whole one is kept.

On Ray Train workers the command (the driver) takes the signal and tells the workers
(pipeline/train/coordination.py); rank 0 looks at most once a second, and after every step the
ranks agree on it (an all-reduce of one number, on the CPU), so that all of them stop after the
same step and rank 0 writes its checkpoint. There the driver takes SIGTERM only: a terminal's
Ctrl-C reaches Ray's processes too, and the run ends at once as before (exit 130).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT"}
RESUME = "run the same command with --resume to continue from it"


class StopRequest:
    """The stop signal of a run, taken in this process: a context manager that installs the
    handlers of `signals` (in the main thread; elsewhere it only holds `signum`). last_whole():
    the checkpoint a resume would read, in words (said when the grace runs out)."""

    def __init__(self, grace_s: float, last_whole: Callable[[], str],
                 signals: tuple[int, ...] = tuple(NAMES)) -> None:
        self.grace_s = grace_s
        self.last_whole = last_whole
        self.signals = signals
        self.signum = 0  # the signal taken; 0: none
        self._previous: dict[int, object] = {}
        self._timer: threading.Timer | None = None

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self.note)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self._timer is not None:
            self._timer.cancel()

    def note(self, signum: int, frame=None) -> None:
        """The signal handler: note the first signal and start the grace period."""
        if self.signum:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # the second Ctrl-C: now
            return
        self.signum = signum
        print(f"pipeline: {NAMES[signum]}: finishing the step in flight, then a checkpoint "
              f"(within run.stop_grace_s = {self.grace_s:g} s)", file=sys.stderr, flush=True)
        self._timer = threading.Timer(self.grace_s, self._expire)
        self._timer.daemon = True
        self._timer.start()

    @property
    def status(self) -> int:
        return 128 + self.signum

    def _expire(self) -> None:
        print(f"pipeline: stopped by {NAMES[self.signum]}: no checkpoint within "
              f"run.stop_grace_s = {self.grace_s:g} s; the last whole one is kept: "
              f"{self.last_whole()}; {RESUME}", file=sys.stderr, flush=True)
        os._exit(self.status)


def stopped_message(signum: int, step: int, checkpoint: str) -> str:
    return (f"stopped by {NAMES[signum]} after step {step}: checkpoint {checkpoint} written; "
            f"{RESUME}")
