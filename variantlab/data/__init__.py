"""Data sources (synthetic, text files, the stdlib corpus), the tokenizer and the batches
probes draw (stage 3)."""
