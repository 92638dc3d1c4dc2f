"""The extractor's errors that reach a user, in a module without torch: `pipeline`'s command line
names them without loading the detector."""


class WeightsError(ValueError):
    """A checkpoint that cannot be read, or does not match the detector."""
