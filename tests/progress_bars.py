"""A stand-in for the tqdm bar of `pipeline extract`, recording what the run shows on it."""

import threading


class RecordingBar:
    """Records the bar's updates and postfixes (pipeline.extract.job builds it as it would its progress_bar).

    terminal: whether the bar draws to a terminal (ExtractProgress then redraws it every second).
    """

    terminal = False

    def __init__(self, total=None, **kwargs):
        RecordingBar.last = self
        self.total, self.n = total, 0
        self.disable = False
        self.fp = self  # the bar's stream, asked isatty()
        self.updates: list[int] = []
        self.postfixes: list[str] = []
        self.refreshes = 0
        self.closed = False
        self.changed = threading.Condition()

    def isatty(self) -> bool:
        return self.terminal

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        assert not refresh, "a stage must not draw the bar (a GPU run would draw every batch)"
        with self.changed:
            self.postfixes.append(text)
            self.changed.notify_all()

    def update(self, n: int) -> None:
        self.n += n
        self.updates.append(n)

    def refresh(self) -> None:
        self.refreshes += 1

    def close(self) -> None:
        self.closed = True

    def wait_for_postfix(self, text: str, timeout: float = 60.0) -> None:
        """Block until the run shows `text`; AssertionError if it does not within `timeout`."""
        with self.changed:
            if not self.changed.wait_for(lambda: text in self.postfixes, timeout):
                raise AssertionError(f"the bar never showed {text!r}: {self.postfixes}")
