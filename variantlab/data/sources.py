"""Batches for the probes: synthetic tokens, text files, or the Python stdlib sources.

Every source is deterministic for a seed (a private ``torch.Generator``; the global RNG is
left alone so model initialisation stays the seeds'). Text is tokenised with GPT-2 BPE
(:mod:`variantlab.data.tokenizer`); token ids at or above the model's ``vocab_size`` are folded
with ``id % vocab_size`` so a small model can read a real corpus (folding merges unrelated
tokens, so a small-vocabulary model sees a harder, noisier language than GPT-2 does).
Every batch is made by the family's task (:mod:`variantlab.model.tasks`) from token rows; a task
whose ``inputs`` is ``"floats"`` ignores the source and makes its own float inputs.
"""

from __future__ import annotations

import glob
import os
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

import torch
from pydantic import Field, PositiveInt

from ..model.specs import ModelSpec
from ..model.tasks import Batch, task_for
from ..plugin.registry import Registry
from ..plugin.settings import Strict
from .tokenizer import ENDOFTEXT_ID, gpt2_encoding


class SyntheticData(Strict):
    """Random tokens, or associative recall (key-value pairs, then a queried key)."""

    source: Literal["synthetic"] = "synthetic"
    task: Literal["random", "recall"] = "random"


class TextData(Strict):
    """Text files (a path or glob, relative to the experiment file), GPT-2 BPE tokens."""

    source: Literal["text"] = "text"
    path: str


class StdlibData(Strict):
    """The running Python's standard-library sources: a real corpus present everywhere."""

    source: Literal["stdlib"] = "stdlib"
    max_files: PositiveInt | None = 200


DataSpec = Annotated[SyntheticData | TextData | StdlibData, Field(discriminator="source")]

__all__ = ["DataError", "batches", "recall_tokens", "stdlib_files", "text_files", "token_stream"]


class DataError(ValueError):
    """A data source that cannot give the batches asked for (no files, corpus too short)."""


def batches(
    data: SyntheticData | TextData | StdlibData | None,
    spec: ModelSpec,
    batch_size: int,
    seq_len: int,
    n: int,
    *,
    seed: int,
    registry: Registry,
    base_dir: Path | str = ".",
) -> list[Batch]:
    """``n`` batches of ``batch_size`` rows of ``seq_len`` positions for ``spec``'s family,
    made by the family's task in ``registry``."""
    data = data if data is not None else SyntheticData()
    gen = torch.Generator().manual_seed(int(seed))
    task = task_for(spec, registry)
    if task.inputs == "floats":
        return [task.batch(spec, batch_size, seq_len, generator=gen) for _ in range(n)]
    vocab = spec.vocab_size
    out = []
    if isinstance(data, SyntheticData):
        for _ in range(n):
            if data.task == "recall":
                tokens = recall_tokens(batch_size, seq_len + 1, vocab, generator=gen)
            else:
                tokens = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=gen)
            out.append(task.batch(spec, batch_size, seq_len, tokens=tokens, generator=gen))
        return out
    if isinstance(data, TextData):
        files = text_files(data.path, base_dir)
        where = f"data.path {data.path!r}"
    else:
        files = stdlib_files(data.max_files)
        where = f"the Python stdlib ({len(files)} files)"
    stream = token_stream(tuple(str(f) for f in files))  # (N,) GPT-2 ids
    if stream.numel() < seq_len + 2:
        raise DataError(
            f"{where} gives {stream.numel()} tokens, fewer than seq_len + 1 = {seq_len + 1}; "
            "use more text or a shorter seq_len"
        )
    stream = stream % vocab  # fold ids above the model's vocabulary
    for _ in range(n):
        starts = torch.randint(0, stream.numel() - seq_len - 1, (batch_size,), generator=gen)
        offsets = torch.arange(seq_len + 1)
        tokens = stream[starts[:, None] + offsets[None, :]]  # (B, seq_len + 1)
        out.append(task.batch(spec, batch_size, seq_len, tokens=tokens, generator=gen))
    return out


def recall_tokens(
    batch_size: int, length: int, vocab_size: int, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Associative recall (multi-query, as in Zoology / H3): each row first lists key-value
    pairs ``k1 v1 k2 v2 ...`` (distinct keys from the lower half of the vocabulary, values
    from the upper half), then asks ``q v q v ...`` with keys drawn from those pairs; the
    token after a queried key is its value. Only a model that looks back at the pairs
    (attention with working positions) predicts the answers; a bag-of-tokens model cannot.
    Returns (batch_size, length) int64.
    """
    if vocab_size < 4:
        raise DataError(f"the recall task needs vocab_size >= 4, got {vocab_size}")
    half = vocab_size // 2
    n_pairs = max(1, min(length // 4, half))
    n_queries = (length - 2 * n_pairs + 1) // 2
    rows = []
    for _ in range(batch_size):
        keys = torch.randperm(half, generator=generator)[:n_pairs]  # (P,)
        values = torch.randint(half, vocab_size, (n_pairs,), generator=generator)  # (P,)
        context = torch.stack([keys, values], dim=1).flatten()  # (2P,)
        pick = torch.randint(0, n_pairs, (n_queries,), generator=generator)  # (Q,)
        queries = torch.stack([keys[pick], values[pick]], dim=1).flatten()  # (2Q,)
        rows.append(torch.cat([context, queries])[:length])
    return torch.stack(rows)  # (B, length)


def text_files(pattern: str, base_dir: Path | str = ".") -> list[Path]:
    """Files matching ``pattern`` (a path or glob, ``**`` allowed), relative to ``base_dir``."""
    full = Path(os.path.expanduser(pattern))
    if not full.is_absolute():
        full = Path(base_dir) / full
    matches = sorted(Path(p) for p in glob.glob(str(full), recursive=True) if Path(p).is_file())
    if not matches:
        raise DataError(
            f"data.path {pattern!r}: no file matches {str(full)!r} (relative paths start at "
            f"the experiment's folder {str(base_dir)!r}); fix the path or glob"
        )
    return matches


def stdlib_files(max_files: int | None = None) -> list[Path]:
    """The running Python's standard-library ``.py`` sources, sorted, at most ``max_files``
    (installed packages under site-/dist-packages are left out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in root.rglob("*.py")
        if not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts)
    )
    if not files:
        raise DataError(f"no .py sources under the stdlib folder {root}")
    return files[:max_files] if max_files else files


@lru_cache(maxsize=8)
def token_stream(paths: tuple[str, ...]) -> torch.Tensor:
    """GPT-2 ids of the files, in order, each followed by ``<|endoftext|>``: (N,) int64."""
    enc = gpt2_encoding()
    texts = [Path(p).read_text(encoding="utf-8", errors="replace") for p in paths]
    ids: list[int] = []
    for doc in enc.encode_ordinary_batch(texts, num_threads=2):
        ids.extend(doc)
        ids.append(ENDOFTEXT_ID)
    return torch.tensor(ids, dtype=torch.long)
