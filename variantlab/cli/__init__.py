"""The command line: ``variantlab`` and ``python -m variantlab``. It formats; the library
computes (last stage)."""
