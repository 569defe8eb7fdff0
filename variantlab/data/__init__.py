"""Data sources (synthetic, text files, the stdlib corpus, ``datasets`` on disk), the
tokenizers, the token cache, the train/validation/test splits and the batches probes draw
(stage 3)."""
