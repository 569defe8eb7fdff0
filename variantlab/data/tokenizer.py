"""GPT-2 BPE, offline: the vocabulary ships in the package and is hash-checked before use.

``variantlab/data/gpt2.tiktoken`` is byte-identical to tiktoken's ``r50k_base`` file; with the
r50k split pattern and ``<|endoftext|>`` = 50256 it is the GPT-2 tokenizer. Nothing here ever
touches the network (tiktoken's own loader would download and cache the file).
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache
from importlib import resources
from pathlib import Path

import tiktoken

GPT2_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
R50K_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
ENDOFTEXT = "<|endoftext|>"
ENDOFTEXT_ID = 50256
N_VOCAB = 50257


class VocabularyError(RuntimeError):
    """The shipped vocabulary is missing, altered, or unreadable."""


def vocabulary_bytes(path: Path | None = None) -> bytes:
    """The raw vocabulary file: ``path`` if given, else the copy shipped in the package."""
    if path is not None:
        return Path(path).read_bytes()
    ref = resources.files("variantlab") / "data" / "gpt2.tiktoken"
    try:
        return ref.read_bytes()
    except FileNotFoundError:
        raise VocabularyError(
            f"GPT-2 vocabulary not found at {ref}; reinstall variantlab (the file ships "
            "in the package as variantlab/data/gpt2.tiktoken)"
        ) from None


def parse_ranks(contents: bytes, source: str = "gpt2.tiktoken") -> dict[bytes, int]:
    """tiktoken's format: one ``base64(token) rank`` pair per line."""
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(contents.splitlines(), 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as exc:
            raise VocabularyError(f"{source}:{lineno}: not a 'base64 rank' line: {exc}") from None
    return ranks


def encoding_from_bytes(contents: bytes, source: str = "gpt2.tiktoken") -> tiktoken.Encoding:
    """Build the GPT-2 encoding after checking ``contents`` against the known sha256."""
    digest = hashlib.sha256(contents).hexdigest()
    if digest != GPT2_SHA256:
        raise VocabularyError(
            f"{source}: sha256 {digest} does not match the GPT-2 vocabulary ({GPT2_SHA256}); "
            "the file is corrupted or a different vocabulary; restore it from the variantlab "
            "package (it is tiktoken's r50k_base.tiktoken)"
        )
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=R50K_PATTERN,
        mergeable_ranks=parse_ranks(contents, source),
        special_tokens={ENDOFTEXT: ENDOFTEXT_ID},
        explicit_n_vocab=N_VOCAB,
    )


@lru_cache(maxsize=1)
def gpt2_encoding() -> tiktoken.Encoding:
    """The GPT-2 tokenizer from the shipped, hash-checked vocabulary (cached)."""
    return encoding_from_bytes(vocabulary_bytes(), "variantlab/data/gpt2.tiktoken")


def encode(text: str) -> list[int]:
    """GPT-2 token ids of ``text``; ``<|endoftext|>`` in the text is encoded as the special
    token, so documents can be joined with it."""
    return gpt2_encoding().encode(text, allowed_special={ENDOFTEXT})
