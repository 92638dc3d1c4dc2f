"""The progress bar of `pipeline extract`: images written, and the stage of the batch in hand.

The bar advances a batch at a time, as each batch is written, and on a CPU one detector batch can
take minutes: so its postfix names the batch the engine is on and where it is ("batch 2/5:
decode 1/4", "batch 2/5: detector", "batch 5/5: write"), and on a terminal the bar is redrawn
every second, so the postfix and the elapsed time stay current while a batch runs. A stage only
changes the postfix (no drawing), so a fast run on a GPU draws no more often than tqdm does.
"""

from __future__ import annotations

import threading

from tqdm import tqdm


class ExtractProgress:
    """A tqdm bar counting images written, with the current batch's stage as its postfix.

    batches: the run's batch (unit) count, for "batch i/n". Stages are set from the engine's
    detector thread only (the local engine writes in another thread, behind it): the postfix
    names what the run is waiting on.
    """

    REDRAW_SECONDS = 1.0

    def __init__(self, bar: tqdm, batches: int):
        self.bar = bar
        self.batches = batches
        self._closed = threading.Event()
        self._redraws = None
        # Only on a terminal: in a log file or pipe each redraw would add to one endless line.
        if not bar.disable and bar.fp.isatty():
            self._redraws = threading.Thread(target=self._redraw, name="progress", daemon=True)
            self._redraws.start()

    def stage(self, batch: int, stage: str) -> None:
        """Batch `batch` (0-based, of the run's batches) is now in `stage`."""
        self.bar.set_postfix_str(f"batch {batch + 1}/{self.batches}: {stage}", refresh=False)

    def written(self, images: int) -> None:
        """`images` more images are in shards (or recorded as failed)."""
        self.bar.update(images)

    def close(self) -> None:
        """Stop the redrawing and close the bar: a finished run's bar ends without a stage, a
        stopped one's names where it stopped."""
        self._closed.set()
        if self._redraws is not None:
            self._redraws.join()
        if self.bar.n == self.bar.total:
            self.bar.set_postfix_str("", refresh=False)
        self.bar.close()

    def _redraw(self) -> None:
        while not self._closed.wait(self.REDRAW_SECONDS):
            self.bar.refresh()
