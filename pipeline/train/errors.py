"""Training's errors that reach a user, in a module without torch (the command line names them)."""


class DivergenceError(RuntimeError):
    """A training loss that became NaN or infinite."""
