"""Tokenizers: GPT-2 BPE (offline: the vocabulary ships in the package and is hash-checked
before use) and raw UTF-8 bytes.

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


#: The tokenizers a text source can name (``data: {tokenizer: ...}``).
TOKENIZERS = ("gpt2", "bytes")
#: The bytes tokenizer ends each document with this id (NUL, which UTF-8 text does not hold).
BYTES_END_ID = 0


def n_vocab(tokenizer: str) -> int:
    """How many ids ``tokenizer`` gives: 50257 for GPT-2 BPE, 256 for bytes."""
    return N_VOCAB if tokenizer == "gpt2" else 256


def encode_documents(tokenizer: str, texts: list[str]) -> list[list[int]]:
    """Each text's ids, followed by the end-of-document id: GPT-2 BPE with ``<|endoftext|>``
    (50256), or the UTF-8 bytes (ids 0-255, the byte-level input of ByT5, Xue et al. 2022)
    with a NUL byte (0)."""
    if tokenizer == "bytes":
        return [[*text.encode("utf-8"), BYTES_END_ID] for text in texts]
    if tokenizer != "gpt2":
        raise ValueError(f"tokenizer {tokenizer!r} is not one of {TOKENIZERS}")
    docs = gpt2_encoding().encode_ordinary_batch(texts, num_threads=2)
    return [[*doc, ENDOFTEXT_ID] for doc in docs]
