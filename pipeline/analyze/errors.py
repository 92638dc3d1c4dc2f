"""The analysis's error for what the user gave (imported by the command line, so kept light)."""


class AnalysisError(ValueError):
    """An input the analysis cannot use; the message names the file and the problem."""
