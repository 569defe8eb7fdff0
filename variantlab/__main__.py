"""``python -m variantlab``: the same command line as ``variantlab``."""

from .cli.main import main

if __name__ == "__main__":
    main()
