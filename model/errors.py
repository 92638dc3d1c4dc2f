"""The model library's errors that reach a user, in a module without torch: `pipeline`'s command
line names them without loading a model."""


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model or the format: every difference is listed by name."""
