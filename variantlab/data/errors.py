"""The data stage's error, below every data module so that each can raise it."""


class DataError(ValueError):
    """A data source that cannot give the batches asked for (no files, corpus too short)."""
