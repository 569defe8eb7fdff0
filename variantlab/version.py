"""The package version, on its own so that the stages (unit keys, the runner, the stored
records) read it without importing the package's public face (``variantlab/__init__.py``)."""

__version__ = "0.1.0"
