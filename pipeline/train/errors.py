"""Training's errors that reach a user, in a module without torch (the command line names them)."""


class DivergenceError(RuntimeError):
    """A training loss that became NaN or infinite."""


class Stopped(Exception):
    """A run stopped by a signal after writing its checkpoint (pipeline/train/stop.py): the
    message says where to resume; `status` is the command's exit status (143 SIGTERM, 130
    SIGINT)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status
