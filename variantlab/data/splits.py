"""Train / validation / test splits of a tokenised corpus, by document.

Each document is ranked by the sha256 of its token ids (a fixed shuffle that depends on the
content only, not on file names or order); the first ``floor(D * test_fraction)`` documents of
that ranking are the test split, the next ``floor(D * val_fraction)`` the validation split, and
the rest (in corpus order) the training split. A fraction left unset (``None``, the default)
is sized for held-out scoring (:func:`held_count`): ``AUTO_FRACTION`` of the documents, or
more, next in the ranking, until the split holds ``HELD_DOCUMENTS`` documents and
``HELD_TOKENS`` tokens, never more than ``MAX_AUTO_FRACTION`` of the documents; a split still
short of either gets a warning (:func:`shortfalls`). A corpus too small for any of that
(fewer documents than give each held-out split one, ``D * fraction < 1``, or none left
to train on) is split by position
instead: the last ``test_fraction`` of its tokens are the test split, the ``val_fraction``
before them the validation split (unset: ``AUTO_FRACTION``, or ``HELD_TOKENS`` tokens up to
``MAX_AUTO_FRACTION``). Either way the three splits share no token of the corpus, and every window
a probe reads lies inside one split (:func:`windows`), so training never reads a held-out
token.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from .cache import Tokens

Split = Literal["train", "val", "test"]
SPLITS: tuple[Split, ...] = ("train", "val", "test")
SPLIT_NAMES = {"train": "training", "val": "validation", "test": "test"}

#: Tokens each held-out split is scored on by default (``eval_tokens``), and what an unset
#: held-out fraction aims for: at least this many tokens and HELD_DOCUMENTS documents, from
#: AUTO_FRACTION of the documents up to MAX_AUTO_FRACTION.
HELD_TOKENS = 65_536
HELD_DOCUMENTS = 10
AUTO_FRACTION = 0.05
MAX_AUTO_FRACTION = 0.15


@dataclass(frozen=True)
class Splits:
    """The token ids of each split, (N_split,) each, and how the corpus was divided."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    by: Literal["documents", "positions"]
    documents: dict[str, list[int]]  # split -> document indices (empty when by positions)

    def of(self, split: Split) -> np.ndarray:
        return {"train": self.train, "val": self.val, "test": self.test}[split]


def document_ranking(tokens: Tokens) -> list[int]:
    """Document indices sorted by the sha256 of each document's ids (ties by index)."""
    ids, off = tokens.ids, tokens.offsets
    digests = [hashlib.sha256(np.ascontiguousarray(ids[off[i]:off[i + 1]]).tobytes()).digest()
               for i in range(tokens.n_documents)]
    return sorted(range(tokens.n_documents), key=lambda i: (digests[i], i))


def held_count(sizes: np.ndarray, n_docs: int, fraction: float | None) -> int:
    """Documents in a held-out split whose candidates, in ranking order, have ``sizes``
    tokens: ``floor(n_docs * fraction)``; unset, from ``AUTO_FRACTION`` of ``n_docs`` on,
    one more while the split has fewer than ``HELD_DOCUMENTS`` documents or ``HELD_TOKENS``
    tokens, at most ``MAX_AUTO_FRACTION`` of ``n_docs``."""
    if fraction is not None:
        return math.floor(n_docs * fraction)
    n, cap = math.floor(n_docs * AUTO_FRACTION), math.floor(n_docs * MAX_AUTO_FRACTION)
    total = int(sizes[:n].sum())
    while n < min(cap, len(sizes)) and (n < HELD_DOCUMENTS or total < HELD_TOKENS):
        total += int(sizes[n])
        n += 1
    return n


def split_tokens(tokens: Tokens, val_fraction: float | None,
                 test_fraction: float | None) -> Splits:
    """The three splits of ``tokens`` by the rule of the module docstring (a fraction of
    ``None``: sized for held-out scoring)."""
    n_docs = tokens.n_documents
    least = [math.floor(n_docs * (f if f is not None else AUTO_FRACTION))
             for f in (val_fraction, test_fraction)]
    ids, off = tokens.ids, tokens.offsets
    if min(least) >= 1 and n_docs - sum(least) >= 1:
        ranked = document_ranking(tokens)
        sizes = np.diff(off)[ranked]  # (D,) tokens per document, in ranking order
        n_test = held_count(sizes, n_docs, test_fraction)
        n_val = held_count(sizes[n_test:], n_docs, val_fraction)
        docs = {"test": sorted(ranked[:n_test]), "val": sorted(ranked[n_test:n_test + n_val])}
        held = set(docs["test"]) | set(docs["val"])
        docs["train"] = [i for i in range(n_docs) if i not in held]
        parts = {name: np.concatenate([ids[off[i]:off[i + 1]] for i in idx])  # (N_split,)
                 for name, idx in docs.items()}
        return Splits(parts["train"], parts["val"], parts["test"], "documents", docs)
    n = len(ids)
    test_start = n - held_positions(n, test_fraction)
    val_start = test_start - held_positions(n, val_fraction)
    return Splits(np.asarray(ids[:val_start]), np.asarray(ids[val_start:test_start]),
                  np.asarray(ids[test_start:]), "positions", {})


def held_positions(n: int, fraction: float | None) -> int:
    """Tokens of a held-out split of a corpus of ``n`` tokens split by position."""
    if fraction is not None:
        return math.floor(n * fraction)
    return min(math.floor(n * MAX_AUTO_FRACTION),
               max(math.floor(n * AUTO_FRACTION), HELD_TOKENS))


def shortfalls(parts: Splits, where: str) -> list[str]:
    """A line for each held-out split with fewer than ``HELD_DOCUMENTS`` documents or
    ``HELD_TOKENS`` tokens (held-out losses from it are noisier); nothing when both have
    enough."""
    out = []
    for split in ("val", "test"):
        n_tokens = len(parts.of(split))
        n_docs = len(parts.documents[split]) if parts.by == "documents" else None
        if n_tokens >= HELD_TOKENS and (n_docs is None or n_docs >= HELD_DOCUMENTS):
            continue
        has = (f"{n_docs} documents and {n_tokens:,} tokens" if n_docs is not None
               else f"{n_tokens:,} tokens (split by position)")
        out.append(f"the {SPLIT_NAMES[split]} split of {where} has {has}, fewer than the "
                   f"{HELD_DOCUMENTS} documents and {HELD_TOKENS:,} tokens held-out scoring "
                   f"asks for, so its losses are noisier; use a larger corpus or a larger "
                   f"{split}_fraction")
    return out


def windows(stream: np.ndarray, batch_size: int, length: int,
            generator: torch.Generator) -> torch.Tensor:
    """``batch_size`` windows of ``length`` consecutive ids at random starts inside
    ``stream``: (batch_size, length) int64."""
    starts = torch.randint(0, len(stream) - length, (batch_size,), generator=generator)  # (B,)
    index = starts.numpy()[:, None] + np.arange(length)[None, :]  # (B, length)
    return torch.from_numpy(stream[index].astype(np.int64))
