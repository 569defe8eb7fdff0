"""Train / validation / test splits of a tokenised corpus, by document.

Each document is ranked by the sha256 of its token ids (a fixed shuffle that depends on the
content only, not on file names or order); the first ``floor(D * test_fraction)`` documents of
that ranking are the test split, the next ``floor(D * val_fraction)`` the validation split, and
the rest (in corpus order) the training split. A corpus too small for that (fewer documents
than give each held-out split one, ``D * fraction < 1``, or none left to train on) is split
by position instead: the
last ``test_fraction`` of its tokens are the test split, the ``val_fraction`` before them the
validation split. Either way the three splits share no token of the corpus, and every window
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


def split_tokens(tokens: Tokens, val_fraction: float, test_fraction: float) -> Splits:
    """The three splits of ``tokens`` by the rule of the module docstring."""
    n_docs = tokens.n_documents
    n_test, n_val = math.floor(n_docs * test_fraction), math.floor(n_docs * val_fraction)
    ids, off = tokens.ids, tokens.offsets
    if n_test >= 1 and n_val >= 1 and n_docs - n_test - n_val >= 1:
        ranked = document_ranking(tokens)
        docs = {"test": sorted(ranked[:n_test]), "val": sorted(ranked[n_test:n_test + n_val])}
        held = set(docs["test"]) | set(docs["val"])
        docs["train"] = [i for i in range(n_docs) if i not in held]
        parts = {name: np.concatenate([ids[off[i]:off[i + 1]] for i in idx])  # (N_split,)
                 for name, idx in docs.items()}
        return Splits(parts["train"], parts["val"], parts["test"], "documents", docs)
    n = len(ids)
    test_start = n - math.floor(n * test_fraction)
    val_start = test_start - math.floor(n * val_fraction)
    return Splits(np.asarray(ids[:val_start]), np.asarray(ids[val_start:test_start]),
                  np.asarray(ids[test_start:]), "positions", {})


def windows(stream: np.ndarray, batch_size: int, length: int,
            generator: torch.Generator) -> torch.Tensor:
    """``batch_size`` windows of ``length`` consecutive ids at random starts inside
    ``stream``: (batch_size, length) int64."""
    starts = torch.randint(0, len(stream) - length, (batch_size,), generator=generator)  # (B,)
    index = starts.numpy()[:, None] + np.arange(length)[None, :]  # (B, length)
    return torch.from_numpy(stream[index].astype(np.int64))
